"""Lab 09-01 starter: the sampling pipeline, batched, in vLLM's order.

Every function takes a batch of logits ``(B, V)`` and one knob per row, and returns a new array
(the input is never edited). A removed token is ``-inf``. ``process`` chains the stages in the
order of ``vllm/v1/sample/sampler.py``; ``sample`` draws one token per row from its own generator.
Write the seven functions that raise ``NotImplementedError``; ``softmax`` and the four stages
imported from ``mini_vllm.sampler`` are provided. Each message says what to do in words; when you
are stuck, ``python -m course hint 09-01`` lists code-level hints (they give the trick away).
Grade with: LAB_IMPL=starter pytest phase-09-sampling-and-decoding-algorithms/labs/lab-01-sampling-ops -q
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from mini_vllm import SamplingParams
from mini_vllm.sampler import (  # noqa: F401 (you will use these)
    apply_allowed_token_ids,
    apply_bad_words,
    apply_logit_bias,
    apply_min_tokens,
)
from mini_vllm.sampling_params import SAMPLING_EPS  # noqa: F401


def softmax(x: np.ndarray) -> np.ndarray:
    """Row-wise softmax with the max subtracted first (provided)."""
    e = np.exp(x - x.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def apply_temperature(logits: np.ndarray, temperature: np.ndarray) -> np.ndarray:
    """Divide row ``i`` by ``temperature[i]``; rows below ``SAMPLING_EPS`` (greedy) are left as they are."""
    raise NotImplementedError(
        "divide by the temperature, but replace temperatures below SAMPLING_EPS by 1.0 first (np.where)"
    )


def apply_top_k(logits: np.ndarray, k: np.ndarray) -> np.ndarray:
    """Keep every logit ``>=`` the row's k-th largest (ties at the cut all survive); ``k <= 0`` or
    ``k >= V`` leaves the row alone."""
    raise NotImplementedError(
        "for rows with 0 < k < V: find the row's k-th largest value, then remove only the logits strictly "
        "below it, so every tie at the cut survives (hint 1)"
    )


def apply_top_p(logits: np.ndarray, p: np.ndarray) -> np.ndarray:
    """Keep the shortest prefix of the tokens, most probable first (equal probabilities: lowest id
    first), whose probabilities sum to at least ``p``: the token that crosses ``p`` stays, an exact
    hit stops there. ``p = 1`` leaves the row alone."""
    raise NotImplementedError(
        "per row with p < 1: walk the tokens from most to least probable (ties: lowest id first) adding "
        "probabilities; keep every token before the sum reaches p, and the one that makes it reach p (hint 2)"
    )


def apply_min_p(logits: np.ndarray, min_p: np.ndarray) -> np.ndarray:
    """Remove every token whose probability is below ``min_p * (the row's top probability)``."""
    raise NotImplementedError(
        "probs = softmax(logits); mask probs < min_p[:, None] * probs.max(axis=1, keepdims=True)"
    )


def apply_penalties(
    logits: np.ndarray,
    prompt_token_ids: Sequence[Sequence[int]],
    output_token_ids: Sequence[Sequence[int]],
    presence: np.ndarray,
    frequency: np.ndarray,
    repetition: np.ndarray,
) -> np.ndarray:
    """Repetition first (ids seen in the prompt *or* the output: a positive logit times ``1/r``,
    a zero or negative one times ``r``), then ``- frequency * count in the output``, then
    ``- presence`` once for any id in the output."""
    raise NotImplementedError(
        "count each id's occurrences in the row's output; seen = in the prompt or the output; "
        "repetition on seen, then frequency * count, then presence (hint 4)"
    )


def process(
    logits: np.ndarray,
    params: Sequence[SamplingParams],
    output_token_ids: Sequence[Sequence[int]],
    prompt_token_ids: Sequence[Sequence[int]],
    eos_token_id: int | None = None,
) -> np.ndarray:
    """The whole pipeline in vLLM's order. Greedy rows stop after the penalties (their argmax is
    taken there); random rows go on through temperature, min-p, top-k and top-p.

    The first four stages are provided by ``mini_vllm.sampler``; each edits ``logits`` in place
    and returns it:

    * ``apply_allowed_token_ids(logits, allowed: Sequence[Sequence[int] | None])``: one entry per
      row (``params[i].allowed_token_ids``, ``None`` = no limit);
    * ``apply_bad_words(logits, bad_words: dict[int, Sequence[Sequence[int]]], past_tokens)``:
      row index -> that row's ``bad_words_token_ids``; ``past_tokens`` = the outputs so far;
    * ``apply_min_tokens(logits, rows: Sequence[int], stop_ids: Sequence[Sequence[int]])``: the
      rows with fewer than ``min_tokens`` outputs, and for each its stop ids (plus
      ``eos_token_id`` unless ``ignore_eos``);
    * ``apply_logit_bias(logits, biases: dict[int, Sequence[tuple[int, float]]])``: row index ->
      that row's ``logit_bias`` (``(token id, bias)`` pairs).
    """
    raise NotImplementedError(
        "allowed ids, bad words, min-tokens, logit bias (provided), your penalties; "
        "then, random rows only: temperature, min-p, top-k, top-p"
    )


def sample(
    logits: np.ndarray,
    params: Sequence[SamplingParams],
    generators: Sequence[np.random.Generator | None],
    output_token_ids: Sequence[Sequence[int]] | None = None,
    prompt_token_ids: Sequence[Sequence[int]] | None = None,
    eos_token_id: int | None = None,
) -> list[int]:
    """One token per row. Greedy rows: argmax of the processed logits (lowest id on ties), no
    randomness used. Random rows, in row order: ``u = generator.random()`` (``None``: a fresh
    ``default_rng(seed)``), then the first id whose cumulative probability exceeds ``u``."""
    raise NotImplementedError(
        "process(), then per row: greedy -> argmax; else draw one uniform u from the row's generator (or a "
        "fresh one seeded with params.seed) and return the first id whose cumulative probability exceeds u (hint 3)"
    )


def _kept(row: np.ndarray) -> str:
    return " ".join(f"{t}" for t in np.flatnonzero(np.isfinite(row)))


def main() -> None:
    probs = np.array([0.5, 0.25, 0.125, 0.0625, 0.03125, 0.03125])  # dyadic: every sum is exact
    x = np.log(probs)[None]
    print("probabilities  ", " ".join(f"{p:g}" for p in probs))
    print("top_k=3         keeps", _kept(apply_top_k(x, np.array([3]))[0]))
    print(
        "top_p=0.875     keeps",
        _kept(apply_top_p(x, np.array([0.875]))[0]),
        " (0.5+0.25+0.125 = 0.875: exact hit)",
    )
    print("top_p=0.9       keeps", _kept(apply_top_p(x, np.array([0.9]))[0]), " (the crossing token stays)")
    print("min_p=0.2       keeps", _kept(apply_min_p(x, np.array([0.2]))[0]), " (threshold 0.2 x 0.5 = 0.1)")
    hot = apply_temperature(x, np.array([2.0]))
    print("T=2 then min_p  keeps", _kept(apply_min_p(hot, np.array([0.2]))[0]), " (flatter: more survive)")
    row = np.array([[2.0, -2.0, 1.0, 1.0, 1.0]])
    pen = apply_penalties(row, [[0]], [[1, 2, 2]], np.array([0.5]), np.array([0.25]), np.array([2.0]))
    print(
        "penalties       [2, -2, 1, 1, 1] with prompt [0], output [1, 2, 2], presence 0.5, frequency 0.25,"
        " repetition 2"
    )
    print("                ->", pen[0].tolist())
    sp = SamplingParams(temperature=0.7, top_k=4, top_p=0.9, min_p=0.1, seed=7)
    g = np.random.default_rng(7)
    draws = [sample(x, [sp], [g])[0] for _ in range(12)]
    print("12 seeded draws (T=0.7, top_k=4, top_p=0.9, min_p=0.1, seed 7):", draws)


if __name__ == "__main__":
    main()
