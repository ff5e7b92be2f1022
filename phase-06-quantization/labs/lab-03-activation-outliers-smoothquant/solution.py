"""Lab 06-03 — activation outliers and SmoothQuant (reference solution).

W8A8 quantizes both operands of ``Y = X @ W.T``: ``X`` (tokens, in) are the activations, ``W``
(out, in) the weights. Activations of large models carry a few *outlier channels* (input
dimensions that are 10-100x louder than the rest on every token); a per-tensor int8 scale sized
for them leaves the other channels a handful of levels. SmoothQuant (Xiao et al., arXiv 2211.10438)
divides each input channel ``j`` of ``X`` by ``s_j`` and multiplies the matching column of ``W`` by
the same ``s_j``, an exact identity that moves loudness from the hard operand to the easy one:

    s_j = max|X[:, j]|**alpha / max|W[:, j]|**(1 - alpha)
    X_hat[:, j] = X[:, j] / s_j        W_hat[:, j] = W[:, j] * s_j        X_hat @ W_hat.T == X @ W.T

Granularity, a design choice this lab fixes: activations get ONE per-tensor scale (they exist
only at runtime, so their scales must be cheap); weights get one scale per OUTPUT row, as vLLM's
W8A8 int8 and fp8 channel schemes do. After smoothing, the weights carry the loud columns, and a
per-row weight scale is what keeps the quiet output rows precise.
"""

from __future__ import annotations

import numpy as np

QMAX = 127
EPS = 1e-5   # floor for the column maxima, so a dead channel never yields s_j = 0 or inf


# --------------------------------------------------------------------------- the lab
def quantize_per_tensor(T: np.ndarray) -> tuple[np.ndarray, float]:
    """Symmetric int8 with one scale for the whole tensor: ``scale = max|T| / 127`` (1.0 if T is all zero)."""
    scale = float(np.abs(T).max()) / QMAX or 1.0
    return np.clip(np.round(T / scale), -QMAX, QMAX).astype(np.int8), scale


def fake_quant(T: np.ndarray) -> np.ndarray:
    """Quantize per tensor, then dequantize: what the activations look like after the int8 round trip."""
    q, scale = quantize_per_tensor(T)
    return q.astype(np.float64) * scale


def fake_quant_per_channel(W: np.ndarray) -> np.ndarray:
    """Per-output-row int8 round trip of ``W`` (out, in): ``s[o] = max|W[o]| / 127`` (1 for an all-zero row)."""
    s = np.abs(W).max(axis=1, keepdims=True) / QMAX
    s[s == 0] = 1.0
    return np.clip(np.round(W / s), -QMAX, QMAX) * s


def w8a8_matmul(X: np.ndarray, W: np.ndarray) -> np.ndarray:
    """``Y ≈ X @ W.T`` with X fake-quantized per tensor and W per output channel."""
    return fake_quant(X) @ fake_quant_per_channel(W).T


def smoothing_factors(X: np.ndarray, W: np.ndarray, alpha: float = 0.5) -> np.ndarray:
    """``s_j = max|X[:, j]|**alpha / max|W[:, j]|**(1 - alpha)`` per input channel j, shape (in,).

    Both maxima are floored at ``EPS`` so an all-zero channel gives a finite, positive factor.
    """
    x_max = np.maximum(np.abs(X).max(axis=0), EPS)
    w_max = np.maximum(np.abs(W).max(axis=0), EPS)
    return x_max**alpha / w_max ** (1.0 - alpha)


def smooth(X: np.ndarray, W: np.ndarray, alpha: float = 0.5) -> tuple[np.ndarray, np.ndarray]:
    """The SmoothQuant migration: ``(X / s, W * s)`` with ``s = smoothing_factors(X, W, alpha)``."""
    s = smoothing_factors(X, W, alpha)
    return X / s[None, :], W * s[None, :]


# --------------------------------------------------------------------------- provided
def relative_error(approx: np.ndarray, exact: np.ndarray) -> float:
    """``||approx - exact|| / ||exact||`` (Frobenius norm)."""
    return float(np.linalg.norm(approx - exact) / np.linalg.norm(exact))


def make_problem(seed: int = 0, tokens: int = 64, d_in: int = 256, d_out: int = 128,
                 outliers: tuple[int, ...] = (17, 200), factor: float = 80.0) -> tuple[np.ndarray, np.ndarray]:
    """Gaussian activations with a few channels ``factor`` times louder on every token, and Gaussian weights."""
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((tokens, d_in))
    X[:, list(outliers)] *= factor
    W = rng.standard_normal((d_out, d_in))
    return X, W


def channel_spread(T: np.ndarray) -> float:
    """Loudest input channel's max over the median channel's max (columns are channels)."""
    col = np.abs(T).max(axis=0)
    return float(col.max() / np.median(col))


def main() -> None:
    X, W = make_problem()
    Y = X @ W.T
    _, scale = quantize_per_tensor(X)
    quiet_max = np.median(np.abs(X).max(axis=0))
    print("Activations 64 x 256 with channels 17 and 200 x80; weights 128 x 256")
    print(f"  per-tensor scale {scale:.3f}: a median quiet channel (max {quiet_max:.2f}) spans only "
          f"+/-{quiet_max / scale:.1f} grid steps of the +/-127")
    print(f"  naive W8A8 error      : {relative_error(w8a8_matmul(X, W), Y):.2%}")
    Xh, Wh = smooth(X, W)
    print(f"  smoothing exact?      : max |X_hat W_hat^T - X W^T| = {np.abs(Xh @ Wh.T - Y).max():.1e}")
    print(f"  smoothed W8A8 error   : {relative_error(w8a8_matmul(Xh, Wh), Y):.2%}")
    print(f"  X channel spread      : {channel_spread(X):.1f} -> {channel_spread(Xh):.1f}")
    print(f"  max|W|                : {np.abs(W).max():.2f} -> {np.abs(Wh).max():.2f}")
    print()
    Xt, _ = make_problem(outliers=())
    Yt = Xt @ W.T
    print("Control: the same shapes with no outlier channels")
    print(f"  naive W8A8 error      : {relative_error(w8a8_matmul(Xt, W), Yt):.2%}")
    print(f"  smoothed W8A8 error   : {relative_error(w8a8_matmul(*smooth(Xt, W)), Yt):.2%}")
    print()
    print("alpha sweep (the outlier problem)")
    for alpha in (0.0, 0.25, 0.5, 0.75, 1.0):
        Xa, Wa = smooth(X, W, alpha)
        print(f"  alpha {alpha:.2f}: X spread {channel_spread(Xa):7.1f}  W spread {channel_spread(Wa):7.1f}  "
              f"W8A8 error {relative_error(w8a8_matmul(Xa, Wa), Y):6.2%}")


if __name__ == "__main__":
    main()
