"""Lab 18-03 — batched top-k / top-p masking in Triton, with no sort (starter).

The sort-based path (vLLM's ``apply_top_k_top_p_pytorch``) sorts every row of the vocabulary.
This kernel finds each row's two cut values by bisection instead, one program per row, reading
the row in blocks of ``BLOCK`` columns on every pass:

1. Map each float to an int32 *key* whose signed order is the float order (flip the low 31 bits
   of negative floats). Bisection over the 2^32 keys then ends on an exact logit value after at
   most 32 passes: no tolerance, no sort.
2. Top-k: the largest key ``T_k`` with ``count(key >= T_k) >= k``. That is the k-th largest
   logit; every logit equal to it is kept (ties at the cut survive, as in vLLM).
3. Top-p over the survivors: with ``m = max`` and ``Z = sum(exp(x - m))`` over the survivors,
   ``mass(T) = sum(exp(x - m)) / Z`` over survivors with ``key > T``. The cut is the smallest key
   ``T_p`` with ``mass(T_p) < p``: a token is kept when the tokens strictly above it hold less
   than ``p`` of the mass. Equal logits share one fate.
4. Write ``x`` where ``key >= max(T_k, T_p)``, ``-inf`` elsewhere.

``python solution.py`` prints the README's figures (under the interpreter on a CPU).
"""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():  # no GPU: run the kernel in Triton's CPU interpreter
    os.environ.setdefault("TRITON_INTERPRET", "1")

import triton  # noqa: E402  (imported after TRITON_INTERPRET is decided)
import triton.language as tl  # noqa: E402

KEY_MIN = -(2**31)
KEY_MAX = 2**31 - 1


@triton.jit
def _keys(x):
    """Order-preserving int32 keys of fp32 values (-0.0 folded into +0.0 first)."""
    bits = (x + 0.0).to(tl.int32, bitcast=True)
    return bits ^ ((bits >> 31) & 0x7FFFFFFF)


@triton.jit
def top_k_top_p_kernel(
    in_ptr,
    out_ptr,
    stride_row,
    stride_col,
    out_stride_row,
    k_ptr,
    p_ptr,
    vocab_size,
    TOPK: tl.constexpr,
    TOPP: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """One program per row. Your steps (see the module docstring):

    1. top-k (if TOPK): bisection over int64 [KEY_MIN, KEY_MAX] for the largest T with
       count(_keys(x) >= T) >= k; 33 iterations, each one pass over the row in BLOCK-wide tiles
       (mask the tail tile; load with stride_col).
    2. top-p (if TOPP): the max m and Z = sum(exp(x - m)) over the survivors, then bisection for the
       smallest T with sum(exp(x - m) for survivors with key > T) / Z < p.
    3. a last pass: store x where key >= both cuts, -inf elsewhere, into row ``row`` of out.
    """
    pass


def apply_top_k_top_p(
    logits: torch.Tensor, k: torch.Tensor | None, p: torch.Tensor | None, block_size: int = 1024
) -> torch.Tensor:
    """A new (B, V) fp32 tensor: ``logits`` with every token outside the row's top-k, then top-p, set to -inf.

    ``logits`` fp32 (B, V), any strides, left untouched. ``k`` int (B,) in [1, V] (V keeps the
    whole row) or None; ``p`` float (B,) in (0, 1] or None. Ties at either cut are all kept.
    """
    raise NotImplementedError(
        "apply_top_k_top_p: refuse a non-2-D or non-float32 logits, k / p of the wrong shape, k outside [1, V] "
        "and p outside (0, 1] with ValueError; allocate out (B, V) fp32, then launch top_k_top_p_kernel[(batch,)] with both "
        "tensors and their strides, k as int32 and p as float32 (any tensor as a dummy when None), vocab, "
        "TOPK / TOPP flags and BLOCK=block_size; return out"
    )


def reference(logits: torch.Tensor, k: torch.Tensor | None, p: torch.Tensor | None) -> torch.Tensor:
    """The rule in plain torch (per row, float64 masses): the tests' oracle for ties and the edge cases."""
    out = logits.clone().to(torch.float32)
    for r in range(logits.shape[0]):
        x = logits[r].to(torch.float64)
        keep = torch.ones_like(x, dtype=torch.bool)
        if k is not None:
            kth = torch.sort(x, descending=True).values[int(k[r]) - 1]
            keep &= x >= kth
        if p is not None:
            w = torch.where(keep, torch.exp(x - x[keep].max()), torch.zeros_like(x))
            w = w / w.sum()
            above = torch.stack([w[x > v].sum() for v in x])
            keep &= above < float(p[r])
        out[r][~keep] = float("-inf")
    return out


def main() -> None:
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(4, 1000, generator=g) * 3
    k = torch.tensor([1, 50, 1000, 10], dtype=torch.int32)
    p = torch.tensor([0.9, 0.5, 0.95, 1.0])
    out = apply_top_k_top_p(logits, k, p, block_size=256)
    kept = (~torch.isinf(out)).sum(1).tolist()
    print(
        f"4 rows x 1000 tokens, k = {k.tolist()}, p = {[round(v, 2) for v in p.tolist()]}: kept per row {kept}"
    )
    same = torch.equal(torch.isinf(out), torch.isinf(reference(logits, k, p)))
    print(f"same mask as the plain-torch rule: {same}")
    ties = torch.tensor([[3.0, 1.0, 2.0, 2.0, 2.0, 0.0]])
    out = apply_top_k_top_p(ties, torch.tensor([2]), None, block_size=4)
    print(
        f"k = 2 on {ties[0].tolist()}: kept {out[0].isfinite().nonzero().flatten().tolist()} (all three 2.0s tie)"
    )


# Grade with: LAB_IMPL=starter .venv/bin/python -m pytest phase-18-performance-engineering/labs/lab-03-triton-top-k-top-p -q

if __name__ == "__main__":
    main()
