import numpy as np

import mini_vllm
from course.runtime import lab_module

lab = lab_module(__file__)   # solution.py by default; LAB_IMPL=starter grades starter.py


def greedy(max_tokens):
    return mini_vllm.SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)


class CountingModel:
    """Wraps the engine's toy model and records every forward call."""

    def __init__(self, model):
        self.model = model
        self.calls = []  # (last_tokens, positions) per call

    def forward(self, last_tokens, positions):
        self.calls.append((list(np.asarray(last_tokens)), list(np.asarray(positions))))
        return self.model.forward(last_tokens, positions)


class CountingSampler:
    def __init__(self, sampler):
        self.sampler = sampler
        self.calls = 0

    def sample(self, logits, params, generator=None):
        self.calls += 1
        return self.sampler.sample(logits, params, generator)


def run_both(jobs, **engine_kwargs):
    """Run the same requests through LLMEngine.step (reference) and lab.engine_step (yours).

    Returns per-step (scheduled dict, finished ids) traces and final outputs for both.
    """
    traces = []
    for use_lab in (False, True):
        engine = mini_vllm.LLMEngine(**engine_kwargs)
        ids = [engine.add_request(prompt, greedy(n)) for prompt, n in jobs]
        requests = [engine.scheduler.requests[rid] for rid in ids]
        steps = []
        for _ in range(200):
            if not engine.has_unfinished_requests():
                break
            before = [r.num_computed_tokens for r in requests]
            if use_lab:
                finished = [r.request_id for r in lab.engine_step(engine.scheduler, engine.model, engine.sampler)]
            else:
                finished = [o.request_id for o in engine.step()]
            moved = {r.request_id: r.num_computed_tokens - b for r, b in zip(requests, before)
                     if r.num_computed_tokens != b}
            steps.append((moved, sorted(finished)))
        outputs = {r.request_id: list(r.output_token_ids) for r in requests}
        statuses = {r.request_id: r.status.name for r in requests}
        traces.append((steps, outputs, statuses))
    return traces


def test_single_request_matches_reference():
    (ref_steps, ref_out, ref_status), (steps, out, status) = run_both([("hello", 6)])
    assert out == ref_out, (
        f"your engine_step produced different tokens from LLMEngine.step for one greedy request:\n"
        f"  reference {ref_out}\n  yours     {out}\nfeed the model the LAST scheduled token and its "
        f"position (num_computed_tokens + n - 1) and sample with sampler.sample(logits[i], params)"
    )
    assert steps == ref_steps, f"per-step schedule/finish differs:\n  reference {ref_steps}\n  yours     {steps}"
    assert status == ref_status, f"final statuses differ: reference {ref_status}, yours {status}"


def test_batch_matches_reference():
    jobs = [("hello world", 5), ("hi", 3), ("the quick brown fox", 4)]
    (ref_steps, ref_out, _), (steps, out, _) = run_both(jobs)
    assert out == ref_out, (
        f"with three requests in one batch your tokens differ from the engine's: row i of the logits "
        f"must go to out.scheduled_requests[i] (no swaps between requests).\n  reference {ref_out}\n  yours     {out}"
    )
    assert steps == ref_steps, f"per-step schedule/finish differs:\n  reference {ref_steps}\n  yours     {steps}"


def test_matches_under_chunked_prefill():
    jobs = [("a much longer prompt here", 4), ("short", 3), ("another prompt", 2)]
    kw = {"max_num_batched_tokens": 6, "long_prefill_token_threshold": 4}
    (ref_steps, ref_out, _), (steps, out, _) = run_both(jobs, **kw)
    assert sum(1 for d, _ in ref_steps if sum(d.values()) == 6) >= 3, "test setup: the budget of 6 should bind often"
    assert steps == ref_steps, (
        f"under a tight budget (6) and chunks of at most 4 your loop scheduled/finished differently:\n"
        f"  reference {ref_steps}\n  yours     {steps}\ncall update_from_output every step, even when "
        f"nothing was sampled, or a chunked prefill never advances"
    )
    assert out == ref_out, f"tokens differ under chunked prefill:\n  reference {ref_out}\n  yours     {out}"


def test_mid_prefill_chunk_emits_no_token():
    engine = mini_vllm.LLMEngine(long_prefill_token_threshold=4)
    rid = engine.add_request("abcdefghij", greedy(2))
    request = engine.scheduler.requests[rid]
    sampler = CountingSampler(engine.sampler)
    lab.engine_step(engine.scheduler, engine.model, sampler)
    assert request.num_computed_tokens == 4, (
        f"the first step prefills a 4-token chunk, so num_computed_tokens must be 4, got {request.num_computed_tokens}"
    )
    assert request.num_output_tokens == 0 and sampler.calls == 0, (
        f"a mid-prefill chunk (4 of 10 prompt tokens) must not sample: its logits belong to a prompt "
        f"position. Guard with Scheduler.needs_sample(request, n). Sampler calls: {sampler.calls}, "
        f"output tokens: {list(request.output_token_ids)}"
    )
    lab.engine_step(engine.scheduler, engine.model, sampler)
    lab.engine_step(engine.scheduler, engine.model, sampler)
    assert (request.num_computed_tokens, request.num_output_tokens, sampler.calls) == (10, 1, 1), (
        "after chunks 4 + 4 + 2 the prompt is complete and exactly one token is sampled, in the third step; "
        f"got num_computed_tokens={request.num_computed_tokens}, outputs={request.num_output_tokens}, "
        f"sampler calls={sampler.calls}"
    )


def test_empty_schedule_returns_no_finished():
    engine = mini_vllm.LLMEngine()
    model = CountingModel(engine.model)
    sampler = CountingSampler(engine.sampler)
    for _ in range(2):  # twice: a skipped update_from_output would make the second schedule() fail
        finished = lab.engine_step(engine.scheduler, model, sampler)
        assert finished == [], f"an idle engine finishes nothing, got {finished}"
    assert model.calls == [] and sampler.calls == 0, (
        f"with nothing scheduled, do not run the model or the sampler (forward calls: {len(model.calls)}, "
        f"sampler calls: {sampler.calls})"
    )


def test_one_batched_forward_per_step():
    engine = mini_vllm.LLMEngine()
    prompts = ["hello", "hi", "howdy"]
    for p in prompts:
        engine.add_request(p, greedy(2))
    model = CountingModel(engine.model)
    lab.engine_step(engine.scheduler, model, engine.sampler)
    assert len(model.calls) == 1, f"run the whole batch in ONE model.forward call, got {len(model.calls)} calls"
    last_tokens, positions = model.calls[0]
    assert positions == [len(p) - 1 for p in prompts], (
        f"each prefill row must use its request's last prompt position (len - 1), got positions {positions}"
    )
    assert last_tokens == [ord(p[-1]) for p in prompts], (
        f"each row's token must be the token AT that position (the prompt's last byte), got {last_tokens}"
    )


def test_a_mid_prefill_chunk_feeds_the_token_at_its_own_last_position():
    # Chunks of 4 over a 10-token prompt: steps end at positions 3, 7 and 9. Each row's token is the
    # one AT that position ('d', 'h', 'j'), not the newest token of the whole sequence.
    engine = mini_vllm.LLMEngine(long_prefill_token_threshold=4)
    engine.add_request("abcdefghij", greedy(2))
    model = CountingModel(engine.model)
    for _ in range(3):
        lab.engine_step(engine.scheduler, model, engine.sampler)
    got = [(calls[0][0], calls[1][0]) for calls in model.calls]
    want = [(ord("d"), 3), (ord("h"), 7), (ord("j"), 9)]
    assert got == want, (
        f"(token, position) per prefill chunk should be {want}, got {got}: the token of row i is "
        f"all_token_ids[c + n - 1], the one at the chunk's last position, not all_token_ids[-1]"
    )


def test_each_row_is_sampled_with_its_own_requests_params():
    # Mixed knobs in one batch: greedy first, then two seeded random requests. Each row is drawn with
    # ITS request's SamplingParams, never one params object for the whole batch.
    engine = mini_vllm.LLMEngine()
    params = [
        greedy(3),
        mini_vllm.SamplingParams(max_tokens=3, temperature=1.0, seed=7, ignore_eos=True),
        mini_vllm.SamplingParams(max_tokens=3, temperature=1.5, seed=3, ignore_eos=True),
    ]
    ids = [engine.add_request(p, sp) for p, sp in zip(["hello world", "hi", "the quick brown fox"], params)]
    seen = []

    class ParamsSpy:
        def sample(self, logits, sp, generator=None):
            seen.append(sp)
            return engine.sampler.sample(logits, sp, generator)

    lab.engine_step(engine.scheduler, engine.model, ParamsSpy())
    want = [engine.scheduler.requests[rid].sampling_params for rid in ids]
    assert len(seen) == 3 and all(a is b for a, b in zip(seen, want)), (
        f"step 1 samples all three rows; row i must use request i's own SamplingParams. Got temperatures "
        f"{[sp.temperature for sp in seen]}, expected {[sp.temperature for sp in want]}"
    )


def test_a_preempted_request_samples_only_when_its_recompute_catches_up():
    # 4 usable blocks of 4 slots cannot hold two 5-token prompts growing to 12 tokens: one is
    # preempted and later recomputes prompt + outputs in chunks of 4. A chunk that covers the
    # prompt but not yet the earlier outputs (c + n >= num_prompt_tokens, < num_tokens) is still
    # mid-prefill: sampling there would invent a token in the middle of the known sequence.
    kw = {"num_gpu_blocks": 5, "block_size": 4, "long_prefill_token_threshold": 4, "enable_prefix_caching": False}
    jobs = [("hello", 8), ("world", 8)]
    try:
        (ref_steps, ref_out, _), (steps, out, _) = run_both(jobs, **kw)
    except ValueError as e:
        raise AssertionError(
            f"after a preemption the recompute of prompt + outputs was sampled too early ({e}): a request "
            f"samples only when num_computed_tokens + n reaches num_tokens (Scheduler.needs_sample), not "
            f"when it passes the prompt length"
        ) from None
    assert any(n < 0 for moved, _ in ref_steps for n in moved.values()), (
        "test setup: a request should be preempted (its num_computed_tokens drops back) in this run"
    )
    assert steps == ref_steps, f"per-step schedule/finish differs:\n  reference {ref_steps}\n  yours     {steps}"
    assert out == ref_out, f"tokens differ after a preemption:\n  reference {ref_out}\n  yours     {out}"
