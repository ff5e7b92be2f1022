"""Lab 09-05 — Gumbel-max sampling in Triton, batch-invariant by construction (starter).

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

Your file: write ``gumbel_argmax_kernel`` and ``gumbel_sample``. ``python starter.py`` prints the README's
figures once they work (under the interpreter on a CPU).
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
    # TODO: program `row` draws one token for its row.
    #   1. Load the row's temperature (as fp32), seed and position. The per-step key is
    #      tl.randint(seed, position): the row index must play no part in the noise.
    #   2. The row starts at logits_ptr + row * stride_row; column c is at + c * stride_col. Both offsets in int64:
    #      a strided view can put a row or a column 2**31 elements past the start.
    #   3. Walk the vocabulary in blocks of BLOCK columns (the last one partial: mask it, load -inf there).
    #      For a sampling row (temperature != 0): u = max(tl.rand(key, column), FP32_TINY),
    #      x = logits / temperature + -log(-log(u)), and masked lanes back to -inf.
    #      A greedy row (temperature 0) keeps the raw logits: no noise.
    #   4. tl.max(x, axis=0, return_indices=True) gives the block's best; keep the running best across
    #      blocks with a strict > (ties keep the earlier block, so greedy ties go to the lowest id).
    #   5. Store the best column (int64) at out_ptr + row.
    tl.static_assert(False, "gumbel_argmax_kernel is not written yet: see the TODO in starter.py")


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
    raise NotImplementedError(
        "check the inputs (2-D float logits; temperature/seeds/positions of shape (B,) -> 'one entry per row'; "
        "temperature >= 0; block_size a power of two), then launch gumbel_argmax_kernel on a grid of (B,) with "
        "both strides of logits and the seeds kept int64 (vLLM's seeds use all 64 bits), and return the int64 tokens"
    )


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
