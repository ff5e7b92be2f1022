import numpy as np

from course.runtime import lab_module

lab = lab_module(__file__)   # solution.py by default; LAB_IMPL=starter grades starter.py


def _rel(a, b):
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def _problem(seed=0, outliers=(17, 200), factor=80.0):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((64, 256))
    X[:, list(outliers)] *= factor
    return X, rng.standard_normal((128, 256))


def _spread(T):
    col = np.abs(T).max(axis=0)
    return col.max() / np.median(col)


def test_smoothing_is_mathematically_exact():
    X, W = _problem()
    Xh, Wh = lab.smooth(X, W, alpha=0.5)
    assert Xh.shape == X.shape and Wh.shape == W.shape, "smooth must return (X_hat, W_hat) with X's and W's shapes"
    Y = X @ W.T
    err = np.abs(Xh @ Wh.T - Y).max() / np.abs(Y).max()
    assert err < 1e-10, (
        f"X_hat @ W_hat.T must equal X @ W.T up to float rounding, got relative max error {err:.1e}: divide column j "
        f"of X by s_j and MULTIPLY column j of W (an input channel, W[:, j]) by the same s_j"
    )
    s = lab.smoothing_factors(X, W, alpha=0.5)
    assert s.shape == (256,), f"one smoothing factor per input channel: expected shape (256,), got {s.shape}"


def test_alpha_balances_the_column_maxima():
    X, W = _problem(1)
    xm, wm = np.abs(X).max(axis=0), np.abs(W).max(axis=0)
    Xh, Wh = lab.smooth(X, W, alpha=0.5)
    assert np.allclose(np.abs(Xh).max(axis=0), np.sqrt(xm * wm)), (
        "alpha = 0.5 gives both operands the same column max, sqrt(max|X_j| * max|W_j|): "
        "s_j = max|X_j|**alpha / max|W_j|**(1 - alpha)"
    )
    assert np.allclose(np.abs(Xh).max(axis=0), np.abs(Wh).max(axis=0)), "at alpha = 0.5 max|X_hat_j| == max|W_hat_j|"
    X1, _ = lab.smooth(X, W, alpha=1.0)
    assert np.allclose(np.abs(X1).max(axis=0), 1.0), "alpha = 1 moves ALL the loudness into W: every X_hat column max is 1"
    _, W0 = lab.smooth(X, W, alpha=0.0)
    assert np.allclose(np.abs(W0).max(axis=0), 1.0), (
        "alpha = 0 is not a no-op: s_j = 1 / max|W_j| flattens W's columns and pushes W's spread into X"
    )
    Xd = X.copy()
    Xd[:, 5] = 0.0                                   # a dead channel
    Xs, Ws = lab.smooth(Xd, W)
    assert np.all(np.isfinite(Xs)) and np.all(np.isfinite(Ws)), (
        "an all-zero activation channel produced NaN/inf: floor both column maxima at a small eps (1e-5) before the powers"
    )


def test_dead_weight_column_stays_finite():
    X, W = _problem(2)
    Wd = W.copy()
    Wd[:, 9] = 0.0                                   # a pruned input channel: its weight column is all zero
    for alpha in (0.0, 0.5, 0.8):
        s = lab.smoothing_factors(X, Wd, alpha=alpha)
        Xs, Ws = lab.smooth(X, Wd, alpha=alpha)
        assert np.all(np.isfinite(s)) and np.all(s > 0) and np.all(np.isfinite(Xs)) and np.all(np.isfinite(Ws)), (
            f"alpha={alpha}: an all-zero WEIGHT column gave a zero or infinite factor: floor max|W[:, j]| at eps "
            f"too, not only max|X[:, j]| (0 ** (1 - alpha) is 0, and X / 0 is inf)"
        )
        err = np.abs(Xs @ Ws.T - X @ Wd.T).max() / np.abs(X @ Wd.T).max()
        assert err < 1e-10, f"alpha={alpha}: smoothing with a dead weight column is no longer exact ({err:.1e})"


def test_outliers_wreck_naive_w8a8():
    X, W = _problem(2)
    err = _rel(lab.w8a8_matmul(X, W), X @ W.T)
    assert err > 0.05, (
        f"two channels 80x louder than the other 254 should push per-tensor W8A8 error past 5%, got {err:.2%}: "
        f"quantize X with ONE scale, max|X| / 127, over the whole tensor"
    )
    q, scale = lab.quantize_per_tensor(X)
    assert q.dtype == np.int8 and np.isclose(scale, np.abs(X).max() / 127), "per-tensor scale = max|X| / 127, q int8"


def test_w8a8_quantizes_weights_per_output_row():
    X, W = _problem(6, outliers=())
    W[3] *= 100.0                                     # one loud OUTPUT row of W, tame activations
    quiet = np.arange(W.shape[0]) != 3
    Y = X @ W.T
    err = _rel(lab.w8a8_matmul(X, W)[:, quiet], Y[:, quiet])
    assert err < 0.03, (
        f"a weight row 100x louder than the rest must not hurt the other outputs, got {err:.2%} error on them: "
        f"w8a8_matmul quantizes W with one scale per OUTPUT row (fake_quant_per_channel), not one for the tensor"
    )
    Wq = lab.fake_quant_per_channel(W)
    row_err = _rel(Wq[quiet], W[quiet])
    assert row_err < 0.01, (
        f"fake_quant_per_channel: the quiet rows keep their own scales and should lose < 1%, got {row_err:.2%}: "
        f"take max|W[o]| over axis=1 (the input dimension), one scale per row"
    )

def test_smoothing_rescues_w8a8():
    X, W = _problem(3)
    Y = X @ W.T
    naive = _rel(lab.w8a8_matmul(X, W), Y)
    smoothed = _rel(lab.w8a8_matmul(*lab.smooth(X, W, alpha=0.5)), Y)
    assert smoothed < naive / 3, (
        f"smoothing should cut the W8A8 error by more than 3x on this problem, got {naive:.2%} -> {smoothed:.2%}. "
        f"Check that w8a8_matmul quantizes W per OUTPUT row after the migration"
    )


def test_no_outliers_means_little_to_gain():
    X, W = _problem(4, outliers=())
    Y = X @ W.T
    naive = _rel(lab.w8a8_matmul(X, W), Y)
    smoothed = _rel(lab.w8a8_matmul(*lab.smooth(X, W)), Y)
    assert naive < 0.02, f"tame Gaussian activations quantize fine per tensor: expected < 2% error, got {naive:.2%}"
    assert abs(smoothed - naive) < 0.3 * naive, (
        f"with no outliers smoothing should change little, got {naive:.2%} -> {smoothed:.2%}"
    )


def test_migration_actually_moved_the_magnitude():
    X, W = _problem(5)
    Xh, Wh = lab.smooth(X, W)
    before, after = _spread(X), _spread(Xh)
    assert before / after > 5, (
        f"the loudest-to-median channel-max ratio of X should collapse by > 5x, got {before:.1f} -> {after:.1f}"
    )
    assert np.abs(Wh).max() > np.abs(W).max(), "the loudness has to go somewhere: max|W_hat| must exceed max|W|"


def test_all_zero_tensor_and_weight_row_quantize_to_zero():
    # max|T| = 0 gives scale 0 and 0 / 0: the convention is scale 1, so zeros come back as zeros
    X = np.zeros((4, 8))
    W = np.random.default_rng(3).standard_normal((5, 8))
    W[2] = 0.0  # a pruned output row
    with np.errstate(divide="raise", invalid="raise"):
        try:
            q, scale = lab.quantize_per_tensor(X)
            Y = lab.w8a8_matmul(np.ones((2, 8)), W)
        except FloatingPointError as exc:
            raise AssertionError(
                f"an all-zero tensor or weight row raised {exc}: a zero scale divides 0 by 0; use scale 1 there"
            ) from None
    assert scale == 1.0 and not q.any(), f"an all-zero tensor has scale 1.0 and quantizes to zeros, got {scale}"
    assert np.all(np.isfinite(Y)) and np.all(Y[:, 2] == 0.0), (
        f"the all-zero weight row must give a zero output column, got {Y[:, 2]}"
    )
