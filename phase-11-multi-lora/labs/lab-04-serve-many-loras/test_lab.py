"""Lab 11-04: serving many LoRAs. Grades solution.py, or starter.py with LAB_IMPL=starter.

The default tests are pure Python: the rounds against mini_vllm's Scheduler (whose waiting loop
applies the same max_loras rule as vLLM's, see mini_vllm/test_upstream_lora.py), the closed forms,
and the corruption rule on the cases the engine shows. The `engine` tests run the real vLLM 0.22.1
engine on CPU (tier 2) with hand-written PEFT adapters and compare it with your predictions.
"""

import random

import pytest

from course.runtime import lab_module

lab = lab_module(__file__)   # solution.py by default; LAB_IMPL=starter grades starter.py

GUIDE_QUEUE = [1, None, 2, 3, 1, None, 3, 4]


def random_queue(rng, n, k):
    return [rng.choice([None] + list(range(1, k + 1))) for _ in range(n)]


def mini_run(adapters, max_loras, max_tokens):
    """mini_vllm's Scheduler with LoRA on: every request queued first; the ids admitted per step."""
    from mini_vllm.config import create_engine_config
    from mini_vllm.lora import LoRARequest
    from mini_vllm.request import Request
    from mini_vllm.sampling_params import SamplingParams
    from mini_vllm.scheduler import Scheduler

    sched = Scheduler(create_engine_config(num_gpu_blocks=256, block_size=4, enable_lora=True, max_loras=max_loras))
    for i, a in enumerate(adapters):
        sched.add_request(Request(f"{i}", [3, 4, 5], SamplingParams(max_tokens=max_tokens, ignore_eos=True),
                                  lora_request=None if a is None else LoRARequest(f"a{a}", a)))
    admitted, seen = [], set()
    for _ in range(10_000):
        if not sched.has_unfinished_requests():
            return admitted
        out = sched.schedule()
        new = [int(r) for r in out.num_scheduled_tokens if r not in seen]
        seen.update(out.num_scheduled_tokens)
        admitted.append(new)
        sched.update_from_output(out, {r.request_id: 7 for r in out.scheduled_requests
                                       if sched.needs_sample(r, out.num_scheduled_tokens[r.request_id])})
    pytest.fail("mini_vllm's scheduler did not finish the queue in 10,000 steps")


# --------------------------------------------------------------------------- scheduling arithmetic
def test_guide_queue_rounds():
    assert lab.admission_rounds(GUIDE_QUEUE, 2) == [[0, 1, 2, 4, 5], [3, 6, 7]], (
        "max_loras=2: round 1 takes A1 (0, 4), A2 (2) and both base requests (1, 5); A3 and A4 wait. "
        "A skipped request does not stop the walk"
    )
    assert lab.admission_rounds(GUIDE_QUEUE, 1) == [[0, 1, 4, 5], [2], [3, 6], [7]], (
        "max_loras=1: one adapter per round, base requests all in the first"
    )
    assert lab.admission_rounds(GUIDE_QUEUE, 4) == [list(range(8))], "4 slots hold all four adapters: one round"


@pytest.mark.parametrize("max_loras", [1, 2, 3, 5])
def test_rounds_are_what_the_scheduler_admits(max_loras):
    rng = random.Random(max_loras)
    for _ in range(6):
        queue = random_queue(rng, rng.randint(1, 14), rng.randint(1, 7))
        steps = mini_run(queue, max_loras, max_tokens=1)
        assert lab.admission_rounds(queue, max_loras) == steps, (
            f"queue {queue}, max_loras={max_loras}: mini_vllm's Scheduler (vLLM's rule) admits {steps} step by step"
        )


def test_min_steps_closed_form():
    cases = [([], 3, 0), ([None, None], 1, 1), ([1, 2, 3, 4], 2, 2), ([1, 2, 3, 4, 5], 2, 3),
             ([5, 5, 5, None], 1, 1), ([1, 2, 3], 7, 1), ([7, 3, 7, 3, 9], 2, 2)]
    for queue, m, want in cases:
        got = lab.min_steps(queue, m)
        assert got == want, (
            f"min_steps({queue}, {m}) = {want}: ceil(distinct adapters / max_loras), 1 for a base-only queue, "
            f"0 for an empty one; got {got}"
        )
    rng = random.Random(11)
    for _ in range(40):
        queue, m = random_queue(rng, rng.randint(0, 12), rng.randint(1, 9)), rng.randint(1, 4)
        assert lab.min_steps(queue, m) == len(lab.admission_rounds(queue, m)), f"{queue}, max_loras={m}"


@pytest.mark.parametrize("max_loras, max_tokens", [(1, 3), (2, 2), (3, 4)])
def test_total_steps_is_what_the_scheduler_takes(max_loras, max_tokens):
    rng = random.Random(10 * max_loras + max_tokens)
    for _ in range(4):
        queue = random_queue(rng, rng.randint(1, 10), 6)
        taken = len(mini_run(queue, max_loras, max_tokens))
        assert lab.total_steps(queue, max_loras, max_tokens) == taken, (
            f"queue {queue}, max_loras={max_loras}, max_tokens={max_tokens}: the scheduler takes {taken} steps. "
            f"A request's prefill step samples its first token, and the next round starts the step after"
        )
    assert lab.total_steps([1, 2], 1, 1) == 2 and lab.total_steps([None], 3, 5) == 5


# --------------------------------------------------------------------------- when base rows break
@pytest.mark.parametrize("max_loras, steps, want", [
    (1, [[None, 1]], [True]),                        # the only slot is the last slot
    (2, [[None, 1]], [False]),                       # slot 1 never filled: its weights are zeros
    (2, [[None, 1, 2]], [True]),
    (2, [[1, 2], [None, 1]], [False, True]),         # slot 1 still holds adapter 2: one adapter is enough
    (2, [[1, 2], [None]], [False, False]),           # no adapter row: the LoRA ops are skipped (no_lora)
    (2, [[1], [None, 1]], [False, False]),
    (3, [[1], [2], [None, 3]], [False, False, True]),  # exactly max_loras adapters ever loaded
    (3, [[1], [2], [None, 2]], [False, False, False]),
    (2, [[None], [1, 2], [3], [None, 3]], [False, False, False, True]),
    (1, [[1, None, 1, 1]], [True]),                  # three requests, one adapter: one slot
    (2, [[2, 2, None, 2]], [False]),
], ids=["m1", "m2-one", "m2-full", "m2-sticky", "m2-base-only", "m2-one-twice", "m3-boundary",
        "m3-below", "m2-evicted", "m1-repeated", "m2-repeated"])
def test_corrupted_steps(max_loras, steps, want):
    try:
        got = lab.corrupted_steps(max_loras, steps)
    except ValueError as e:
        pytest.fail(f"max_loras={max_loras}, steps {steps} is a valid history but raised ValueError({e}): a step needs "
                    f"a slot per distinct adapter, not per request")
    assert got == want, (
        f"max_loras={max_loras}, steps {steps}: expected {want}, got {got}. A step's base rows change when it has a "
        f"base row and an adapter row and slot max_loras-1 holds an adapter, i.e. once max_loras distinct adapters "
        f"have been loaded since start (slots are never emptied, only reloaded)"
    )


# --------------------------------------------------------------------------- promised errors
def test_promised_errors():
    for bad in (0, -1, True, 1.5):
        with pytest.raises(ValueError, match="max_loras"):
            lab.admission_rounds([1], bad)
        with pytest.raises(ValueError, match="max_loras"):
            lab.min_steps([1], bad)
        with pytest.raises(ValueError, match="max_loras"):
            lab.corrupted_steps(bad, [[1]])
    for bad in (0, -2, "a", True):
        with pytest.raises(ValueError, match="adapter"):
            lab.admission_rounds([None, bad], 2)
        with pytest.raises(ValueError, match="adapter"):
            lab.corrupted_steps(2, [[None, bad]])
    with pytest.raises(ValueError, match="max_tokens"):
        lab.total_steps([1], 1, 0)
    calls = {
        "admission_rounds([], 0)": lambda: lab.admission_rounds([], 0),
        "min_steps([], 0)": lambda: lab.min_steps([], 0),
        "total_steps([], 0, 8)": lambda: lab.total_steps([], 0, 8),
        "corrupted_steps(0, [])": lambda: lab.corrupted_steps(0, []),
    }
    for shown, call in calls.items():
        try:
            got = call()
        except ValueError:
            continue
        pytest.fail(f"{shown} returned {got!r}: an empty queue (or history) does not make max_loras=0 valid; "
                    "check the arguments before the early return")
    with pytest.raises(ValueError, match="max_loras=2"):
        lab.corrupted_steps(2, [[1, 2, 3]])


# --------------------------------------------------------------------------- the real engine (tier 2)
PROMPT = [5, 17, 42, 99, 7, 64]


def _phases(token_batches, queue, queue_tokens):
    phases = [{"requests": [[PROMPT, a] for a in batch], "max_tokens": 8} for batch in token_batches]
    phases.append({"requests": [[[3, 4, 5], a] for a in queue], "max_tokens": queue_tokens})
    return phases


def _iterations_per_phase(output, n):
    counts, current = [0] * n, None
    for line in output.splitlines():
        if line.startswith("COURSE_PHASE "):
            current = int(line.split()[1])
        elif "Iteration(" in line and current is not None and current < n:
            counts[current] += 1
    return counts


@pytest.mark.engine
@pytest.mark.parametrize("max_loras, token_batches, queue, queue_tokens", [
    (1, [[None], [None, 1], [None]], [2, 1, None, 2, 3], 3),
    (2, [[None], [None, 1], [None, 1, 2], [None, 1], [None]], GUIDE_QUEUE, 1),
], ids=["max_loras=1", "max_loras=2"])
def test_real_engine_matches_your_predictions(max_loras, token_batches, queue, queue_tokens):
    from course.runtime import engine

    # Predictions first: a starter fails here, before the minute the engine takes to start.
    rounds = lab.admission_rounds(queue, max_loras)
    history = list(token_batches) + [[queue[i] for i in r] for r in rounds]
    corrupt = lab.corrupted_steps(max_loras, history)[: len(token_batches)]
    want_steps = lab.total_steps(queue, max_loras, queue_tokens)
    assert token_batches[0] == [None] and not corrupt[0], "phase 0 is the reference: the base request alone"

    phases = _phases(token_batches, queue, queue_tokens)
    run = engine.run_job("lora_phases", max_loras=max_loras, adapters=[1, 2, 3, 4], phases=phases)
    tokens = run.result["tokens"]
    reference = tokens[0][0]
    for p, batch in enumerate(token_batches):
        base_tokens = tokens[p][batch.index(None)]
        changed = base_tokens != reference
        assert changed == corrupt[p], (
            f"max_loras={max_loras}, phase {p} (adapters {batch}): the base request's greedy tokens "
            f"{'changed' if changed else 'did not change'} ({base_tokens} vs {reference} alone), "
            f"but corrupted_steps predicted {corrupt[p]}"
        )
    steps = _iterations_per_phase(run.output, len(phases))[-1]
    assert steps == want_steps, (
        f"the engine took {steps} steps (Iteration lines) for queue {queue} at max_loras={max_loras}, "
        f"max_tokens={queue_tokens}; total_steps predicted {want_steps}"
    )
