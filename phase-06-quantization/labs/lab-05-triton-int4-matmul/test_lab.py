import math

import numpy as np
import pytest

from course.runtime import lab_module, use_lab

lab = lab_module(__file__)   # solution.py by default; LAB_IMPL=starter grades starter.py


torch = pytest.importorskip("torch")

# lab-02's numpy reference: quantize_grouped, pack_int4, unpack_int4, dequantize_grouped
LAB03 = use_lab("phase-06/lab-02-int4-groups-and-packing")

H100 = (3.35e12, 989e12)   # H100 SXM: HBM3 bytes/s, dense fp16 FLOP/s (NVIDIA H100 datasheet)


def _quantized(n, k, group, seed):
    """A seeded W quantized and packed by lab-02, with its dequantized float64 twin."""
    W = np.random.default_rng(seed).standard_normal((n, k)).astype(np.float32)
    q, s = LAB03.quantize_grouped(W, group)
    packed = LAB03.pack_int4(q)
    w_ref = LAB03.dequantize_grouped(LAB03.unpack_int4(packed), s, group).astype(np.float64)
    return torch.from_numpy(packed), torch.from_numpy(s), w_ref


def _x(m, k, seed):
    return torch.from_numpy(np.random.default_rng(seed).standard_normal((m, k)).astype(np.float32))


# --- interpreter-sized kernel tests (TRITON_INTERPRET=1 on CPU) ------------------------------

def _relative_error(packed, scales, group: int, seed: int) -> float:
    """int4_matmul (BLOCK_K = 32) against x @ dequantized(W).T, as a fraction of the largest output."""
    w_ref = LAB03.dequantize_grouped(LAB03.unpack_int4(packed.numpy()).astype(np.float64), scales.numpy(), group)
    x = _x(2, 128, seed=seed)
    y = lab.int4_matmul(x, packed, scales, group_size=group, block_n=16, block_k=32).double().numpy()
    want = x.double().numpy() @ w_ref.T
    return float(np.abs(y - want).max() / np.abs(want).max())


@pytest.mark.triton
def test_kernel_matches_lab03_dequant_reference():
    packed, scales, w_ref = _quantized(32, 64, 32, seed=0)
    x = _x(3, 64, seed=1)
    y = lab.int4_matmul(x, packed, scales, group_size=32, block_n=16, block_k=32)
    assert tuple(y.shape) == (3, 32), f"y = x @ W.T is (M, N) = (3, 32), got {tuple(y.shape)}"
    want = x.double().numpy() @ w_ref.T
    err = np.abs(y.double().numpy() - want).max()
    assert err < 1e-4, (
        f"kernel output differs from x @ dequantize_grouped(unpack_int4(packed), scales).T by {err:.2e}. "
        f"Low nibble = even k, high nibble = odd k, both minus 8; multiply the partial dot by scales[n, k0 // GROUP]"
    )


@pytest.mark.triton
def test_each_group_uses_its_own_scale():
    packed, scales, _ = _quantized(16, 128, 32, seed=2)
    scales = torch.tensor([1.0, 10.0, 100.0, 1000.0], dtype=torch.float16).repeat(16, 1)   # wildly different groups
    rel = _relative_error(packed, scales, group=32, seed=3)
    assert rel < 1e-5, (
        f"with group scales 1, 10, 100, 1000 the output is {rel:.1e} off (relative): each K step of BLOCK_K columns "
        f"must load scales[n, k0 // GROUP], the group that step lies in"
    )


@pytest.mark.triton
def test_block_k_smaller_than_group_reuses_the_scale():
    packed, _, _ = _quantized(16, 128, 64, seed=8)           # group 64: two groups per row of K = 128
    padded = torch.tensor([1.0, 100.0], dtype=torch.float16).repeat(17, 1)   # a spare row after the last,
    scales = padded[:16]                                     # so a wrong index reads wrong values, not past memory
    rel = _relative_error(packed, scales, group=64, seed=9)
    assert rel < 1e-5, (
        f"with BLOCK_K = 32 inside groups of 64 the output is {rel:.1e} off (relative): two K steps share one "
        f"group, so the scale index is the GROUP of column k0 (k0 // GROUP), not the step number (k0 // BLOCK_K)"
    )

@pytest.mark.triton
def test_nibble_order_matches_lab03():
    packed, scales, w_ref = _quantized(16, 64, 64, seed=4)
    eye = torch.eye(64, dtype=torch.float32)[:17]          # x = e_0 ... e_16: y[i] is column i of W
    y = lab.int4_matmul(eye, packed, scales, group_size=64, block_n=16, block_k=32).double().numpy()
    assert np.allclose(y, w_ref[:, :17].T, atol=1e-6), (
        "feeding one-hot rows of x reads W column by column, and the columns come out in the wrong places: "
        "byte j holds k = 2j in its LOW nibble and k = 2j + 1 in its HIGH nibble (lab-02's order)"
    )


@pytest.mark.triton
def test_ragged_m_and_n_are_masked():
    packed, scales, w_ref = _quantized(24, 64, 32, seed=5)   # N = 24: the second tile of 16 is half empty
    for m in (1, 17):                                         # 17 rows: a second, nearly empty tile of 16
        x = _x(m, 64, seed=6 + m)
        y = lab.int4_matmul(x, packed, scales, group_size=32, block_n=16, block_k=32)
        assert tuple(y.shape) == (m, 24), f"M={m}: expected ({m}, 24), got {tuple(y.shape)}"
        err = np.abs(y.double().numpy() - x.double().numpy() @ w_ref.T).max()
        assert err < 1e-4, f"M={m}, N=24: error {err:.2e}; mask loads and stores with offs_m < M and offs_n < N"


def _kernel(x, packed, scales, y, group, block_n=16, block_k=32):
    """Launch the learner's kernel directly with each operand's own row stride (the launcher copies
    its inputs to contiguous ones, so only a direct launch can hand the kernel a strided view)."""
    M, K = x.shape
    N = packed.shape[0]
    lab._int4_matmul_kernel[(triton_cdiv(M, 16), triton_cdiv(N, block_n))](
        x, packed, scales, y, M, N, K, x.stride(0), packed.stride(0), scales.stride(0), y.stride(0),
        GROUP=group, BLOCK_M=16, BLOCK_N=block_n, BLOCK_K=block_k,
    )


def triton_cdiv(a, b):
    return -(-a // b)


@pytest.mark.triton
def test_kernel_honours_every_row_stride():
    # x, packed, scales and y are each a column slice of a wider buffer: every row stride differs from the width
    packed, scales, w_ref = _quantized(20, 64, 32, seed=10)
    x_wide = _x(5, 64 + 24, seed=11)
    x = x_wide[:, 8:72]                                               # (5, 64), row stride 88
    p_wide = torch.full((20, 32 + 5), 0x88, dtype=torch.uint8)
    p_wide[:, 3:35] = packed
    s_wide = torch.full((20, 2 + 3), 1000.0, dtype=torch.float16)
    s_wide[:, 1:3] = scales
    y_wide = torch.full((5, 20 + 7), 7.0)
    y = y_wide[:, 4:24]
    _kernel(x, p_wide[:, 3:35], s_wide[:, 1:3], y, 32)
    err = np.abs(y.double().numpy() - x.double().numpy() @ w_ref.T).max()
    assert err < 1e-4, (
        f"with x, packed, scales and y each a column slice of a wider buffer the output is off by {err:.2e}: "
        f"step between rows with stride_xm, stride_pn, stride_sn and stride_ym, never with K, K // 2, "
        f"K // GROUP or N"
    )
    assert (y_wide[:, :4] == 7.0).all() and (y_wide[:, 24:] == 7.0).all(), (
        "columns of y's buffer outside the slice were written: store rows stride_ym apart"
    )


def _huge_uint8(n):
    """n bytes; on CPU an untouched anonymous mapping, so only the pages written cost memory."""
    if torch.cuda.is_available():
        return torch.full((n,), 0x88, dtype=torch.uint8, device="cuda"), None
    import mmap
    flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | getattr(mmap, "MAP_NORESERVE", 0)
    mm = mmap.mmap(-1, n, flags=flags)
    return torch.frombuffer(mm, dtype=torch.uint8, count=n), mm


@pytest.mark.triton
def test_offsets_past_2_pow_31_elements():
    # Row 2 of this packed weight starts 2 * (2**30 + 64) = 2**31 + 128 bytes past its first row: in int32,
    # offs_n * stride_pn wraps to -2**31 + 128, inside the untouched pages before it. The 4 GiB buffer is
    # virtual on CPU; only three rows' pages are touched. A real weight (an lm_head) passes 2**31 bytes.
    packed, scales, w_ref = _quantized(3, 64, 32, seed=12)
    stride = (1 << 30) + 64
    big, keep = _huge_uint8((1 << 31) + 2 * stride + 32)
    p = torch.as_strided(big, (3, 32), (stride, 1), 1 << 31)
    p.copy_(packed.to(p.device))
    x = _x(2, 64, seed=13).to(p.device)
    y = torch.zeros(2, 3, device=p.device)
    _kernel(x, p, scales.to(p.device), y, 32)
    err = np.abs(y.double().cpu().numpy() - x.double().cpu().numpy() @ w_ref.T).max()
    del p, big, keep
    assert err < 1e-4, (
        f"the packed row 2**31 + 128 bytes in is read wrongly (error {err:.2e}): offs_n * stride_pn overflowed "
        f"int32. Make the row offsets int64 (offs_n = (...).to(tl.int64), and the same for offs_m)"
    )


# --- the byte model (no kernel) ---------------------------------------------------------------

def test_weight_bytes_model():
    assert lab.weight_bytes(4096, 4096, "fp16") == 33_554_432, "fp16: 2 bytes x 4096 x 4096"
    i4 = lab.weight_bytes(4096, 4096, "int4", group_size=128)
    assert i4 == 8_650_752, (
        f"int4 g128: 4096 x 4096 / 2 = 8,388,608 B of nibbles + 4096 x 32 fp16 scales x 2 B = 262,144 B "
        f"-> 8,650,752 B, got {i4}"
    )
    ratio = lab.weight_bytes(4096, 4096, "fp16") / i4
    assert math.isclose(ratio, 2 / (0.5 + 2 / 128), rel_tol=1e-12), f"fp16 / int4 weight bytes = 3.879, got {ratio:.4f}"
    assert lab.matmul_bytes(1, 4096, 4096, "int4") == i4 + 2 * 4096 + 2 * 4096, "x (1, 4096) and y (1, 4096) in fp16 add 16 KiB"


def test_predicted_speedup_is_the_byte_ratio_at_decode():
    s1 = lab.predicted_speedup(1, 4096, 4096, *H100)
    assert 3.8 < s1 < 3.879, f"at M=1 both kernels are bandwidth-bound: speedup ~ the byte ratio 3.87, got {s1:.3f}"
    s256 = lab.predicted_speedup(256, 4096, 4096, *H100)
    assert 1.0 < s256 < 1.5, (
        f"at M=256 the int4 kernel hits the compute roof (same FLOPs as fp16): speedup collapses to ~1.3, got {s256:.2f}. "
        f"predicted_time must be max(bytes / bandwidth, 2*M*N*K / peak_flops)"
    )
    t = lab.predicted_time(1, 4096, 4096, "fp16", *H100)
    assert math.isclose(t, (33_554_432 + 16_384) / 3.35e12), f"fp16 M=1: (weight + x + y bytes) / 3.35 TB/s, got {t}"


# --- full shapes on a CUDA GPU ----------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.triton
@pytest.mark.parametrize("m", [1, 16, 64])
def test_full_shape_fp16_matches_torch_gpu(m):
    n, k, group = 4096, 4096, 128
    packed, scales = lab.random_int4_weight(n, k, group, seed=0, device="cuda")
    q = LAB03.unpack_int4(packed.cpu().numpy()).astype(np.float32)
    w = torch.from_numpy(LAB03.dequantize_grouped(q, scales.cpu().numpy(), group)).to("cuda", torch.float16)
    x = torch.randn(m, k, device="cuda", dtype=torch.float16, generator=torch.Generator("cuda").manual_seed(1))
    y = lab.int4_matmul(x, packed, scales, group)
    ref = x @ w.T
    rel = ((y.float() - ref.float()).norm() / ref.float().norm()).item()
    assert rel < 2e-3, f"M={m}, 4096 x 4096 g128 in fp16: relative error {rel:.1e} vs torch.matmul on the dequantized W"


@pytest.mark.triton
def test_fp16_partials_accumulate_in_fp32():
    # fp16 activations, one group of 64, BLOCK_K = 32: two K steps whose partial dots are 2049 and -2048.
    # 2049 is not an fp16 number (spacing 2 above 2048): an fp32 accumulator gives y = 1 exactly, while a
    # partial rounded to fp16 before it is added becomes 2048 and y = 0. Only the final store is fp16.
    packed = torch.empty((16, 32), dtype=torch.uint8)
    packed[:, :16] = 0x99  # k < 32: q = +1 (both nibbles 9 - 8)
    packed[:, 16:] = 0x77  # k >= 32: q = -1 (both nibbles 7 - 8)
    scales = torch.ones((16, 1), dtype=torch.float16)
    x = torch.zeros((1, 64), dtype=torch.float16)
    x[0, 0], x[0, 1], x[0, 32] = 2047.0, 2.0, 2048.0  # step 1: 2047 + 2 = 2049; step 2: -2048
    y = lab.int4_matmul(x, packed, scales, group_size=64, block_n=16, block_k=32)
    assert y.dtype == torch.float16, f"y takes x's dtype (float16), got {y.dtype}"
    got = y.float()[0].unique().tolist()
    assert got == [1.0], (
        f"every output should be 2049 - 2048 = 1, got {got}: keep the accumulator AND each step's partial dot in "
        f"float32 (tl.dot's default out dtype) and round to x's dtype only when storing y"
    )


def test_predicted_speedup_honours_the_group_size():
    # Smaller groups mean more fp16 scale bytes, so a slower int4 kernel at decode.
    fp16 = lab.predicted_time(1, 4096, 4096, "fp16", *H100)
    for group in (32, 64, 256):
        s = lab.predicted_speedup(1, 4096, 4096, *H100, group_size=group)
        want = fp16 / lab.predicted_time(1, 4096, 4096, "int4", *H100, group_size=group)
        assert math.isclose(s, want, rel_tol=1e-12), (
            f"group_size={group}: speedup should be {want:.4f} (fp16 time / int4 time with group {group}), got {s:.4f}: "
            f"pass group_size on to predicted_time for the int4 side"
        )
    g32, g128 = (lab.predicted_speedup(1, 4096, 4096, *H100, group_size=g) for g in (32, 128))
    assert g32 < g128, (
        f"group 32 stores 4x the scales of group 128, so it must predict less speedup ({g32:.4f} vs {g128:.4f})"
    )


@pytest.mark.parametrize("fmt", ["int8", "fp8", "int4-g128", "FP16", ""])
def test_weight_bytes_refuses_an_unknown_format(fmt):
    # The byte model knows two formats; any other name must be refused, never counted as one of them.
    try:
        got = lab.weight_bytes(4096, 4096, fmt)
    except ValueError:
        return
    pytest.fail(
        f"weight_bytes(4096, 4096, {fmt!r}) returned {got} instead of raising ValueError: only 'fp16' and "
        f"'int4' are formats here; check fmt == 'int4' explicitly rather than treating every other name as int4"
    )
