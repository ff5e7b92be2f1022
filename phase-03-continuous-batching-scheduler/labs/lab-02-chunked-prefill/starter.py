"""Lab 06-02 starter: chunked prefill changes *when* a prompt is computed, never *what* comes out.

Write ``num_prefill_steps`` and ``predicted_chunks`` (the clamp's arithmetic for a request alone
in the engine) and ``observe`` (run a prompt through ``mini_vllm.LLMEngine`` and record, per
step, the request's scheduled tokens and whether it sampled).
Grade with: LAB_IMPL=starter pytest phase-03-continuous-batching-scheduler/labs/lab-02-chunked-prefill -q
"""

from __future__ import annotations

from typing import NamedTuple

import mini_vllm  # noqa: F401 (you will use these)
from mini_vllm import LLMEngine, SamplingParams, Scheduler  # noqa: F401

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
    raise NotImplementedError(
        "num_prefill_steps: chunk = min(threshold or budget, budget), then the ceiling of prompt_len / chunk "
        "(-(-a // b) is a ceiling division)"
    )


def predicted_chunks(prompt_len: int, threshold: int, budget: int) -> list[int]:
    """The chunk sizes of that prefill, e.g. ``[100, 100, 56]`` for 256 tokens at budget 100."""
    raise NotImplementedError(
        "predicted_chunks: the same chunk; divmod(prompt_len, chunk) gives how many full chunks and the remainder "
        "(no zero-sized last chunk)"
    )


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
    raise NotImplementedError(
        "observe: build LLMEngine(max_num_batched_tokens=budget, long_prefill_token_threshold=threshold), add the "
        "request (greedy, ignore_eos), wrap engine.scheduler.schedule to record out.num_scheduled_tokens[rid] "
        "and Scheduler.needs_sample(request, n) each step, then step until done"
    )


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
