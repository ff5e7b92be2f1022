import numpy as np
import pytest
from hypothesis import Phase, given, settings
from hypothesis import strategies as st

from course.runtime import lab_module, use_lab

lab = lab_module(__file__)   # solution.py by default; LAB_IMPL=starter grades starter.py


torch = pytest.importorskip("torch")

LAB04 = use_lab("phase-04/lab-03-flash-decoding-partitions")

# Tiny interpreter shapes: 2 sequences (5 and 13 tokens, ragged), 4 query heads in 2 GQA groups of 2
# (query heads 0, 1 read KV head 0; heads 2, 3 read KV head 1), head_dim 16, block_size 4, tiles of
# 8 tokens (so a tile spans two pages).
B, H, H_KV, D, BLOCK, NUM_BLOCKS, TILE = 2, 4, 2, 16, 4, 10, 8
GROUP = H // H_KV
SEQ_LENS = [5, 13]


@pytest.fixture(scope="module")
def tiny():
    g = torch.Generator().manual_seed(0)
    tables = torch.stack([torch.randperm(NUM_BLOCKS, generator=g)[:4] for _ in range(B)]).to(torch.int32)
    q = torch.randn(B, H, D, generator=g)
    k = torch.randn(NUM_BLOCKS, BLOCK, H_KV, D, generator=g)
    v = torch.randn(NUM_BLOCKS, BLOCK, H_KV, D, generator=g)
    return q, k, v, tables, torch.tensor(SEQ_LENS, dtype=torch.int32)


def _keys(k, v, tables, b, n, kv_head):
    tok = np.arange(n)
    pages = tables[b].numpy()[tok // BLOCK]
    return (k.numpy()[pages, tok % BLOCK, kv_head].astype(np.float64),
            v.numpy()[pages, tok % BLOCK, kv_head].astype(np.float64))


def _reference(q, k, v, tables):
    """Dense float64 attention per (sequence, head), via lab 03's reference summaries."""
    out = np.zeros((B, H, D))
    for b, n in enumerate(SEQ_LENS):
        for h in range(H):
            K, V = _keys(k, v, tables, b, n, h // GROUP)
            out[b, h] = LAB04.merge_partials([LAB04.attend_partial(q[b, h].double().numpy(), K, V)])
    return out


@pytest.fixture(scope="module")
def partials_s3(tiny):
    q, k, v, tables, seq_lens = tiny
    return lab.split_kv_partials(q, k, v, tables, seq_lens, 3, tile=TILE)


@pytest.mark.triton
def test_split_kernel_writes_unnormalised_summaries(tiny, partials_s3):
    q, k, v, tables, _ = tiny
    part_m, part_l, part_acc = (t.double().numpy() for t in partials_s3)
    for b, n in enumerate(SEQ_LENS):
        for s, (lo, hi) in enumerate(lab.split_bounds(n, 3)):
            for h in range(H):
                K, V = _keys(k, v, tables, b, n, h // GROUP)
                want = LAB04.attend_partial(q[b, h].double().numpy(), K[lo:hi], V[lo:hi])
                where = f"sequence {b} (len {n}), query head {h} (KV head {h // GROUP}), split {s} = tokens [{lo}, {hi})"
                assert abs(part_m[b, h, s] - want.m) < 1e-5, (
                    f"{where}: m should be the max scaled score {want.m:.5f}, got {part_m[b, h, s]:.5f}. "
                    f"Scale q·k by 1/sqrt(D), mask tokens >= the split's end with -inf, and read KV head "
                    f"h // GROUP (consecutive query heads share a KV head)"
                )
                assert abs(part_l[b, h, s] - want.denom) < 1e-4 * max(1.0, want.denom), (
                    f"{where}: l should be sum(exp(s - m)) = {want.denom:.5f}, got {part_l[b, h, s]:.5f}"
                )
                assert np.max(np.abs(part_acc[b, h, s] - want.acc)) < 1e-4, (
                    f"{where}: acc must be the UNnormalised sum of exp(s - m)·v (do not divide by l in kernel 1)"
                )


@pytest.mark.triton
def test_merge_kernel_matches_dense(tiny, partials_s3):
    q, k, v, tables, _ = tiny
    out = lab.merge_partials_triton(*partials_s3).double().numpy()
    err = np.max(np.abs(out - _reference(q, k, v, tables)))
    assert err < 1e-5, (
        f"merging 3 splits differs from dense attention by {err:.2e}: weight split i by exp(m_i - max_j m_j) "
        f"in both the numerator (acc) and the denominator (l), and divide once at the end"
    )


@pytest.mark.triton
def test_split_count_does_not_change_the_answer(tiny):
    q, k, v, tables, seq_lens = tiny
    want = _reference(q, k, v, tables)
    for s in (1, 4):   # S=4 over 5 tokens: splits [0,2) [2,4) [4,5) and an empty [5,5)
        out = lab.flash_decode(q, k, v, tables, seq_lens, s, tile=TILE).double().numpy()
        assert np.all(np.isfinite(out)), (
            f"S={s}: NaN/inf in the output. An empty split must store m=-inf, l=0, acc=0, and the merge "
            f"must give it weight 0"
        )
        err = np.max(np.abs(out - want))
        assert err < 1e-5, f"S={s}: output differs from dense by {err:.2e}"


def test_choose_num_splits():
    cases = [((1, 32, 32768, 132), 8, "1x32 programs is a quarter of 132 SMs: double S until B*H*S >= 132"),
             ((4, 32, 32768, 132), 2, "4x32 = 128 < 132, one doubling fills the GPU"),
             ((64, 32, 4096, 132), 1, "a big batch already fills every SM: splitting only adds merge traffic"),
             ((1, 32, 256, 132), 1, "256 tokens cannot be cut into halves of >= 256 tokens"),
             ((1, 1, 1 << 20, 1024), 64, "never more than max_splits = 64"),
             ((1, 32, 32768, 128), 4, "1x32x4 = 128 programs exactly fill 128 SMs: stop once B*H*S is no longer < SMs"),
             ((1, 32, 512, 132), 2, "512 tokens halve into exactly 256 each: a split of exactly 256 tokens is allowed")]
    for args, want, why in cases:
        got = lab.choose_num_splits(*args)
        assert got == want, f"choose_num_splits{args} should be {want} ({why}), got {got}"
    got = lab.choose_num_splits(1, 32, 32768, 132, min_tokens_per_split=8192)
    assert got == 4, f"with min_tokens_per_split=8192, 32768 tokens stop at 4 splits of 8192, got {got}"
    got = lab.choose_num_splits(1, 1, 1 << 20, 1024, max_splits=4)
    assert got == 4, f"max_splits=4 caps S at 4 (read the argument, not a fixed 64), got {got}"


# --- full shapes on a CUDA GPU ---------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.triton
def test_full_shape_fp16_matches_reference_gpu():
    g = torch.Generator(device="cuda").manual_seed(0)
    Bf, Hf, Hkv, Df, block, nblocks = 4, 32, 8, 128, 16, 4096
    seq = torch.tensor([8192, 3001, 17, 16384], dtype=torch.int32, device="cuda")
    tables = torch.randperm(nblocks, device="cuda", generator=g)[: 4 * 1024].view(4, 1024).to(torch.int32)
    q = torch.randn(Bf, Hf, Df, device="cuda", dtype=torch.float16, generator=g)
    k = torch.randn(nblocks, block, Hkv, Df, device="cuda", dtype=torch.float16, generator=g)
    v = torch.randn(nblocks, block, Hkv, Df, device="cuda", dtype=torch.float16, generator=g)
    ref = lab.reference_decode(q, k, v, tables, seq).float()
    for s in (1, 8, 32):
        out = lab.flash_decode(q, k, v, tables, seq, s).float()
        err = (out - ref).abs().max().item()
        assert err < 1e-2, f"S={s} on full shapes (fp16, fp32 accumulators): max |diff| {err:.2e} > 1e-2"


def _dense_np(q, K, V):
    s = K @ q / np.sqrt(q.shape[-1])
    w = np.exp(s - s.max())
    return (w / w.sum()) @ V


@pytest.mark.triton
def test_distinct_strides_for_every_operand():
    # q: every other head of a wider tensor; K: NHD contiguous; V: stored HND and viewed as NHD;
    # block tables: a column slice of a wider table; block_size 3 and tiles of 4 tokens (ragged pages)
    g = torch.Generator().manual_seed(1)
    block, nblocks, seq = 3, 9, [7, 11]
    q = torch.randn(B, 2 * H, D, generator=g)[:, ::2]
    k = torch.randn(nblocks, block, H_KV, D, generator=g)
    v = torch.randn(nblocks, H_KV, block, D, generator=g).permute(0, 2, 1, 3)
    wide = torch.stack([torch.randperm(nblocks, generator=g)[:6] for _ in range(B)]).to(torch.int32)
    tables = wide[:, 1:5]
    assert v.stride(1) != k.stride(1) and tables.stride(0) != tables.shape[1] and q.stride(1) != D
    out = lab.flash_decode(q, k, v, tables, torch.tensor(seq, dtype=torch.int32), 2, tile=4).double().numpy()
    for b, n in enumerate(seq):
        tok = np.arange(n)
        pages = tables[b].numpy()[tok // block]
        for h in range(H):
            K = k.numpy()[pages, tok % block, h // GROUP].astype(np.float64)
            V = v.numpy()[pages, tok % block, h // GROUP].astype(np.float64)
            want = _dense_np(q[b, h].double().numpy(), K, V)
            err = np.max(np.abs(out[b, h] - want))
            assert err < 1e-5, (
                f"sequence {b}, head {h}: differs from dense by {err:.2e} when q, K, V and the block table "
                f"each have their own strides (V stored head-major, the table a column slice, q every other "
                f"head). Pass and use each tensor's own .stride(): V's strides are not K's, a table row is "
                f"stride(0) apart (not shape[1]), and q's heads are stride(1) apart"
            )


@pytest.mark.triton
def test_all_scores_far_below_zero(tiny):
    # every score is about -200: exp(-200) is 0 in float32, so only m = -inf as the start survives
    q, k, v, tables, seq_lens = tiny
    k2, q2 = k.clone(), q.clone()
    k2[..., 0] = 1.0
    q2[..., 0] = -200.0 * D ** 0.5
    want = np.zeros((B, H, D))
    for b, n in enumerate(SEQ_LENS):
        for h in range(H):
            K, V = _keys(k2, v, tables, b, n, h // GROUP)
            want[b, h] = _dense_np(q2[b, h].double().numpy(), K, V)
    for s in (3,):                          # S=3: the merge kernel pads the splits to 4 lanes
        out = lab.flash_decode(q2, k2, v, tables, seq_lens, s, tile=TILE).double().numpy()
        assert np.all(np.isfinite(out)), (
            f"S={s}, every score near -200: NaN. exp(-200) underflows to 0 in float32, so any max that "
            f"starts at 0 (kernel 1's running max, or the merge's padding lanes loaded with other=0) "
            f"zeroes every weight; use -inf for both"
        )
        assert np.max(np.abs(out - want)) < 1e-4, f"S={s}: scores near -200 differ from dense"


def _huge_int8(n):
    """n int8 elements; on CPU an untouched anonymous mapping, so only the pages written cost memory."""
    if torch.cuda.is_available():
        return torch.zeros(n, dtype=torch.int8, device="cuda"), None
    import mmap
    flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | getattr(mmap, "MAP_NORESERVE", 0)
    mm = mmap.mmap(-1, n, flags=flags)
    return torch.frombuffer(mm, dtype=torch.int8, count=n), mm


@pytest.mark.triton
def test_offsets_past_2_pow_31_elements():
    # Page 4 of these K and V caches starts at element 4 * 2**30 = 2**32: an int32 offset wraps to 0 and reads
    # page 0 instead. Only two 4 KiB pages of each 4 GiB mapping are ever touched.
    stride = 1 << 30
    big, keep = _huge_int8(4 * stride + BLOCK * D)
    big_v, keep_v = _huge_int8(4 * stride + BLOCK * D)       # V laid out like K, so only the offset width matters
    k = torch.as_strided(big, (5, BLOCK, 1, D), (stride, D, D, 1))
    v = torch.as_strided(big_v, (5, BLOCK, 1, D), (stride, D, D, 1))
    g = torch.Generator().manual_seed(2)
    for cache in (k, v):
        cache[4] = torch.randint(-3, 4, (BLOCK, 1, D), generator=g, dtype=torch.int8).to(k.device)
        cache[0] = torch.randint(-3, 4, (BLOCK, 1, D), generator=g, dtype=torch.int8).to(k.device)
    q = torch.randn(1, 1, D, generator=g).to(k.device)
    tables = torch.tensor([[4]], dtype=torch.int32, device=k.device)
    out = lab.flash_decode(q, k, v, tables, torch.tensor([3], dtype=torch.int32, device=k.device), 1, tile=4)
    want = _dense_np(q[0, 0].double().cpu().numpy(), k[4, :3, 0].double().cpu().numpy(),
                     v[4, :3, 0].double().cpu().numpy())
    err = np.max(np.abs(out[0, 0].double().cpu().numpy() - want))
    del k, v, big, keep, big_v, keep_v
    assert err < 1e-5, (
        f"K page 4 starts at element 2**32 and the output is off by {err:.2e}: the row offset "
        f"page * stride overflowed int32. Cast the page id to int64 (tl.load(...).to(tl.int64)) before "
        f"multiplying by the stride; real KV caches are larger than 2**31 elements"
    )




@pytest.mark.triton
@settings(max_examples=15, deadline=None, derandomize=True, phases=(Phase.explicit, Phase.generate))  # no shrinking:
@given(ms=st.lists(st.one_of(st.just(-np.inf), st.floats(-60.0, 60.0)), min_size=1, max_size=9),   # each try is a
       shift=st.sampled_from([-2000.0, 0.0, 2000.0]), seed=st.integers(0, 2**16))                   # kernel launch
def test_property_merge_kernel_matches_float64(ms, shift, seed):
    # S summaries whose maxima lie up to 120 apart (exp underflows in float32 past ~104), all shifted far below
    # or above 0, some -inf (an empty split): kernel 2 must equal a float64 merge
    if all(m == -np.inf for m in ms):
        ms = [*ms[:-1], 0.0]                      # at least one split holds a token
    rng = np.random.default_rng(seed)
    S = len(ms)
    m = np.array(ms, dtype=np.float32) + np.float32(shift)
    live = m > -np.inf
    l = np.where(live, rng.uniform(1.0, 5.0, S), 0.0).astype(np.float32)
    acc = (rng.standard_normal((S, D)) * l[:, None]).astype(np.float32)
    top = m[live].max()
    w = np.where(live, np.exp(m.astype(np.float64) - top), 0.0)
    want = (w[:, None] * acc).sum(0) / (w * l).sum()
    got = lab.merge_partials_triton(torch.from_numpy(m).view(1, 1, S), torch.from_numpy(l).view(1, 1, S),
                                    torch.from_numpy(acc).view(1, 1, S, D))[0, 0].double().numpy()
    assert np.all(np.isfinite(got)) and np.max(np.abs(got - want)) < 1e-4 * max(1.0, np.abs(want).max()), (
        f"merging {S} splits with maxima {np.round(m, 1).tolist()}: {got[:3]} vs float64 {want[:3]}. Weight split i "
        f"by exp(m_i - max m) (0 for m_i = -inf), pad the lanes past S with m = -inf, l = 0, and divide once"
    )
