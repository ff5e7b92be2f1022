from collections import deque

from course.runtime import lab_module

lab = lab_module(__file__)   # solution.py by default; LAB_IMPL=starter grades starter.py


BIG = 1 << 30  # "infinite" budget or memory


def _step(running, waiting, capacity=BIG, budget=2048, seqs=128, threshold=0):
    kv = lab.FakeKV(capacity)
    out = lab.schedule_step(running, waiting, kv, budget, seqs, threshold)
    return out, kv


def test_clamp_chunks_and_budgets():
    cases = [
        # (num_new, budget, threshold) -> expected, why
        ((100, 2048, 0), 100, "neither cap binds: a 100-token prompt fits a 2048 budget"),
        ((100, 30, 0), 30, "the budget binds: only 30 tokens are left in this step"),
        ((100, 2048, 16), 16, "the threshold binds: 0 < 16 < 100, so the chunk is 16"),
        ((10, 2048, 16), 10, "threshold 16 does not bind a 10-token demand"),
        ((100, 8, 16), 8, "both caps apply: threshold gives 16, then the budget cuts it to 8"),
        ((1, 2048, 16), 1, "a decode (1 token) is never changed"),
        ((5, 0, 0), 0, "an empty budget gives 0 tokens"),
        ((5, -3, 0), 0, "an overspent budget gives 0 tokens, never a negative count: floor the result at 0"),
        ((-2, 2048, 16), 0, "a request with less than nothing to do gets 0, never a negative count"),
    ]
    for args, want, why in cases:
        got = lab.clamp(*args)
        assert got == want, f"clamp{args} should be {want} ({why}), got {got}"


def test_budget_caps_total_tokens():
    running, waiting = [], deque(lab.Req(rid, 8) for rid in "abc")
    out, _ = _step(running, waiting, budget=10)
    assert out == {"a": 8, "b": 2}, (
        f"three 8-token prompts with a 10-token budget should give a:8, b:2 (b chunked) and leave c "
        f"waiting, got {out}: charge every admission to the budget and clamp the next one by what is left"
    )
    assert sum(out.values()) <= 10, f"the step scheduled {sum(out.values())} tokens, over the budget of 10"
    assert [r.request_id for r in waiting] == ["c"], "c must stay in waiting: the budget ran out before it"
    assert [r.request_id for r in running] == ["a", "b"], "admitted requests move to the end of running, in order"


def test_max_num_seqs_caps_running():
    running = []
    waiting = deque(lab.Req(f"r{i}", 1 + i % 3) for i in range(10))
    out, _ = _step(running, waiting, seqs=4)
    assert len(running) == 4, (
        f"max_num_seqs=4 must stop admission at 4 running requests, got {len(running)}: "
        f"check len(running) < max_num_seqs before each admission"
    )
    assert list(out) == ["r0", "r1", "r2", "r3"], f"the first four waiters (FCFS) should be admitted, got {list(out)}"
    assert [r.request_id for r in waiting] == [f"r{i}" for i in range(4, 10)], "the other six stay waiting, in order"


def test_chunked_prefill_caps_per_request():
    running, waiting = [], deque([lab.Req("long", 100)])
    out, _ = _step(running, waiting, budget=2048, threshold=16)
    assert out == {"long": 16}, (
        f"a 100-token prompt with long_prefill_token_threshold=16 gets 16 tokens even though the budget "
        f"is 2048, got {out}: apply the threshold in the WAITING phase too"
    )


def test_running_scheduled_before_waiting_admitted():
    decoding = lab.Req("dec", num_tokens=11, num_computed_tokens=10)
    running, waiting = [decoding], deque([lab.Req("new", 20)])
    out, _ = _step(running, waiting, budget=8)
    assert list(out.items()) == [("dec", 1), ("new", 7)], (
        f"the running decode must get its 1 token first and the 20-token waiter the remaining 7 "
        f"(chunked), in that order; got {list(out.items())}: run Phase A (running) before Phase B (waiting)"
    )


def test_admission_stops_when_memory_exhausted():
    running = []
    waiting = deque([lab.Req("A", 16), lab.Req("B", 4), lab.Req("C", 1)])
    out, kv = _step(running, waiting, capacity=16)
    assert out == {"A": 16}, f"A fills all 16 slots, so only A may be scheduled, got {out}"
    assert [r.request_id for r in waiting] == ["B", "C"], (
        f"B cannot be allocated, so admission must stop (break) and B stays first in waiting; C must "
        f"not jump ahead even though it is small (head-of-line blocking); waiting = {[r.request_id for r in waiting]}"
    )
    assert kv.num_free() == 0 and [r.request_id for r in running] == ["A"], "only A holds memory and runs"

    # Head-of-line blocking with room to spare: 2 slots stay free, B needs 4, C would fit in 1.
    running = []
    waiting = deque([lab.Req("A", 14), lab.Req("B", 4), lab.Req("C", 1)])
    out, kv = _step(running, waiting, capacity=16)
    assert out == {"A": 14}, (
        f"B needs 4 slots and only 2 are free, so admission stops at B; C (1 token) must not be admitted "
        f"ahead of B, got {out}: use break, not continue, when an admission does not fit"
    )
    assert [r.request_id for r in waiting] == ["B", "C"], "B keeps its place at the front of waiting"


def test_caught_up_running_request_is_skipped_not_a_stop():
    idle = lab.Req("idle", num_tokens=7, num_computed_tokens=7)  # nothing left to compute this step
    busy = lab.Req("busy", num_tokens=9, num_computed_tokens=8)
    out, _ = _step([idle, busy], deque())
    assert out == {"busy": 1}, (
        f"a running request with 0 tokens to do is skipped (continue), and the ones after it still run; "
        f"got {out}"
    )


def test_waiter_with_a_head_start_schedules_only_the_rest():
    resumed = lab.Req("resumed", num_tokens=40, num_computed_tokens=32)  # cache hit or partial restore
    out, _ = _step([], deque([resumed]))
    assert out == {"resumed": 8}, (
        f"a waiter whose counter is already 32 of 40 needs only 8 tokens, got {out}: "
        f"schedule num_tokens - num_computed_tokens"
    )


def test_simulation_reproduces_the_guide_trace():
    steps = lab.simulate([("A", 5, 3), ("B", 6, 2), ("C", 3, 2)], max_num_batched_tokens=8, max_num_seqs=2)
    got = [scheduled for scheduled, _ in steps]
    want = [{"A": 5, "B": 3}, {"A": 1, "B": 3}, {"A": 1, "B": 1}, {"C": 3}, {"C": 1}]
    assert got == want, f"the guide's §3.8 trace should be {want}, your schedule_step gives {got}"
    assert sum(sum(s.values()) for s in got) == (5 + 3 - 1) + (6 + 2 - 1) + (3 + 2 - 1), (
        "token conservation: each request schedules prompt + max_tokens - 1 tokens over its life"
    )


def test_threshold_chunks_a_long_prompt_in_three_pieces():
    # 40 tokens at threshold 16: 16 (admission), 16 and 8 (as a RUNNING request), then decodes.
    steps = lab.simulate([("long", 40, 2), ("dec", 1, 4)], max_num_batched_tokens=64, max_num_seqs=4,
                         long_prefill_token_threshold=16)
    got = [scheduled.get("long", 0) for scheduled, _ in steps]
    assert got[:4] == [16, 16, 8, 1], (
        f"a 40-token prompt with long_prefill_token_threshold=16 must be chunked 16, 16, 8 and then decode 1; "
        f"got {got}: clamp by the threshold in Phase A (running) too, not only at admission"
    )
    assert all(s.get("dec") == 1 for s, _ in steps[1:4]), "the decode keeps getting its 1 token beside each chunk"


def test_max_num_seqs_counts_running_requests_with_nothing_to_do():
    idle = lab.Req("idle", num_tokens=7, num_computed_tokens=7)     # running, nothing to compute now
    busy = lab.Req("busy", num_tokens=9, num_computed_tokens=8)
    running, waiting = [idle, busy], deque([lab.Req("new", 4)])
    out, _ = _step(running, waiting, seqs=2)
    assert out == {"busy": 1} and [r.request_id for r in waiting] == ["new"], (
        f"two requests are already running and max_num_seqs=2: 'new' must wait even though 'idle' is not "
        f"scheduled this step, got {out}: compare len(running), not the number scheduled, with max_num_seqs"
    )
    assert len(running) == 2


def test_running_request_that_cannot_fit_raises():
    # without preemption (lab 04) a running request whose next chunk does not fit has no right
    # answer: skipping it silently would starve it and let the waiters behind take its memory
    running = [lab.Req("a", 10, 0), lab.Req("big-b", 10, 0)]
    waiting = deque([lab.Req("w", 3, 0)])
    kv = lab.FakeKV(15)
    try:
        out = lab.schedule_step(running, waiting, kv, 2048, 128)
    except NotImplementedError:
        raise
    except RuntimeError as exc:
        assert "big-b" in str(exc), f"the error should name the request that does not fit (big-b): {exc}"
    else:
        raise AssertionError(
            f"a has 10 slots, big-b needs 10 of the 5 left: schedule_step returned {out} instead of raising "
            "RuntimeError; a running request that cannot fit must not be skipped silently"
        )
    assert [r.request_id for r in waiting] == ["w"], "no waiter is admitted in a step that raised"
