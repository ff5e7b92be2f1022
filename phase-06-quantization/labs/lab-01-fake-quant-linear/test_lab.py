import numpy as np

from course.runtime import lab_module

lab = lab_module(__file__)   # solution.py by default; LAB_IMPL=starter grades starter.py


def _rel(a, b):
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def _gaussian(seed=0, shape=(256, 256)):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def test_roundtrip_error_small():
    W = _gaussian()
    q, s = lab.quantize_per_channel(W)
    assert q.dtype == np.int8, f"quantized weights must be stored as int8, got {q.dtype}"
    assert q.shape == W.shape, f"q must keep W's shape {W.shape}, got {q.shape}"
    assert np.abs(q).max() <= 127, "symmetric int8 uses -127..127: clip after rounding"
    err = _rel(lab.dequantize(q, s), W)
    assert err < 0.01, (
        f"int8 per-channel round trip should lose < 1% on Gaussian weights, got {err:.3%}: "
        f"scale each row by max|row| / 127, round, and multiply back by the same row's scale"
    )
    worst = (np.abs(lab.dequantize(q, s) - W) / np.asarray(s).reshape(-1, 1)).max()
    assert worst <= 0.5 + 1e-4, (
        f"no value may move more than half a grid step (scale / 2), got {worst:.3f} steps: "
        f"use round-to-nearest, not floor or truncation"
    )


def test_scales_are_one_per_output_row():
    W = _gaussian(1, (64, 32))
    _, s = lab.quantize_per_channel(W)
    s = np.asarray(s)
    assert s.shape == (64,), (
        f"one scale per OUTPUT channel: W is (out, in) = (64, 32), so scales has shape (64,), got {s.shape}. "
        f"Reduce over axis=1 (the input dimension)"
    )
    assert np.allclose(s, np.abs(W).max(axis=1) / 127, rtol=1e-6), "scale[o] must be max|W[o]| / 127"
    _, st = lab.quantize_per_tensor(W)
    assert np.asarray(st).size == 1, f"per-tensor quantization stores a single scale, got {np.asarray(st).size}"
    assert np.isclose(float(np.asarray(st).ravel()[0]), np.abs(W).max() / 127, rtol=1e-6), "per-tensor scale = max|W| / 127"


def test_zero_row_gets_scale_one():
    W = _gaussian(2, (4, 16))
    W[2] = 0.0
    q, s = lab.quantize_per_channel(W)
    assert np.all(np.isfinite(lab.dequantize(q, s))), (
        "an all-zero row gave NaN/inf: max|row| = 0 makes the scale 0 and W / 0 undefined. "
        "Use scale = 1 for empty rows"
    )
    assert float(np.asarray(s)[2]) == 1.0, f"the convention for an all-zero row is scale = 1, got {np.asarray(s)[2]}"
    assert np.all(q[2] == 0), "an all-zero row must quantize to all zeros"


def test_static_scale_saturates_instead_of_wrapping():
    W = np.array([[0.5, 1.0, 1.5, -2.0]], dtype=np.float32)
    calibrated = np.array([1.0 / 127], dtype=np.float32)     # a scale fitted on data whose max was 1.0
    q = lab.quantize_with_scales(W, calibrated)
    assert q.dtype == np.int8, f"quantize_with_scales must return int8, got {q.dtype}"
    assert q.tolist() == [[64, 127, 127, -127]], (
        f"values past 127 x scale must clip to +/-127, got {q.tolist()}: 1.5 / (1/127) = 190.5 rounds to 190, "
        f"which wraps to -66 if you cast to int8 without np.clip(..., -127, 127) first"
    )


def test_memory_saving_about_4x():
    W = _gaussian(3, (100, 100))
    q, s = lab.quantize_per_channel(W)
    full, quant = lab.memory_bytes(W), lab.memory_bytes_quant(q, s)
    assert full == 40_000, f"100 x 100 fp32 weights = 40,000 bytes, got {full}"
    assert quant == 10_400, (
        f"int8 weights (10,000 B) + 100 fp32 scales (400 B) = 10,400 B, got {quant}: count q.nbytes + scales.nbytes"
    )
    assert 3.8 < full / quant < 4.0, f"the saving is 40,000 / 10,400 = 3.85x, about 4x; got {full / quant:.2f}x"


def test_per_channel_beats_per_tensor_on_outlier():
    W = _gaussian(4)
    W[3] *= 100.0                                   # one loud output channel
    quiet = np.arange(W.shape[0]) != 3
    qc, sc = lab.quantize_per_channel(W)
    qt, st = lab.quantize_per_tensor(W)
    err_c = _rel(lab.dequantize(qc, sc)[quiet], W[quiet])
    err_t = _rel(lab.dequantize(qt, st)[quiet], W[quiet])
    assert err_c < 0.01, f"per-channel: the quiet rows keep their own scales and should stay < 1% error, got {err_c:.2%}"
    assert err_t > 0.3, (
        f"per-tensor: the loud row sets one scale ~100x too coarse for everyone else, so the quiet rows "
        f"should lose > 30%, got {err_t:.2%}. Is quantize_per_tensor using max over the WHOLE matrix?"
    )
    assert err_t > 20 * err_c, f"per-channel should beat per-tensor by far more than 20x here ({err_t:.2%} vs {err_c:.2%})"


def test_quant_linear_matches_fp_matmul():
    rng = np.random.default_rng(5)
    W = rng.standard_normal((128, 256)).astype(np.float32)
    x = rng.standard_normal((16, 256)).astype(np.float32)
    q, s = lab.quantize_per_channel(W)
    y = lab.quant_linear(x, q, s)
    assert y.shape == (16, 128), f"x (16, 256) @ W.T with W (128, 256) gives (16, 128), got {y.shape}: transpose W"
    err_w = _rel(lab.dequantize(q, s), W)
    err_y = _rel(y, x @ W.T)
    assert err_y < 0.01, f"quant_linear should match x @ W.T within 1%, got {err_y:.3%}"
    assert err_y < 2 * err_w, (
        f"the matmul error ({err_y:.3%}) should be about the weight error ({err_w:.3%}): independent rounding "
        f"errors average out in each dot product rather than amplify"
    )


def test_error_grows_as_bits_shrink():
    W = _gaussian(6)
    q, s = lab.quantize_per_channel(W)
    assert np.allclose(lab.quantize_bits(W, 8), lab.dequantize(q, s), atol=1e-6), (
        "quantize_bits(W, 8) must equal the int8 per-channel round trip: qmax = 2**(8-1) - 1 = 127"
    )
    errs = {b: _rel(lab.quantize_bits(W, b), W) for b in (8, 6, 4, 3, 2)}
    assert errs[8] < errs[6] < errs[4] < errs[3] < errs[2], f"fewer bits must mean more error, got {errs}"
    assert 0.08 < errs[4] < 0.2, (
        f"4-bit per-channel has only 7 positive levels (qmax = 2**3 - 1): expect roughly 10-15% error on a "
        f"Gaussian row of 256, got {errs[4]:.1%}"
    )
    two = lab.quantize_bits(W, 2)
    assert len(np.unique(np.round(two[0] / np.abs(two[0]).max(), 6))) <= 3, (
        "2 bits symmetric leaves the grid {-1, 0, +1} x scale: at most 3 distinct values per row"
    )


def test_exact_ties_round_half_to_even():
    # row max 127 gives the scale exactly 1.0, so W / s is exact and 2.5, -2.5, 0.5, 1.5 are true ties.
    # vLLM's reference quantizer (quant_utils.py: quantize_weights) uses torch.round: half to even, like np.round.
    W = np.array([[127.0, 2.5, -2.5, 0.5, 1.5, -0.5, 126.5]], dtype=np.float32)
    q, s = lab.quantize_per_channel(W)
    assert s.tolist() == [1.0], f"max|row| = 127 gives scale 127 / 127 = 1.0 exactly, got {s.tolist()}"
    assert q.tolist() == [[127, 2, -2, 0, 2, 0, 126]], (
        f"ties must round half to EVEN (2.5 -> 2, -2.5 -> -2, 0.5 -> 0, 1.5 -> 2, 126.5 -> 126), as np.round and "
        f"torch.round do; got {q.tolist()}. floor(x + 0.5) rounds every tie up and biases the weights"
    )


def test_zero_row_stays_zero_at_every_bit_width():
    W = _gaussian(4, (4, 16))
    W[1] = 0.0
    for bits in (8, 4, 2):
        out = lab.quantize_bits(W, bits)
        assert np.all(np.isfinite(out)) and not out[1].any(), (
            f"quantize_bits(W, {bits}) turned the all-zero row 1 into {out[1][:4]}...: use scale 1 for an "
            "all-zero row at every bit width, as quantize_per_channel does"
        )


def test_memory_counts_the_weights_real_dtype():
    # A checkpoint is usually fp16/bf16, not fp32: the ledger must read the bytes per element from W itself.
    W16 = _gaussian(7, (100, 60)).astype(np.float16)
    got = lab.memory_bytes(W16)
    assert got == W16.nbytes == 12_000, (
        f"100 x 60 fp16 weights occupy 100 * 60 * 2 = 12,000 bytes, got {got}: count W.nbytes (itemsize x size), "
        f"do not assume 4 bytes per weight"
    )
    q, s = lab.quantize_per_channel(W16.astype(np.float32))
    assert lab.memory_bytes_quant(q, s.astype(np.float16)) == 6_000 + 200, (
        f"int8 values (6,000 B) + 100 fp16 scales (200 B) = 6,200 B, got {lab.memory_bytes_quant(q, s.astype(np.float16))}: "
        f"count scales.nbytes, not 4 bytes per scale"
    )
