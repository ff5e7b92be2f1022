"""MUTANT (blocks_for_every_token): reserves KV for the last sampled token as well (prompt + max_tokens).

Lab 06-04 reference: surviving memory pressure with recompute preemption.

Two 8-token prompts share a KV pool of 5 blocks x 4 slots. Block 0 is the null block, so 16 slots
hold KV. The configuration first proposed for this lab (``max_tokens=20``) can never deliver its
tokens: ``kv_blocks_needed`` and ``max_tokens_that_fit`` say why and what fits instead. ``trace``
runs the prompts through ``mini_vllm.LLMEngine`` and records every step's schedule and
preemptions; ``run`` returns just the tokens, which must equal a roomy pool's.
"""

from __future__ import annotations

from typing import NamedTuple

import mini_vllm
from mini_vllm import LLMEngine, SamplingParams

PROMPTS = ["abcdefgh", "ijklmnop"]  # 8 byte-tokens each
CRAMPED = {"num_gpu_blocks": 5, "block_size": 4}
ROOMY = {"num_gpu_blocks": 256, "block_size": 4}
FIRST_PROPOSAL = 20  # the max_tokens first written for this lab: it cannot fit


class Trace(NamedTuple):
    token_ids: list[list[int]]  # generated tokens, one list per prompt
    finish_reasons: list[str | None]
    scheduled: list[dict[str, int]]  # per step: request id -> tokens
    preempted: list[set[str]]  # per step: ids preempted in that step
    num_preemptions: dict[str, int]  # per request, over the whole run


def kv_blocks_needed(prompt_len: int, max_tokens: int, block_size: int) -> int:
    """Blocks one request holds at the end: every token but the last sampled one has KV."""
    return -(-(prompt_len + max_tokens) // block_size)


def max_tokens_that_fit(num_gpu_blocks: int, block_size: int, prompt_len: int) -> int:
    """The largest ``max_tokens`` one request can reach in this pool, alone.

    The usable pool is ``(num_gpu_blocks - 1) * block_size`` slots (block 0 is the null block).
    The engine caps ``max_model_len`` at that, and a request stops when ``num_tokens`` (prompt +
    outputs, *including* the last sampled token) reaches ``max_model_len``.
    """
    return (num_gpu_blocks - 1) * block_size - prompt_len


def make_engine(num_gpu_blocks: int, block_size: int) -> LLMEngine:
    """An engine over a pool of ``num_gpu_blocks`` blocks of ``block_size`` slots (caching on)."""
    return LLMEngine(num_gpu_blocks=num_gpu_blocks, block_size=block_size, max_num_seqs=8)


def trace(prompts: list[str], num_gpu_blocks: int, block_size: int, max_tokens: int) -> Trace:
    """Generate greedily (``ignore_eos``) and record each step's schedule and preemptions."""
    engine = make_engine(num_gpu_blocks, block_size)
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    ids = [engine.add_request(p, params) for p in prompts]
    requests = {rid: engine.scheduler.requests[rid] for rid in ids}
    scheduled: list[dict[str, int]] = []
    preempted: list[set[str]] = []
    schedule = engine.scheduler.schedule

    def probe() -> mini_vllm.SchedulerOutput:
        out = schedule()
        scheduled.append(dict(out.num_scheduled_tokens))
        preempted.append(set(out.preempted_req_ids))
        return out

    engine.scheduler.schedule = probe
    outputs = {}
    while engine.has_unfinished_requests():
        for output in engine.step():
            outputs[output.request_id] = output
    return Trace(
        token_ids=[outputs[rid].token_ids for rid in ids],
        finish_reasons=[outputs[rid].finish_reason for rid in ids],
        scheduled=scheduled,
        preempted=preempted,
        num_preemptions={rid: requests[rid].num_preemptions for rid in ids},
    )


def run(prompts: list[str], num_gpu_blocks: int, block_size: int, max_tokens: int) -> list[list[int]]:
    """The generated token ids, one list per prompt."""
    return trace(prompts, num_gpu_blocks, block_size, max_tokens).token_ids


def main() -> None:
    usable = (CRAMPED["num_gpu_blocks"] - 1) * CRAMPED["block_size"]
    need = kv_blocks_needed(8, FIRST_PROPOSAL, CRAMPED["block_size"])
    fit = max_tokens_that_fit(**CRAMPED, prompt_len=8)
    print(f"pool: {CRAMPED['num_gpu_blocks']} blocks x {CRAMPED['block_size']} slots, minus the null block = {usable} slots")
    print(f"max_tokens={FIRST_PROPOSAL}: one request needs {need} blocks of KV, the pool has "
          f"{CRAMPED['num_gpu_blocks'] - 1}; largest max_tokens that fits: {fit}")

    first = trace(PROMPTS, **CRAMPED, max_tokens=FIRST_PROPOSAL)
    print(f"  as first written: {[len(t) for t in first.token_ids]} tokens of {FIRST_PROPOSAL}, "
          f"finish reasons {first.finish_reasons} (cut at max_model_len, silently short)")

    cramped = trace(PROMPTS, **CRAMPED, max_tokens=fit)
    roomy = trace(PROMPTS, **ROOMY, max_tokens=fit)
    print(f"\nmax_tokens={fit}, cramped pool, step by step:")
    for i, (sched, pre) in enumerate(zip(cramped.scheduled, cramped.preempted), 1):
        note = f"   preempted {sorted(pre)}" if pre else ""
        print(f"  step {i:>2}: {sched}{note}")
    total_c = sum(sum(s.values()) for s in cramped.scheduled)
    total_r = sum(sum(s.values()) for s in roomy.scheduled)
    print(f"preemptions per request: cramped {cramped.num_preemptions}, roomy {roomy.num_preemptions}")
    print(f"steps: cramped {len(cramped.scheduled)}, roomy {len(roomy.scheduled)}; tokens computed: "
          f"cramped {total_c}, roomy {total_r} (extra {total_c - total_r})")
    print(f"outputs identical: {cramped.token_ids == roomy.token_ids}; lengths {[len(t) for t in cramped.token_ids]}")


if __name__ == "__main__":
    main()
