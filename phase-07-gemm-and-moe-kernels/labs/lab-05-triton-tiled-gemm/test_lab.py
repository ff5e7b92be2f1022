import pytest

from course.runtime import lab_module

lab = lab_module(__file__)   # solution.py by default; LAB_IMPL=starter grades starter.py


torch = pytest.importorskip("torch")


def _rand(*shape, seed=0, dtype=torch.float32, device="cpu"):
    g = torch.Generator(device=device).manual_seed(seed)
    return torch.randn(*shape, generator=g, device=device).to(dtype)


def test_grouped_order_visits_every_tile_once():
    order = [lab.program_tile(p, 3, 4, 2) for p in range(12)]
    want = [(0, 0), (1, 0), (0, 1), (1, 1), (0, 2), (1, 2), (0, 3), (1, 3), (2, 0), (2, 1), (2, 2), (2, 3)]
    assert order == want, (
        f"GROUP_M=2 on 3 x 4 tiles: programs go down a group of 2 tile rows, then one column right; the last group "
        f"has 1 row. Expected {want}, got {order}"
    )
    assert [lab.program_tile(p, 3, 4, 1) for p in range(12)] == [(m, n) for m in range(3) for n in range(4)], (
        "GROUP_M=1 must be plain row-major order"
    )
    for shape, gm in [((5, 7), 3), ((8, 8), 8), ((1, 9), 4), ((9, 1), 4)]:
        tiles = [lab.program_tile(p, shape[0], shape[1], gm) for p in range(shape[0] * shape[1])]
        assert sorted(tiles) == [(m, n) for m in range(shape[0]) for n in range(shape[1])], (
            f"{shape[0]} x {shape[1]} tiles, GROUP_M={gm}: every tile must be computed by exactly one program"
        )


def test_grouping_shrinks_the_l2_working_set():
    rm = sum(lab.panels_in_wave(4096, 4096, 128, 128, 1, 132))
    gr = sum(lab.panels_in_wave(4096, 4096, 128, 128, 8, 132))
    assert (rm, gr) == (37, 25), (
        f"first wave of 132 programs over a 32 x 32 tile grid: row-major reads 5 A + 32 B = 37 panels, GROUP_M=8 "
        f"reads 8 A + 17 B = 25; got {rm} and {gr}"
    )


@pytest.mark.triton
def test_matches_torch_on_whole_tiles():
    a, b = _rand(32, 32, seed=1), _rand(32, 32, seed=2)
    c = lab.matmul(a, b)
    err = (c - a @ b).abs().max().item()
    assert err < 1e-4, (
        f"32x32x32 with 16x16x16 tiles (4 programs, 2 K steps) differs from torch.matmul by {err:.2e}: "
        f"accumulate tl.dot over every K step, and address BOTH the A tile and the B tile at the current K offset"
    )


@pytest.mark.triton
def test_ragged_edges_are_masked():
    a, b = _rand(37, 19, seed=3), _rand(19, 23, seed=4)   # M=37, K=19, N=23: partial tiles in M, N and K
    c = lab.matmul(a, b)
    err = (c - a @ b).abs().max().item()
    assert err < 1e-4, (
        f"37x19 @ 19x23 differs from torch.matmul by {err:.2e}: mask the loads (rows < M, k < K left, cols < N, "
        f"other=0) and the store (rows < M, cols < N); the last K step is partial and must still run"
    )


@pytest.mark.triton
def test_transposed_weight_uses_strides():
    x, w = _rand(16, 32, seed=5), _rand(24, 32, seed=6)   # a linear layer computes x @ W.T
    c = lab.matmul(x, w.T)
    err = (c - x @ w.T).abs().max().item()
    assert err < 1e-4, (
        f"x @ W.T with W.T a strided view (strides {w.T.stride()}) differs by {err:.2e}: address B with "
        f"stride_bk and stride_bn, never assume it is contiguous"
    )


@pytest.mark.triton
def test_group_size_does_not_change_the_result():
    a, b = _rand(32, 16, seed=7), _rand(16, 48, seed=8)   # 2 x 3 tiles
    c1, c3 = lab.matmul(a, b, group_m=1), lab.matmul(a, b, group_m=3)
    assert torch.equal(c1, c3), "GROUP_M only reorders the programs: the result must be bit-identical"
    assert (c1 - a @ b).abs().max().item() < 1e-4, "and both must equal torch.matmul"


@pytest.mark.triton
def test_every_operand_strided_non_square_tiles():
    # A: a column slice of a transposed buffer (neither stride is 1); B: a column slice of a wider matrix;
    # non-square 32 x 16 tiles with BLOCK_K 16 (so the grid is cdiv(M, 32) * cdiv(N, 16) programs)
    a = _rand(40, 70, seed=11).T[:, 5:25]            # (70, 20), strides (1, 70): 3 x 3 tiles of 32 x 16
    b = _rand(20, 50, seed=12)[:, 7:40]              # (20, 33), strides (50, 1)
    c = lab.matmul(a, b, block_m=32, block_n=16, block_k=16, group_m=2)
    err = (c - a @ b).abs().max().item()
    assert err < 1e-4, (
        f"A (strides {a.stride()}) @ B (strides {b.stride()}) with 32 x 16 tiles differs by {err:.2e}: address A "
        f"through stride_am/stride_ak and B through stride_bk/stride_bn, and size the grid as "
        f"cdiv(M, BLOCK_M) * cdiv(N, BLOCK_N) — BLOCK_M and BLOCK_N need not be equal"
    )



@pytest.mark.triton
def test_nothing_past_k_is_read_even_when_it_is_nan():
    # A and B are K = 19 slices of buffers whose memory past the slice holds NaN: a tile load not
    # masked in K reads it, and NaN * 0 (the other operand's masked zero) is still NaN
    a_buf = torch.full((37, 32), float("nan"))
    a_buf[:, :19] = _rand(37, 19, seed=21)
    b_buf = torch.full((32, 23), float("nan"))
    b_buf[:19] = _rand(19, 23, seed=22)
    a, b = a_buf[:, :19], b_buf[:19]
    c = lab.matmul(a, b)
    bad = int(torch.isnan(c).sum())
    assert bad == 0 and (c - a @ b).abs().max().item() < 1e-4, (
        f"{bad} NaN outputs for a (37 x 19, row stride {a.stride(0)}) @ b (19 x 23): a load read past K, where "
        "the buffer holds NaN; mask BOTH tiles with k < K (A: rows and k, B: k and cols), not only B's"
    )

def _huge_fp16(n):
    """n fp16 elements; on CPU an untouched anonymous mapping, so only the pages written cost memory."""
    if torch.cuda.is_available():
        return torch.zeros(n, dtype=torch.float16, device="cuda"), None
    import mmap
    flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | getattr(mmap, "MAP_NORESERVE", 0)
    mm = mmap.mmap(-1, 2 * n, flags=flags)
    return torch.frombuffer(mm, dtype=torch.float16, count=n), mm


@pytest.mark.triton
def test_offsets_past_2_pow_31_elements():
    # A starts 2**31 elements into a buffer and its row 2 sits 2 * (2**30 + 8) = 2**31 + 16 elements past A's
    # start: in int32 that offset wraps to -2**31 + 16, the buffer's first (all-zero) row. The 8 GiB buffer is
    # virtual on CPU: only the pages holding A's three rows are ever touched.
    stride = (1 << 30) + 8
    big, keep = _huge_fp16((1 << 31) + 2 * stride + 16)
    a = torch.as_strided(big, (3, 16), (stride, 1), 1 << 31)
    for r in range(3):
        a[r] = _rand(16, seed=20 + r, dtype=torch.float16).to(a.device)
    b = _rand(16, 16, seed=13, dtype=torch.float16).to(a.device)
    c = lab.matmul(a, b, out_dtype=torch.float32)
    want = a.float() @ b.float()
    err = (c - want).abs().max().item()
    del a, big, keep
    assert err < 1e-2, (
        f"A's row 2 starts 2**31 + 16 elements past A and C differs from torch by {err:.2e}: rows * stride_am overflowed "
        f"int32. Compute the row, column and K offsets in int64 (e.g. rows = (...).to(tl.int64)); real "
        f"activations and weights pass 2**31 elements"
    )


@pytest.mark.gpu
@pytest.mark.triton
def test_full_shape_bf16_matches_torch_gpu():
    for (M, K, N) in [(4096, 4096, 4096), (4095, 1000, 4097)]:
        a, b = _rand(M, K, seed=9, dtype=torch.bfloat16, device="cuda"), _rand(K, N, seed=10, dtype=torch.bfloat16, device="cuda")
        ref = (a.float() @ b.float())
        ran = 0
        for cfg in lab.GPU_CONFIGS[:3]:
            bm, bn, bk, gm, nw, ns = cfg
            try:
                c = lab.matmul(a, b, bm, bn, bk, gm, nw, ns).float()
            except Exception as exc:          # a config can need more shared memory than this GPU has
                if "OutOfResources" in type(exc).__name__:
                    continue
                raise
            ran += 1
            rel = ((c - ref).abs().max() / ref.abs().max()).item()
            assert rel < 1e-2, (
                f"{M}x{K}x{N} bf16 with config {cfg}: max error {rel:.2e} of the largest output (bf16 output, fp32 "
                f"accumulation); check the masks of the partial tiles in M, N and K"
            )
        assert ran, "none of the first three GPU_CONFIGS fits this GPU's shared memory: add a smaller one"


@pytest.mark.triton
def test_fp16_partials_accumulate_in_fp32():
    # fp16 A (16 x 32) @ B (32 x 16) with BLOCK_K = 16: two K steps whose partial dots for row 0 are 2049 and -2048.
    # 2049 is not an fp16 number (spacing 2 above 2048): an fp32 accumulator gives C[0] = 1 exactly, while a
    # partial rounded to fp16 before it is added becomes 2048 and C[0] = 0. Only the final store is fp16.
    a = torch.zeros((16, 32), dtype=torch.float16)
    a[0, 0], a[0, 1], a[0, 16] = 2047.0, 2.0, 2048.0
    b = torch.ones((32, 16), dtype=torch.float16)
    b[16:] = -1.0
    c = lab.matmul(a, b, block_m=16, block_n=16, block_k=16)
    assert c.dtype == torch.float16, f"C takes A's dtype (float16) by default, got {c.dtype}"
    got = c.float()[0].unique().tolist()
    assert got == [1.0] and not c[1:].any(), (
        f"row 0 of C should be 2049 - 2048 = 1 in every column, got {got}: pass the accumulator to tl.dot "
        f"(acc = tl.dot(a, b, acc)) or add its float32 result unrounded; cast to C's dtype only when storing"
    )
