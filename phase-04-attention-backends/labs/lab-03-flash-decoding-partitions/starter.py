"""Lab 03-03 — flash-decoding: split the keys, summarise each part, merge the summaries (starter).

A *summary* of attention over a set of keys is the triple

    m     = max_i s_i                      (s_i = k_i·q / sqrt(d))
    denom = sum_i exp(s_i - m)
    acc   = sum_i exp(s_i - m) · v_i       (a vector, NOT divided by denom)

Two summaries over disjoint key sets merge exactly (rescale both to the larger max, then add),
so the keys can be cut into any number of pieces, processed in parallel, and combined in any
order or tree shape. The output is acc / denom, divided once, at the very end.

Shapes (float64): q (d,), K and V (n, d).
"""

from __future__ import annotations

import sys
from functools import reduce  # noqa: F401  (merge_partials folds with it)
from typing import NamedTuple

import numpy as np


class Summary(NamedTuple):
    m: float          # running max of the scores (-inf for an empty key set)
    denom: float      # sum of exp(score - m)
    acc: np.ndarray   # sum of exp(score - m) * v, unnormalised, shape (d_v,)


def empty_summary(d_v: int) -> Summary:
    """The identity of merge_two: no keys at all."""
    return Summary(-np.inf, 0.0, np.zeros(d_v))


def attend_partial(q: np.ndarray, K: np.ndarray, V: np.ndarray) -> Summary:
    """Summarise attention of q over the key rows K (values V). Never normalises.

    An empty K (0 rows) returns ``empty_summary``.
    """
    raise NotImplementedError(
        "attend_partial: if K has 0 rows return empty_summary(V.shape[-1]); else s = K @ q / sqrt(d), "
        "m = s.max(), p = exp(s - m); return Summary(m, p.sum(), p @ V) — do NOT divide acc by denom"
    )


def merge_two(a: Summary, b: Summary) -> Summary:
    """Combine summaries of two disjoint key sets into the summary of their union."""
    raise NotImplementedError(
        "merge_two: m = max(a.m, b.m); if m is -inf both are empty, return a; otherwise scale each side "
        "by exp(its m - m) and add denoms and accs (the exponents are <= 0, so nothing overflows)"
    )


def merge_partials(summaries: list[Summary]) -> np.ndarray:
    """Merge any number of summaries (empty ones allowed) and return the attention output."""
    raise NotImplementedError(
        "merge_partials: fold the list with merge_two (functools.reduce), then return acc / denom once"
    )


def partitioned_attention(q: np.ndarray, K: np.ndarray, V: np.ndarray, num_partitions: int) -> np.ndarray:
    """Split the keys into num_partitions contiguous chunks (np.array_split), summarise, merge."""
    raise NotImplementedError(
        "partitioned_attention: np.array_split K and V into num_partitions chunks, attend_partial each, "
        "then merge_partials"
    )


# --- demo ---------------------------------------------------------------------------------

def _worked() -> None:
    """The guide's hand example: the four keys of lab 01 cut into two partitions."""
    q = np.array([1.0])
    K, V = np.array([[1.0], [3.0], [2.0], [5.0]]), np.array([[10.0], [20.0], [30.0], [40.0]])
    a, b = attend_partial(q, K[:2], V[:2]), attend_partial(q, K[2:], V[2:])
    for name, p in (("partition A (scores 1, 3)", a), ("partition B (scores 2, 5)", b)):
        print(f"{name}: m={p.m:.4f}  denom={p.denom:.4f}  acc={p.acc[0]:.4f}  alone: acc/denom={p.acc[0] / p.denom:.4f}")
    m = max(a.m, b.m)
    print(
        f"merge: m*={m:.4f}  weight A=exp({a.m:g}-{m:g})={np.exp(a.m - m):.4f}  "
        f"weight B=exp({b.m:g}-{m:g})={np.exp(b.m - m):.4f}"
    )
    ab = merge_two(a, b)
    print(f"merged: denom={ab.denom:.4f}  acc={ab.acc[0]:.4f}  out={ab.acc[0] / ab.denom:.4f}")
    wrong = (a.acc[0] / a.denom + b.acc[0] / b.denom) / 2
    print(f"wrong (average of the two normalised outputs): {wrong:.4f}")


def main() -> None:
    if "--worked" in sys.argv:
        _worked()
        return
    rng = np.random.default_rng(0)
    d, n = 16, 1000
    q, K, V = rng.standard_normal(d), rng.standard_normal((n, d)), rng.standard_normal((n, d))
    s = K @ q / np.sqrt(d)
    w = np.exp(s - s.max())
    dense = (w / w.sum()) @ V
    print(f"n={n} keys, d={d}; dense out[:3] = {np.round(dense[:3], 6).tolist()}")
    for p in (1, 2, 7, 32, 1000, 1500):
        out = partitioned_attention(q, K, V, p)
        empties = max(0, p - n)
        print(f"  {p:5d} partitions ({empties:3d} empty): matches dense to 1e-12: "
              f"{bool(np.max(np.abs(out - dense)) < 1e-12)}")
    parts = [attend_partial(q, k, v) for k, v in zip(np.array_split(K, 8), np.array_split(V, 8))]
    flat = merge_partials(parts)
    tree = merge_two(merge_two(merge_two(parts[0], parts[1]), merge_two(parts[2], parts[3])),
                     merge_two(merge_two(parts[4], parts[5]), merge_two(parts[6], parts[7])))
    print(f"8 partials, left fold vs balanced tree: equal to 1e-12: "
          f"{bool(np.max(np.abs(flat - tree.acc / tree.denom)) < 1e-12)}")
    print("per-partition maxima m_i:", np.round([p.m for p in parts], 3).tolist())
    wrong = np.mean([p.acc / p.denom for p in parts], axis=0)
    print(f"wrong merge (normalise each, then average): max error = {np.max(np.abs(wrong - dense)):.3f}")


if __name__ == "__main__":
    main()
