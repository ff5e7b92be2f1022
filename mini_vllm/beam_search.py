"""Beam search, run from outside the engine one token at a time, as vLLM runs it.

Mirrors ``vllm/entrypoints/generate/beam_search/offline.py`` (``BeamSearchOfflineMixin.beam_search``,
what ``LLM.beam_search`` runs) and ``vllm/entrypoints/generate/beam_search/utils.py``
(``BeamSearchSequence``, ``BeamSearchOutput``, ``get_beam_search_score``). The engine knows
nothing of beams: each step every live beam is a fresh request of ``max_tokens = 1``; its
candidates (the sampled token, then the ``2 * beam_width`` likeliest) are scored by
``cum_logprob / seq_len ** length_penalty`` and the ``beam_width`` best live on. README.md
("Beam search") gives the loop in full. The engine is typed by a ``Protocol`` here, so this module
never imports ``engine.py`` (which imports it).

Left out, and why: the logprobs come from the raw log-softmax of the toy model's row for the
beam's last token and position (``LLMEngine.step`` hands no logprobs back yet), so a checkpoint's
engine refuses beam search; no LoRA, multimodal or encoder-decoder prompts, no
``concurrency_limit``, no progress bar. A prompt whose length plus ``max_tokens`` exceeds
``max_model_len`` is refused up front (upstream drops a beam that hits the limit).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from .sampler import log_softmax
from .sampling_params import BeamSearchParams, SamplingParams
from .tokenizer import Prompt


class LLMEngine(Protocol):
    """What beam search needs of the engine (``engine.LLMEngine``; no import, so no cycle)."""

    tokenizer: Any
    max_model_len: int
    model: Any  # answers forward(last_tokens, positions) -> logits, as ToyModel does

    def _tokenize(self, prompt: Prompt) -> list[int]: ...

    def generate(self, prompts: Any, sampling_params: Any = None) -> list[Any]: ...


@dataclass(slots=True)
class BeamSearchSequence:
    """One hypothesis: ``tokens`` holds the prompt and what was generated, ``cum_logprob`` the sum of
    the generated tokens' logprobs, ``text`` the whole sequence decoded (filled in at the end)."""

    tokens: list[int]
    cum_logprob: float = 0.0
    text: str | None = None


@dataclass(frozen=True)
class BeamSearchOutput:
    """The best ``beam_width`` sequences of one prompt (fewer if fewer exist), best first."""

    sequences: list[BeamSearchSequence]


def get_beam_search_score(
    tokens: Sequence[int], cumulative_logprob: float, eos_token_id: int, length_penalty: float = 1.0
) -> float:
    """``cumulative_logprob / seq_len ** length_penalty``; ``seq_len`` counts every token but a final EOS."""
    seq_len = len(tokens)
    if tokens[-1] == eos_token_id:
        seq_len -= 1
    return cumulative_logprob / seq_len**length_penalty


def _normalize_prompts(engine: LLMEngine, prompts: Prompt | Sequence[Prompt], max_tokens: int) -> list[list[int]]:
    if isinstance(prompts, str):
        prompts = [prompts]
    if not isinstance(prompts, (list, tuple)):
        raise TypeError(f"prompts must be a str or a list of prompts, got {type(prompts).__name__}")
    if prompts and all(isinstance(p, (int, np.integer)) and not isinstance(p, bool) for p in prompts):
        raise TypeError("prompts looks like one list of token ids; wrap it in a list: [[...]]")
    token_lists = [engine._tokenize(p) for p in prompts]
    for ids in token_lists:
        if len(ids) + max_tokens > engine.max_model_len:
            raise ValueError(
                f"a prompt of {len(ids)} tokens plus max_tokens={max_tokens} is longer than "
                f"max_model_len={engine.max_model_len}"
            )
    return token_lists


def beam_search(engine: LLMEngine, prompts: Prompt | Sequence[Prompt], params: BeamSearchParams) -> list[BeamSearchOutput]:
    """Beam search for each prompt (a ``str`` or token ids, or a list of them); outputs in input order."""
    if not isinstance(params, BeamSearchParams):
        raise TypeError(f"params must be a BeamSearchParams, got {type(params).__name__}")
    width, eos, lp = params.beam_width, engine.tokenizer.eos_token_id, params.length_penalty
    token_lists = _normalize_prompts(engine, prompts, params.max_tokens)
    step_params = SamplingParams(max_tokens=1, temperature=params.temperature, logprobs=2 * width)

    def key(beam: BeamSearchSequence) -> float:
        return get_beam_search_score(beam.tokens, beam.cum_logprob, eos, lp)

    live = [[BeamSearchSequence(list(ids))] for ids in token_lists]
    completed: list[list[BeamSearchSequence]] = [[] for _ in token_lists]
    for _ in range(params.max_tokens):
        all_beams = [beam for beams in live for beam in beams]
        if not all_beams:
            break
        outputs = engine.generate([beam.tokens for beam in all_beams], step_params)
        last = np.array([beam.tokens[-1] for beam in all_beams])
        positions = np.array([len(beam.tokens) - 1 for beam in all_beams])
        rows = log_softmax(engine.model.forward(last, positions))
        k = 0
        for i, beams in enumerate(live):
            candidates = []
            for beam in beams:
                row, sampled = rows[k], outputs[k].token_ids[0]
                k += 1
                # the logprobs upstream hands back: the sampled token, then the 2 * width likeliest
                top = np.argsort(-row, kind="stable")[: 2 * width].tolist()
                for tok in dict.fromkeys([sampled, *top]):
                    new = BeamSearchSequence([*beam.tokens, tok], beam.cum_logprob + row[tok])
                    if tok == eos and not params.ignore_eos:
                        completed[i].append(new)
                    else:
                        candidates.append(new)
            live[i] = sorted(candidates, key=key, reverse=True)[:width]
    results = []
    for done, beams in zip(completed, live):
        best = sorted(done + beams, key=key, reverse=True)[:width]
        for beam in best:
            beam.cum_logprob = float(beam.cum_logprob)
            beam.text = engine.tokenizer.decode(beam.tokens)
        results.append(BeamSearchOutput(best))
    return results
