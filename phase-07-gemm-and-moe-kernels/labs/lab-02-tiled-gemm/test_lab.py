import math

import numpy as np

from course.runtime import lab_module

lab = lab_module(__file__)   # solution.py by default; LAB_IMPL=starter grades starter.py


def _mats(m, k, n, seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((m, k)), rng.standard_normal((k, n))


def test_tiled_equals_matmul_divisible():
    A, B = _mats(64, 32, 48)
    for tm, tn in [(16, 16), (32, 8), (64, 48)]:
        C = lab.tiled_gemm(A, B, tm, tn)
        assert C.shape == (64, 48), f"C must be M x N = 64 x 48, got {C.shape}"
        assert np.allclose(C, A @ B), f"tile {tm}x{tn}: tiled result differs from A @ B (max {np.max(np.abs(C - A @ B)):.2e})"


def test_tiled_equals_matmul_ragged():
    A, B = _mats(37, 19, 23)     # M=37, K=19, N=23: with 8x5 tiles every edge tile is partial (37 = 4·8+5, 23 = 4·5+3)
    C = lab.tiled_gemm(A, B, 8, 5)
    assert np.allclose(C, A @ B), (
        "ragged 37x23 output with 8x5 tiles differs from A @ B: the last row and column of tiles are partial, so "
        "loop with range(0, M, tile_m) and clip each tile with min(i0 + tile_m, M) (CUTLASS predication, a Triton mask)"
    )


def test_tile_size_one_is_the_naive_algorithm():
    assert lab.naive_traffic(1024, 1024, 1024) == 2 * 1024 ** 3, "naive loads = M·N·2K: each output reads a row of A and a column of B"
    for m, n, k in [(37, 23, 19), (1024, 1024, 1024), (1, 4096, 4096)]:
        assert lab.tiled_traffic(m, n, k, 1, 1) == lab.naive_traffic(m, n, k), (
            f"{m}x{n}x{k}: a 1x1 tile reuses nothing, so tiled_traffic(..., 1, 1) must equal naive_traffic"
        )
    A, B = _mats(37, 19, 23)
    meter = lab.LoadMeter()
    lab.tiled_gemm(A, B, 1, 1, meter)
    assert meter.loads == lab.naive_traffic(37, 23, 19) == 32_338, (
        f"tiled_gemm with 1x1 tiles must stage 2K = 38 elements per output, 32,338 in all; counted {meter.loads}: "
        f"load the A panel and the B panel once per tile through meter.load"
    )


def test_traffic_formulas():
    tiled = lab.tiled_traffic(1024, 1024, 1024, 128, 128)
    assert tiled == 16_777_216, (
        f"1024^3 with 128x128 tiles: A (1M elements) is read 8 times and B 8 times = 16,777,216 loads, got {tiled:,}"
    )
    assert lab.naive_traffic(1024, 1024, 1024) == 2_147_483_648, "naive 1024^3 = 2,147,483,648 loads (2 G)"
    got = lab.tiled_traffic(37, 23, 19, 8, 5)
    want = 37 * 19 * math.ceil(23 / 5) + 19 * 23 * math.ceil(37 / 8)
    assert got == want == 5_700, f"ragged 37x23x19 with 8x5 tiles: 37·19·ceil(23/5) + 19·23·ceil(37/8) = 5,700, got {got}: partial tiles still load full panels, so round UP"


def test_counted_loads_match_the_formula():
    A, B = _mats(37, 19, 23)
    for tm, tn in [(8, 5), (16, 16), (37, 23), (5, 64)]:
        meter = lab.LoadMeter()
        lab.tiled_gemm(A, B, tm, tn, meter)
        want = lab.tiled_traffic(37, 23, 19, tm, tn)
        assert meter.loads == want, (
            f"tile {tm}x{tn}: tiled_gemm staged {meter.loads:,} elements but the model predicts {want:,}: "
            f"load A[i0:i1, :] and B[:, j0:j1] exactly once per output tile"
        )


def test_bigger_tiles_mean_less_traffic():
    sizes = [1, 2, 4, 8, 16, 32, 64, 128, 256]
    traffic = [lab.tiled_traffic(1024, 1024, 1024, t, t) for t in sizes]
    assert all(a > b for a, b in zip(traffic, traffic[1:])), f"square tiles 1..256 must strictly reduce loads, got {traffic}"
    assert traffic[0] // traffic[-1] == 256, "a 256x256 tile loads 256 times less than the naive loop"


def test_reuse_factor_is_the_harmonic_tile_size():
    assert lab.reuse_factor(128, 128) == 128, "a square t x t tile reuses every loaded element t times: reuse_factor(128, 128) = 128"
    r = lab.reuse_factor(256, 16)
    assert math.isclose(r, 30.118, rel_tol=1e-3), (
        f"256x16 has the same area as 64x64 but reuse 2/(1/256 + 1/16) = 30.1, governed by the short side; got {r}"
    )
    for tm, tn in [(16, 16), (64, 32), (256, 16)]:
        ratio = lab.naive_traffic(1024, 1024, 1024) / lab.tiled_traffic(1024, 1024, 1024, tm, tn)
        assert math.isclose(ratio, lab.reuse_factor(tm, tn)), f"when tiles divide the matrix, naive/tiled ({ratio}) is exactly reuse_factor({tm}, {tn})"


def test_decode_shape_has_no_reuse_to_harvest():
    for tm, tn in [(1, 1), (1, 128), (128, 128), (256, 256), (1, 4096)]:
        r = lab.naive_traffic(1, 4096, 4096) / lab.tiled_traffic(1, 4096, 4096, tm, tn)
        assert r <= 2.0 + 1e-12, (
            f"M=1 (one decode token), tile {tm}x{tn}: reuse {r:.3f} > 2. With one row, tile_m is effectively 1 and "
            f"ceil(M/tile_m) = 1, so every weight is loaded once per step: the reuse is at most 2"
        )
    assert lab.reuse_factor(1, 1 << 20) < 2, "tile_m = 1 caps the harmonic mean below 2 however wide tile_n is"


def test_mixed_dtypes_keep_the_product_dtype():
    # C must hold what A @ B holds: an integer A times a float B is a float matrix, float32 x float64 is float64.
    rng = np.random.default_rng(3)
    A_int = rng.integers(-3, 4, size=(9, 6))
    B = rng.standard_normal((6, 7)) * 0.3
    C = lab.tiled_gemm(A_int, B, 4, 4)
    assert C.dtype == (A_int @ B).dtype, (
        f"int64 A @ float64 B is {(A_int @ B).dtype}, but C came back {C.dtype}: allocate C with "
        f"np.result_type(A, B), not A's dtype, or every tile is truncated when it is written"
    )
    assert np.allclose(C, A_int @ B), (
        f"int A, float B: C differs from A @ B by {np.max(np.abs(C - A_int @ B)):.3f}"
    )
    A32 = rng.standard_normal((9, 6)).astype(np.float32) * np.float32(1 / 3)
    C = lab.tiled_gemm(A32, B, 4, 4)
    err = np.max(np.abs(C - A32 @ B))
    assert C.dtype == np.float64 and err < 1e-12, (
        f"float32 A @ float64 B must stay float64 (got {C.dtype}, max error {err:.1e} against A @ B): the output "
        f"dtype is the promotion of both inputs"
    )
