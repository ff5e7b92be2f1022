"""Lab 09-03 starter: beam search as vLLM runs it (outside the engine, one step at a time),
on a bigram toy model with a garden path that greedy decoding walks into.

Write ``beam_score``, ``greedy`` and ``beam_search``; the toy model and ``top_candidates`` are provided.
Grade with: LAB_IMPL=starter pytest phase-09-sampling-and-decoding-algorithms/labs/lab-03-beam-search -q
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

Model = Callable[[Sequence[int]], np.ndarray]  # tokens so far -> log-probabilities of the next (V,)

EOS = 0
# A bigram model over 6 ids: 0 EOS, 1 the prompt, 2 "a" (likely first, then a spread-out future),
# 3 "b" (less likely first, then almost surely EOS), 4 and 5 (each followed by EOS).
GARDEN_PATH = {
    0: {0: 1.0},
    1: {2: 0.6, 3: 0.4},
    2: {4: 0.35, 5: 0.35, 0: 0.3},
    3: {0: 0.9, 4: 0.1},
    4: {0: 1.0},
    5: {0: 1.0},
}


def bigram_model(table: dict[int, dict[int, float]], vocab: int) -> Model:
    """Provided: a model whose next-token distribution depends on the last token only."""
    rows = np.full((vocab, vocab), -np.inf)
    for prev, nxt in table.items():
        for tok, p in nxt.items():
            rows[prev, tok] = math.log(p)

    def model(tokens: Sequence[int]) -> np.ndarray:
        return rows[tokens[-1]].copy()

    return model


@dataclass(frozen=True)
class Beam:
    """A hypothesis: ``tokens`` holds the prompt and what was generated (as vLLM's
    ``BeamSearchSequence`` does), ``cum_logprob`` the sum of the generated tokens' log-probabilities."""

    tokens: tuple[int, ...]
    cum_logprob: float


def beam_score(
    tokens: Sequence[int], cum_logprob: float, eos_token_id: int, length_penalty: float = 1.0
) -> float:
    """vLLM's ranking: ``cum_logprob / seq_len ** length_penalty``, where ``seq_len`` counts every
    token (the prompt's too) except a final EOS."""
    raise NotImplementedError(
        "seq_len = len(tokens), minus one if the last token is EOS; "
        "return cum_logprob / seq_len ** length_penalty"
    )


def top_candidates(logprobs: np.ndarray, n: int) -> list[int]:
    """Provided: the ``n`` most likely ids, most likely first, equal log-probabilities lowest id
    first; impossible ids (``-inf``) never."""
    order = np.argsort(-logprobs, kind="stable")[:n]
    return [int(t) for t in order if np.isfinite(logprobs[t])]


def greedy(model: Model, prompt: Sequence[int], max_tokens: int, eos_token_id: int) -> Beam:
    """Take the argmax (lowest id on ties) each step; stop after EOS or ``max_tokens`` tokens."""
    raise NotImplementedError(
        "append argmax(model(tokens)) and add its logprob, max_tokens times, stopping right after EOS"
    )


def beam_search(
    model: Model,
    prompt: Sequence[int],
    beam_width: int,
    max_tokens: int,
    eos_token_id: int,
    length_penalty: float = 1.0,
    ignore_eos: bool = False,
) -> list[Beam]:
    """vLLM's beam search, for one prompt. Each step every live beam proposes its
    ``2 * beam_width`` most likely next tokens; a candidate ending in EOS is finished (unless
    ``ignore_eos``) and set aside, the others compete, and the ``beam_width`` best by
    ``beam_score`` live on. After ``max_tokens`` steps (or when no beam is live) the finished and
    the live beams are ranked together; the best ``beam_width`` are returned, best first."""
    raise NotImplementedError(
        "validate; beams = [Beam(prompt, 0)]; each step expand each beam by top_candidates(lp, 2 * beam_width), "
        "EOS -> completed, keep the best beam_width by beam_score; finally rank completed + beams"
    )


def main() -> None:
    model = bigram_model(GARDEN_PATH, 6)
    g = greedy(model, [1], 4, EOS)
    print(
        f"greedy          {list(g.tokens)}  p = {math.exp(g.cum_logprob):.3f}  score = "
        f"{beam_score(g.tokens, g.cum_logprob, EOS):.4f}"
    )
    for width in (1, 2, 3):
        for b in beam_search(model, [1], width, 4, EOS)[:2]:
            print(
                f"beam width {width}    {list(b.tokens)}  p = {math.exp(b.cum_logprob):.3f}  score = "
                f"{beam_score(b.tokens, b.cum_logprob, EOS):.4f}"
            )
    print(
        "length_penalty 0 (raw log-probability):",
        [list(b.tokens) for b in beam_search(model, [1], 2, 4, EOS, length_penalty=0.0)],
    )


if __name__ == "__main__":
    main()
