import numpy as np

from mini_vllm import LLMEngine, SamplingParams

GREEDY = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
PROMPTS = ["hello world, this is a longer prompt that spans blocks", "hi", "the quick brown fox " * 3]


def token_ids(outputs):
    return [o.token_ids for o in outputs]


def record_schedules(engine):
    """Wrap engine.scheduler.schedule so every SchedulerOutput is kept (behaviour unchanged)."""
    outputs = []
    schedule = engine.scheduler.schedule

    def probe():
        out = schedule()
        outputs.append(out)
        return out

    engine.scheduler.schedule = probe
    return outputs


def test_generate_hi():
    (out,) = LLMEngine().generate(["hi"], SamplingParams(max_tokens=4, temperature=0))
    assert out.request_id == "req-0" and out.prompt == "hi" and out.prompt_token_ids == [104, 105]
    assert len(out.token_ids) == 4 and out.finish_reason == "length" and out.finished
    assert isinstance(out.text, str)


def test_request_ids_count_per_engine_and_outputs_keep_input_order():
    eng = LLMEngine()
    outs = eng.generate(["a long prompt " * 4, "b"], SamplingParams(max_tokens=2, temperature=0))
    assert [o.request_id for o in outs] == ["req-0", "req-1"]
    assert eng.add_request("x") == "req-2"
    assert LLMEngine().add_request("y") == "req-0", "a fresh engine starts counting again"


def test_step_loop_matches_generate_and_reports_counters():
    eng = LLMEngine()
    rid = eng.add_request("hello", SamplingParams(max_tokens=4, temperature=0, ignore_eos=True))
    trace, finished = [], []
    while eng.has_unfinished_requests():
        done = eng.step()
        finished += done
        trace += [(r.status.name, r.num_computed_tokens, r.num_tokens) for r in eng.scheduler.running]
    assert trace == [("RUNNING", 5, 6), ("RUNNING", 6, 7), ("RUNNING", 7, 8)], (
        "prefill + first token in step 1"
    )
    assert [o.request_id for o in finished] == [rid] and len(finished[0].token_ids) == 4
    assert token_ids(finished) == token_ids(
        LLMEngine().generate(["hello"], SamplingParams(max_tokens=4, temperature=0, ignore_eos=True))
    )


def test_tight_budget_mixes_prefill_and_decode():
    eng = LLMEngine(max_num_batched_tokens=8)
    eng.add_request("hello world", SamplingParams(max_tokens=4, temperature=0, ignore_eos=True))
    eng.add_request("goodbye", SamplingParams(max_tokens=4, temperature=0, ignore_eos=True))
    outs = record_schedules(eng)
    while eng.has_unfinished_requests():
        eng.step()
    plans = [dict(o.num_scheduled_tokens) for o in outs]
    assert plans == [
        {"req-0": 8},
        {"req-0": 3, "req-1": 5},
        {"req-0": 1, "req-1": 2},
        {"req-0": 1, "req-1": 1},
        {"req-0": 1, "req-1": 1},
        {"req-1": 1},
    ]


def test_chunked_prefill_matches_unchunked_output():
    for params in (GREEDY, SamplingParams(max_tokens=12, temperature=0.8, top_k=50, top_p=0.9)):
        whole = LLMEngine().generate(PROMPTS, params)
        chunked = LLMEngine(long_prefill_token_threshold=5, max_num_batched_tokens=16).generate(
            PROMPTS, params
        )
        assert token_ids(whole) == token_ids(chunked), (
            "chunking may change when a position is computed, never its token"
        )


def test_prefix_caching_matches_no_caching_output():
    shared = "You are a helpful assistant. Answer briefly. " * 2
    prompts = [shared + q for q in ("What is 2+2?", "Name a colour.", "What is 2+2?")]
    on = LLMEngine(block_size=4)
    off = LLMEngine(block_size=4, enable_prefix_caching=False)
    assert token_ids(on.generate(prompts, GREEDY)) == token_ids(off.generate(prompts, GREEDY))


def test_preemption_matches_no_preemption_output():
    # 4 usable blocks x 4 = 16 slots = max_model_len, so an 8-token prompt gets at most 8 outputs
    params = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
    prompts = ["abcdefgh", "ijklmnop"]
    cramped = LLMEngine(num_gpu_blocks=5, block_size=4)
    outs = record_schedules(cramped)
    tight = cramped.generate(prompts, params)
    roomy = LLMEngine(num_gpu_blocks=256, block_size=4).generate(prompts, params)
    assert any(o.preempted_req_ids for o in outs), "the 5-block pool must actually force a preemption"
    assert token_ids(tight) == token_ids(roomy) and all(len(o.token_ids) == 8 for o in tight)


def test_sampling_is_reproducible_per_engine_seed_and_request_seed():
    params = SamplingParams(max_tokens=10, temperature=1.0)
    a = LLMEngine(seed=3).generate(PROMPTS, params)
    b = LLMEngine(seed=3).generate(PROMPTS, params)
    c = LLMEngine(seed=4).generate(PROMPTS, params)
    assert token_ids(a) == token_ids(b) and token_ids(a) != token_ids(c)
    seeded = SamplingParams(max_tokens=10, temperature=1.0, seed=11)
    assert token_ids(LLMEngine(seed=1).generate(["x"], seeded)) == token_ids(
        LLMEngine(seed=2).generate(["x"], seeded)
    )


def _eos_prompt():
    model = LLMEngine().model
    for pos in range(3, 64):
        logits = model.forward(np.arange(257), np.full(257, pos))
        hits = np.flatnonzero(logits.argmax(axis=1) == 256)
        if len(hits):
            return [32] * pos + [int(hits[0])]
    raise AssertionError("the toy model never predicts EOS")


def test_eos_stops_unless_ignored():
    prompt = _eos_prompt()
    (out,) = LLMEngine().generate([prompt], SamplingParams(max_tokens=5, temperature=0))
    assert out.token_ids == [256] and out.finish_reason == "stop" and out.text == "" and out.prompt is None
    (out,) = LLMEngine().generate([prompt], SamplingParams(max_tokens=5, temperature=0, ignore_eos=True))
    assert len(out.token_ids) == 5 and out.finish_reason == "length"


def test_max_model_len_caps_generation():
    (out,) = LLMEngine(max_model_len=8).generate(
        ["hello"], SamplingParams(max_tokens=10, temperature=0, ignore_eos=True)
    )
    assert len(out.token_ids) == 3 and out.finish_reason == "length", "5 prompt + 3 output = max_model_len 8"


def test_abort_request():
    eng = LLMEngine()
    rid = eng.add_request("hello")
    eng.step()
    (out,) = eng.abort_request(rid)
    assert out.finish_reason == "abort" and not eng.has_unfinished_requests()
    assert eng.scheduler.kv_cache_manager.block_pool.get_usage() == 0.0


def test_prefix_cache_savings_accounting():
    """Phase 03 lab-05's numbers: 8 prompts sharing 64 tokens at block size 4, max_tokens 4."""
    prompts = ["S" * 64 + str(i) for i in range(8)]
    params = SamplingParams(max_tokens=4, temperature=0, ignore_eos=True)
    totals = {}
    for caching in (False, True):
        eng = LLMEngine(block_size=4, enable_prefix_caching=caching)
        outs = record_schedules(eng)
        eng.generate(prompts, params)
        totals[caching] = sum(o.total_num_scheduled_tokens for o in outs)
    assert totals == {False: 8 * (65 + 3), True: 68 + 7 * 4}, "544 without caching, 96 with"


def test_importing_mini_vllm_never_imports_torch_or_vllm():
    import subprocess
    import sys

    code = "import sys, mini_vllm; print(sorted(m for m in ('torch', 'vllm') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]", "mini_vllm must stay numpy-only at import; real_vllm is imported lazily"


def test_cache_salt_walls_off_the_prefix_cache():
    """A salted prompt hits only blocks cached under the same salt; a bad salt queues nothing."""
    import pytest

    engine = LLMEngine(block_size=4)
    prompt = "a prompt of six blocks!!"  # 24 bytes; hits stop below num_tokens - 1: 5 blocks, 20 tokens
    engine.generate([prompt], SamplingParams(max_tokens=2, temperature=0))
    engine.add_request(prompt, SamplingParams(max_tokens=2, temperature=0), cache_salt="tenant-1")
    engine.generate([prompt], SamplingParams(max_tokens=2, temperature=0))  # drains both
    engine.add_request(prompt, SamplingParams(max_tokens=2), request_id="same-salt", cache_salt="tenant-1")
    engine.add_request(prompt, SamplingParams(max_tokens=2), request_id="other-salt", cache_salt="tenant-2")
    engine.add_request(prompt, SamplingParams(max_tokens=2), request_id="no-salt")
    kv, waiting = engine.scheduler.kv_cache_manager, {r.request_id: r for r in engine.scheduler.waiting}
    hits = {rid: kv.get_computed_blocks(r)[1] for rid, r in waiting.items()}
    assert hits == {"same-salt": 20, "other-salt": 0, "no-salt": 20}, f"prefix hits per request: {hits}"
    with pytest.raises(ValueError, match="cache_salt"):
        engine.add_request(prompt, cache_salt="")
    assert len(engine.scheduler.requests) == 3, "a refused salt must queue nothing"


def test_grammar_drafts_are_cut_before_an_eos():
    # post_step keeps the drafts the grammar accepts, and of those only the ones before an EOS: the
    # scheduler stops a request at an EOS mid-list, so a draft EOS would end it on a guess.
    from mini_vllm import StructuredOutputsParams
    from mini_vllm.outputs import DraftTokenIds

    spec = {"num_speculative_tokens": 4, "prompt_lookup_min": 1, "prompt_lookup_max": 3}
    engine = LLMEngine(speculative_config=spec, block_size=4, num_gpu_blocks=64)
    params = SamplingParams(
        max_tokens=20, temperature=0, structured_outputs=StructuredOutputsParams(regex="a+")
    )
    rid = engine.add_request("aaaa", params)
    engine.step()  # the prefill: the output is "a", where "a+" accepts, so EOS is legal next
    eos, a = engine.tokenizer.eos_token_id, ord("a")
    engine.model_executor.take_draft_token_ids = lambda: DraftTokenIds([rid], [[a, eos, a]])
    engine.post_step(set())
    drafts = engine.scheduler.requests[rid].spec_token_ids
    assert list(drafts) == [a], (
        f"drafts {[a, eos, a]} under 'a+' were scheduled as {list(drafts)}: keep the prefix the grammar "
        "accepts ([a, EOS]) and cut it before the EOS"
    )
