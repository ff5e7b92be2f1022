"""Lab 08-04 reference: read vLLM's own spec-decode counters and reconcile them with lab 03's model.

vLLM counts four things about speculation, per engine, whatever the drafter (n-gram, EAGLE, a
draft model): ``vllm:spec_decode_num_drafts`` (verify cycles that carried drafts),
``vllm:spec_decode_num_draft_tokens`` (drafts proposed), ``vllm:spec_decode_num_accepted_tokens``
(drafts kept) and ``vllm:spec_decode_num_accepted_tokens_per_pos`` (a vector: how many cycles kept
the draft at position 0, 1, …). ``LLM.get_metrics()`` returns them as ``Counter`` and ``Vector``
objects (``name``, ``labels``, ``value`` / ``values``), one per engine. This file turns them into
the numbers vLLM logs and into lab 03's α, and says how well the i.i.d. model fits.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from course.runtime import use_lab
from mini_vllm.spec_decode import NgramProposer

LAB03 = use_lab("phase-08/lab-03-speedup-model")

DRAFTS = "vllm:spec_decode_num_drafts"
DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens"
ACCEPTED = "vllm:spec_decode_num_accepted_tokens"
PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos"


@dataclass(frozen=True)
class SpecCounters:
    """vLLM's four spec-decode counters, summed over engines."""

    num_drafts: int
    num_draft_tokens: int
    num_accepted_tokens: int
    accepted_per_pos: tuple[int, ...]


@dataclass(frozen=True)
class Reconciliation:
    """Measured against lab 03's i.i.d. model at the α that reproduces the measured tokens per cycle."""

    k: int
    alpha: float                               # per-position rate, from the mean acceptance length
    tokens_per_cycle: float                    # measured: vLLM's mean acceptance length
    model_tokens_per_cycle: float              # lab 03's 1 + α + … + α^k at that α
    per_position: tuple[float, ...]            # measured: accepted at position i / cycles
    model_per_position: tuple[float, ...]      # the model's α^(i+1)
    max_position_gap: float                    # max |measured − model| over positions
    full_drafts: bool                          # every cycle carried k drafts (lab 03's assumption)


def read_spec_counters(metrics: Iterable[Any]) -> SpecCounters:
    """Sum the four counters over every engine in ``LLM.get_metrics()``'s list.

    Counters carry ``.value``; the per-position metric is a ``Vector`` with ``.values`` (summed
    element by element). Every other metric is ignored. ``ValueError`` when the list has no
    ``vllm:spec_decode_num_drafts`` (speculation off, or stats off: ``disable_log_stats=True``),
    and when two engines' vectors have different lengths.
    """
    totals = {DRAFTS: 0, DRAFT_TOKENS: 0, ACCEPTED: 0}
    per_pos: list[int] | None = None
    seen = False
    for metric in metrics:
        name = metric.name
        if name in totals:
            totals[name] += int(metric.value)
            seen = seen or name == DRAFTS
        elif name == PER_POS:
            values = [int(v) for v in metric.values]
            if per_pos is None:
                per_pos = values
            elif len(values) != len(per_pos):
                raise ValueError(f"per-position vectors of different lengths: {len(per_pos)} and {len(values)}")
            else:
                per_pos = [a + b for a, b in zip(per_pos, values)]
    if not seen:
        raise ValueError(
            f"no {DRAFTS} in the metrics: was speculative decoding on, and the engine built with disable_log_stats=False?"
        )
    return SpecCounters(totals[DRAFTS], totals[DRAFT_TOKENS], totals[ACCEPTED], tuple(per_pos or ()))


def _check(c: SpecCounters) -> None:
    if c.num_drafts <= 0:
        raise ValueError(f"no cycle carried drafts (num_drafts={c.num_drafts}): nothing to measure")
    if sum(c.accepted_per_pos) != c.num_accepted_tokens:
        raise ValueError(
            f"the per-position counts sum to {sum(c.accepted_per_pos)}, not to the {c.num_accepted_tokens} accepted tokens"
        )


def mean_acceptance_length(c: SpecCounters) -> float:
    """vLLM's "Mean acceptance length": tokens per cycle, the target's own token included."""
    _check(c)
    return 1.0 + c.num_accepted_tokens / c.num_drafts


def draft_acceptance_rate(c: SpecCounters) -> float:
    """vLLM's "Avg Draft acceptance rate" as a fraction: accepted per *proposed* draft token."""
    _check(c)
    if c.num_draft_tokens <= 0:
        raise ValueError("no draft tokens were proposed")
    return c.num_accepted_tokens / c.num_draft_tokens


def per_position_rates(c: SpecCounters) -> list[float]:
    """vLLM's "Per-position acceptance rate": cycles that kept the draft at position i, over all cycles."""
    _check(c)
    return [a / c.num_drafts for a in c.accepted_per_pos]


def conditional_rates(c: SpecCounters) -> list[float]:
    """P(draft i kept | drafts 0..i−1 kept): position 0 over all cycles, then each count over the previous.

    The i.i.d. model says every entry is α. ``nan`` where the previous position was never kept.
    """
    _check(c)
    out, before = [], c.num_drafts
    for a in c.accepted_per_pos:
        out.append(a / before if before else math.nan)
        before = a
    return out


def reconcile(c: SpecCounters, k: int) -> Reconciliation:
    """Fit lab 03's α to the measured tokens per cycle at ``k`` and compare the per-position rates.

    ``k`` is ``num_speculative_tokens``: ``ValueError`` unless it equals the length of vLLM's
    per-position vector.
    """
    _check(c)
    if k != len(c.accepted_per_pos):
        raise ValueError(f"k={k} but vLLM counted {len(c.accepted_per_pos)} draft positions: pass num_speculative_tokens")
    tokens = mean_acceptance_length(c)
    alpha = LAB03.alpha_from_tokens_per_verify(tokens, k)
    measured = per_position_rates(c)
    model = [alpha ** (i + 1) for i in range(k)]
    return Reconciliation(
        k=k,
        alpha=alpha,
        tokens_per_cycle=tokens,
        model_tokens_per_cycle=LAB03.expected_tokens_per_verify(alpha, k),
        per_position=tuple(measured),
        model_per_position=tuple(model),
        max_position_gap=max((abs(a - b) for a, b in zip(measured, model)), default=0.0),
        full_drafts=c.num_draft_tokens == k * c.num_drafts,
    )


def predict_ngram_counters(
    prompts: list[list[int]], outputs: list[list[int]], k: int, prompt_lookup_min: int, prompt_lookup_max: int,
    max_model_len: int = 512,
) -> SpecCounters:
    """The counters a greedy n-gram run *must* report, replayed from its prompts and output tokens.

    Greedy verification keeps a draft exactly when it equals the token the target emits, so the
    whole run is a function of the tokens. Per request: the prefill step emits ``outputs[0]`` with
    no drafts; then, while fewer than ``len(output)`` tokens are out, the drafter (mini_vllm's
    ``NgramProposer``, the same rule as vLLM's) proposes from prompt + tokens so far; a cycle with
    no draft is not counted; a cycle with drafts counts one draft cycle, its draft tokens, and its
    accepted prefix (the leading drafts equal to the next output tokens), and emits accepted + 1
    tokens.
    """
    if len(prompts) != len(outputs):
        raise ValueError(f"one output per prompt: {len(prompts)} prompts, {len(outputs)} outputs")
    proposer = NgramProposer(k, prompt_lookup_min, prompt_lookup_max, max_model_len)
    drafts = draft_tokens = accepted = 0
    per_pos = [0] * k
    for prompt, out in zip(prompts, outputs):
        done = 1 if out else 0                      # the prefill step samples the first token
        while done < len(out):
            context = np.asarray(list(prompt) + list(out[:done]), dtype=np.int64)
            proposal = proposer.propose([[out[done - 1]]], np.array([len(context)]), context[None, :])[0]
            kept = 0
            while kept < len(proposal) and done + kept < len(out) and proposal[kept] == out[done + kept]:
                kept += 1
            if proposal:
                drafts += 1
                draft_tokens += len(proposal)
                accepted += kept
                for i in range(kept):
                    per_pos[i] += 1
            done += kept + 1
    return SpecCounters(drafts, draft_tokens, accepted, tuple(per_pos))


def report(c: SpecCounters, k: int) -> str:
    """The lines ``run.py`` and ``main`` print: vLLM's three logged figures, then the reconciliation."""
    r = reconcile(c, k)
    rates = ", ".join(f"{x:.3f}" for x in r.per_position)
    model = ", ".join(f"{x:.3f}" for x in r.model_per_position)
    cond = ", ".join("nan" if math.isnan(x) else f"{x:.3f}" for x in conditional_rates(c))
    return "\n".join([
        f"counters: {c.num_drafts} cycles with drafts, {c.num_draft_tokens} drafted, {c.num_accepted_tokens} accepted, "
        f"per position {list(c.accepted_per_pos)}",
        f"mean acceptance length {r.tokens_per_cycle:.2f}   draft acceptance rate {draft_acceptance_rate(c):.1%}"
        f"   full drafts: {r.full_drafts}",
        f"per-position acceptance (measured): {rates}",
        f"lab 03 at alpha = {r.alpha:.3f}, k = {k}: {r.model_tokens_per_cycle:.2f} tokens per cycle; "
        f"per position alpha^(i+1): {model}",
        f"conditional rates (model: all equal alpha): {cond}   max per-position gap {r.max_position_gap:.3f}",
    ])


def main() -> None:
    # Two constructed workloads at k = 5, 1,000 cycles each, 2,800 accepted drafts (mean acceptance length 3.8):
    # one whose acceptances are i.i.d. (counts follow alpha^(i+1)), one whose first draft is easy and later
    # ones correlated (an n-gram-like drafter: when the first draft hits, the rest of the copy tends to hit).
    alpha = LAB03.alpha_from_tokens_per_verify(3.8, 5)
    iid = [round(1000 * alpha ** (i + 1)) for i in range(5)]
    iid[-1] += 2800 - sum(iid)
    correlated = [700, 560, 520, 510, 510]
    for name, per_pos in (("i.i.d. acceptances", iid), ("correlated acceptances", correlated)):
        c = SpecCounters(1000, 5000, sum(per_pos), tuple(per_pos))
        print(f"--- {name}")
        print(report(c, 5))


if __name__ == "__main__":
    main()
