"""Lab 06-05 starter: predict prefix-cache savings to the token, then check them.

The meter is the total number of tokens the scheduler hands out over a run (the sum of
``SchedulerOutput.total_num_scheduled_tokens`` over every ``schedule()``). Write ``run_and_count``
(measure it on ``mini_vllm.LLMEngine``) and ``predicted_savings`` / ``predicted_total`` (predict it).
Grade with: LAB_IMPL=starter pytest phase-03-continuous-batching-scheduler/labs/lab-05-prefix-cache-savings -q
"""

from __future__ import annotations

import mini_vllm  # noqa: F401 (you will use these)
from mini_vllm import LLMEngine, SamplingParams  # noqa: F401

BLOCK_SIZE = 4
MAX_TOKENS = 4
SYSTEM = "S" * 64  # 64 byte-tokens = 16 full blocks of 4
PROMPTS = [SYSTEM + str(i) for i in range(8)]  # 65 tokens each, unique last token


def run_and_count(
    prompts: list[str],
    enable_caching: bool,
    block_size: int = BLOCK_SIZE,
    max_tokens: int = MAX_TOKENS,
    num_gpu_blocks: int = 256,
) -> tuple[int, list[list[int]]]:
    """Generate greedily (``ignore_eos``) and count every token the scheduler hands out.

    Returns ``(total scheduled tokens, generated token ids per prompt)``. All prompts are passed
    to one ``generate`` call, so they are admitted in the same step.
    """
    raise NotImplementedError(
        "run_and_count: LLMEngine(num_gpu_blocks=..., block_size=..., enable_prefix_caching=enable_caching); wrap "
        "engine.scheduler.schedule to add out.total_num_scheduled_tokens to a running total; engine.generate(prompts, "
        "greedy + ignore_eos); return (total, [o.token_ids for o in outputs])"
    )


def predicted_savings(num_requests: int, prompt_len: int, shared_prefix_len: int, block_size: int) -> int:
    """Tokens caching saves when ``num_requests`` prompts of ``prompt_len`` share ``shared_prefix_len``.

    Every follower (all but the first) adopts the shared prefix's *full* blocks, but never a block
    holding its last prompt token: hits stop at ``prompt_len - 1`` tokens, in whole blocks.
    """
    raise NotImplementedError(
        "predicted_savings: each of the num_requests - 1 followers adopts min(shared // block_size, "
        "(prompt_len - 1) // block_size) full blocks"
    )


def predicted_total(
    num_requests: int, prompt_len: int, shared_prefix_len: int, max_tokens: int, block_size: int, enable_caching: bool
) -> int:
    """Scheduled tokens over the run: each request computes prompt + max_tokens - 1, minus the hits."""
    raise NotImplementedError(
        "predicted_total: num_requests * (prompt_len + max_tokens - 1), minus predicted_savings when caching is on"
    )


def main() -> None:
    off, tokens_off = run_and_count(PROMPTS, enable_caching=False)
    on, tokens_on = run_and_count(PROMPTS, enable_caching=True)
    n, length = len(PROMPTS), len(PROMPTS[0])
    print(f"8 prompts = 64 shared + 1 unique byte-token, block_size {BLOCK_SIZE}, max_tokens {MAX_TOKENS}, greedy")
    print(f"  caching off: {off} tokens scheduled (predicted {predicted_total(n, length, 64, MAX_TOKENS, BLOCK_SIZE, False)})")
    print(f"  caching on : {on} tokens scheduled (predicted {predicted_total(n, length, 64, MAX_TOKENS, BLOCK_SIZE, True)})")
    saved = off - on
    print(f"  saved {saved} = {predicted_savings(n, length, 64, BLOCK_SIZE)} predicted "
          f"({saved / off:.1%} of the work); outputs identical: {tokens_off == tokens_on}")

    print("\nother shapes (8 requests, max_tokens 4):")
    cases = [
        ("66-token shared prefix + 1 unique", ["S" * 66 + str(i) for i in range(8)], 66),
        ("identical 64-token prompts", ["S" * 64] * 8, 64),
        ("nothing shared (unique first token)", [str(i) + "S" * 64 for i in range(8)], 0),
    ]
    for name, prompts, shared in cases:
        off, _ = run_and_count(prompts, enable_caching=False)
        on, _ = run_and_count(prompts, enable_caching=True)
        pred = predicted_savings(len(prompts), len(prompts[0]), shared, BLOCK_SIZE)
        print(f"  {name:<38} off {off:>4}  on {on:>4}  saved {off - on:>4}  predicted {pred:>4}")


if __name__ == "__main__":
    main()
