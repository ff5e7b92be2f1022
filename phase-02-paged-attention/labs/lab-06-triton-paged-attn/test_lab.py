from course.harness import load_lab

lab = load_lab(__file__)   # solution.py by default; LAB_IMPL=starter grades starter.py

import math

import pytest
import torch


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
