"""Lab 08-02 starter: rejection sampling, the verify rule that keeps sampled output exact.

The drafter proposes ``x ~ q``; the target's distribution at that position is ``p``. Accept ``x``
with probability ``min(1, p[x] / q[x])`` (draw ``u ~ U[0, 1)`` and accept when ``p[x] / q[x] >= u``,
the comparison vLLM makes); on a rejection, draw the replacement from the residual
``max(p − q, 0)`` normalised. Whatever ``q`` is, the token that comes out is distributed exactly as
``p``, and the acceptance rate is the overlap ``Σ min(p, q)``. At temperature 0 the rule collapses
to "accept when the draft is the target's argmax". ``main`` prints the numbers in the README.

Write ``accept_prob``, ``residual_distribution``, ``verify_token``, ``speculative_tokens``,
``expected_acceptance_rate`` and ``verify_greedy_token``; ``check_distribution``, the lab's pair and
``main`` are provided.
Grade with: LAB_IMPL=starter pytest phase-08-speculative-decoding/labs/lab-02-rejection-sampling -q
"""

from __future__ import annotations

import numpy as np

ATOL = 1e-6  # how far from 1 a distribution's sum may be


def check_distribution(name: str, dist: np.ndarray, vocab: int | None = None) -> np.ndarray:
    """``dist`` as a float64 vector: 1-D, non-negative, summing to 1 (within ``ATOL``); else ``ValueError``."""
    dist = np.asarray(dist, dtype=np.float64)
    if dist.ndim != 1 or dist.size == 0 or (vocab is not None and dist.size != vocab):
        raise ValueError(f"{name} must be a 1-D distribution over {vocab or 'the'} tokens, got shape {dist.shape}")
    if not np.isfinite(dist).all() or (dist < 0).any() or abs(dist.sum() - 1.0) > ATOL:
        raise ValueError(f"{name} must be non-negative and sum to 1, got sum {dist.sum()!r}")
    return dist


def accept_prob(p: np.ndarray, q: np.ndarray, x: int) -> float:
    """``min(1, p[x] / q[x])``: the chance that draft ``x`` survives. ``q[x] == 0`` gives 0 (vLLM rejects).

    ``ValueError`` for invalid distributions or ``x`` outside the vocabulary.
    """
    raise NotImplementedError(
        "accept_prob: validate p and q with check_distribution (q must match p's size) and 0 <= x < len(p); "
        "return 0.0 when q[x] == 0, else min(1, p[x] / q[x])"
    )


def residual_distribution(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """``max(p − q, 0)`` normalised: where to draw the replacement token after a rejection.

    When ``p == q`` there is no surplus anywhere and a rejection cannot happen; return a copy of
    ``p`` rather than dividing by zero.
    """
    raise NotImplementedError(
        'residual_distribution: validate p and q; surplus = max(p - q, 0); return surplus / surplus.sum(), '
        'or a copy of p when the surplus is all zero'
    )


def verify_token(p: np.ndarray, q: np.ndarray, x: int, u: float, rng: np.random.Generator) -> tuple[int, bool]:
    """One verify decision with a given uniform ``u``: ``(x, True)`` when ``p[x] / q[x] >= u``,
    otherwise ``(a draw from residual_distribution(p, q), False)``."""
    raise NotImplementedError(
        'verify_token: ValueError unless 0 <= u < 1; prob = accept_prob(p, q, x); accept (x, True) when '
        'prob > 0 and u <= prob; otherwise draw from residual_distribution(p, q) with rng.choice and return '
        '(token, False)'
    )


def speculative_tokens(
    p: np.ndarray, q: np.ndarray, n: int, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``n`` independent draft-and-verify rounds at once: ``(tokens, drafts, accepted)``.

    Draw ``n`` drafts from ``q`` and ``n`` uniforms, accept where ``u <= min(1, p/q)`` at the draft,
    and replace every rejected draft by a draw from the residual. Vectorised: 200,000 rounds must
    take milliseconds. ``ValueError`` for ``n < 0``.
    """
    raise NotImplementedError(
        'speculative_tokens: validate; drafts = rng.choice(V, size=n, p=q); u = rng.random(n); accepted '
        '= u <= min(1, p[drafts] / q[drafts]) (0 where q is 0); replace the rejected drafts with rng.choice '
        'draws from the residual; return (tokens, drafts, accepted) as arrays, no Python loop over n'
    )


def expected_acceptance_rate(p: np.ndarray, q: np.ndarray) -> float:
    """α = Σ min(p, q): the overlap of the two distributions (1 − total-variation distance)."""
    raise NotImplementedError(
        'expected_acceptance_rate: validate p and q, return float(sum(min(p, q)))'
    )


def verify_greedy_token(p: np.ndarray, x: int) -> tuple[int, bool]:
    """Temperature 0: the target emits its argmax; the draft survives only if it is that argmax.

    Ties go to the lowest token id (numpy's and torch's argmax)."""
    raise NotImplementedError(
        'verify_greedy_token: best = argmax(p) (lowest id on ties); return (best, x == best)'
    )


# ----------------------------------------------------------------------------- the lab's pair (provided)

VOCAB = 10
UNIFORM_DRAFTER = np.full(VOCAB, 0.1)  # a clueless drafter
SKEWED_TARGET = np.array([0.30, 0.20, 0.10, 0.10, 0.10, 0.05, 0.05, 0.05, 0.05, 0.0])


def main() -> None:
    p, q = SKEWED_TARGET, UNIFORM_DRAFTER
    rng = np.random.default_rng(0)
    n = 200_000
    tokens, drafts, accepted = speculative_tokens(p, q, n, rng)
    hist = np.bincount(tokens, minlength=VOCAB) / n
    print(f"target p        : {np.array2string(p, precision=2, floatmode='fixed')}")
    print(f"drafter q       : {np.array2string(q, precision=2, floatmode='fixed')}")
    print(f"residual        : {np.array2string(residual_distribution(p, q), precision=3, floatmode='fixed')}")
    print(f"alpha = sum min : {expected_acceptance_rate(p, q):.4f}")
    print(f"accepted        : {accepted.mean():.4f} of {n:,} drafts")
    print(f"output histogram: {np.array2string(hist, precision=3, floatmode='fixed')}")
    print(f"max |hist - p|  : {np.abs(hist - p).max():.4f}  (4.5 sigma at p = 0.5 is {4.5 * np.sqrt(0.25 / n):.4f})")
    print(f"drafter = target: alpha {expected_acceptance_rate(p, p):.2f}; "
          f"disjoint drafter: alpha {expected_acceptance_rate(np.array([.5, .5, 0, 0]), np.array([0, 0, .5, .5])):.2f}")


if __name__ == "__main__":
    main()
