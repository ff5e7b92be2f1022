"""Lab 06-01 reference: one scheduler step, the same shape as vLLM's ``Scheduler.schedule()``.

``clamp`` is chunked prefill in three lines; ``schedule_step`` is the two-phase loop (RUNNING
first, then WAITING) without preemption, which lab 04 adds. ``Req`` and ``FakeKV`` are tiny
stand-ins for ``mini_vllm.Request`` and ``mini_vllm.KVCacheManager``: one KV slot per token, no
blocks, no hashes. ``simulate`` (provided) drives ``schedule_step`` step after step.
"""

from __future__ import annotations

from collections import deque
from collections.abc import MutableSequence
from dataclasses import dataclass, field


@dataclass
class Req:
    """A request reduced to the two counters the scheduler reads."""

    request_id: str
    num_tokens: int  # prompt + generated so far
    num_computed_tokens: int = 0  # tokens whose KV is already in the cache
    max_tokens: int = 1  # used only by simulate(): how many tokens to generate
    output_tokens: int = 0  # used only by simulate()


@dataclass
class FakeKV:
    """A KV cache with one slot per token and a fixed capacity (no blocks, no hashes)."""

    capacity: int
    used: dict[str, int] = field(default_factory=dict)  # request id -> slots held

    def num_free(self) -> int:
        return self.capacity - sum(self.used.values())

    def allocate(self, req: Req, num_new_tokens: int) -> bool:
        """Reserve ``num_new_tokens`` slots for ``req``; False (and no change) if they do not fit."""
        if num_new_tokens > self.num_free():
            return False
        self.used[req.request_id] = self.used.get(req.request_id, 0) + num_new_tokens
        return True

    def free(self, req: Req) -> None:
        self.used.pop(req.request_id, None)


def clamp(num_new_tokens: int, token_budget: int, threshold: int) -> int:
    """How many of ``num_new_tokens`` a request gets this step.

    Cap 1, the per-request chunk: when ``0 < threshold < num_new_tokens``, use ``threshold``
    (0 disables it). Cap 2, the step: at most ``token_budget``. Never negative.
    """
    if 0 < threshold < num_new_tokens:
        num_new_tokens = threshold
    return max(0, min(num_new_tokens, token_budget))


def schedule_step(
    running: MutableSequence[Req],
    waiting: deque[Req],
    kv: FakeKV,
    max_num_batched_tokens: int,
    max_num_seqs: int,
    long_prefill_token_threshold: int = 0,
) -> dict[str, int]:
    """Decide one step: ``{request_id: tokens}`` in scheduling order (running first).

    Phase A, RUNNING in list order: clamp how far each request is behind, skip it if that is 0,
    reserve the slots (a running request whose slots do not fit raises ``RuntimeError``: without
    preemption, lab 04's job, there is no right answer), charge the budget. Phase B, WAITING front
    first, while there is budget and ``len(running) < max_num_seqs``: clamp, reserve; the first
    refusal stops admission (``break``: head-of-line blocking); an admitted request moves from
    ``waiting`` to the end of ``running``.
    Counters are not advanced here: the engine does that after the model runs.
    """
    budget = max_num_batched_tokens
    scheduled: dict[str, int] = {}

    # Phase A: RUNNING requests first; they have users watching.
    for req in running:
        if budget <= 0:
            break
        n = clamp(req.num_tokens - req.num_computed_tokens, budget, long_prefill_token_threshold)
        if n == 0:
            continue
        if not kv.allocate(req, n):
            raise RuntimeError(f"{req.request_id} is running but its KV does not fit: preemption is lab 04's job")
        scheduled[req.request_id] = n
        budget -= n

    # Phase B: WAITING requests, first come first served.
    while waiting and budget > 0 and len(running) < max_num_seqs:
        req = waiting[0]
        n = clamp(req.num_tokens - req.num_computed_tokens, budget, long_prefill_token_threshold)
        if n == 0 or not kv.allocate(req, n):
            break  # head-of-line: nobody behind it jumps the queue
        waiting.popleft()
        running.append(req)
        scheduled[req.request_id] = n
        budget -= n
    return scheduled


# -- provided: a tiny engine loop around schedule_step ----------------------------------------
def simulate(
    requests: list[tuple[str, int, int]],
    max_num_batched_tokens: int,
    max_num_seqs: int,
    long_prefill_token_threshold: int = 0,
    capacity: int = 1 << 30,
) -> list[tuple[dict[str, int], list[str]]]:
    """Run ``(request_id, prompt_len, max_tokens)`` requests to completion.

    Returns one ``(scheduled, emitted)`` pair per step: the dict from ``schedule_step`` and the
    ids that sampled a token that step (those whose counter caught up).
    """
    waiting = deque(Req(rid, prompt, 0, max_tokens) for rid, prompt, max_tokens in requests)
    running: list[Req] = []
    kv = FakeKV(capacity)
    steps = []
    while running or waiting:
        scheduled = schedule_step(
            running, waiting, kv, max_num_batched_tokens, max_num_seqs, long_prefill_token_threshold
        )
        if not scheduled:
            raise RuntimeError("no progress: nothing could be scheduled")
        emitted = []
        for req in list(running):
            n = scheduled.get(req.request_id, 0)
            if n == 0:
                continue
            req.num_computed_tokens += n
            if req.num_computed_tokens == req.num_tokens:  # caught up: sample one token
                emitted.append(req.request_id)
                req.num_tokens += 1
                req.output_tokens += 1
                if req.output_tokens == req.max_tokens:
                    running.remove(req)
                    kv.free(req)
        steps.append((scheduled, emitted))
    return steps


GUIDE_TRACE = [("A", 5, 3), ("B", 6, 2), ("C", 3, 2)]  # the worked example of guide §3.8


def main() -> None:
    print("clamp(num_new, budget, threshold):")
    for args in [(100, 2048, 0), (100, 30, 0), (100, 2048, 16), (10, 2048, 16), (100, 8, 16)]:
        print(f"  clamp{args} = {clamp(*args)}")

    print("\nthree 8-token prompts, budget 10:")
    running: list[Req] = []
    waiting = deque(Req(rid, 8) for rid in "abc")
    out = schedule_step(running, waiting, FakeKV(1000), 10, 4)
    print(f"  scheduled {out}, still waiting {[r.request_id for r in waiting]}")

    print("\nguide 3.8 trace: budget 8, max_num_seqs 2; A(prompt 5, 3 tokens) B(6, 2) C(3, 2)")
    total = 0
    for i, (scheduled, emitted) in enumerate(simulate(GUIDE_TRACE, 8, 2), 1):
        step_total = sum(scheduled.values())
        total += step_total
        print(f"  step {i}: scheduled {scheduled}  total {step_total}  emitted {emitted}")
    print(f"  tokens scheduled over all steps: {total}")


if __name__ == "__main__":
    main()
