"""Speculative decoding inside the scheduler and the engine: config, drafts, rollback, properties.

The differential tests against the real vLLM classes live in test_upstream_spec_scheduler.py;
these pin the rules one at a time and check the properties on random traces: greedy output is
exactly the output without speculation, repetitive text takes fewer steps, no block leaks
after rejections, and speculation composes with preemption and prefix caching.
"""

import random
import re

import numpy as np
import pytest

from mini_vllm import (
    CacheConfig,
    LLMEngine,
    Request,
    SamplingParams,
    Scheduler,
    SchedulerConfig,
    SpeculativeConfig,
    VllmConfig,
    create_engine_config,
)
from mini_vllm.outputs import DraftTokenIds
from mini_vllm.testing.spec_traces import run_mini_spec_trace, spec_trace_family

NGRAM = {"num_speculative_tokens": 4, "prompt_lookup_min": 1, "prompt_lookup_max": 3}

# ------------------------------------------------------------------------------- config


def test_speculative_config_defaults_follow_vllm():
    c = SpeculativeConfig(num_speculative_tokens=3)
    assert (c.method, c.prompt_lookup_min, c.prompt_lookup_max) == ("ngram", 5, 5), "neither given: 5 and 5"
    assert SpeculativeConfig(num_speculative_tokens=1, prompt_lookup_max=3).prompt_lookup_min == 3
    assert SpeculativeConfig(num_speculative_tokens=1, prompt_lookup_min=2).prompt_lookup_max == 2
    assert SpeculativeConfig(method="[ngram]", num_speculative_tokens=2).method == "ngram"
    assert c.num_lookahead_tokens == 0, "n-gram drafts write no KV while drafting: no lookahead (upstream)"


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"num_speculative_tokens": 2, "prompt_lookup_min": 4, "prompt_lookup_max": 3}, ValueError,
         r"prompt_lookup_min=4 must be <= prompt_lookup_max=3"),
        ({"num_speculative_tokens": 0}, ValueError, "num_speculative_tokens must be >= 1"),
        ({}, ValueError, "num_speculative_tokens must be provided"),
        ({"num_speculative_tokens": True}, TypeError, "num_speculative_tokens must be an int"),
        ({"num_speculative_tokens": 2, "prompt_lookup_min": 0}, ValueError, "prompt_lookup_min must be >= 1"),
        ({"num_speculative_tokens": 2, "prompt_lookup_max": 2.0}, TypeError, "prompt_lookup_max must be an int"),
        ({"method": "eagle", "num_speculative_tokens": 2}, ValueError, "method='ngram' only"),
    ],
)
def test_speculative_config_errors(kwargs, error, match):
    with pytest.raises(error, match=match):
        SpeculativeConfig(**kwargs)


def test_engine_and_create_engine_config_take_a_dict():
    assert create_engine_config(speculative_config=NGRAM).speculative_config == SpeculativeConfig(**NGRAM)
    assert create_engine_config().speculative_config is None
    engine = LLMEngine(num_gpu_blocks=20, block_size=4, speculative_config=NGRAM)
    assert engine.scheduler.num_spec_tokens == 4 and engine.drafter is not None
    with pytest.raises(TypeError, match="speculative_config must be a SpeculativeConfig"):
        VllmConfig(speculative_config=3)
    with pytest.raises(ValueError, match="must be <= prompt_lookup_max"):
        LLMEngine(speculative_config={"num_speculative_tokens": 2, "prompt_lookup_min": 3, "prompt_lookup_max": 2})


# ------------------------------------------------------------------------------- scheduler rules


def make_sched(k=3, budget=64, max_model_len=40, block_size=4, num_blocks=40):
    return Scheduler(
        VllmConfig(
            CacheConfig(block_size=block_size, num_gpu_blocks=num_blocks),
            SchedulerConfig(max_num_batched_tokens=budget, max_model_len=max_model_len),
            speculative_config=SpeculativeConfig(num_speculative_tokens=k, prompt_lookup_min=1, prompt_lookup_max=2),
        )
    )


def decoding(sched, rid="a", prompt=(5, 6, 7, 8, 9), **params):
    """Admit a request and run its prefill step: it is now one token behind."""
    params.setdefault("max_tokens", 20)
    sched.add_request(Request(rid, list(prompt), SamplingParams(**params)))
    out = sched.schedule()
    sched.update_from_output(out, {rid: 40})
    return sched.requests[rid]


def test_drafts_are_scheduled_with_the_request_and_reported():
    sched = make_sched()
    r = decoding(sched)
    sched.update_draft_token_ids(DraftTokenIds(["a"], [[1, 2, 3]]))
    assert r.num_tokens_with_spec == r.num_tokens + 3
    out = sched.schedule()
    assert out.num_scheduled_tokens == {"a": 4}, "the last real token plus three drafts"
    assert out.scheduled_spec_decode_tokens == {"a": [1, 2, 3]}
    assert r.spec_token_ids == [], "scheduled drafts are spent; the next ones come from the proposer"
    blocks = sched.kv_cache_manager.get_block_ids("a")
    assert len(blocks) == 3, f"positions 0..8 (prompt 5, 1 output, 3 drafts) need 3 blocks of 4, got {blocks}"


def test_rejected_drafts_are_rolled_back_and_counted():
    sched = make_sched()
    r = decoding(sched)
    sched.update_draft_token_ids({"a": [1, 2, 3]})
    out = sched.schedule()
    computed, tokens = r.num_computed_tokens, r.num_tokens
    sched.update_from_output(out, {"a": [1, 9]})  # draft 1 accepted, draft 2 rejected, 9 is the correction
    assert r.num_computed_tokens == computed + 4 - 2, "two drafts rejected: their KV must be recomputed"
    assert r.num_tokens == tokens + 2 and list(r.output_token_ids[-2:]) == [1, 9]
    assert r.num_computed_tokens == r.num_tokens - 1, "after a verify step the request is one token behind"
    stats = sched.make_spec_decoding_stats()
    assert (stats.num_drafts, stats.num_draft_tokens, stats.num_accepted_tokens) == (1, 3, 1)
    assert stats.num_accepted_tokens_per_pos == [1, 0, 0]
    out = sched.schedule()
    assert out.num_scheduled_tokens == {"a": 1} and not out.scheduled_spec_decode_tokens
    sched.update_from_output(out, {"a": 7})
    assert sched.make_spec_decoding_stats() is None, "a step without drafts has no spec stats"


def test_all_drafts_accepted_gives_the_bonus_token():
    sched = make_sched()
    r = decoding(sched)
    sched.update_draft_token_ids({"a": [1, 2]})
    out = sched.schedule()
    sched.update_from_output(out, {"a": [1, 2, 3]})
    assert list(r.output_token_ids) == [40, 1, 2, 3] and r.num_computed_tokens == r.num_tokens - 1


def test_budget_and_max_model_len_cut_the_drafts():
    sched = make_sched(budget=3)
    decoding(sched, prompt=(5, 6))
    sched.update_draft_token_ids({"a": [1, 2, 3]})
    out = sched.schedule()
    assert out.num_scheduled_tokens == {"a": 3} and out.scheduled_spec_decode_tokens == {"a": [1, 2]}
    sched.update_from_output(out, {"a": [1, 2]})
    sched = make_sched(max_model_len=8)  # prompt 5 + 1 output: positions 6 and 7 left, one draft fits
    decoding(sched)
    sched.update_draft_token_ids({"a": [1, 2, 3]})
    out = sched.schedule()
    assert out.num_scheduled_tokens == {"a": 2} and out.scheduled_spec_decode_tokens == {"a": [1]}
    sched.update_from_output(out, {"a": [1, 4]})
    assert sched.requests == {}, "the request reached max_model_len"


def test_budget_with_no_room_for_drafts_schedules_none():
    sched = make_sched(budget=1)
    decoding(sched, prompt=(5,))
    sched.update_draft_token_ids({"a": [1, 2]})
    out = sched.schedule()
    assert out.num_scheduled_tokens == {"a": 1} and out.scheduled_spec_decode_tokens == {}
    sched.update_from_output(out, {"a": 3})


@pytest.mark.parametrize(
    ("params", "emitted", "kept", "reason"),
    [
        ({"stop_token_ids": [2]}, [1, 2, 3], [1, 2], "stop"),
        ({"max_tokens": 3}, [1, 2, 3], [1, 2], "length"),
        ({}, [1, 256, 3], [1, 256], "stop"),  # EOS accepted as a draft
    ],
)
def test_a_stop_inside_the_accepted_list_drops_the_rest(params, emitted, kept, reason):
    sched = make_sched()
    r = decoding(sched, **params)
    sched.update_draft_token_ids({"a": [1, 2 if 2 in emitted[:2] else 256]})
    out = sched.schedule()
    finished = sched.update_from_output(out, {"a": emitted})
    assert finished == [r] and list(r.output_token_ids) == [40, *kept], "tokens after the stop are dropped"
    assert r.get_finished_reason() == reason
    assert sched.kv_cache_manager.block_pool.get_num_free_blocks() == 39, "every block is back in the pool"


def test_preemption_drops_the_drafts():
    sched = make_sched()
    r = decoding(sched)
    sched.update_draft_token_ids({"a": [1, 2]})
    sched.running.pop()
    sched._preempt_request(r)
    assert r.spec_token_ids == [] and r.num_tokens_with_spec == r.num_tokens


def test_update_draft_token_ids_skips_and_refuses():
    sched = make_sched(budget=6)
    r = decoding(sched)
    sched.add_request(Request("b", list(range(10, 20)), SamplingParams(max_tokens=5)))
    out = sched.schedule()  # a: 1 token, b: a 5-token chunk of its prompt
    sched.update_from_output(out, {"a": 41})
    sched.update_draft_token_ids({"a": [1], "b": [2], "gone": [3]})
    assert r.spec_token_ids == [1] and sched.requests["b"].spec_token_ids == [], "a prefill chunk gets no drafts"
    for bad, match in [
        ({"a": [1, 2, 3, 4]}, "at most num_speculative_tokens=3"),
        ({"a": [-1]}, "token ids"),
        ({"a": "ab"}, "list of token ids"),
    ]:
        with pytest.raises(ValueError, match=match):
            sched.update_draft_token_ids(bad)
        assert r.spec_token_ids == [1], "a refused call changes nothing"
    with pytest.raises(TypeError, match="DraftTokenIds or a mapping"):
        sched.update_draft_token_ids([("a", [1])])
    off = Scheduler(VllmConfig(CacheConfig(block_size=4, num_gpu_blocks=20)))
    with pytest.raises(ValueError, match="speculative decoding is off"):
        off.update_draft_token_ids({"a": [1]})


def test_update_from_output_refuses_bad_token_lists_and_changes_nothing():
    sched = make_sched()
    r = decoding(sched)
    sched.update_draft_token_ids({"a": [1, 2]})
    out = sched.schedule()
    before = (r.num_computed_tokens, r.num_tokens)
    for bad in ([], [1, 2, 3, 4], [1, -2], "ab"):
        with pytest.raises(ValueError, match="token ids|non-negative int"):
            sched.update_from_output(out, {"a": bad})
        assert (r.num_computed_tokens, r.num_tokens) == before
    sched.update_from_output(out, {"a": 5})  # a bare int: every draft rejected
    assert r.num_computed_tokens == r.num_tokens - 1 and sched.make_spec_decoding_stats().num_accepted_tokens == 0


# ------------------------------------------------------------------------------- the KV manager


def test_allocate_slots_reserves_the_lookahead_up_to_max_model_len():
    sched = make_sched(max_model_len=20)
    kv = sched.kv_cache_manager
    r = Request("a", [1, 2, 3], SamplingParams(max_tokens=4))
    assert [b.block_id for b in kv.allocate_slots(r, 3, num_lookahead_tokens=6)] == [1, 2, 3], (
        "3 tokens + 6 lookahead slots = 9 slots = 3 blocks of 4"
    )
    r.num_computed_tokens, r.spec_token_ids = 3, [9]  # a running request: the decode fast path
    assert len(kv.allocate_slots(r, 1, num_lookahead_tokens=8)) == 0, "4 + 8 slots fit its 3 blocks"
    assert len(kv.allocate_slots(r, 1, num_lookahead_tokens=9)) == 1, "4 + 9 slots need a 4th block"
    r2 = Request("b", [1, 2, 3, 4, 5], SamplingParams(max_tokens=4))
    assert len(kv.allocate_slots(r2, 5, num_lookahead_tokens=100)) == 5, "capped at max_model_len=20: 5 blocks"
    with pytest.raises(ValueError, match="num_lookahead_tokens"):
        kv.allocate_slots(Request("c", [1], SamplingParams()), 1, num_lookahead_tokens=-1)
    r3 = Request("d", [1, 2], SamplingParams())
    r3.spec_token_ids = [7, 7]
    assert kv.allocate_slots(r3, 4) is not None, "drafts may be scheduled: up to num_tokens_with_spec"
    with pytest.raises(ValueError, match="drafts included"):
        kv.allocate_slots(Request("e", [1, 2], SamplingParams()), 3)


# ------------------------------------------------------------------------------- engine properties


def run(prompts, params, seed=0, spec=None, **engine_args):
    engine = LLMEngine(seed=seed, speculative_config=spec, **engine_args)
    outs = engine.generate(prompts, params)
    return engine, [o.token_ids for o in outs], [o.finish_reason for o in outs]


def random_case(seed):
    rng = random.Random(seed)
    alphabet = rng.choice(["ab", "abc ", "the cat sat on a mat", "xyzzy 0123"])
    prompts = ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 30))) for _ in range(rng.randint(1, 4))]
    max_tokens = [rng.randint(1, 50) for _ in prompts]
    params = [
        SamplingParams(
            max_tokens=n, temperature=0, ignore_eos=rng.random() < 0.5,
            stop_token_ids=rng.choice([[], [ord("a")], [ord(" ")]]),
            min_tokens=min(n, rng.choice([0, 0, 5])), repetition_penalty=rng.choice([1.0, 1.0, 1.3]),
            frequency_penalty=rng.choice([0.0, 0.5]), bad_words_token_ids=rng.choice([(), ((97, 98),)]),
        )
        for n in max_tokens
    ]
    engine_args = {
        "block_size": rng.choice([1, 2, 4, 16]),
        "max_num_seqs": rng.randint(1, 4),
        "max_num_batched_tokens": rng.randint(8, 64),
        "long_prefill_token_threshold": rng.choice([0, 0, 4]),
        "enable_prefix_caching": rng.random() < 0.7,
    }
    engine_args["num_gpu_blocks"] = -(-100 // engine_args["block_size"]) + rng.randint(1, 30)
    engine_args["max_model_len"] = 100
    lo = rng.randint(1, 3)
    spec = {"num_speculative_tokens": rng.randint(1, 6), "prompt_lookup_min": lo, "prompt_lookup_max": lo + rng.randint(0, 2)}
    return prompts, params, engine_args, spec


GREEDY_SEEDS = range(16)


@pytest.mark.parametrize("seed", GREEDY_SEEDS)
def test_greedy_output_is_identical_with_speculation(seed):
    prompts, params, engine_args, spec = random_case(seed)
    base_engine, base, base_reasons = run(prompts, params, **engine_args)
    engine, got, reasons = run(prompts, params, spec=spec, **engine_args)
    assert got == base and reasons == base_reasons, "speculation must never change greedy output"
    assert engine.num_steps <= base_engine.num_steps + len(prompts)
    pool = engine.scheduler.kv_cache_manager.block_pool
    assert pool.get_num_free_blocks() == pool.num_gpu_blocks - 1, "a block leaked (rejected drafts keep theirs)"


def test_greedy_cases_exercise_rejection_preemption_and_prefix_hits():
    rejected = preempted = hits = 0
    for seed in GREEDY_SEEDS:
        prompts, params, engine_args, spec = random_case(seed)
        engine = LLMEngine(speculative_config=spec, **engine_args)
        ids = [engine.add_request(p, sp) for p, sp in zip(prompts, params)]
        requests = [engine.scheduler.requests[i] for i in ids]
        while engine.has_unfinished_requests():
            engine.step()
            s = engine.scheduler.make_spec_decoding_stats()
            if s is not None:
                rejected += s.num_draft_tokens - s.num_accepted_tokens
            hits += engine.scheduler.kv_cache_manager.make_prefix_cache_stats().hits
        preempted += sum(r.num_preemptions for r in requests)
    assert rejected > 50 and preempted > 0 and hits > 0, (rejected, preempted, hits)


def test_speculation_takes_fewer_steps_on_repetitive_text():
    params = SamplingParams(max_tokens=300, temperature=0, ignore_eos=True)
    base_engine, base, _ = run(["the cat", "hello world"], params, block_size=4, num_gpu_blocks=400)
    engine, got, _ = run(["the cat", "hello world"], params, spec=NGRAM, block_size=4, num_gpu_blocks=400)
    assert got == base and base_engine.num_steps == 300
    assert engine.num_steps < 0.5 * base_engine.num_steps, (
        f"the toy model's greedy output cycles with period 64, which the drafter predicts: {engine.num_steps} steps"
    )


def test_random_path_uses_each_requests_own_generator():
    params = SamplingParams(max_tokens=120, temperature=0.8, top_k=20, seed=7, ignore_eos=True)
    other = SamplingParams(max_tokens=60, temperature=1.0, top_p=0.9, ignore_eos=True)
    _, alone, _ = run(["abcabc"], [params], spec=NGRAM, block_size=4, num_gpu_blocks=200)
    engine, batched, _ = run(["xyz", "abcabc", "hello"], [other, params, other], spec=NGRAM, block_size=4,
                             num_gpu_blocks=200)
    assert batched[1] == alone[0], "a seeded request's tokens must not depend on its neighbours"
    _, again, _ = run(["xyz", "abcabc", "hello"], [other, params, other], spec=NGRAM, block_size=4, num_gpu_blocks=200)
    assert again == batched, "same seed, same output"
    assert all(0 <= t < 257 for row in batched for t in row) and len(batched[1]) == 120


@pytest.mark.parametrize("knob", [{"top_k": 1}, {"top_p": 1e-9}, {"min_p": 1.0}])
def test_random_path_with_a_one_token_support_is_greedy(knob):
    """A random request whose filters leave one token has ``p`` one-hot on the argmax: rejection
    sampling must then accept exactly the drafts greedy accepts and recover the argmax, so the
    output equals greedy output with or without speculation (the target rows go through
    temperature, min-p, top-k and top-p as the sampler's would)."""
    prompts = ["the cat", "hello hello", "abcabcabc"]
    greedy = SamplingParams(max_tokens=150, temperature=0, ignore_eos=True, repetition_penalty=1.2)
    filtered = SamplingParams(max_tokens=150, temperature=0.7, ignore_eos=True, repetition_penalty=1.2, **knob)
    _, want, _ = run(prompts, greedy, block_size=4, num_gpu_blocks=300)
    engine, got, _ = run(prompts, filtered, spec=NGRAM, block_size=4, num_gpu_blocks=300)
    assert got == want
    base_engine, _, _ = run(prompts, filtered, block_size=4, num_gpu_blocks=300)
    assert engine.num_steps < base_engine.num_steps, "drafts were accepted on the random path"


@pytest.mark.parametrize("seed", range(6))
def test_scheduler_trace_family_is_deterministic_and_leak_free(seed):
    config, trace = spec_trace_family(seed)
    records = run_mini_spec_trace(config, trace)
    assert records == run_mini_spec_trace(config, trace)
    assert records[-1].num_free_blocks == config.sched.num_gpu_blocks - 1, "every block back in the pool"


def test_trace_family_covers_every_edge():
    preempted = cut_by_budget = cut_by_stop = rejected = 0
    for seed in range(10):
        config, trace = spec_trace_family(seed)
        for s in run_mini_spec_trace(config, trace):
            preempted += len(s.preempted)
            cut_by_budget += sum(len(d) < config.num_speculative_tokens for d in s.spec_tokens.values())
            cut_by_stop += sum(len(s.generated[rid]) < n for rid, n in s.num_emitted.items())
            if s.spec_stats:
                rejected += s.spec_stats[1] - s.spec_stats[2]
    assert preempted and cut_by_budget and cut_by_stop and rejected, (preempted, cut_by_budget, cut_by_stop, rejected)


def test_each_verify_step_emits_the_accepted_drafts_plus_exactly_one_token(monkeypatch):
    """Spy on the engine's hand-off to the scheduler: per request, the emitted list is the
    longest prefix of its drafts that greedy decoding agrees with, then one more token (the
    bonus when every draft was accepted, else the correction), all equal to the greedy output."""
    params = SamplingParams(max_tokens=200, temperature=0, ignore_eos=True)
    prompts = ["the cat", "hello world", "aaaa"]
    _, base, _ = run(prompts, params, block_size=4, num_gpu_blocks=400)
    engine = LLMEngine(block_size=4, num_gpu_blocks=400, speculative_config=NGRAM)
    seen = []
    real_update = engine.scheduler.update_from_output

    def spy(out, sampled, *pooled, **kwargs):
        for rid, drafts in out.scheduled_spec_decode_tokens.items():
            r = engine.scheduler.requests[rid]
            seen.append((rid, r.num_output_tokens, list(drafts), list(sampled[rid])))
        return real_update(out, sampled, *pooled, **kwargs)

    monkeypatch.setattr(engine.scheduler, "update_from_output", spy)
    got = [o.token_ids for o in engine.generate(prompts, params)]
    assert got == base
    full = 0
    for rid, done, drafts, emitted in seen:
        want = base[int(rid.split("-")[1])][done:]
        n = 0
        while n < len(drafts) and n < len(want) and drafts[n] == want[n]:
            n += 1
        if len(want) <= len(drafts):  # max_tokens ends the request inside this list: only the prefix counts
            assert emitted[: len(want)] == want[: len(emitted)]
            continue
        ok = emitted == want[: n + 1]
        assert ok, f"{rid}: drafts {drafts} -> emit the {n} accepted + one, got {emitted}"
        full += n == len(drafts)
    assert full > 10, "some steps accepted every draft and must have carried the bonus token"


# ----------------------------------------------------------------- speculation with the other knobs
@pytest.mark.parametrize(
    "knobs",
    [
        {"repetition_penalty": 1.3},
        {"frequency_penalty": 0.3},
        {"frequency_penalty": 0.8, "presence_penalty": 0.5},
        # two pairs the toy model's greedy output contains, so drafts propose them and the ban must fire
        {"bad_words_token_ids": [[102, 183]]},
        {"bad_words_token_ids": [[114, 122]]},
        {"min_tokens": 40},
    ],
    ids=["repetition", "frequency", "frequency-presence", "bad-words-a", "bad-words-b", "min-tokens"],
)
def test_greedy_output_with_history_knobs_is_identical_with_speculation(knobs):
    # Each draft position is verified with the history it would have had: output so far + earlier drafts.
    params = SamplingParams(max_tokens=120, temperature=0, ignore_eos=not knobs.get("min_tokens"), **knobs)
    prompts = ["the cat sat on the mat. the cat sat", "abcabcabc"]
    base_engine, base, base_reasons = run(prompts, params, block_size=4, num_gpu_blocks=200)
    engine, got, reasons = run(prompts, params, spec=NGRAM, block_size=4, num_gpu_blocks=200)
    assert got == base and reasons == base_reasons, (
        f"with {knobs} speculation changed greedy output: verify each draft with the history of its position "
        "(the output so far plus the drafts before it), and the bonus token with every draft in its history"
    )
    stats = engine.scheduler.kv_cache_manager.block_pool
    assert stats.get_num_free_blocks() == stats.num_gpu_blocks - 1


@pytest.mark.parametrize("pattern", ["(ab)+c", "a(b|c)*d", "(abc)+"])
def test_constrained_drafts_are_trimmed_to_the_grammar_and_output_is_unchanged(pattern):
    from mini_vllm import StructuredOutputsParams

    def run_constrained(spec):
        engine = LLMEngine(speculative_config=spec, block_size=4, num_gpu_blocks=200)
        params = SamplingParams(max_tokens=40, temperature=0, structured_outputs=StructuredOutputsParams(regex=pattern))
        rid = engine.add_request("abababcabcabcabc", params)
        drafts, legal = [], engine.structured_output_manager
        for _ in range(200):
            if not engine.has_unfinished_requests():
                break
            request = engine.scheduler.requests.get(rid)
            if request is not None and request.spec_token_ids:
                drafts.append(list(request.spec_token_ids))
                assert legal.validate_draft_tokens(rid, request.spec_token_ids) == request.spec_token_ids, (
                    f"drafts {request.spec_token_ids} were scheduled past what the grammar accepts: trim them with "
                    "validate_draft_tokens when they are proposed"
                )
            finished = engine.step()
        else:
            pytest.fail("not finished after 200 steps")
        return engine, finished[0], drafts

    base_engine, base, _ = run_constrained(None)
    engine, got, drafts = run_constrained(NGRAM)
    assert drafts, f"the repetitive prompt should give {pattern!r}'s request drafts"
    assert (got.token_ids, got.finish_reason) == (base.token_ids, base.finish_reason), (
        f"speculation changed a constrained greedy output: {got.text!r} vs {base.text!r}; mask every verified "
        "position with the grammar's state after the drafts before it"
    )
    assert re.fullmatch(pattern, got.text) or got.finish_reason == "length", f"{got.text!r} breaks {pattern!r}"
    assert not engine.structured_output_manager.grammars, "a finished request's grammar must be freed"


@pytest.mark.parametrize(
    "knobs",
    [
        {"temperature": 0.3},
        {"temperature": 0.3, "top_k": 5},
        {"temperature": 1.7, "top_p": 0.8},
        {"temperature": 0.6, "min_p": 0.05},
    ],
)
def test_verify_rows_use_the_requests_temperature_and_filters(monkeypatch, knobs):
    """Every draft row the rejection sampler verifies must carry the distribution the sampler
    would draw from: softmax(logits / T), then top-k / top-p, written here from the definitions
    (not only at T = 1 or greedy, where a dropped temperature is invisible)."""
    from mini_vllm import model_runner

    captured = []
    real_sample, real_reject = model_runner.GPUModelRunner._sample, model_runner.rejection_sample

    def sample(self, logits, req_ids, first_rows, spec):
        drafts = [spec.get(rid, []) for rid in req_ids]
        rows = [first_rows[i] + j for i, d in enumerate(drafts) for j in range(len(d))]
        captured.append([logits[r].astype(np.float64) for r in rows])
        return real_sample(self, logits, req_ids, first_rows, spec)

    def reject(draft_ids, num_draft, draft_probs, target_logits, *args, **kwargs):
        captured[-1] = (captured[-1], np.array(target_logits, dtype=np.float64))
        return real_reject(draft_ids, num_draft, draft_probs, target_logits, *args, **kwargs)

    monkeypatch.setattr(model_runner.GPUModelRunner, "_sample", sample)
    monkeypatch.setattr(model_runner, "rejection_sample", reject)
    params = SamplingParams(max_tokens=40, seed=3, ignore_eos=True, **knobs)
    run(["abcabcabc", "hello hello"], params, spec=NGRAM, block_size=4, num_gpu_blocks=200)
    verified = [c for c in captured if isinstance(c, tuple)]
    assert verified, "no draft was verified: the test needs repetitive prompts"
    for raw_rows, target in verified:
        for raw, got in zip(raw_rows, target, strict=True):
            x = raw / knobs["temperature"]
            if "min_p" in knobs:  # drop tokens below min_p times the top probability
                x = np.where(np.exp(x - x.max()) >= knobs["min_p"], x, -np.inf)
            if "top_k" in knobs:
                x = np.where(x >= np.sort(x)[-knobs["top_k"]], x, -np.inf)
            want = np.exp(x - x.max())
            want /= want.sum()
            if "top_p" in knobs:
                order = np.argsort(-want, kind="stable")
                keep = np.cumsum(want[order]) - want[order] < knobs["top_p"]
                mask = np.zeros_like(want, dtype=bool)
                mask[order[keep]] = True
                want = np.where(mask, want, 0.0)
                want /= want.sum()
            with np.errstate(invalid="ignore"):
                have = np.exp(got - got.max())
            have /= have.sum()
            np.testing.assert_allclose(
                have, want, atol=1e-9,
                err_msg=f"a verified draft row's target distribution is not the sampler's at {knobs}: "
                "divide by the request's temperature and apply its filters before rejection sampling",
            )
