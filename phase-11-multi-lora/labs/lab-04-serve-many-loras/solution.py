"""Lab 11-04 — Serve many LoRAs: steps when adapters outnumber slots, and when base rows break (reference).

Two predictions about a multi-LoRA engine, each checked against the real vLLM 0.22.1 engine on
CPU (tier 2, ``test_lab.py``'s ``engine`` tests) and, on a GPU, by ``run.py``:

1. **Scheduling arithmetic.** With every request queued before the first step and each needing
   ``max_tokens`` steps, the scheduler's ``max_loras`` rule splits the queue into rounds: a round
   takes every base request, the first ``max_loras`` distinct adapters in queue order and every
   request for them; the next round starts when the previous one has finished. So the run takes
   ``rounds × max_tokens`` steps, and the number of rounds is ``ceil(k / max_loras)`` for ``k``
   distinct adapters (1 when only base requests wait, 0 for an empty queue).
2. **The −1 defect, end to end.** vLLM's CPU LoRA ops give base rows (slot index −1) the delta of
   the *last* slot, ``max_loras − 1``. Slots fill from 0 and an adapter stays in its slot until a
   newer one evicts it, so the last slot holds an adapter from the first time ``max_loras``
   distinct adapters have been loaded, for the rest of the engine's life. A step whose batch has
   no adapter rows skips the LoRA ops altogether (``no_lora``). So a step corrupts its base rows
   exactly when it has a base row, at least one adapter row, and ``max_loras`` or more distinct
   adapters have been loaded so far (this step's included).
"""

from __future__ import annotations

from collections.abc import Sequence

from mini_vllm.lora import claim_adapter


def _check(adapters: Sequence[int | None], max_loras: int) -> None:
    if isinstance(max_loras, bool) or not isinstance(max_loras, int) or max_loras < 1:
        raise ValueError(f"max_loras must be an int >= 1, got {max_loras!r}")
    for i, a in enumerate(adapters):
        if a is not None and (isinstance(a, bool) or not isinstance(a, int) or a < 1):
            raise ValueError(f"request {i} has adapter {a!r}: an adapter id is an int >= 1 (None = base)")


def admission_rounds(adapters: Sequence[int | None], max_loras: int) -> list[list[int]]:
    """The positions of the requests each round admits, every request queued before the first step.

    ``adapters[i]`` is request ``i``'s adapter id (``None``: the base model). A round walks the
    queue first come first served: a base request passes, a request for an adapter already claimed
    this round passes, a new adapter passes while fewer than ``max_loras`` are claimed; any other
    request is skipped and the walk goes on. Admitted requests leave the queue. Raises
    ``ValueError`` for ``max_loras < 1`` or an adapter id that is not an int ``>= 1``.
    """
    _check(adapters, max_loras)
    queue = list(range(len(adapters)))
    rounds: list[list[int]] = []
    while queue:
        claimed: set[int] = set()
        admitted = [i for i in queue if claim_adapter(claimed, adapters[i], max_loras)]
        rounds.append(admitted)
        taken = set(admitted)
        queue = [i for i in queue if i not in taken]
    return rounds


def min_steps(adapters: Sequence[int | None], max_loras: int) -> int:
    """The number of rounds in closed form: ``ceil(k / max_loras)`` for ``k`` distinct adapters,
    1 when only base requests wait, 0 for an empty queue. Same ``ValueError``s."""
    _check(adapters, max_loras)
    k = len({a for a in adapters if a is not None})
    if k == 0:
        return 1 if adapters else 0
    return -(-k // max_loras)


def total_steps(adapters: Sequence[int | None], max_loras: int, max_tokens: int) -> int:
    """Engine steps to finish the queue when every request generates ``max_tokens`` tokens.

    A request's first step (its prefill) samples its first token, so it runs ``max_tokens`` steps;
    a round ends with its last token, and the skipped requests are admitted in the very next step.
    ``ValueError`` for ``max_tokens < 1`` too.
    """
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise ValueError(f"max_tokens must be an int >= 1, got {max_tokens!r}")
    return min_steps(adapters, max_loras) * max_tokens


def corrupted_steps(max_loras: int, steps: Sequence[Sequence[int | None]]) -> list[bool]:
    """For each step of a fresh engine, whether vLLM's CPU LoRA ops (at the pin) change its base rows.

    ``steps[s]`` lists the adapter of each request in step ``s`` (``None``: base). True when the
    step has a base request, at least one adapter request, and at least ``max_loras`` distinct
    adapters have been loaded since the engine started (this step's adapters included): then the
    last slot holds an adapter, and base rows (index −1) receive its delta. Raises ``ValueError``
    for ``max_loras < 1``, an invalid adapter id, or a step with more than ``max_loras`` distinct
    adapters (the scheduler never builds one; vLLM's worker would refuse it).
    """
    _check((), max_loras)  # even with no steps
    loaded: set[int] = set()
    out: list[bool] = []
    for s, batch in enumerate(steps):
        _check(batch, max_loras)
        here = {a for a in batch if a is not None}
        if len(here) > max_loras:
            raise ValueError(f"step {s} uses {len(here)} adapters but max_loras={max_loras}: no scheduler builds it")
        loaded |= here
        out.append(None in batch and bool(here) and len(loaded) >= max_loras)
    return out


def throughput_ratio(adapters: Sequence[int | None], max_loras: int) -> float:
    """Provided. Throughput relative to an engine with a slot for every adapter (one round), when the
    rounds run back to back and a step costs the same however many requests it holds (decode-bound):
    ``1 / rounds``."""
    rounds = min_steps(adapters, max_loras)
    return 1.0 / rounds if rounds else 1.0


def main() -> None:
    queue = [1, None, 2, 3, 1, None, 3, 4]
    print(f"queue (adapter per request, None = base): {queue}")
    for m in (1, 2, 3, 4):
        rounds = admission_rounds(queue, m)
        print(f"  max_loras={m}: rounds {rounds} -> {len(rounds)} round{'' if len(rounds) == 1 else 's'}, "
              f"{total_steps(queue, m, 32)} steps at max_tokens=32")
    tenants = [t for _ in range(16) for t in range(1, 9)] + [None] * 16
    print("\n144 requests: 16 for each of 8 adapters, 16 base; max_tokens=128 (decode-bound, a step costs the same)")
    print(f"{'max_loras':>9} {'rounds':>6} {'steps':>6} {'throughput vs 8 slots':>22}")
    for m in (1, 2, 4, 8):
        print(f"{m:>9} {min_steps(tenants, m):>6} {total_steps(tenants, m, 128):>6} {throughput_ratio(tenants, m):>21.2f}x")
    print("\nbase rows corrupted by the CPU ops (a fresh engine, one step per batch):")
    for m, steps in [(1, [[None, 1]]), (2, [[None, 1]]), (2, [[None, 1, 2]]),
                     (2, [[1, 2], [None, 1]]), (2, [[1, 2], [None]]), (8, [[None, 1, 2, 3]])]:
        print(f"  max_loras={m}  steps {steps}  ->  {corrupted_steps(m, steps)}")


if __name__ == "__main__":
    main()
