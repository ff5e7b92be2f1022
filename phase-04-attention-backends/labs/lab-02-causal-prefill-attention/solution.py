"""Lab 03-02 — causal prefill over a paged cache; chunked prefill == one-shot prefill (reference).

A prefill chunk is M query rows for absolute positions start_pos .. start_pos+M-1. The runner
first writes the chunk's K/V into the cache through the slot mapping (the write map), so the
cache then holds tokens 0 .. start_pos+M-1. Query row i (position p = start_pos + i) attends
over tokens [0, p] through the block table (the read map). The causal mask is nothing more
than that loop bound, seq_len = p + 1.

The inner per-query kernel is lab 01's reference ``paged_online_attention``.

Shapes (float64): Q, K, V (M, d); k_cache, v_cache (num_blocks, block_size, d).
"""

from __future__ import annotations

import numpy as np

from course.runtime import use_lab

_LAB01 = use_lab("phase-04/lab-01-paged-attention-gather")
paged_online_attention = _LAB01.paged_online_attention   # one query over tokens [0, seq_len)


def slot_mapping(block_table: list[int], block_size: int, start_pos: int, num_tokens: int) -> np.ndarray:
    """Flat cache slots for tokens start_pos .. start_pos+num_tokens-1 (the write map).

    slot(t) = block_table[t // block_size] * block_size + t % block_size
    """
    t = np.arange(start_pos, start_pos + num_tokens)
    return np.asarray(block_table)[t // block_size] * block_size + t % block_size


def write_chunk(k_cache: np.ndarray, v_cache: np.ndarray, block_table: list[int], start_pos: int,
                K_new: np.ndarray, V_new: np.ndarray) -> None:
    """Scatter the chunk's K/V rows into the caches in place (numpy's reshape_and_cache)."""
    num_blocks, block_size, d = k_cache.shape
    slots = slot_mapping(block_table, block_size, start_pos, K_new.shape[0])
    k_cache.reshape(num_blocks * block_size, d)[slots] = K_new
    v_cache.reshape(num_blocks * block_size, v_cache.shape[-1])[slots] = V_new


def dense_causal_attention(Q: np.ndarray, K: np.ndarray, V: np.ndarray, start_pos: int) -> np.ndarray:
    """Reference: Q holds positions start_pos.., K/V hold tokens 0..start_pos+M-1 contiguously."""
    d = Q.shape[-1]
    out = np.empty((Q.shape[0], V.shape[-1]))
    for i, q in enumerate(Q):
        n = start_pos + i + 1                      # the causal prefix, including the token itself
        s = K[:n] @ q / np.sqrt(d)
        w = np.exp(s - s.max())
        out[i] = (w / w.sum()) @ V[:n]
    return out


def paged_causal_prefill_attention(Q: np.ndarray, k_cache: np.ndarray, v_cache: np.ndarray,
                                   block_table: list[int], start_pos: int) -> np.ndarray:
    """Each query row i attends over cached tokens [0, start_pos + i] through the block table.

    Precondition: the cache already holds tokens 0 .. start_pos + len(Q) - 1.
    """
    return np.stack([
        paged_online_attention(q, k_cache, v_cache, block_table, start_pos + i + 1)
        for i, q in enumerate(Q)
    ])


def chunked_prefill(Q: np.ndarray, K: np.ndarray, V: np.ndarray, chunk_sizes: list[int],
                    k_cache: np.ndarray, v_cache: np.ndarray, block_table: list[int]) -> np.ndarray:
    """Run a prompt's prefill as consecutive chunks: write each chunk's K/V, then attend its queries.

    Chunk sizes that do not add up to the prompt length raise ``ValueError`` before anything is written.
    """
    if sum(chunk_sizes) != Q.shape[0]:
        raise ValueError(f"chunk sizes {list(chunk_sizes)} add up to {sum(chunk_sizes)}, not {Q.shape[0]}")
    outs, start = [], 0
    for size in chunk_sizes:
        end = start + size
        write_chunk(k_cache, v_cache, block_table, start, K[start:end], V[start:end])
        outs.append(paged_causal_prefill_attention(Q[start:end], k_cache, v_cache, block_table, start))
        start = end
    return np.concatenate(outs)


# --- demo ---------------------------------------------------------------------------------

def main() -> None:
    rng = np.random.default_rng(0)
    n, d, block_size, num_blocks = 12, 8, 4, 8
    table = [6, 2, 5]
    Q, K, V = (rng.standard_normal((n, d)) for _ in range(3))
    print(f"prompt of {n} tokens, block_size={block_size}, block_table={table}")
    print(f"slot_mapping for a chunk at start_pos=5 of 7 tokens: "
          f"{slot_mapping(table, block_size, 5, 7).tolist()}")
    dense = dense_causal_attention(Q, K, V, 0)
    results = {}
    for chunks in ([12], [5, 7], [4, 4, 4], [1] * 12):
        kc, vc = np.full((num_blocks, block_size, d), np.nan), np.full((num_blocks, block_size, d), np.nan)
        results[str(chunks)] = out = chunked_prefill(Q, K, V, chunks, kc, vc, table)
        print(f"  chunks {chunks!s:38s} max|out - one-shot dense| < 1e-12: "
              f"{bool(np.max(np.abs(out - dense)) < 1e-12)}")
    same = max(np.max(np.abs(o - results["[12]"])) for o in results.values())
    print(f"every chunking gives the same rows to 1e-9: {bool(same < 1e-9)}")
    reads_loop = sum(range(1, n + 1))
    print(f"key rows gathered by this per-query loop for {n} queries: {reads_loop} "
          f"(= 1+2+...+{n}); a key-tile-outer kernel reads each of the {n} rows once")


if __name__ == "__main__":
    main()
