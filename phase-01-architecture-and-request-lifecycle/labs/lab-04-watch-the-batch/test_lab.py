from course.runtime import lab_module

lab = lab_module(__file__)   # solution.py by default; LAB_IMPL=starter grades starter.py


# A = "hello world" (11 byte tokens), B = "goodbye" (7). Ids are read from trace_batches'
# return value, never typed in.
A, B = "hello world", "goodbye"


def named(ids, steps):
    """Rewrite the per-step dicts with letters A, B, C... in place of the engine's ids."""
    letter = dict(zip(ids, "ABCDEFGH"))
    return [{letter[rid]: n for rid, n in step.items()} for step in steps]


def test_ample_budget_prefills_everyone_in_step_one():
    ids, steps = lab.trace_batches([A, B], max_tokens=4)
    got = named(ids, steps)
    assert got[0] == {"A": 11, "B": 7}, (
        f"with the default budget of 2048 tokens both prompts fit in step 1 (A: 11, B: 7), got {got[0]}"
    )
    assert got[1:] == [{"A": 1, "B": 1}] * 3, (
        f"after the prefill step (which samples token 1) each request decodes 1 token per step for "
        f"max_tokens - 1 = 3 more steps, got {got[1:]}"
    )


def test_token_conservation_per_request():
    cases = [([A, B], 4, {}), ([A, B], 4, {"max_num_batched_tokens": 8}),
             (["hello", "goodbye", "hey you"], [2, 5, 3], {"max_num_seqs": 2}),
             (["a fairly long prompt to chunk", "x"], 6, {"max_num_batched_tokens": 5})]
    for prompts, caps, kw in cases:
        ids, steps = lab.trace_batches(prompts, caps, **kw)
        caps = [caps] * len(prompts) if isinstance(caps, int) else caps
        for rid, p, n in zip(ids, prompts, caps):
            total = sum(s.get(rid, 0) for s in steps)
            assert total == len(p) + n - 1, (
                f"{p!r} with max_tokens={n} ({kw or 'defaults'}): the engine computes every prompt token "
                f"and every output token except the last one sampled, {len(p)} + {n} - 1 = "
                f"{len(p) + n - 1}; your trace adds up to {total}. Record exactly one dict per step."
            )


def test_budget_is_never_exceeded():
    for budget in (4, 8, 13):
        _ids, steps = lab.trace_batches([A, B, "the quick brown fox"], 3, max_num_batched_tokens=budget)
        sums = [sum(s.values()) for s in steps]
        assert max(sums) <= budget, f"max_num_batched_tokens={budget} but a step scheduled {max(sums)}: {sums}"
        assert budget in sums, (
            f"with a budget of {budget} and plenty of prompt left, some step should use it all; per-step "
            f"totals {sums}. Did you pass **engine_kwargs to LLMEngine?"
        )


def test_tight_budget_chunks_and_defers():
    ids, steps = lab.trace_batches([A, B], max_tokens=4, max_num_batched_tokens=8)
    got = named(ids, steps)
    assert got[0] == {"A": 8}, (
        f"step 1: A takes the whole budget of 8 (a chunk of its 11-token prompt) and B is not admitted, got {got[0]}"
    )
    assert got[1] == {"A": 3, "B": 5}, (
        f"step 2: A finishes its prompt with 3 tokens and B is admitted with the 5 left over, got {got[1]}"
    )
    assert got == [{"A": 8}, {"A": 3, "B": 5}, {"A": 1, "B": 2}, {"A": 1, "B": 1}, {"A": 1, "B": 1}, {"B": 1}], (
        f"whole schedule differs from the expected 6 steps: {got}"
    )


def test_mixed_batches_exist_under_load():
    _ids, steps = lab.trace_batches([A, B], max_tokens=4, max_num_batched_tokens=8)
    mixed = [s for s in steps if len(s) > 1 and min(s.values()) == 1 and max(s.values()) > 1]
    assert mixed, (
        f"under a tight budget some step should mix a decode (1 token) with a prefill chunk (> 1): {steps}"
    )


def test_third_request_waits_for_a_seat():
    ids, steps = lab.trace_batches(["hello", "goodbye", "hey you"], [2, 5, 3], max_num_seqs=2)
    got = named(ids, steps)
    last_a = max(i for i, s in enumerate(got) if "A" in s)
    first_c = min(i for i, s in enumerate(got) if "C" in s)
    assert first_c == last_a + 1, (
        f"with max_num_seqs=2, C can only join in the step after A (max_tokens=2) finishes: A's last "
        f"step is {last_a + 1}, C's first is {first_c + 1}. Steps: {got}"
    )
    assert all(len(s) <= 2 for s in got), f"never more than 2 requests per step with max_num_seqs=2: {got}"


def test_render_draws_the_batch_picture():
    ids, steps = lab.trace_batches([A, B], max_tokens=4, max_num_batched_tokens=8)
    lines = lab.render_batches(ids, steps, [11, 7])
    want = [f"{'step':>4}  {ids[0]:<8}{ids[1]:<8}total"] + [
        f"{i:>4}  {a:<8}{b:<8}{t:>5}"
        for i, (a, b, t) in enumerate(
            [("P8", ".", 8), ("P3*", "P5", 8), ("D", "P2*", 3), ("D", "D", 2), ("D", "D", 2), (".", "D", 1)], 1
        )
    ]
    assert lines == want, (
        "the picture must mark a prefill chunk P<n>, the chunk that completes the prompt with '*', decode "
        "steps D and idle steps '.'\n  want:\n    " + "\n    ".join(want) + "\n  got:\n    " + "\n    ".join(lines)
    )


def test_render_handles_a_one_shot_prefill():
    lines = lab.render_batches(["r"], [{"r": 3}, {"r": 1}, {}], [3])
    cells = [line.split()[1] for line in lines[1:]]
    assert cells == ["P3*", "D", "."], (
        f"a prompt prefilled in one step is 'P3*' (it samples), then 'D', then '.', got {cells}"
    )
    assert [line.split()[-1] for line in lines[1:]] == ["3", "1", "0"], "the last column is the step's total"


def test_render_one_token_prefill_is_not_a_decode():
    # Prefill vs decode is decided by the prompt, not by the chunk size: a 1-token chunk of a prompt
    # is still prefill. A 1-token prompt ("x") is prefilled in one 1-token step, and a budget can
    # leave a 1-token tail of a longer prompt.
    ids, steps = lab.trace_batches(["x", "hello"], max_tokens=2)
    lines = lab.render_batches(ids, steps, [1, 5])
    cells = [line.split()[1:3] for line in lines[1:]]
    assert cells == [["P1*", "P5*"], ["D", "D"]], (
        f"the 1-token prompt 'x' is prefilled (and samples) in step 1, so its cell is 'P1*', not 'D': a "
        f"request is prefilling while the tokens scheduled for it so far are below its prompt length, "
        f"whatever the chunk size. Got {cells}"
    )
    tail = lab.render_batches(["a"], [{"a": 4}, {"a": 1}, {"a": 1}], [5])
    assert [line.split()[1] for line in tail[1:]] == ["P4", "P1*", "D"], (
        f"a 5-token prompt split 4 + 1 is 'P4' then 'P1*' (the 1-token chunk completes the prompt), then 'D', "
        f"got {[line.split()[1] for line in tail[1:]]}"
    )


def test_max_tokens_per_prompt_any_sequence_and_refused_when_the_count_is_wrong():
    # One cap per prompt may come as any sequence (a tuple here): A gets 2 tokens, B gets 3.
    ids, steps = lab.trace_batches([A, B], (2, 3))
    totals = [sum(s.get(rid, 0) for s in steps) for rid in ids]
    assert totals == [11 + 2 - 1, 7 + 3 - 1], (
        f"max_tokens=(2, 3) gives A and B their own caps: scheduled tokens should be [12, 9] "
        f"(prompt + cap - 1), got {totals}; treat any non-int max_tokens as one cap per prompt"
    )
    # Two caps for three prompts (or three for two) is a caller's mistake: refuse it, never run a
    # subset silently or drop the extra caps.
    for prompts, caps in (([A, B, "hey"], [2, 3]), ([A, B], [2, 3, 4])):
        try:
            got = lab.trace_batches(prompts, caps)
        except ValueError:
            continue
        raise AssertionError(
            f"trace_batches with {len(prompts)} prompts and {len(caps)} max_tokens values returned "
            f"{len(got[0])} request ids instead of raising ValueError: check len(max_tokens) == len(prompts) "
            f"(too many as well as too few) before adding any request"
        )
