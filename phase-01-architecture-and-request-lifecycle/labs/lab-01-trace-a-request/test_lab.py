from itertools import pairwise

from course.runtime import lab_module

lab = lab_module(__file__)   # solution.py by default; LAB_IMPL=starter grades starter.py


# "hello" is 5 byte tokens; "abcdefghij" is 10. Request ids are never compared with a literal:
# each trace builds its own engine, and the tests only check that one id is used throughout.


def _fmt(events):
    return "\n".join(f"    {tuple(e)}" for e in events)


def test_first_event_is_running_after_prefill():
    events = lab.trace_request("hello", max_tokens=4)
    assert events, "trace_request returned no events: call engine.step() until has_unfinished_requests() is False"
    first = events[0]
    assert first.step == 1, f"the first event must be taken after step 1 (no snapshot before stepping), got step={first.step}"
    assert first.status == "RUNNING", (
        f"after step 1 the request must be RUNNING (admission happens inside step()'s schedule(), "
        f"not in add_request), got {first.status}. Did you snapshot before calling step()?"
    )
    assert (first.num_computed_tokens, first.num_tokens) == (5, 6), (
        f"step 1 prefills all 5 prompt tokens and samples the first output token, so "
        f"(num_computed_tokens, num_tokens) must be (5, 6), got "
        f"({first.num_computed_tokens}, {first.num_tokens})\n{_fmt(events)}"
    )
    assert all(e.status != "WAITING" for e in events), (
        f"on an empty engine the request is admitted in its first step, so no WAITING event appears:\n{_fmt(events)}"
    )


def test_counters_monotonic_and_decode_by_one():
    events = lab.trace_request("hello", max_tokens=6)
    computed = [e.num_computed_tokens for e in events]
    assert computed == sorted(computed), f"num_computed_tokens may never go down, got {computed}"
    for before, after in pairwise(events):
        assert after.num_computed_tokens - before.num_computed_tokens == 1, (
            f"after the prefill step every step is a decode step: num_computed_tokens grows by exactly 1, "
            f"got {before.num_computed_tokens} -> {after.num_computed_tokens}\n{_fmt(events)}"
        )
        assert after.num_tokens - before.num_tokens == 1, (
            f"each decode step appends exactly one sampled token: num_tokens grows by 1, got "
            f"{before.num_tokens} -> {after.num_tokens}\n{_fmt(events)}"
        )
    assert all(e.num_tokens - e.num_computed_tokens == 1 for e in events), (
        f"after every step the only uncomputed token is the one just sampled "
        f"(num_tokens - num_computed_tokens == 1):\n{_fmt(events)}"
    )
    assert [e.step for e in events] == list(range(1, len(events) + 1)), "steps must be numbered 1, 2, 3, ..."


def test_finishes_at_length_cap():
    events = lab.trace_request("hello", max_tokens=4)
    last = events[-1]
    assert last.status == "FINISHED_LENGTH_CAPPED", (
        f"with ignore_eos=True the request can only end by hitting max_tokens, whose status is "
        f"FINISHED_LENGTH_CAPPED (upstream's name too), got {last.status}. Did you lose the final "
        f"event because the finished request left scheduler.running? Keep the Request object itself."
    )
    assert all(not e.status.startswith("FINISHED") for e in events[:-1]), (
        f"only the last event may be finished:\n{_fmt(events)}"
    )
    assert (last.num_computed_tokens, last.num_tokens) == (8, 9), (
        f"5 prompt + 4 output tokens = 9 tokens; the last sampled token is never computed, so 8 "
        f"are computed. Got ({last.num_computed_tokens}, {last.num_tokens})"
    )


def test_ignore_eos_keeps_the_length_cap():
    # "Say 6" is a prompt whose greedy first token, in the toy model, is EOS (256). With
    # ignore_eos=True that EOS is an ordinary token and the trace still runs to max_tokens.
    events = lab.trace_request("Say 6", max_tokens=3)
    assert len(events) == 3 and events[-1].status == "FINISHED_LENGTH_CAPPED", (
        f"for 'Say 6' the toy model's greedy first token is EOS (256); trace_request must pass "
        f"ignore_eos=True (and temperature=0.0) to SamplingParams so the request still ends by the "
        f"max_tokens=3 cap, after 3 steps. Got:\n{_fmt(events)}"
    )
    assert (events[-1].num_computed_tokens, events[-1].num_tokens) == (7, 8), (
        f"5 prompt + 3 output tokens = 8, of which 7 are computed; got {tuple(events[-1])}"
    )


def test_total_decode_steps_equals_max_tokens():
    # The name is the spec's: the engine loop runs max_tokens times in all. The first token comes
    # out of the prefill step, so only max_tokens - 1 of those steps are decode steps.
    for n in (1, 3, 7):
        events = lab.trace_request("hello", max_tokens=n)
        assert len(events) == n, (
            f"max_tokens={n} on a prompt that fits the token budget takes exactly {n} engine steps "
            f"(1 prefill step that also samples token 1, then {n - 1} decode steps), got {len(events)}"
        )
        assert lab.split_steps(events, 5) == (1, n - 1), (
            f"max_tokens={n}: expected 1 prefill step + {n - 1} decode steps, got {lab.split_steps(events, 5)}"
        )


def test_engine_kwargs_reach_the_engine():
    events = lab.trace_request("abcdefghij", max_tokens=2, long_prefill_token_threshold=2)
    got = [(e.num_computed_tokens, e.num_tokens) for e in events]
    assert got == [(2, 10), (4, 10), (6, 10), (8, 10), (10, 11), (11, 12)], (
        f"with long_prefill_token_threshold=2 the 10-token prompt is prefilled 2 tokens per step; "
        f"num_tokens stays at 10 until the chunk that completes the prompt samples a token. Pass "
        f"**engine_kwargs to LLMEngine. Got {got}"
    )
    assert lab.split_steps(events, 10) == (5, 1), (
        f"5 chunks of 2 prompt tokens, then 1 decode step: expected (5, 1), got {lab.split_steps(events, 10)}"
    )


def test_one_request_id_throughout():
    events = lab.trace_request("hello", max_tokens=3)
    ids = {e.request_id for e in events}
    assert len(ids) == 1 and all(isinstance(i, str) and i for i in ids), (
        f"a single request must keep one non-empty string id in every event, got {ids}"
    )


def test_split_steps_counts_prompt_work():
    E = lab.Event
    chunked = [E(1, "r", "RUNNING", 3, 7), E(2, "r", "RUNNING", 6, 7), E(3, "r", "RUNNING", 7, 8),
               E(4, "r", "FINISHED_LENGTH_CAPPED", 8, 9)]
    assert lab.split_steps(chunked, 7) == (3, 1), (
        "steps that end with num_computed_tokens <= the prompt length did prompt work, including the "
        f"step that completes the prompt exactly (7 <= 7): expected (3, 1), got {lab.split_steps(chunked, 7)}"
    )
    assert lab.split_steps([], 5) == (0, 0), "an empty trace has no steps"
