"""Lab 08-01 starter: an n-gram drafter and a greedy verifier, around a deterministic target.

The "big model" is any function ``target(context) -> token`` (greedy, so reproducible). A cycle
asks the drafter for up to ``k`` guesses, checks them against the target left to right as one
verify pass would, keeps the matching run, and appends the target's own next token (the
correction after a miss, or the bonus after a clean sweep). ``run_speculative`` repeats cycles and
counts them; ``run_baseline`` is plain greedy decoding, one target run per token. The drafter
follows vLLM's ``NgramProposer`` rule, so ``mini_vllm.spec_decode`` gives the same drafts.

Write ``ngram_propose``, ``verify_greedy``, ``run_speculative`` and ``run_baseline``; the demo targets and
``main`` are provided.
Grade with: LAB_IMPL=starter pytest phase-08-speculative-decoding/labs/lab-01-ngram-spec-decode -q
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

Target = Callable[[list[int]], int]


class SpecStats(NamedTuple):
    runs: int  # target verify passes (one per cycle)
    proposed: int  # draft tokens the target checked
    accepted: int  # draft tokens it kept


def ngram_propose(context: list[int], k: int, min_n: int = 1, max_n: int = 3) -> list[int]:
    """Up to ``k`` draft tokens copied from what followed an earlier match of the context's tail.

    Try ``n`` from ``max_n`` down to ``min_n``: the last ``n`` tokens must occur earlier in
    ``context`` as a block that ends before the last token (the tail never matches itself). The
    first ``n`` that has such an occurrence wins; among its occurrences take the **earliest**
    (vLLM's tie-break). Return the up-to-``k`` tokens that follow it (fewer when the context ends
    first), or ``[]`` when no ``n`` matches. ``ValueError`` when ``k < 1`` or
    ``not 1 <= min_n <= max_n``.
    """
    raise NotImplementedError(
        'ngram_propose: for n from max_n down to min_n, look for the last n tokens at an earlier start s '
        'with s + n <= len(context) - 1; the first n with a hit wins, the earliest s breaks ties; return '
        'context[s + n : s + n + k] (or [] when nothing matches); ValueError unless k >= 1 and 1 <= min_n '
        '<= max_n'
    )


def verify_greedy(context: list[int], proposed: list[int], target: Target) -> tuple[list[int], int]:
    """Check ``proposed`` against the target; return (tokens emitted this cycle, drafts accepted).

    Proposal ``i`` is accepted when it equals ``target(context + accepted so far)``: the context
    grows with every acceptance. Stop at the first mismatch. Then append the target's own token
    for the next position (the correction, or the bonus when all were accepted), so a cycle
    always emits at least one token and at most ``len(proposed) + 1``.
    """
    raise NotImplementedError(
        'verify_greedy: walk the proposals, accepting each that equals target(context + accepted_so_far); '
        'stop at the first mismatch; then append target(context + accepted_so_far) (correction or bonus); '
        'return (emitted, number_accepted)'
    )


def run_speculative(
    prompt: list[int], target: Target, num_tokens: int, k: int = 4, min_n: int = 1, max_n: int = 3
) -> tuple[list[int], SpecStats]:
    """Generate exactly ``num_tokens`` tokens with draft-and-verify cycles; return them and the counts.

    Each cycle: draft with ``ngram_propose(prompt + generated, k, min_n, max_n)``, verify with
    ``verify_greedy``, extend. A cycle may overshoot ``num_tokens``: keep only the first
    ``num_tokens`` (the counts describe the cycles that ran). ``ValueError`` on an empty prompt or
    a negative ``num_tokens``.
    """
    raise NotImplementedError(
        'run_speculative: validate (non-empty prompt, num_tokens >= 0); loop while fewer than num_tokens '
        'tokens: draft with ngram_propose(prompt + generated, k, min_n, max_n), verify with verify_greedy, '
        'extend, count runs/proposed/accepted; return generated[:num_tokens] and SpecStats'
    )


def run_baseline(prompt: list[int], target: Target, num_tokens: int) -> list[int]:
    """Plain greedy decoding: one target run per token."""
    raise NotImplementedError(
        'run_baseline: validate the prompt, then append target(tokens) num_tokens times and return the new tokens'
    )


# ----------------------------------------------------------------------------- demo targets (provided)


def periodic_target(period: int = 7, noise_every: int = 0) -> Target:
    """Repeats the token ``period`` positions back (a looping, highly guessable text).

    With ``noise_every > 0``, every ``noise_every``-th position gets a fresh token instead, so some
    guesses fail.
    """
    def target(context: list[int]) -> int:
        position = len(context)
        if noise_every and position % noise_every == 0:
            return 1000 + position
        return context[position - period] if position >= period else position % period
    return target


def fresh_target() -> Target:
    """A new token at every position: nothing ever repeats, so the drafter has nothing to copy."""
    return lambda context: 10_000 + len(context)


def main() -> None:
    prompt, num_tokens = [0, 1, 2, 3, 4, 5, 6], 64
    print(f"{'target':<22} {'k':>2} {'runs':>5} {'proposed':>8} {'accepted':>8} {'tokens/run':>10}  same as baseline")
    # tokens/run = (accepted + runs) / runs: every cycle emits its accepted drafts plus one target token
    for name, target in (("periodic (7)", periodic_target()), ("periodic, noise/11", periodic_target(7, 11)),
                         ("fresh every position", fresh_target())):
        baseline = run_baseline(prompt, target, num_tokens)
        for k in (2, 4, 8):
            tokens, stats = run_speculative(prompt, target, num_tokens, k=k)
            print(f"{name:<22} {k:>2} {stats.runs:>5} {stats.proposed:>8} {stats.accepted:>8} "
                  f"{(stats.accepted + stats.runs) / stats.runs:>10.2f}  {tokens == baseline}")


if __name__ == "__main__":
    main()
