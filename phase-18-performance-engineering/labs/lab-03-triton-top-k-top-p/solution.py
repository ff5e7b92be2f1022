"""Lab 18-03 — batched top-k / top-p masking in Triton, with no sort (reference).

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
    row = tl.program_id(0)
    row_in = in_ptr + row.to(tl.int64) * stride_row
    row_out = out_ptr + row.to(tl.int64) * out_stride_row
    cut = tl.full((), KEY_MIN, tl.int64)  # keep key >= cut

    if TOPK:
        k = tl.load(k_ptr + row).to(tl.int64)
        lo = tl.full((), KEY_MIN, tl.int64)  # count(key >= lo) >= k holds (it is the whole row)
        hi = tl.full((), KEY_MAX, tl.int64)
        for _ in range(33):  # largest T with count(key >= T) >= k
            mid = (lo + hi + 1) >> 1
            count = tl.zeros((), tl.int64)
            for start in range(0, vocab_size, BLOCK):
                cols = start + tl.arange(0, BLOCK)
                mask = cols < vocab_size
                x = tl.load(row_in + cols.to(tl.int64) * stride_col, mask=mask, other=float("-inf"))
                key = _keys(x.to(tl.float32)).to(tl.int64)
                count += tl.sum((mask & (key >= mid)).to(tl.int64))
            ok = count >= k
            lo = tl.where(ok, mid, lo)
            hi = tl.where(ok, hi, mid - 1)
        cut = lo

    if TOPP:
        p = tl.load(p_ptr + row).to(tl.float32)
        m = tl.full((), float("-inf"), tl.float32)
        for start in range(0, vocab_size, BLOCK):
            cols = start + tl.arange(0, BLOCK)
            mask = cols < vocab_size
            x = tl.load(row_in + cols.to(tl.int64) * stride_col, mask=mask, other=float("-inf")).to(
                tl.float32
            )
            m = tl.maximum(m, tl.max(x, axis=0))
        z = tl.zeros((), tl.float32)
        for start in range(0, vocab_size, BLOCK):
            cols = start + tl.arange(0, BLOCK)
            mask = cols < vocab_size
            x = tl.load(row_in + cols.to(tl.int64) * stride_col, mask=mask, other=float("-inf")).to(
                tl.float32
            )
            live = mask & (_keys(x).to(tl.int64) >= cut)
            z += tl.sum(tl.where(live, tl.exp(x - m), 0.0))
        lo = cut - 1  # smallest T with mass(key > T) < p
        hi = tl.full((), KEY_MAX, tl.int64)
        for _ in range(33):
            mid = (lo + hi) >> 1
            mass = tl.zeros((), tl.float32)
            for start in range(0, vocab_size, BLOCK):
                cols = start + tl.arange(0, BLOCK)
                mask = cols < vocab_size
                x = tl.load(row_in + cols.to(tl.int64) * stride_col, mask=mask, other=float("-inf")).to(
                    tl.float32
                )
                key = _keys(x).to(tl.int64)
                above = mask & (key >= cut) & (key > mid)
                mass += tl.sum(tl.where(above, tl.exp(x - m), 0.0))
            ok = mass / z < p
            hi = tl.where(ok, mid, hi)
            lo = tl.where(ok, lo, mid + 1)
        cut = tl.maximum(cut, hi)

    for start in range(0, vocab_size, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        mask = cols < vocab_size
        x = tl.load(row_in + cols.to(tl.int64) * stride_col, mask=mask, other=float("-inf")).to(tl.float32)
        keep = _keys(x).to(tl.int64) >= cut
        tl.store(row_out + cols, tl.where(keep, x, float("-inf")), mask=mask)


def apply_top_k_top_p(
    logits: torch.Tensor, k: torch.Tensor | None, p: torch.Tensor | None, block_size: int = 1024
) -> torch.Tensor:
    """A new (B, V) fp32 tensor: ``logits`` with every token outside the row's top-k, then top-p, set to -inf.

    ``logits`` fp32 (B, V), any strides, left untouched. ``k`` int (B,) in [1, V] (V keeps the
    whole row) or None; ``p`` float (B,) in (0, 1] or None. Ties at either cut are all kept.
    """
    if logits.dim() != 2 or logits.dtype != torch.float32:
        raise ValueError(f"logits must be a 2-D float32 tensor, got {tuple(logits.shape)} {logits.dtype}")
    batch, vocab = logits.shape
    if k is not None:
        if k.shape != (batch,):
            raise ValueError(f"k must have shape ({batch},), got {tuple(k.shape)}")
        if batch and (int(k.min()) < 1 or int(k.max()) > vocab):
            raise ValueError(f"top-k values must lie in [1, {vocab}], got {k.tolist()}")
    if p is not None:
        if p.shape != (batch,):
            raise ValueError(f"p must have shape ({batch},), got {tuple(p.shape)}")
        if batch and (float(p.min()) <= 0.0 or float(p.max()) > 1.0):
            raise ValueError(f"top-p values must lie in (0, 1], got {p.tolist()}")
    out = torch.empty((batch, vocab), dtype=torch.float32, device=logits.device)
    if batch == 0:
        return out
    dummy = out
    top_k_top_p_kernel[(batch,)](
        logits,
        out,
        logits.stride(0),
        logits.stride(1),
        out.stride(0),
        k.to(device=logits.device, dtype=torch.int32).contiguous() if k is not None else dummy,
        p.to(device=logits.device, dtype=torch.float32).contiguous() if p is not None else dummy,
        vocab,
        TOPK=k is not None,
        TOPP=p is not None,
        BLOCK=block_size,
    )
    return out


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


if __name__ == "__main__":
    main()
