"""Lab 06-02 — int4 group quantization and nibble packing (starter: write the six functions).

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
    raise NotImplementedError(
        'quantize_grouped: reject a group_size that does not divide the input width (ValueError); '
        'view W as (out, in // group_size, group_size) so each group is its own last axis, take one'
        ' max|.| / QMAX per group, store it as float16 (zeros -> 1), and round with the STORED '
        'float16 scale so dequantization reproduces exactly what a kernel would read'
    )


def dequantize_grouped(q: np.ndarray, scales: np.ndarray, group_size: int) -> np.ndarray:
    """``W_approx[o, i] = scales[o, i // group_size] × q[o, i]``, as float32."""
    raise NotImplementedError(
        'dequantize_grouped: every weight needs the scale of group i // group_size of its row; '
        'stretch the (out, in // group_size) scales along axis 1 so each is repeated group_size '
        'times in a row, then multiply elementwise in float32'
    )


def pack_int4(q: np.ndarray) -> np.ndarray:
    """Two int4 values per byte along the last axis: ``byte = (q[2j] + 8) | (q[2j+1] + 8) << 4``.

    Shape ``(out, in)`` → uint8 ``(out, in // 2)``. Raises ValueError for an odd last dimension or a
    value outside [-8, 7].
    """
    raise NotImplementedError(
        'pack_int4: validate first (even width, values in [-8, 7]); shift every value by +8 so it '
        'fits an unsigned nibble, then build each byte from the pair (2j, 2j+1): the even element '
        'goes in bits 0-3, the odd one in bits 4-7'
    )


def unpack_int4(packed: np.ndarray) -> np.ndarray:
    """Exact inverse of ``pack_int4``: uint8 ``(out, n)`` → int8 ``(out, 2n)``."""
    raise NotImplementedError(
        'unpack_int4: the mirror image of pack_int4: mask out the low nibble and shift down the '
        'high one, undo the +8 offset in a signed dtype, and interleave them back so the low nibble'
        ' lands at the even index'
    )


def memory_bytes_grouped(packed: np.ndarray, scales: np.ndarray) -> int:
    """Bytes stored for a group-quantized matrix: the packed nibbles plus the scales."""
    raise NotImplementedError(
        'memory_bytes_grouped: what the checkpoint stores is the packed array plus the float16 '
        'scales; add up the bytes of both (a (256, 1024) matrix at group 128 comes to 135,168)'
    )


def scale_overhead(group_size: int, weight_bits: int = 4, scale_bits: int = 16) -> float:
    """Extra storage the scales add, as a fraction of the weight payload.

    Each weight carries ``scale_bits / group_size`` bits of scale next to its ``weight_bits``:
    group 128 with fp16 scales adds 0.125 bit to 4, i.e. 0.03125 (3.125 %).
    """
    raise NotImplementedError(
        "scale_overhead: spread one scale's bits over the group it serves to get scale bits per "
        "weight, then express that relative to the weight's own bits (the payload), not relative to"
        ' a byte'
    )


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
    print(
        f"{'group':>6} {'scales':>7} {'scale bits/w':>13} {'vs 4-bit payload':>17} "
        f"{'share of bytes':>15} {'B/weight':>9} {'error':>7}"
    )
    for g in (16, 32, 64, 128, 256):
        qg, sg = quantize_grouped(Wb, g)
        nbytes = memory_bytes_grouped(pack_int4(qg), sg)
        print(f"{g:>6} {sg.size:>7} {16 / g:>13.4f} {scale_overhead(g):>16.3%} {2 * sg.size / nbytes:>14.2%} "
              f"{nbytes / Wb.size:>9.5f} {relative_error(dequantize_grouped(qg, sg, g), Wb):>7.2%}")
    print(f"(the same 0.125 bit is {scale_overhead(128, weight_bits=8):.4%} of an 8-bit payload)")


if __name__ == "__main__":
    main()
