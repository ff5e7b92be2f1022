"""MUTANT: paged_attention maps query head h to KV head h % group instead of h // group.

Lab 02.04 — paged attention in numpy: the write map, the read map, and the proof that paging
changes where the bytes live but not what attention computes (reference solution).

Layout (one layer): k_cache and v_cache are FLAT arrays of shape [num_slots, num_kv_heads, head_dim],
num_slots = num_blocks * block_size. Slot s lives in physical block s // block_size at offset
s % block_size. A request's block_table lists its physical block ids in logical order.

    slot(t) = block_table[t // block_size] * block_size + t % block_size

Upstream analogues: the write is the CUDA op reshape_and_cache (csrc/, not in the wheel); the
slot mapping is built per step by the worker (vllm/v1/worker/block_table.py:141 —
BlockTable.compute_slot_mapping); the read is the paged attention kernel.
"""

from __future__ import annotations

import numpy as np


def build_slot_mapping(block_table: np.ndarray, block_size: int, start: int, num_tokens: int) -> np.ndarray:
    """Flat slot index of each token start .. start+num_tokens-1 (int64, length num_tokens).
    A decode step writes one token at start = seq_len; a prefill chunk writes its whole range."""
    table = np.asarray(block_table, dtype=np.int64)
    t = np.arange(start, start + num_tokens, dtype=np.int64)
    return table[t // block_size] * block_size + t % block_size


def write_kv(k_cache: np.ndarray, v_cache: np.ndarray, new_k: np.ndarray, new_v: np.ndarray,
             slot_mapping: np.ndarray) -> None:
    """Scatter new_k/new_v rows ([n, kv_heads, dim]) into the flat caches at slot_mapping, in place."""
    if len(slot_mapping) != len(new_k) or len(new_k) != len(new_v):
        raise ValueError("one slot per new token: slot_mapping, new_k and new_v must have equal length")
    k_cache[slot_mapping] = new_k
    v_cache[slot_mapping] = new_v


def paged_attention(q: np.ndarray, k_cache: np.ndarray, v_cache: np.ndarray, block_table: np.ndarray,
                    seq_len: int, block_size: int) -> np.ndarray:
    """Decode attention for ONE query token of one sequence, reading K/V through the table.

    q: [num_heads, head_dim]; caches: [num_slots, num_kv_heads, head_dim]. Query head h reads KV head
    h // (num_heads // num_kv_heads) (grouped-query attention; the block table is shared).
    Returns [num_heads, head_dim] = softmax(K q / sqrt(d)) V per head, over exactly seq_len tokens.
    """
    num_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[1]
    if num_heads % num_kv_heads:
        raise ValueError("num_heads must be a multiple of num_kv_heads")
    group = num_heads // num_kv_heads
    slots = build_slot_mapping(block_table, block_size, 0, seq_len)   # exactly seq_len rows
    k = k_cache[slots]                                                 # [seq_len, kv_heads, dim]
    v = v_cache[slots]
    out = np.empty_like(q)
    scale = 1.0 / np.sqrt(head_dim)
    for h in range(num_heads):
        kv = h % group
        scores = k[:, kv, :] @ q[h] * scale
        p = np.exp(scores - scores.max())
        out[h] = (p / p.sum()) @ v[:, kv, :]
    return out


def main() -> None:
    rng = np.random.default_rng(0)
    num_blocks, block_size, heads, kv_heads, dim, seq_len = 16, 16, 4, 2, 8, 35
    k_cache = np.zeros((num_blocks * block_size, kv_heads, dim))
    v_cache = np.zeros_like(k_cache)
    table = rng.permutation(np.arange(1, num_blocks))[:3]            # 3 logical blocks, scattered
    print(f"seq_len={seq_len} block_size={block_size} -> {len(table)} logical blocks, "
          f"physical ids = {table.tolist()}")
    print(f"tail block holds {seq_len - 2 * block_size} valid tokens; "
          f"{3 * block_size - seq_len} slots are padding")
    k = rng.standard_normal((seq_len, kv_heads, dim))
    v = rng.standard_normal((seq_len, kv_heads, dim))
    write_kv(k_cache, v_cache, k[:32], v[:32], build_slot_mapping(table, block_size, 0, 32))  # prefill chunk
    for t in range(32, seq_len):                                                               # 3 decode writes
        write_kv(k_cache, v_cache, k[t:t + 1], v[t:t + 1], build_slot_mapping(table, block_size, t, 1))
    print(f"decode write of token 34 lands in slot {build_slot_mapping(table, block_size, 34, 1)[0]} "
          f"= {table[2]} * {block_size} + {34 % block_size}")
    pad = build_slot_mapping(table, block_size, seq_len, 3 * block_size - seq_len)
    k_cache[pad] = 1e6                                       # poison the padding: a masking bug is loud
    v_cache[pad] = 1e6
    q = np.abs(rng.standard_normal((heads, dim)))
    out = paged_attention(q, k_cache, v_cache, table, seq_len, block_size)
    dense = np.empty_like(q)
    for h in range(heads):
        s = k[:, h // 2, :] @ q[h] / np.sqrt(dim)
        p = np.exp(s - s.max())
        dense[h] = (p / p.sum()) @ v[:, h // 2, :]
    print(f"paged vs dense: max|diff| < 1e-12 -> {bool(np.abs(out - dense).max() < 1e-12)}")
    wrong = paged_attention(q, k_cache, v_cache, table, 3 * block_size, block_size)
    print(f"reading all {3 * block_size} slots (padding = 1e6): max|diff| = {np.abs(wrong - dense).max():.1e}")
    print(f"decode gather touched {seq_len} x {kv_heads} x {dim} x 2 = {seq_len * kv_heads * dim * 2} "
          f"K/V values for one output token")


if __name__ == "__main__":
    main()
