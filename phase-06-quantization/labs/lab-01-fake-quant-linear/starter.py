"""Lab 06-01 — int8 fake-quant linear (starter: write the eight functions).

Symmetric int8 quantization of a weight matrix ``W`` of shape ``(out, in)``, the layout of
``nn.Linear.weight`` and of vLLM's linear layers:

* ``quantize_with_scales``: the one rule everything else uses, ``q = clip(round(W / s), -127, 127)``;
* ``quantize_per_channel``: one scale per output row, ``s[o] = max|W[o]| / 127``;
* ``quantize_per_tensor``: one scale for the whole matrix (the comparison baseline);
* ``dequantize``: ``W ≈ s × q``, the scales broadcast back over each row;
* ``quant_linear``: ``x @ dequantize(q, s).T``, the "apply" path with the dequant done up front;
* ``memory_bytes`` / ``memory_bytes_quant``: the bytes each representation stores.

"Fake" quantization: the integers are real, the matmul runs in float. Real kernels do the same
arithmetic with the dequant folded into the GEMM (Phase 7).
"""

from __future__ import annotations

import numpy as np

QMAX = 127  # symmetric int8 grid: -127..127 (255 points; -128 is left unused so negation is exact)


# --------------------------------------------------------------------------- the lab
def quantize_with_scales(W: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """Quantize ``W`` (out, in) with given per-row scales (shape (out,), or a single scale).

    Returns int8 ``clip(round(W / s), -127, 127)``. Clipping matters whenever a scale came from
    somewhere else (a calibration set, a checkpoint): a value past ``127 × s`` must saturate at
    ±127, never wrap around in the int8 cast.
    """
    raise NotImplementedError(
        'quantize_with_scales: make the scales a column of shape (-1, 1) so row o is divided by its'
        ' own scale; round to the nearest integer, then saturate to +/-QMAX BEFORE the int8 cast '
        '(casting first turns 190 into -66)'
    )


def quantize_per_channel(W: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """One scale per output row: ``s[o] = max|W[o]| / 127`` (1.0 for an all-zero row).

    Returns ``(q, scales)`` with ``q`` int8 of W's shape and ``scales`` float32 of shape (out,).
    """
    raise NotImplementedError(
        'quantize_per_channel: take the largest |value| of each output row (reduce over the INPUT '
        'axis, so you get one number per row), divide by QMAX, keep float32, patch all-zero rows to'
        ' 1.0, then let quantize_with_scales do the rounding'
    )


def quantize_per_tensor(W: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """One scale for the whole matrix: ``s = max|W| / 127``. Returns ``(q, scales)``, scales shape (1,)."""
    raise NotImplementedError(
        'quantize_per_tensor: the same recipe with a single maximum over every element; keep that '
        'one scale as a float32 array of shape (1,) so dequantize can broadcast it exactly like the'
        ' per-row case'
    )


def dequantize(q: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """``W_approx = s × q`` with one scale per row (or one for all). Returns float32."""
    raise NotImplementedError(
        'dequantize: undo the division: each integer times the scale of its row. Shaping the scales'
        ' as a (-1, 1) column serves both cases (one scale per row, or one for all); return float32'
    )


def quant_linear(x: np.ndarray, q: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """The layer's forward: ``x @ dequantize(q, s).T`` for ``x`` of shape (tokens, in)."""
    raise NotImplementedError(
        'quant_linear: rebuild the approximate weight with your dequantize, then apply it the way '
        'nn.Linear does; mind the shapes: x is (tokens, in), W is (out, in), y must be (tokens, '
        'out)'
    )


def memory_bytes(W: np.ndarray) -> int:
    """Bytes the unquantized matrix occupies (its dtype's size × element count)."""
    raise NotImplementedError(
        'memory_bytes: every numpy array knows how many bytes its data occupies (element count x '
        'itemsize); return that as a Python int'
    )


def memory_bytes_quant(q: np.ndarray, scales: np.ndarray) -> int:
    """Bytes of the quantized form: the int8 values plus the float32 scales."""
    raise NotImplementedError(
        'memory_bytes_quant: count both stored arrays, the int8 values AND the float32 scales (a '
        '100 x 100 matrix should come to 10,400 bytes)'
    )


def quantize_bits(W: np.ndarray, bits: int) -> np.ndarray:
    """Per-channel symmetric fake quant at any bit width; returns the dequantized float32 matrix.

    The grid has ``qmax = 2**(bits-1) - 1`` positive levels (127 for 8 bits, 7 for 4, 1 for 2),
    the scale is ``max|W[o]| / qmax`` per row (1.0 for an all-zero row).
    """
    raise NotImplementedError(
        'quantize_bits: the per-channel recipe again, with QMAX replaced by the largest level a '
        'symmetric signed grid of `bits` bits keeps (127 for 8 bits, 7 for 4, 1 for 2); return the '
        'values already multiplied back by their scales'
    )


# --------------------------------------------------------------------------- provided
def relative_error(approx: np.ndarray, exact: np.ndarray) -> float:
    """``||approx - exact|| / ||exact||`` (Frobenius norm)."""
    return float(np.linalg.norm(approx - exact) / np.linalg.norm(exact))


def outlier_matrix(rng: np.random.Generator, out: int = 256, inp: int = 256, factor: float = 100.0) -> np.ndarray:
    """Gaussian weights with one output row scaled by ``factor`` (a "loud" channel)."""
    W = rng.standard_normal((out, inp)).astype(np.float32)
    W[3] *= factor
    return W


def main() -> None:
    rng = np.random.default_rng(0)
    W = rng.standard_normal((256, 256)).astype(np.float32)
    q, s = quantize_per_channel(W)
    print("Gaussian W, 256 x 256, int8 per-channel")
    print(f"  scale of row 0     : {s[0]:.5f} (= max|W[0]| / 127 = {np.abs(W[0]).max():.4f} / 127)")
    worst = (np.abs(dequantize(q, s) - W) / s[:, None]).max()
    print(f"  worst |error|/scale: {worst:.3f} (rounding never moves a value more than half a step)")
    print(f"  relative error     : {relative_error(dequantize(q, s), W):.3%}")
    print()

    W100 = rng.standard_normal((100, 100)).astype(np.float32)
    q100, s100 = quantize_per_channel(W100)
    fp32, int8 = memory_bytes(W100), memory_bytes_quant(q100, s100)
    print("Memory ledger, 100 x 100")
    print(f"  fp32               : {fp32:,} B")
    print(f"  int8 + fp32 scales : {q100.nbytes:,} + {s100.nbytes:,} = {int8:,} B  ({fp32 / int8:.2f}x smaller)")
    print()

    Wo = outlier_matrix(rng)
    qc, sc = quantize_per_channel(Wo)
    qt, st = quantize_per_tensor(Wo)
    quiet = np.arange(Wo.shape[0]) != 3
    print("One loud row (row 3 x100): error on the 255 quiet rows")
    print(f"  per-tensor scale   : {st[0]:.4f}   relative error {relative_error(dequantize(qt, st)[quiet], Wo[quiet]):.2%}")
    print(f"  per-channel scales : {np.median(sc):.4f} (median)  relative error "
          f"{relative_error(dequantize(qc, sc)[quiet], Wo[quiet]):.2%}")
    print(f"  quiet values that round to 0 under the per-tensor scale: {np.mean(qt[quiet] == 0):.1%}")
    print()

    x = rng.standard_normal((8, 256)).astype(np.float32)
    print("quant_linear vs the float matmul (8 tokens)")
    print(f"  relative error of y: {relative_error(quant_linear(x, q, s), x @ W.T):.3%}")
    print()
    print("Error vs bit width (per-channel, Gaussian 256 x 256)")
    for bits in (8, 6, 4, 3, 2):
        print(f"  {bits} bits ({2 ** (bits - 1) - 1:>3} positive levels): {relative_error(quantize_bits(W, bits), W):7.2%}")


if __name__ == "__main__":
    main()
