from course.harness import load_lab

lab = load_lab(__file__)   # solution.py by default; LAB_IMPL=starter grades starter.py

from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

LAB04 = load_lab(Path(__file__).resolve().parent.parent / "lab-03-flash-decoding-partitions" / "test_lab.py",
                 impl="solution")

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
             ((1, 1, 1 << 20, 1024), 64, "never more than max_splits = 64")]
    for args, want, why in cases:
        got = lab.choose_num_splits(*args)
        assert got == want, f"choose_num_splits{args} should be {want} ({why}), got {got}"


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
