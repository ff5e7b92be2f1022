"""Lab 09-05 — Gumbel-max sampling in Triton, batch-invariant by construction (reference).

Sampling token ``i`` with probability ``softmax(l / T)_i`` is the same as taking
``argmax_i(l_i / T + g_i)`` with ``g_i = -log(-log(u_i))`` and ``u_i`` uniform on (0, 1) (the
Gumbel-max trick). The kernel never computes a softmax or a cumulative sum: one pass over the
vocabulary keeps a running (best value, best index).

The uniforms come from Philox, a counter-based generator: ``tl.randint(seed, position)`` turns a
row's (seed, position) into a per-step key, and ``tl.rand(key, column)`` gives column ``column``'s
uniform. Nothing depends on which row of the batch the request sits in, how many rows there are
or what the other rows hold: a row's token is a function of its logits, seed and position only.
This is the keying vLLM's model-runner-v2 sampler uses, so for the same inputs both kernels draw
the same token.

``python solution.py`` prints the README's figures (under the interpreter on a CPU).
"""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():               # no GPU: run the kernel in Triton's CPU interpreter
    os.environ.setdefault("TRITON_INTERPRET", "1")

import triton  # noqa: E402  (imported after TRITON_INTERPRET is decided)
import triton.language as tl  # noqa: E402

FP32_TINY = tl.constexpr(2.0 ** -126)   # smallest normal fp32: u is clamped to it so log(u) stays finite


@triton.jit
def gumbel_argmax_kernel(
    logits_ptr, stride_row, stride_col,
    temp_ptr, seed_ptr, pos_ptr, out_ptr,
    vocab_size,
    BLOCK: tl.constexpr,
):
    """One program per row: a running argmax of ``l / T + gumbel`` over blocks of ``BLOCK`` columns."""
    row = tl.program_id(0)
    temp = tl.load(temp_ptr + row).to(tl.float32)
    seed = tl.load(seed_ptr + row)
    pos = tl.load(pos_ptr + row)
    key = tl.randint(seed, pos)                   # the (seed, position) key: no row index anywhere
    row_ptr = logits_ptr + row.to(tl.int64) * stride_row
    best_val = float("-inf")
    best_idx = 0
    for start in range(0, vocab_size, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        mask = cols < vocab_size
        x = tl.load(row_ptr + cols.to(tl.int64) * stride_col, mask=mask, other=float("-inf")).to(tl.float32)
        if temp != 0.0:
            u = tl.maximum(tl.rand(key, cols), FP32_TINY)
            x = x / temp + -tl.log(-tl.log(u))
            x = tl.where(mask, x, float("-inf"))
        val, idx = tl.max(x, axis=0, return_indices=True)   # ties inside a block: the lowest column
        if val > best_val:                                   # strict: ties across blocks keep the earlier
            best_val = val
            best_idx = start + idx
    tl.store(out_ptr + row, best_idx.to(tl.int64))


def gumbel_sample(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    seeds: torch.Tensor,
    positions: torch.Tensor,
    block_size: int = 1024,
) -> torch.Tensor:
    """One token per row of ``logits`` (B, V), any strides: ``argmax`` where ``temperature`` is 0,
    else a draw from ``softmax(logits / temperature)`` keyed by (``seeds``, ``positions``).

    ``temperature`` float (B,), ``seeds`` and ``positions`` int64 (B,). Returns int64 (B,).
    ``-inf`` logits are never drawn; greedy ties go to the lowest token id.
    """
    if logits.dim() != 2 or not logits.is_floating_point():
        raise ValueError(f"logits must be a 2-D float tensor (batch, vocab), got {tuple(logits.shape)} {logits.dtype}")
    batch, vocab = logits.shape
    for name, t in (("temperature", temperature), ("seeds", seeds), ("positions", positions)):
        if t.shape != (batch,):
            raise ValueError(f"{name} must have shape ({batch},), one entry per row, got {tuple(t.shape)}")
    if (temperature < 0).any():
        raise ValueError("temperature must be >= 0 (0 means greedy)")
    if block_size < 1 or block_size & (block_size - 1):
        raise ValueError(f"block_size must be a power of two, got {block_size}")
    out = torch.empty(batch, dtype=torch.int64, device=logits.device)
    if batch == 0:
        return out
    gumbel_argmax_kernel[(batch,)](
        logits, logits.stride(0), logits.stride(1),
        temperature.to(torch.float32).contiguous(), seeds.to(torch.int64).contiguous(),
        positions.to(torch.int64).contiguous(), out, vocab, BLOCK=block_size,
    )
    return out


# --------------------------------------------------------------------------- the README's figures
def chi_square(counts: list[int], probs: list[float]) -> float:
    """Pearson's statistic of observed ``counts`` against expected probabilities ``probs``."""
    n = sum(counts)
    return sum((c - n * p) ** 2 / (n * p) for c, p in zip(counts, probs, strict=True))


PROBS = [0.5, 0.3, 0.2]
DRAWS = 300


def draws(probs=PROBS, n=DRAWS, temperature=1.0, seed=1234, vocab=8, block_size=4):
    """``n`` draws of one row (``log probs``, padded with -inf to ``vocab``) at positions 0..n-1."""
    row = torch.full((vocab,), float("-inf"))
    row[: len(probs)] = torch.log(torch.tensor(probs))
    logits = row.repeat(n, 1)
    tokens = gumbel_sample(logits, torch.full((n,), temperature), torch.full((n,), seed, dtype=torch.int64),
                           torch.arange(n, dtype=torch.int64), block_size)
    return torch.bincount(tokens, minlength=vocab).tolist()


def main() -> None:
    import math

    counts = draws()
    stat = chi_square(counts[:3], PROBS)
    print(f"{DRAWS} draws of one row, probs {PROBS} (5 more columns at -inf), seed 1234, positions 0..{DRAWS - 1}:")
    print(f"  counts {counts[:3]} (expected {[round(DRAWS * p) for p in PROBS]}), -inf columns drawn {sum(counts[3:])}")
    print(f"  chi-square {stat:.2f}, df 2; fails above {-2 * math.log(1e-3):.2f} (p = 0.001)")
    g = torch.Generator().manual_seed(0)
    target = torch.randn(1, 37, generator=g)
    others = torch.randn(3, 37, generator=g)
    seen = []
    for batch, at in ((0, 0), (1, 1), (3, 0), (3, 3)):
        rows = list(others[:batch])
        rows.insert(at, target[0])
        b = len(rows)
        seeds = torch.tensor([11, 5, 6, 7][:b], dtype=torch.int64)
        pos = torch.tensor([9, 2, 3, 4][:b], dtype=torch.int64)
        seeds[at], pos[at] = 42, 17
        temp = torch.tensor([1.0, 0.0, 0.7, 2.0][:b])
        temp[at] = 0.8
        seen.append((b, at, int(gumbel_sample(torch.stack(rows), temp, seeds, pos, 16)[at])))
    print("the same row (seed 42, position 17, T 0.8, vocab 37) in different batches:")
    for b, at, tok in seen:
        print(f"  batch of {b}, at row {at}: token {tok}")


if __name__ == "__main__":
    main()
