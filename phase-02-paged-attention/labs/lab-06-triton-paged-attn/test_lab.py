import math
import os

import numpy as np
import pytest
import torch

from course.runtime import lab_module

lab = lab_module(__file__)   # solution.py by default; LAB_IMPL=starter grades starter.py


def dense_oracle(q, k_cache, v_cache, block_tables, seq_lens):
    """Independent check: copy each sequence's K/V out contiguously (slot formula), then plain
    softmax attention in float64."""
    num_seqs, hq, d = q.shape
    bs, hkv = k_cache.shape[1], k_cache.shape[2]
    out = torch.empty(num_seqs, hq, d, dtype=torch.float64)
    for s in range(num_seqs):
        n = int(seq_lens[s])
        t = torch.arange(n)
        phys = block_tables[s].long()[t // bs]
        k = k_cache[phys, t % bs].double()                      # [n, hkv, d]
        v = v_cache[phys, t % bs].double()
        for h in range(hq):
            kv = h // (hq // hkv)
            p = torch.softmax(k[:, kv] @ q[s, h].double() / math.sqrt(d), dim=0)
            out[s, h] = p @ v[:, kv]
    return out


def poison_tails(k_cache, v_cache, block_tables, seq_lens, value=1e4):
    bs = k_cache.shape[1]
    for s, n in enumerate(seq_lens.tolist()):
        nb = -(-n // bs)
        last = int(block_tables[s, nb - 1])
        valid = n - (nb - 1) * bs
        k_cache[last, valid:] = value
        v_cache[last, valid:] = value


def test_torch_reference_matches_dense():
    q, kc, vc, bt, sl = lab.make_problem(3, 4, 2, 8, 4, [1, 6, 13], num_blocks=16, seed=1)
    got = lab.paged_attention_torch(q, kc, vc, bt, sl)
    err = (got.double() - dense_oracle(q, kc, vc, bt, sl)).abs().max().item()
    assert err < 1e-5, (
        f"paged_attention_torch differs from dense attention by {err:.2e}: walk ceil(seq_len / block_size) "
        f"logical blocks, take only the valid rows of the last one, and map query head h to KV head h // group")


def test_torch_reference_computes_in_fp32_for_an_fp16_cache():
    # The reference is the oracle you debug the kernel against, so it softmaxes in fp32 whatever the
    # cache dtype: its fp16 output is then the exact answer rounded once. Computed in fp16 instead,
    # a third of the outputs land an ulp or more away.
    problem = lab.make_problem(3, 4, 2, 16, 4, [5, 14, 33], num_blocks=24, dtype=torch.float16, seed=5)
    q, kc, vc, bt, sl = problem
    q = (q.float() * 4).half()  # sharper scores: fp16 rounding shows
    got = lab.paged_attention_torch(q, kc, vc, bt, sl)
    assert got.dtype == torch.float16, f"the reference returns q's dtype (float16), got {got.dtype}"
    exact = dense_oracle(q, kc, vc, bt, sl).half()
    off = (got != exact).float().mean().item()
    assert off <= 0.02, (
        f"{off:.0%} of the fp16 reference's outputs differ from the float64 answer rounded to fp16 (allowed: 2%): "
        f"cast K, V and q to float32 before the scores and the softmax, and cast back only at the end"
    )


@pytest.mark.triton
def test_kernel_ignores_nan_and_inf_in_the_padding_rows():
    # 1e4 in the padding is hidden by a -inf score mask alone (weight exactly 0). NaN and inf are not:
    # p * V = 0 * NaN is NaN. Only the load mask (other=0) keeps them out of the accumulator.
    for poison in (float("nan"), float("inf")):
        q, kc, vc, bt, sl = lab.make_problem(2, 2, 2, 8, 8, [3, 11], num_blocks=8, seed=3)
        poison_tails(kc, vc, bt, sl, value=poison)
        got = lab.paged_decode_attention(q, kc, vc, bt, sl)
        err = (got.double() - dense_oracle(q, kc, vc, bt, sl)).abs().max().item()
        assert torch.isfinite(got).all() and err < 1e-4, (
            f"padding rows past seq_len hold {poison}: the output has "
            f"{int((~torch.isfinite(got)).sum())} non-finite values (max|diff| {err:.2e}); mask the K and V "
            f"loads with i * BLOCK_SIZE + t < seq_len (other=0), not only the scores"
        )


@pytest.mark.triton
def test_kernel_matches_dense_reference():
    q, kc, vc, bt, sl = lab.make_problem(3, 4, 2, 16, 4, [1, 7, 10], num_blocks=16, seed=2)
    got = lab.paged_decode_attention(q, kc, vc, bt, sl)
    assert got.shape == q.shape, f"output must have q's shape {tuple(q.shape)}, got {tuple(got.shape)}"
    err = (got.double() - dense_oracle(q, kc, vc, bt, sl)).abs().max().item()
    assert err < 1e-5, (
        f"Triton kernel differs from dense attention by {err:.2e} (fp32): check the block-table load "
        f"(physical = block_tables[seq, i]) and the online-softmax rescaling acc * alpha")


@pytest.mark.triton
def test_kernel_masks_the_partial_tail_block():
    q, kc, vc, bt, sl = lab.make_problem(2, 2, 2, 8, 8, [3, 11], num_blocks=8, seed=3)
    poison_tails(kc, vc, bt, sl)
    got = lab.paged_decode_attention(q, kc, vc, bt, sl)
    err = (got.double() - dense_oracle(q, kc, vc, bt, sl)).abs().max().item()
    assert err < 1e-4, (
        f"rows past seq_len in the last block (filled with 1e4) leaked into the result (max|diff| {err:.2e}): "
        f"mask tokens with i * BLOCK_SIZE + t < seq_len in the load AND set their scores to -inf")


@pytest.mark.triton
def test_kernel_handles_gqa_groups_and_odd_head_dim():
    hq, hkv, d = 6, 2, 12                       # group of 3 and head_dim 12: both need padding + masks
    q, kc, vc, bt, sl = lab.make_problem(1, hq, hkv, d, 4, [9], num_blocks=8, seed=4)
    got = lab.paged_decode_attention(q, kc, vc, bt, sl)
    err = (got.double() - dense_oracle(q, kc, vc, bt, sl)).abs().max().item()
    assert err < 1e-5, (
        f"{hq} query heads over {hkv} KV heads, head_dim {d}: max|diff| {err:.2e}; pad the group and head_dim "
        f"to powers of two with masks, and query head h reads KV head h // (hq // hkv)")


@pytest.mark.triton
def test_kernel_fp16_cache_within_gate():
    q, kc, vc, bt, sl = lab.make_problem(1, 4, 2, 16, 4, [14], num_blocks=8, dtype=torch.float16, seed=5)
    got = lab.paged_decode_attention(q, kc, vc, bt, sl)
    assert got.dtype == torch.float16, "the output keeps the input dtype"
    err = (got.double() - dense_oracle(q, kc, vc, bt, sl)).abs().max().item()
    assert err <= 1e-2, (
        f"fp16 inputs: max|diff| {err:.2e} exceeds the 1e-2 gate; accumulate m, l and acc in fp32")




@pytest.mark.triton
def test_kernel_scores_far_below_zero():
    # K points away from q: every score is around -300, where exp() underflows to 0 in fp32.
    q, kc, vc, bt, sl = lab.make_problem(1, 2, 1, 8, 4, [7], num_blocks=4, seed=9)
    q = q.abs() + 0.5
    kc = kc * 0.1 - 100.0
    scores = (kc.reshape(-1, 8) @ q[0, 0]) / math.sqrt(8)
    assert scores.max() < -200, "sanity: every score is far below zero"
    got = lab.paged_decode_attention(q, kc, vc, bt, sl)
    assert torch.isfinite(got).all(), (
        "scores all far below zero gave NaN/inf: the running max must start at -inf (not 0), so the "
        "first block sets it and exp(s - m) never underflows to an all-zero sum")
    err = (got.double() - dense_oracle(q, kc, vc, bt, sl)).abs().max().item()
    assert err < 1e-4, f"with scores around -300 the kernel must still match dense attention; max|diff| {err:.2e}"

@pytest.mark.triton
def test_kernel_reads_k_and_v_with_different_layouts():
    # Every operand laid out differently: q a transposed view, K a slice of KV heads 1..2 out of a
    # 4-head buffer, V stored [block, kv_head, token, dim] (4 heads) and permuted back, the block
    # table a column slice of a wider table. Values are those of a plain contiguous problem. Both
    # cache buffers hold 1024 elements, so even reading V with K's strides stays in bounds.
    q, kc, vc, bt, sl = lab.make_problem(2, 4, 2, 8, 4, [6, 3], num_blocks=8, seed=7)
    q_view = q.transpose(0, 1).contiguous().transpose(0, 1)                   # strides (8, 16, 1)
    k_wide = torch.zeros(8, 4, 4, 8)
    k_wide[:, :, 1:3] = kc
    k_view = k_wide[:, :, 1:3]                                                # strides (128, 32, 8, 1)
    v_wide = torch.zeros(8, 4, 4, 8)
    v_wide[:, 0:2] = vc.permute(0, 2, 1, 3)
    v_view = v_wide[:, 0:2].permute(0, 2, 1, 3)                               # strides (128, 8, 32, 1)
    bt_wide = torch.full((2, 5), 7, dtype=torch.int32)
    bt_wide[:, 1:1 + bt.shape[1]] = bt
    bt_view = bt_wide[:, 1:1 + bt.shape[1]]
    assert k_view.stride() != v_view.stride() != kc.stride(), "sanity: the three cache layouts differ"
    got = lab.paged_decode_attention(q_view, k_view, v_view, bt_view, sl)
    err = (got.double() - dense_oracle(q, kc, vc, bt, sl)).abs().max().item()
    assert err < 1e-5, (
        f"with q, K, V and the block table each in its own layout the kernel is off by {err:.2e}: pass and use "
        f"V's own strides (stride_vb, stride_vt, stride_vh), never K's, and index every operand through its strides")


@pytest.mark.triton
def test_cache_offsets_are_64_bit(monkeypatch):
    # A real KV cache passes 2^31 elements (16384 blocks x 16 tokens x 8 heads x 128 dims), where an
    # int32 `physical * stride_kb` wraps. Allocating that is out of the question on CPU, so instead
    # watch the interpreter's pointer arithmetic: the offset added to the K and V base pointers
    # must already be int64.
    from triton.runtime import interpreter

    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("needs Triton's interpreter (TRITON_INTERPRET=1) to watch pointer arithmetic; "
                    "on a GPU, test_full_shape_on_gpu covers the 64-bit offsets")
    q, kc, vc, bt, sl = lab.make_problem(1, 2, 1, 4, 4, [5], num_blocks=4, seed=8)
    bases = {kc.data_ptr(): "k_cache", vc.data_ptr(): "v_cache"}
    seen = {}
    real = interpreter.interpreter_builder.create_addptr

    def spy(ptr, offset):
        base = np.unique(ptr.data)
        if base.size == 1 and int(base[0]) in bases:
            seen.setdefault(bases[int(base[0])], set()).add(str(offset.data.dtype))
        return real(ptr, offset)

    monkeypatch.setattr(interpreter.interpreter_builder, "create_addptr", spy)
    lab.paged_decode_attention(q, kc, vc, bt, sl)
    assert set(seen) == {"k_cache", "v_cache"}, f"sanity: expected offsets added to both caches, saw {seen}"
    for name, dtypes in seen.items():
        assert dtypes == {"int64"}, (
            f"offsets into {name} were computed as {sorted(dtypes)}: cast the physical block id to int64 "
            f"BEFORE multiplying by the block stride, or caches past 2^31 elements read the wrong block")

@pytest.mark.gpu
@pytest.mark.triton
def test_full_shape_on_gpu():
    lens = [2048, 1999, 1024, 17, 1, 513, 777, 1500]
    q, kc, vc, bt, sl = lab.make_problem(8, 32, 8, 128, 16, lens, num_blocks=1024, dtype=torch.float16,
                                         device="cuda", seed=6)
    got = lab.paged_decode_attention(q, kc, vc, bt, sl)
    torch.cuda.synchronize()
    ref = dense_oracle(*(x.cpu() for x in (q, kc, vc, bt, sl)))     # independent float64 oracle
    err = (got.cpu().double() - ref).abs().max().item()
    assert err <= 1e-2, (
        f"Llama-3-8B-shaped decode on GPU (fp16): max|diff| {err:.2e} > 1e-2 against dense float64 "
        f"attention; check the 64-bit block offset (physical * stride_kb) and fp32 accumulation")
