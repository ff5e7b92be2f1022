"""Lab 02.06 — a paged decode-attention kernel in Triton, GQA-aware (your version).

Write paged_attention_torch first (the slow, obvious reference), then the body of
_paged_decode_kernel; the launcher paged_decode_attention and make_problem are provided.
Grade with:  LAB_IMPL=starter pytest phase-02-paged-attention/labs/lab-06-triton-paged-attn -q
(on CPU the kernel runs in Triton's interpreter; on a GPU it is compiled).

One decode step for a batch of sequences: each sequence has ONE new query token per query head
and reads its past K/V through a block table.

    q            [num_seqs, num_q_heads, head_dim]
    k_cache      [num_blocks, block_size, num_kv_heads, head_dim]   (v_cache: same shape, own strides)
    block_tables [num_seqs, max_blocks_per_seq] int32   logical block -> physical block
    seq_lens     [num_seqs] int32                        valid tokens per sequence
    out          [num_seqs, num_q_heads, head_dim] = softmax(q K^T / sqrt(d)) V, per head

Token t of a sequence sits in physical block block_tables[s, t // block_size], row t % block_size.

The kernel runs one program per (sequence, KV head). That program loads each K/V tile ONCE and uses
it for every query head of its group (num_q_heads // num_kv_heads of them): the GQA saving.
It streams over the logical blocks with an online softmax (running max m, running sum l,
accumulator acc, all fp32), so it never materialises the scores or a contiguous copy of K/V.

On a machine without CUDA the course's conftest sets TRITON_INTERPRET=1 and this same kernel runs
on CPU tensors through Triton's interpreter (slowly: keep shapes tiny there).
"""

from __future__ import annotations

import math
import os

import torch

if not torch.cuda.is_available():               # no GPU: run kernels in Triton's CPU interpreter
    os.environ.setdefault("TRITON_INTERPRET", "1")

# triton must be imported after TRITON_INTERPRET is decided
import triton
import triton.language as tl


@triton.jit
def _paged_decode_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr, seq_lens_ptr, out_ptr,
    scale,
    stride_qs, stride_qh,                  # q / out: [seq, head, dim], dim contiguous
    stride_kb, stride_kt, stride_kh,       # k_cache: [block, token, kv_head, dim], dim contiguous
    stride_vb, stride_vt, stride_vh,       # v_cache: same shape, its own strides (layouts may differ)
    stride_bt,                             # block_tables: [seq, logical block]
    QUERIES_PER_KV: tl.constexpr,          # num_q_heads // num_kv_heads
    GROUP: tl.constexpr,                   # QUERIES_PER_KV rounded up to a power of two
    BLOCK_SIZE: tl.constexpr,              # tokens per KV block (the tile size)
    HEAD_DIM: tl.constexpr,
    HEAD_DIM_P2: tl.constexpr,             # HEAD_DIM rounded up to a power of two
):
    raise NotImplementedError(
        '_paged_decode_kernel: this program owns one (sequence, KV head) pair and the GROUP '
        'query heads that read it. Keep the running max, sum and accumulator in fp32 and walk '
        'the logical blocks, reading each physical id from the block table before loading that '
        'block\'s K and V tiles. Rows past seq_len in the last block must be masked twice: in '
        'the loads and in the scores (-inf)')


def paged_decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                           block_tables: torch.Tensor, seq_lens: torch.Tensor) -> torch.Tensor:
    """Launch the kernel over grid (num_seqs, num_kv_heads); returns a tensor shaped like q."""
    num_seqs, num_q_heads, head_dim = q.shape
    _, block_size, num_kv_heads, _ = k_cache.shape
    if num_q_heads % num_kv_heads:
        raise ValueError("num_q_heads must be a multiple of num_kv_heads")
    if block_size & (block_size - 1):
        raise ValueError("block_size must be a power of two (it is the kernel's tile size)")
    q = q.contiguous()
    out = torch.empty_like(q)
    queries_per_kv = num_q_heads // num_kv_heads
    grid = (num_seqs, num_kv_heads)
    _paged_decode_kernel[grid](
        q, k_cache, v_cache, block_tables, seq_lens, out,
        1.0 / math.sqrt(head_dim),
        q.stride(0), q.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        block_tables.stride(0),
        QUERIES_PER_KV=queries_per_kv,
        GROUP=triton.next_power_of_2(queries_per_kv),
        BLOCK_SIZE=block_size,
        HEAD_DIM=head_dim,
        HEAD_DIM_P2=triton.next_power_of_2(head_dim),
    )
    return out


def paged_attention_torch(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                          block_tables: torch.Tensor, seq_lens: torch.Tensor) -> torch.Tensor:
    """Slow, obvious reference: for each sequence, walk its logical blocks, copy the valid rows
    out through the table, then do a plain softmax in fp32. Use it to debug the kernel."""
    raise NotImplementedError(
        'paged_attention_torch: per sequence, copy out exactly seq_len rows of K and V by '
        'walking its logical blocks through block_tables (the last block is partial), then do '
        'ordinary softmax attention in fp32; query head h reads KV head h // group')


def make_problem(num_seqs: int, num_q_heads: int, num_kv_heads: int, head_dim: int, block_size: int,
                 seq_lens: list[int], num_blocks: int, dtype=torch.float32, device="cpu", seed: int = 0):
    """A random paged KV cache and query batch; each sequence gets distinct physical blocks in a
    shuffled order (provided helper)."""
    gen = torch.Generator().manual_seed(seed)
    max_blocks = max(-(-n // block_size) for n in seq_lens)
    need = sum(-(-n // block_size) for n in seq_lens)
    if need > num_blocks:
        raise ValueError(f"{need} blocks needed, pool has {num_blocks}")
    perm = torch.randperm(num_blocks, generator=gen)
    tables = torch.zeros(num_seqs, max_blocks, dtype=torch.int32)
    pos = 0
    for s, n in enumerate(seq_lens):
        nb = -(-n // block_size)
        tables[s, :nb] = perm[pos:pos + nb].to(torch.int32)
        pos += nb
    q = torch.randn(num_seqs, num_q_heads, head_dim, generator=gen)
    k_cache = torch.randn(num_blocks, block_size, num_kv_heads, head_dim, generator=gen)
    v_cache = torch.randn(num_blocks, block_size, num_kv_heads, head_dim, generator=gen)
    lens = torch.tensor(seq_lens, dtype=torch.int32)
    return tuple(x.to(device) if x.dtype == torch.int32 else x.to(device=device, dtype=dtype)
                 for x in (q, k_cache, v_cache, tables, lens))


def main() -> None:
    block_size, seq_len = 16, 130
    q, k_cache, v_cache, tables, lens = make_problem(
        num_seqs=1, num_q_heads=4, num_kv_heads=2, head_dim=16, block_size=block_size,
        seq_lens=[seq_len], num_blocks=96, seed=0)
    ids = tables[0].tolist()
    print(f"seq_len={seq_len} block_size={block_size} -> {len(ids)} logical blocks, physical ids = {ids}")
    print(f"the 9th block holds {seq_len} - 8*{block_size} = {seq_len - 8 * block_size} valid tokens")
    ref = paged_attention_torch(q, k_cache, v_cache, tables, lens)
    got = paged_decode_attention(q, k_cache, v_cache, tables, lens)
    diff = (got - ref).abs().max().item()
    print(f"triton vs torch reference (fp32): max|diff| < 1e-4 -> {diff < 1e-4}")
    print("GQA: 4 query heads share 2 KV heads; grid = (1 sequence, 2 KV heads) = 2 programs")


if __name__ == "__main__":
    main()
