"""Lab 10-01 starter: tensor-parallel sharding is exact algebra.

Ranks are simulated in one process: a loop over ``num_ranks`` shards plays one GPU per
iteration, ``np.concatenate`` plays the all-gather and a sum plays the all-reduce. Convention
(torch's and vLLM's): ``y = x @ W.T`` with ``W`` shaped ``(out_features, in_features)``.
Grade with: LAB_IMPL=starter pytest phase-10-distributed-inference/labs/lab-01-tp-sharding-math -q
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np


class MLPResult(NamedTuple):
    output: np.ndarray  # [tokens, hidden]: the block's output, identical on every rank
    num_all_reduces: int  # collectives that sum across ranks
    num_all_gathers: int  # collectives that concatenate across ranks


def shard(n: int, num_ranks: int, rank: int) -> slice:
    """The slice of an axis of length ``n`` that ``rank`` owns: equal, contiguous, in rank order.

    Raises ``ValueError`` when ``num_ranks`` is not an int >= 1, ``rank`` is outside
    ``[0, num_ranks)``, or ``n`` does not divide evenly (TP never pads a weight's hidden axis).
    """
    raise NotImplementedError(
        'shard: check num_ranks (int >= 1), rank in [0, num_ranks) and n % num_ranks == 0 (ValueError otherwise), '
        'then return slice(rank * chunk, (rank + 1) * chunk) with chunk = n // num_ranks'
    )


def column_parallel(x: np.ndarray, W: np.ndarray, num_ranks: int) -> np.ndarray:
    """``x @ W.T`` with ``W``'s output rows split over ranks; the pieces are all-gathered (concatenated).

    Rank r holds ``W[shard(out, num_ranks, r)]`` and the full ``x``; it computes its slice of the
    output features.
    """
    raise NotImplementedError(
        'column_parallel: for each rank r compute x @ W[shard(W.shape[0], num_ranks, r)].T, then np.concatenate '
        'the pieces on the last axis (the all-gather)'
    )


def row_parallel(x: np.ndarray, W: np.ndarray, num_ranks: int) -> np.ndarray:
    """``x @ W.T`` with ``W``'s input columns and ``x``'s columns split alike; the partials are summed.

    Rank r holds ``W[:, s]`` and ``x[:, s]`` with ``s = shard(in, num_ranks, r)``; its product is
    full-shaped but partial: the all-reduce adds the ranks' partials.
    """
    raise NotImplementedError(
        'row_parallel: for each rank r take s = shard(W.shape[1], num_ranks, r), compute the full-shaped '
        'partial x[:, s] @ W[:, s].T, and sum the partials (the all-reduce)'
    )


def mlp_tp(x: np.ndarray, W1: np.ndarray, W2: np.ndarray, num_ranks: int) -> MLPResult:
    """``relu(x @ W1.T) @ W2.T`` with W1 column-parallel and W2 row-parallel: one all-reduce.

    ``W1`` is ``(inter, hidden)``, ``W2`` is ``(hidden, inter)``. Each rank keeps its slice of the
    intermediate activation (never gathered), applies ReLU to it (valid because ReLU is
    elementwise), multiplies by the matching columns of ``W2`` and contributes a partial sum.
    """
    raise NotImplementedError(
        'mlp_tp: check W1.shape[0] == W2.shape[1]; per rank: h = relu(x @ W1[s].T) on its slice s of the '
        'intermediate features, partial = h @ W2[:, s].T; sum the partials once; return MLPResult(output, '
        '1 if num_ranks > 1 else 0, 0)'
    )


def _err(e: float) -> str:
    """An error for the printed table: exact zero, or below 1e-12 (the last digits depend on the BLAS build)."""
    return "0" if e == 0 else "< 1e-12" if e < 1e-12 else f"{e:.1e}"


def main() -> None:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 64))
    W1, W2 = rng.standard_normal((256, 64)), rng.standard_normal((64, 256))
    dense = np.maximum(x @ W1.T, 0) @ W2.T
    print("x [4, 64], W1 [256, 64] (column-parallel), W2 [64, 256] (row-parallel), float64")
    print("ranks | column max err | row max err | mlp max err | all-reduces | all-gathers")
    for n in (1, 2, 4, 8):
        c = np.abs(column_parallel(x, W1, n) - x @ W1.T).max()
        r = np.abs(row_parallel(np.maximum(x @ W1.T, 0), W2, n) - dense).max()
        res = mlp_tp(x, W1, W2, n)
        print(f"{n:>5} | {_err(c):>14} | {_err(r):>11} | {_err(np.abs(res.output - dense).max()):>11} |"
              f" {res.num_all_reduces:>11} | {res.num_all_gathers:>11}")
    xi = rng.integers(-3, 4, (4, 64)).astype(float)
    Wi = rng.integers(-3, 4, (256, 64)).astype(float)
    print("integer-valued inputs, 8 ranks: column exact:", np.array_equal(column_parallel(xi, Wi, 8), xi @ Wi.T),
          "| row exact:", np.array_equal(row_parallel(xi @ Wi.T, Wi.T.copy(), 8), (xi @ Wi.T) @ Wi))
    for n in (3, 6):
        try:
            mlp_tp(x, W1, W2, n)
        except ValueError as exc:
            print(f"num_ranks={n}: ValueError: {exc}")


if __name__ == "__main__":
    main()
