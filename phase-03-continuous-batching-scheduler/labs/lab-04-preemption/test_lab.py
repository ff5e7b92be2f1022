import functools

from course.runtime import lab_module
from mini_vllm import RequestStatus

lab = lab_module(__file__)   # solution.py by default; LAB_IMPL=starter grades starter.py


PROMPTS = ["abcdefgh", "ijklmnop"]  # 8 byte-tokens each
CRAMPED = {"num_gpu_blocks": 5, "block_size": 4}
ROOMY = {"num_gpu_blocks": 256, "block_size": 4}


@functools.cache
def traced(pool: str, max_tokens: int):
    return lab.trace(PROMPTS, **(CRAMPED if pool == "cramped" else ROOMY), max_tokens=max_tokens)


def test_first_proposal_can_never_finish():
    need = lab.kv_blocks_needed(8, 20, 4)
    assert need == 7, (
        f"8 prompt + 20 output tokens leave 8 + 20 - 1 = 27 tokens of KV (the last sampled token is never "
        f"fed back) = ceil(27/4) = 7 blocks, got {need}"
    )
    need9 = lab.kv_blocks_needed(8, 9, 4)
    assert need9 == 4, (
        f"with max_tokens=9 the KV holds 8 + 9 - 1 = 16 tokens = 4 blocks (the 9th token is sampled, never "
        f"computed), got {need9}"
    )
    fit = lab.max_tokens_that_fit(5, 4, 8)
    assert fit == 8, (
        f"5 blocks minus the null block = 16 slots; max_model_len is capped at 16 and counts the last "
        f"sampled token too, so max_tokens <= 16 - 8 = 8, got {fit}"
    )
    first = traced("cramped", 20)
    assert [len(t) for t in first.token_ids] == [8, 8] and first.finish_reasons == ["length", "length"], (
        f"with max_tokens=20 the engine stops each request at max_model_len: 8 tokens, reason 'length'; "
        f"got {[len(t) for t in first.token_ids]} tokens, reasons {first.finish_reasons}"
    )


def test_cramped_pool_matches_roomy_pool():
    max_tokens = lab.max_tokens_that_fit(5, 4, 8)
    cramped = lab.run(PROMPTS, **CRAMPED, max_tokens=max_tokens)
    roomy = lab.run(PROMPTS, **ROOMY, max_tokens=max_tokens)
    assert [len(t) for t in cramped] == [max_tokens, max_tokens], (
        f"both requests must reach their full max_tokens={max_tokens} in the cramped pool, got "
        f"{[len(t) for t in cramped]}: pick a max_tokens that fits (and pass the pool size to the engine)"
    )
    assert cramped == roomy, (
        f"a cramped pool (preemption) must produce exactly the roomy pool's tokens: {cramped} vs {roomy}"
    )


def test_preemption_actually_happens_under_pressure():
    engine = lab.make_engine(5, 4)
    from mini_vllm import SamplingParams

    params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    a, b = (engine.add_request(p, params) for p in PROMPTS)
    sched = engine.scheduler
    out = sched.schedule()
    assert out.num_scheduled_tokens == {a: 8, b: 8}, (
        f"both 8-token prompts are admitted in step 1 (2 blocks each fill the 4 usable blocks), "
        f"got {out.num_scheduled_tokens}: make_engine must build a 5-block pool of 4-slot blocks"
    )
    sched.update_from_output(out, {a: 65, b: 66})  # both caught up: each sampled one token
    out = sched.schedule()
    assert out.preempted_req_ids == {b}, (
        f"A needs a 3rd block for position 8 and none is free: the most recently admitted request ({b}) "
        f"must be preempted, got {out.preempted_req_ids}"
    )
    victim = sched.requests[b]
    assert victim.status == RequestStatus.PREEMPTED and victim.num_computed_tokens == 0, (
        "the victim is PREEMPTED with its counter reset to 0 (its KV is gone)"
    )
    assert list(victim.output_token_ids) == [66], "the victim keeps its generated token: recompute, not restart"
    assert sched.waiting[0] is victim, "the victim goes to the FRONT of waiting"
    assert out.num_scheduled_tokens == {a: 1}, f"nobody is admitted in a step that preempted, got {out.num_scheduled_tokens}"


def test_victim_is_recomputed_from_prompt_plus_outputs():
    t = traced("cramped", 8)
    assert t.preempted[1] == {"req-1"} and t.scheduled[1] == {"req-0": 1}, (
        f"step 2 must preempt req-1 and run only req-0's decode, got {t.scheduled[1]} / {t.preempted[1]}"
    )
    readmit = [s for s in t.scheduled if s.get("req-1", 0) > 1][1:]
    assert readmit and readmit[0]["req-1"] == 9, (
        f"req-1 comes back with num_computed_tokens = 0 and replays prompt (8) + its 1 output = 9 tokens, "
        f"got {readmit}"
    )
    assert t.num_preemptions == {"req-0": 0, "req-1": 1}, f"exactly one preemption, of req-1: {t.num_preemptions}"


def test_preemption_costs_exactly_the_lost_prefill():
    cramped, roomy = traced("cramped", 8), traced("roomy", 8)
    total_c = sum(sum(s.values()) for s in cramped.scheduled)
    total_r = sum(sum(s.values()) for s in roomy.scheduled)
    assert total_r == 2 * (8 + 8 - 1), f"roomy: each request computes prompt + max_tokens - 1 = 15 tokens, got {total_r}"
    assert total_c - total_r == 8, (
        f"the cramped run recomputes exactly the victim's lost KV (its 8 prompt tokens): "
        f"{total_c} - {total_r} should be 8"
    )
    assert roomy.num_preemptions == {"req-0": 0, "req-1": 0}, "a roomy pool never preempts"


def test_prompt_ending_mid_block_at_block_size_8():
    assert lab.kv_blocks_needed(6, 3, 4) == 2, (
        "6 prompt + 3 output tokens leave 8 tokens of KV = 2 blocks of 4: the first outputs fill the prompt's "
        "tail block, they do not start a new one")
    assert lab.kv_blocks_needed(5, 12, 8) == 2, "5 + 12 - 1 = 16 tokens of KV at block size 8 = 2 blocks"
    fit = lab.max_tokens_that_fit(3, 8, 5)
    assert fit == 11, (
        f"3 blocks of 8 minus the null block = 16 slots, and a 5-token prompt leaves 16 - 5 = 11 (its tail block's "
        f"3 free slots included), got {fit}")
    prompts = ["abcde", "fghij"]
    cramped = lab.trace(prompts, 3, 8, fit)
    roomy = lab.trace(prompts, 256, 8, fit)
    assert [len(t) for t in cramped.token_ids] == [11, 11] and cramped.token_ids == roomy.token_ids, (
        f"at block size 8 the cramped pool must still deliver 11 tokens each, equal to a roomy pool's: "
        f"{cramped.token_ids} vs {roomy.token_ids}")
    assert cramped.num_preemptions == {"req-0": 0, "req-1": 1}, f"one preemption of req-1, got {cramped.num_preemptions}"


def test_trace_ignores_eos():
    # Under greedy decoding the toy model's first token after "66666666" is EOS (id 256): without
    # ignore_eos that request stops after 1 token and the pool arithmetic no longer describes the run.
    t = lab.trace(["66666666", "abcdefgh"], **ROOMY, max_tokens=4)
    lengths = [len(ids) for ids in t.token_ids]
    assert lengths == [4, 4] and t.finish_reasons == ["length", "length"], (
        f"both requests must generate all 4 tokens and finish with 'length', got lengths {lengths}, "
        f"reasons {t.finish_reasons}: trace must pass ignore_eos=True (a prompt whose greedy next token is EOS)"
    )


def test_make_engine_keeps_prefix_caching_and_eight_seats():
    from mini_vllm import SamplingParams

    engine = lab.make_engine(64, 4)
    params = SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True)
    ids = [engine.add_request("abcdefghi", params) for _ in range(9)]  # 9 identical 9-token prompts
    out = engine.scheduler.schedule()
    got = [out.num_scheduled_tokens.get(rid, 0) for rid in ids]
    assert got == [9] + [1] * 7 + [0], (
        f"with prefix caching on and max_num_seqs=8, the first copy computes 9 tokens, the next 7 adopt its two "
        f"full blocks (8 tokens) and compute 1, the 9th waits for a seat; got {got}: make_engine must keep "
        f"prefix caching on (the default) and set max_num_seqs=8"
    )
