"""MUTANT (threshold_overrides_budget): uses the threshold as the chunk even when it is larger than the budget.

Lab 06-02 reference: chunked prefill changes *when* a prompt is computed, never *what* comes out.

``num_prefill_steps`` and ``predicted_chunks`` are the arithmetic of the clamp for a request
alone in the engine; ``observe`` runs a prompt through ``mini_vllm.LLMEngine`` and records, for
each step, how many tokens the request got and whether it sampled (``Scheduler.needs_sample``).
"""

from __future__ import annotations

from typing import NamedTuple

import mini_vllm
from mini_vllm import LLMEngine, SamplingParams, Scheduler

PROMPT_256 = ("The quick brown fox jumps over the lazy dog. " * 6)[:256]  # 256 byte-tokens


class Observed(NamedTuple):
    scheduled: list[int]  # tokens the request got in each step it was scheduled
    sampled: list[bool]  # did that step end with a sampled token?
    token_ids: list[int]  # the generated tokens


def num_prefill_steps(prompt_len: int, threshold: int, budget: int) -> int:
    """Steps a lone request needs to prefill ``prompt_len`` tokens.

    The chunk is ``threshold`` when it is set (``> 0``), else the whole budget, and never more
    than the budget: ``chunk = min(threshold or budget, budget)``; steps = ``ceil(prompt_len / chunk)``.
    """
    chunk = threshold or budget
    return -(-prompt_len // chunk)


def predicted_chunks(prompt_len: int, threshold: int, budget: int) -> list[int]:
    """The chunk sizes of that prefill, e.g. ``[100, 100, 56]`` for 256 tokens at budget 100."""
    chunk = threshold or budget
    full, rest = divmod(prompt_len, chunk)
    return [chunk] * full + ([rest] if rest else [])


def observe(
    prompt: str | list[int],
    threshold: int,
    budget: int = 2048,
    max_tokens: int = 4,
) -> Observed:
    """Generate ``max_tokens`` greedy tokens for ``prompt`` alone in a ``mini_vllm.LLMEngine``.

    Wrap ``engine.scheduler.schedule`` so every step records this request's scheduled tokens and
    ``Scheduler.needs_sample(request, n)`` (read right after ``schedule()``: mini advances the
    counters later, in ``update_from_output``).
    """
    engine = LLMEngine(max_num_batched_tokens=budget, long_prefill_token_threshold=threshold)
    rid = engine.add_request(prompt, SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True))
    scheduled: list[int] = []
    sampled: list[bool] = []
    schedule = engine.scheduler.schedule

    def probe() -> mini_vllm.SchedulerOutput:
        out = schedule()
        for request in out.scheduled_requests:
            if request.request_id == rid:
                n = out.num_scheduled_tokens[rid]
                scheduled.append(n)
                sampled.append(Scheduler.needs_sample(request, n))
        return out

    engine.scheduler.schedule = probe
    token_ids: list[int] = []
    while engine.has_unfinished_requests():
        for output in engine.step():
            token_ids = output.token_ids
    return Observed(scheduled, sampled, token_ids)


def main() -> None:
    print("a 256-token prompt, budget 2048, max_tokens 4 (greedy)")
    for threshold in (0, 64, 100, 7):
        steps = num_prefill_steps(256, threshold, 2048)
        obs = observe(PROMPT_256, threshold)
        chunks = " ".join(str(n) for n in obs.scheduled)
        flags = "".join("S" if s else "." for s in obs.sampled)
        print(f"  threshold {threshold:>3}: {steps:>2} prefill steps | per step: {chunks}")
        print(f"                 sampled: {flags}   tokens {obs.token_ids}")
    print("\nbudget binds when the threshold is larger: num_prefill_steps(256, 512, 100) =",
          num_prefill_steps(256, 512, 100), predicted_chunks(256, 512, 100))


if __name__ == "__main__":
    main()
