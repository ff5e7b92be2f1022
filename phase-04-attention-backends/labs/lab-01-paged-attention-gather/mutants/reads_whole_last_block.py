"""MUTANT: reads the whole last block instead of only the valid rows (attends over garbage).

Lab 03-01 — paged attention with online softmax (reference solution).

One decode step, one head: a single query vector attends over `seq_len` cached tokens whose
K/V rows live in scattered physical blocks. `paged_online_attention` walks the logical blocks
through the block table and keeps a running (max, denominator, accumulator) triple, so it never
holds more than one block of scores at a time. `dense_attention` is the oracle.

Shapes (float64 throughout):
    q           (d,)
    K, V        (n, d)                         dense reference
    k_cache     (num_blocks, block_size, d)    physical blocks
    v_cache     (num_blocks, block_size, d)
    block_table list[int]                      logical block i -> physical block id
"""

from __future__ import annotations

import sys

import numpy as np


def dense_attention(q: np.ndarray, K: np.ndarray, V: np.ndarray) -> np.ndarray:
    """softmax(K·q / sqrt(d)) · V, computed the naive way: every score, then one softmax."""
    d = q.shape[-1]
    scores = K @ q / np.sqrt(d)
    weights = np.exp(scores - scores.max())
    return (weights / weights.sum()) @ V


def paged_online_attention(
    q: np.ndarray,
    k_cache: np.ndarray,
    v_cache: np.ndarray,
    block_table: list[int],
    seq_len: int,
    trace: list | None = None,
) -> np.ndarray:
    """Attention for one query over tokens [0, seq_len), gathered block by block.

    Token t lives in physical block ``block_table[t // block_size]`` at offset
    ``t % block_size``. Only the first ``seq_len`` tokens are valid; rows past them in the last
    block are garbage and must never be read. If ``trace`` is a list, one dict per block is
    appended (m, corr, denom, acc after the update) so you can watch the recurrence.
    """
    block_size = k_cache.shape[1]
    d = q.shape[-1]
    m, denom, acc = -np.inf, 0.0, np.zeros(v_cache.shape[-1])
    num_blocks = -(-seq_len // block_size)  # ceil
    for logical in range(num_blocks):
        physical = block_table[logical]
        valid = block_size
        k_blk = k_cache[physical, :valid]
        v_blk = v_cache[physical, :valid]
        s = k_blk @ q / np.sqrt(d)
        m_new = max(m, s.max())
        corr = np.exp(m - m_new) if m != -np.inf else 0.0  # first block: nothing to rescale
        p = np.exp(s - m_new)
        acc = acc * corr + p @ v_blk
        denom = denom * corr + p.sum()
        m = m_new
        if trace is not None:
            trace.append({"block": logical, "physical": physical, "scores": s.copy(), "m": m,
                          "corr": corr, "denom": denom, "acc": acc.copy()})
    return acc / denom


# --- demo ---------------------------------------------------------------------------------

def _scatter(K: np.ndarray, block_table: list[int], num_blocks: int, block_size: int,
             fill: float = np.nan) -> np.ndarray:
    """Place the rows of K into a fresh cache along block_table; unused rows hold `fill`."""
    cache = np.full((num_blocks, block_size, K.shape[1]), fill)
    for t, row in enumerate(K):
        cache[block_table[t // block_size], t % block_size] = row
    return cache


def _trace_demo() -> None:
    """The two-block, one-dimensional example the guide works by hand."""
    q = np.array([1.0])
    K = np.array([[1.0], [3.0], [2.0], [5.0]])   # d = 1, so the scores are just K
    V = np.array([[10.0], [20.0], [30.0], [40.0]])
    table = [1, 0]
    kc, vc = _scatter(K, table, 2, 2), _scatter(V, table, 2, 2)
    trace: list = []
    out = paged_online_attention(q, kc, vc, table, 4, trace=trace)
    for step in trace:
        print(f"block {step['block']}: scores={np.round(step['scores'], 4).tolist()}  "
              f"m={step['m']:.4f}  corr={step['corr']:.4f}  "
              f"denom={step['denom']:.4f}  acc={step['acc'][0]:.4f}")
    print(f"online:  acc/denom = {out[0]:.4f}")
    print(f"dense:   softmax([1, 3, 2, 5]) @ [10, 20, 30, 40] = {dense_attention(q, K, V)[0]:.4f}")


def main() -> None:
    if "--trace" in sys.argv:
        _trace_demo()
        return
    rng = np.random.default_rng(0)
    d, block_size, num_blocks = 8, 4, 8
    cases = [("block-aligned", 16, [3, 1, 7, 0]),
             ("partial last block", 13, [5, 2, 6, 4]),
             ("same tokens, other blocks", 13, [0, 7, 1, 3])]
    q = rng.standard_normal(d)
    K, V = rng.standard_normal((16, d)), rng.standard_normal((16, d))
    for name, seq_len, table in cases:
        kc = _scatter(K[:seq_len], table, num_blocks, block_size)
        vc = _scatter(V[:seq_len], table, num_blocks, block_size)
        paged = paged_online_attention(q, kc, vc, table, seq_len)
        dense = dense_attention(q, K[:seq_len], V[:seq_len])
        ok = np.max(np.abs(paged - dense)) < 1e-12
        print(f"{name:26s} seq_len={seq_len:2d} table={table}  blocks read={-(-seq_len // block_size)}"
              f"  out[:3]={np.round(paged[:3], 6).tolist()}  matches dense (1e-12): {ok}")
    print("unused cache rows hold NaN: any read past seq_len would have turned the output into NaN")


if __name__ == "__main__":
    main()
