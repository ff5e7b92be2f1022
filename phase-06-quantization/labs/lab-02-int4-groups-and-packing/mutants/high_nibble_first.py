"""MUTANT — puts the even index in the HIGH nibble; round-trips with its own unpack but not with anyone else's reader.

Lab 06-02 — int4 group quantization and nibble packing (reference solution).

What a model card's ``W4A16, group_size=128, sym`` means, as code. ``W`` is ``(out, in)``; groups
run along the input dimension, so row ``o`` holds ``in // group_size`` groups of consecutive
weights, each with its own scale:

* ``quantize_grouped``: ``scale = max|group| / 7`` stored as float16, ``q = clip(round(w / scale), -7, 7)``;
* ``dequantize_grouped``: every weight times its group's scale;
* ``pack_int4`` / ``unpack_int4``: two 4-bit values per byte, offset by 8 so ``-8..7`` becomes
  ``0..15``; the even index goes in the low nibble, the odd index in the high nibble;
* ``memory_bytes_grouped``: packed bytes plus scale bytes;
* ``scale_overhead``: scale bits per weight as a fraction of the weight bits.

Scales are float16, as in real checkpoints; ``q`` is computed with the *stored* (rounded) scale so
that ``dequantize_grouped`` reproduces exactly what a kernel reading the checkpoint would.
"""

from __future__ import annotations

import numpy as np

QMAX = 7  # symmetric int4: -7..7 (15 levels); -8 is left unused so q = 0 <=> w ~ 0 and negation is exact


# --------------------------------------------------------------------------- the lab
def quantize_grouped(W: np.ndarray, group_size: int) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric int4 with one float16 scale per ``group_size`` consecutive weights of a row.

    Returns ``(q, scales)``: ``q`` int8 holding values in [-7, 7], W's shape; ``scales`` float16
    of shape ``(out, in // group_size)``. Raises ValueError if ``group_size`` does not divide ``in``.
    """
    out, inp = W.shape
    if group_size <= 0 or inp % group_size:
        raise ValueError(f"group_size {group_size} must divide the input dimension {inp}")
    groups = W.reshape(out, inp // group_size, group_size)
    scales = (np.abs(groups).max(axis=2) / QMAX).astype(np.float16)
    scales[scales == 0] = 1.0                       # all-zero group (or fp16 underflow): any scale gives zeros
    s = scales.astype(np.float32)[:, :, None]
    q = np.clip(np.round(groups / s), -QMAX, QMAX).astype(np.int8)
    return q.reshape(out, inp), scales


def dequantize_grouped(q: np.ndarray, scales: np.ndarray, group_size: int) -> np.ndarray:
    """``W_approx[o, i] = scales[o, i // group_size] × q[o, i]``, as float32."""
    return q.astype(np.float32) * np.repeat(scales.astype(np.float32), group_size, axis=1)


def pack_int4(q: np.ndarray) -> np.ndarray:
    """Two int4 values per byte along the last axis: ``byte = (q[2j] + 8) | (q[2j+1] + 8) << 4``.

    Shape ``(out, in)`` → uint8 ``(out, in // 2)``. Raises ValueError for an odd last dimension or a
    value outside [-8, 7].
    """
    if q.shape[-1] % 2:
        raise ValueError(f"need an even number of values per row to pack pairs, got {q.shape[-1]}")
    if q.min() < -8 or q.max() > 7:
        raise ValueError(f"int4 values must lie in [-8, 7], got [{q.min()}, {q.max()}]")
    u = (q.astype(np.int16) + 8).astype(np.uint8)   # -8..7 -> 0..15
    return ((u[..., 0::2] << 4) | u[..., 1::2]).astype(np.uint8)


def unpack_int4(packed: np.ndarray) -> np.ndarray:
    """Exact inverse of ``pack_int4``: uint8 ``(out, n)`` → int8 ``(out, 2n)``."""
    low = (packed >> 4).astype(np.int8) - 8
    high = (packed & 0x0F).astype(np.int8) - 8
    q = np.empty(packed.shape[:-1] + (2 * packed.shape[-1],), dtype=np.int8)
    q[..., 0::2] = low
    q[..., 1::2] = high
    return q


def memory_bytes_grouped(packed: np.ndarray, scales: np.ndarray) -> int:
    """Bytes stored for a group-quantized matrix: the packed nibbles plus the scales."""
    return int(packed.nbytes + scales.nbytes)


def scale_overhead(group_size: int, weight_bits: int = 4, scale_bits: int = 16) -> float:
    """Extra storage the scales add, as a fraction of the weight payload.

    Each weight carries ``scale_bits / group_size`` bits of scale next to its ``weight_bits``:
    group 128 with fp16 scales adds 0.125 bit to 4, i.e. 0.03125 (3.125 %).
    """
    return scale_bits / group_size / weight_bits


# --------------------------------------------------------------------------- provided
def relative_error(approx: np.ndarray, exact: np.ndarray) -> float:
    """``||approx - exact|| / ||exact||`` (Frobenius norm)."""
    return float(np.linalg.norm(approx - exact) / np.linalg.norm(exact))


def banded_matrix(rng: np.random.Generator, out: int = 64, inp: int = 1024, band: int = 16) -> np.ndarray:
    """Gaussian weights whose magnitude changes every ``band`` input columns (spread over ~e^±2)."""
    gains = np.exp(rng.uniform(-2.0, 2.0, size=inp // band))
    return (rng.standard_normal((out, inp)) * np.repeat(gains, band)[None, :]).astype(np.float32)


def main() -> None:
    q_row = np.array([[1, -2, 7, -7]], dtype=np.int8)
    packed = pack_int4(q_row)
    print("Packing one row: q = [1, -2, 7, -7]")
    print(f"  +8 offset        : {(q_row + 8).tolist()[0]}")
    print(f"  bytes            : {[f'0x{b:02x}' for b in packed[0]]}  (low nibble = even index)")
    print(f"  unpacked         : {unpack_int4(packed).tolist()[0]}")
    print()

    rng = np.random.default_rng(0)
    W = rng.standard_normal((16, 64)).astype(np.float32)
    q, s = quantize_grouped(W, 32)
    print(f"W (16, 64), group 32: q {q.shape} int8 -> packed {pack_int4(q).shape} uint8, scales {s.shape} float16")
    print(f"  relative error   : {relative_error(dequantize_grouped(q, s, 32), W):.2%}")
    print()

    print("W4A16 g128 sym: bytes per weight = 4/8 + 16/128/8")
    bpw = 0.5 + 2 / 128
    print(f"  {bpw} B/weight; {4 / bpw:.2f}x smaller than fp32, {2 / bpw:.2f}x smaller than fp16")
    for name, n in (("Llama-3-8B", 8.03e9), ("Llama-3-70B", 70.6e9)):
        print(f"  {name:<12}: fp16 {2 * n / 1e9:6.1f} GB -> int4 g128 {bpw * n / 1e9:5.1f} GB")
    print()

    Wb = banded_matrix(np.random.default_rng(1))
    print("Group size trade-off (fp16 scales; error on banded weights 64 x 1024, bands of 16)")
    print(f"{'group':>6} {'scales':>7} {'scale bits/w':>13} {'vs 4-bit payload':>17} {'share of bytes':>15} {'B/weight':>9} {'error':>7}")
    for g in (16, 32, 64, 128, 256):
        qg, sg = quantize_grouped(Wb, g)
        nbytes = memory_bytes_grouped(pack_int4(qg), sg)
        print(f"{g:>6} {sg.size:>7} {16 / g:>13.4f} {scale_overhead(g):>16.3%} {2 * sg.size / nbytes:>14.2%} "
              f"{nbytes / Wb.size:>9.5f} {relative_error(dequantize_grouped(qg, sg, g), Wb):>7.2%}")
    print(f"(the same 0.125 bit is {scale_overhead(128, weight_bits=8):.4%} of an 8-bit payload)")


if __name__ == "__main__":
    main()
