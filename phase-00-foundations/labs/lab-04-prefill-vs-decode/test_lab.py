import math

from course.runtime import lab_module

lab = lab_module(__file__)   # solution.py by default; LAB_IMPL=starter grades starter.py


A100_FLOPS, A100_BW = 312e12, 2.0e12  # datasheet: dense fp16/bf16 tensor-core peak, HBM bandwidth
N_8B, N_70B, FP16 = 8e9, 70e9, 2


def test_a100_ridge_point():
    r = lab.ridge_point(A100_FLOPS, A100_BW)
    assert r == 156.0, f"A100 ridge = 312e12 FLOP/s / 2.0e12 B/s = 156 FLOP/byte, got {r}: divide peak FLOPs by bandwidth"
    h = lab.ridge_point(989e12, 3.35e12)
    assert math.isclose(h, 295.2, rel_tol=1e-3), f"H100 SXM ridge = 989e12 / 3.35e12 ~ 295, got {h}"


def test_intensity_is_just_tokens_over_dtype():
    for tokens in (1, 7, 64, 2048):
        i8 = lab.arithmetic_intensity(N_8B, tokens, FP16)
        i70 = lab.arithmetic_intensity(N_70B, tokens, FP16)
        assert i8 == i70 == 2 * tokens / FP16, (
            f"intensity = (2 x n_params x tokens) / (n_params x dtype_bytes) = 2 x tokens / dtype_bytes: "
            f"the model size cancels. For {tokens} tokens in fp16 expected {2 * tokens / FP16}, got 8B={i8}, 70B={i70}"
        )
    i4 = lab.arithmetic_intensity(N_8B, 1, 0.5)
    assert i4 == 4.0, f"int4 weights (0.5 B/param) give 4 FLOP/byte for one token, got {i4}: bytes = n_params x dtype_bytes"


def test_single_decode_is_hopelessly_bandwidth_bound():
    i = lab.arithmetic_intensity(N_8B, 1, FP16)
    r = lab.ridge_point(A100_FLOPS, A100_BW)
    assert i == 1.0, f"one decode token in fp16 does 2 FLOPs per 2 bytes = 1 FLOP/byte, got {i}"
    assert lab.is_compute_bound(i, r) is False, (
        f"intensity 1 is far left of the ridge ({r}): batch-1 decode is memory-bound, is_compute_bound must be False"
    )
    assert math.isclose(i / r, 1 / 156), "batch-1 decode uses 1/156 ~ 0.64% of the A100's FLOPs"


def test_prefill_is_compute_bound():
    i = lab.arithmetic_intensity(N_8B, 2048, FP16)
    r = lab.ridge_point(A100_FLOPS, A100_BW)
    assert i == 2048.0, f"a 2,048-token prefill in fp16 has intensity 2 x 2048 / 2 = 2048, got {i}"
    assert lab.is_compute_bound(i, r) is True, f"2048 FLOP/byte is right of the ridge ({r}): prefill is compute-bound"


def test_critical_batch_size_is_the_ridge():
    b = lab.critical_batch_size(A100_FLOPS, A100_BW, FP16)
    assert math.isclose(b, 156), f"in fp16 the critical batch is ridge x dtype_bytes / 2 = 156 tokens per step, got {b}"
    r = lab.ridge_point(A100_FLOPS, A100_BW)
    assert lab.is_compute_bound(lab.arithmetic_intensity(N_8B, 155, FP16), r) is False, (
        "155 tokens per step (intensity 155 < 156) is still memory-bound"
    )
    assert lab.is_compute_bound(lab.arithmetic_intensity(N_8B, 156, FP16), r) is True, (
        "156 tokens per step sits exactly on the ridge and counts as compute-bound (use >=, not >)"
    )
    b8 = lab.critical_batch_size(A100_FLOPS, A100_BW, 1)
    assert math.isclose(b8, 78), f"with 1-byte weights each token brings 2 FLOPs per byte, so the critical batch halves to 78, got {b8}"


def test_decode_speed_limit_8b_fp16():
    tps = lab.decode_tokens_per_second(N_8B, FP16, A100_BW)
    assert math.isclose(tps, 125.0), (
        f"each decode step reads 16 GB of weights; 2.0e12 B/s / 16e9 B = 125 steps/s = 125 tok/s, got {tps}"
    )
    assert math.isclose(lab.decode_tokens_per_second(N_8B, 0.5, A100_BW), 500.0), "int4 weights (4 GB) lift the ceiling to 500 tok/s"
    assert math.isclose(lab.decode_tokens_per_second(N_8B, FP16, 3.35e12), 209.375), "H100 SXM: 3.35e12 / 16e9 = 209 tok/s"


def test_batching_multiplies_decode_throughput_for_free():
    one = lab.batched_decode_throughput(1, N_8B, FP16, A100_BW, A100_FLOPS)
    b64 = lab.batched_decode_throughput(64, N_8B, FP16, A100_BW, A100_FLOPS)
    assert math.isclose(one, 125.0), f"batch 1 is the single-stream limit, 125 tok/s, got {one}"
    assert math.isclose(b64, 8000.0), (
        f"64 sequences share one 8 ms weight read (the math takes only 3.3 ms), so 64 x 125 = 8,000 tok/s, got {b64}"
    )


def test_throughput_saturates_past_the_ridge():
    at_ridge = lab.batched_decode_throughput(156, N_8B, FP16, A100_BW, A100_FLOPS)
    big = lab.batched_decode_throughput(512, N_8B, FP16, A100_BW, A100_FLOPS)
    ceiling = A100_FLOPS / (2 * N_8B)
    assert math.isclose(at_ridge, ceiling) and math.isclose(big, ceiling), (
        f"past the ridge the step is compute-bound: throughput = peak / (2 x n_params) = {ceiling:,.0f} tok/s "
        f"for any batch >= 156; got {at_ridge:,.0f} at 156 and {big:,.0f} at 512. "
        f"Step time is max(weight bytes / bandwidth, 2 x n_params x batch / peak)"
    )


def test_bytes_per_weight_reach_every_formula():
    # Each knob counts in every function that takes it: 0.5 B/param (int4) and 1 B/param (fp8)
    # weights are read faster, batched or not, and the memory-bound plateau moves with them.
    for dtype_bytes, want in ((0.5, 500.0), (1, 250.0), (2, 125.0)):
        single = lab.decode_tokens_per_second(N_8B, dtype_bytes, A100_BW)
        batched = lab.batched_decode_throughput(1, N_8B, dtype_bytes, A100_BW, A100_FLOPS)
        assert math.isclose(batched, want) and math.isclose(single, want), (
            f"8B weights at {dtype_bytes} B/param on the A100 read in {N_8B * dtype_bytes / A100_BW * 1e3:g} ms: "
            f"batch 1 must give {want} tok/s in both decode_tokens_per_second ({single}) and "
            f"batched_decode_throughput ({batched}); use dtype_bytes in the weight-read term"
        )
    b64 = lab.batched_decode_throughput(64, N_8B, 1, A100_BW, A100_FLOPS)
    assert math.isclose(b64, 16_000.0), f"batch 64 with 1-byte weights: 64 / 4 ms = 16,000 tok/s, got {b64}"


def test_critical_batch_size_is_not_rounded():
    # On the H100 the ridge is 295.22 FLOP/byte, so fp16 needs 295.22 tokens per step; a whole
    # number below it (295) is still memory-bound. Return the exact quotient; round only when you print.
    h_ridge = lab.ridge_point(989e12, 3.35e12)
    b = lab.critical_batch_size(989e12, 3.35e12, FP16)
    assert math.isclose(b, 989e12 / 3.35e12), (
        f"H100 fp16 critical batch = ridge x 2 / 2 = {989e12 / 3.35e12:.4f} tokens per step, got {b}: "
        f"do not truncate or round it"
    )
    assert lab.is_compute_bound(lab.arithmetic_intensity(N_8B, b, FP16), h_ridge), (
        f"a step of exactly the critical batch size ({b}) must sit on the ridge (compute-bound)"
    )
