import functools

import pytest

from course.runtime import lab_module

lab = lab_module(__file__)   # solution.py by default; LAB_IMPL=starter grades starter.py


def out(index, tokens=(), finished=False):
    return lab.ChildOutput(index, tuple(tokens), finished)


# --- part 1: the fan-out ----------------------------------------------------------------------
def test_children_get_indexed_ids_and_consecutive_seeds():
    parent = lab.ParentRequest("cmpl-7", 3, seed=10)
    got = [parent.get_child_info(i) for i in range(3)]
    assert got == [("0_cmpl-7", 10), ("1_cmpl-7", 11), ("2_cmpl-7", 12)], (
        f"child i of request 'cmpl-7' is '{{i}}_cmpl-7' (index first) with seed 10 + i, so the n samples differ "
        f"and the whole request still replays; got {got}"
    )
    zero = lab.ParentRequest("r", 5, seed=0)
    got = [zero.get_child_info(i)[1] for i in range(5)]
    assert got == [0, 1, 2, 3, 4], f"seed=0 is a seed: children get 0..4, got {got} (test `seed is None`, not falsiness)"
    unseeded = lab.ParentRequest("r", 4)
    got = [unseeded.get_child_info(i) for i in (3, 0)]
    assert got == [("3_r", None), ("0_r", None)], f"no seed: every child is unseeded, ids still indexed; got {got}"


def test_bad_fan_out_is_refused():
    with pytest.raises(ValueError, match="n must be"):
        lab.ParentRequest("r", 0)
    with pytest.raises(ValueError, match="request_id"):
        lab.ParentRequest("", 2)
    parent = lab.ParentRequest("r", 2, seed=1)
    with pytest.raises(ValueError, match="child index"):
        parent.get_child_info(2)
    with pytest.raises(ValueError, match="child index"):
        parent.get_child_info(-1)
    assert parent.child_requests == set(), "a refused child index registers nothing"


def test_final_only_waits_for_every_child_and_orders_by_index():
    parent = lab.ParentRequest("r", 3, seed=5)
    ids = [parent.get_child_info(i)[0] for i in range(3)]
    assert parent.get_outputs(ids[2], out(2, [9], finished=True)) == ([], False), (
        "non-streaming: a finished child is kept, nothing is handed back while others still run"
    )
    assert parent.get_outputs(ids[0], out(0, [4], finished=False)) == ([], False), "an unfinished update is kept too"
    assert parent.get_outputs(ids[0], out(0, [4, 5], finished=True)) == ([], False)
    got, done = parent.get_outputs(ids[1], out(1, [7], finished=True))
    assert done and [o.index for o in got] == [0, 1, 2], (
        f"when the last child finishes, all n outputs come back in index order (0, 1, 2), not finish order "
        f"(2, 0, 1); got indices {[o.index for o in got]}"
    )
    assert got[0].token_ids == (4, 5), "each slot holds the child's latest output"


def test_streaming_hands_each_output_back_once():
    parent = lab.ParentRequest("r", 2, final_only=False)
    a, b = (parent.get_child_info(i)[0] for i in range(2))
    assert parent.get_outputs(a, out(0, [1])) == ([out(0, [1])], False), "streaming: every update passes through"
    assert parent.get_outputs(a, out(0, [1, 2], True)) == ([out(0, [1, 2], True)], False)
    assert parent.get_outputs(a, out(0, [1, 2], True)) == ([], False), (
        "a child already finished and handed back must not be handed back again"
    )
    assert parent.get_outputs(b, out(1, [3], True)) == ([out(1, [3], True)], True), "the last child finishes the request"


@pytest.fixture(scope="module")
def real_vllm():
    """Wire the real vLLM for the CPU before its first import (torch + vllm: seconds, once)."""
    from mini_vllm.testing import real_vllm

    return real_vllm


@pytest.mark.upstream
def test_fan_out_matches_vllms_parent_request(real_vllm):
    from vllm import SamplingParams
    from vllm.outputs import CompletionOutput
    from vllm.sampling_params import RequestOutputKind
    from vllm.v1.engine import EngineCoreRequest
    from vllm.v1.engine.parallel_sampling import ParentRequest

    def real(req_id, n, seed, kind):
        params = SamplingParams(n=n, seed=seed, output_kind=kind)
        return ParentRequest(EngineCoreRequest(
            request_id=req_id, prompt_token_ids=[1, 2, 3], mm_features=None, sampling_params=params,
            pooling_params=None, arrival_time=0.0, lora_request=None, cache_salt=None, data_parallel_rank=None,
            external_req_id=req_id))

    for req_id, n, seed in (("p", 3, 10), ("cmpl-x", 4, None), ("q", 2, 0)):
        theirs, mine = real(req_id, n, seed, RequestOutputKind.FINAL_ONLY), lab.ParentRequest(req_id, n, seed)
        t = [(cid, sp.seed, sp.n) for cid, sp in (theirs.get_child_info(i) for i in range(n))]
        m = [mine.get_child_info(i) for i in range(n)]
        assert [(cid, s) for cid, s, _ in t] == m, f"vLLM's ParentRequest gives {t} for n={n}, seed={seed}; yours {m}"
        assert {x[2] for x in t} == {1}, "each child is an n=1 request in vLLM"

    # The same finish sequence through both, streaming and not: same outputs, same 'finished' flags.
    events = [(2, True), (0, False), (0, True), (0, True), (1, True)]
    for kind, final_only in ((RequestOutputKind.FINAL_ONLY, True), (RequestOutputKind.CUMULATIVE, False)):
        theirs, mine = real("p", 3, 1, kind), lab.ParentRequest("p", 3, 1, final_only=final_only)
        for i in range(3):
            theirs.get_child_info(i), mine.get_child_info(i)
        for index, finished in events:
            co = CompletionOutput(index=index, text="", token_ids=[index], cumulative_logprob=None, logprobs=None,
                                  finish_reason="length" if finished else None)
            t_out, t_done = theirs.get_outputs(f"{index}_p", co)
            m_out, m_done = mine.get_outputs(f"{index}_p", out(index, [index], finished))
            assert ([o.index for o in t_out], t_done) == ([o.index for o in m_out], m_done), (
                f"{kind.name}: after child {index} (finished={finished}) vLLM hands back indices "
                f"{[o.index for o in t_out]} (done={t_done}), yours {[o.index for o in m_out]} (done={m_done})"
            )


# --- part 2: the arithmetic -------------------------------------------------------------------
def test_children_hit_the_prompts_full_blocks_but_never_the_last_token():
    assert lab.predict_child_hits(100, 4, 16) == [0, 96, 96, 96], (
        "a 100-token prompt at block size 16 has 6 full blocks (96 tokens): child 0 computes them, children 1..3 "
        f"hit all 6; got {lab.predict_child_hits(100, 4, 16)}"
    )
    got = lab.predict_child_hits(64, 3, 16)
    assert got == [0, 48, 48], (
        f"a 64-token prompt is 4 full blocks, but a hit never covers the last prompt token (its logits are needed): "
        f"(64 - 1) // 16 = 3 blocks = 48 tokens; got {got}"
    )
    assert lab.predict_child_hits(10, 3, 4) == [0, 8, 8], "block size 4: 10 tokens -> 2 shareable blocks, 8 tokens"
    assert lab.predict_child_hits(15, 1, 16) == [0], "n = 1 is one request: nothing to hit"
    assert lab.predict_counters(100, 4, 16) == (400, 288), (
        f"every child looks its whole prompt up: queries 4 x 100 = 400, hits 3 x 96 = 288; "
        f"got {lab.predict_counters(100, 4, 16)}"
    )


def test_blocks_with_and_without_sharing():
    cases = [  # (prompt_len, n, max_tokens, block_size, shared, unshared)
        (100, 4, 24, 16, 14, 32),   # per child cdiv(123, 16) = 8; 6 shared -> 8 + 3 x 2
        (64, 3, 1, 16, 6, 12),      # per child 4 blocks, only 3 shareable -> 4 + 2 x 1
        (64, 3, 2, 16, 9, 15),      # the first decode token's KV opens a 5th block
        (10, 2, 3, 4, 4, 6),        # per child cdiv(12, 4) = 3; child 1 reuses 2 of its 3
        (30, 1, 5, 16, 3, 3),       # n = 1: sharing changes nothing
    ]
    for p, n, g, bs, shared, unshared in cases:
        got = (lab.blocks_used(p, n, g, bs, True), lab.blocks_used(p, n, g, bs, False))
        assert got == (shared, unshared), (
            f"prompt {p}, n={n}, max_tokens={g}, block {bs}: a child's last step holds the KV of prompt + max_tokens "
            f"- 1 tokens (the last sampled token's KV is never computed); children 1..n-1 reuse (p - 1) // bs blocks; "
            f"expected (shared, unshared) = {(shared, unshared)}, got {got}"
        )
    with pytest.raises(ValueError, match="max_tokens"):
        lab.blocks_used(10, 2, 0, 4, True)


# --- part 3: mini_vllm ------------------------------------------------------------------------
@functools.cache
def measured(p, n, g, bs, caching=True):
    return lab.measure_mini(lab.make_prompt(p), n, g, bs, caching)


@pytest.mark.parametrize("p, n, g, bs", [(100, 4, 24, 16), (64, 3, 2, 16), (10, 2, 3, 4), (33, 5, 6, 8)])
def test_mini_vllm_counters_match_the_prediction(p, n, g, bs):
    m = measured(p, n, g, bs)
    assert (m.queries, m.hits) == lab.predict_counters(p, n, bs), (
        f"mini_vllm's KVCacheManager recorded (queries, hits) = {(m.queries, m.hits)} for prompt {p}, n={n}, block "
        f"{bs}; the prediction is {lab.predict_counters(p, n, bs)}"
    )
    assert m.peak_blocks == lab.blocks_used(p, n, g, bs, True), (
        f"peak blocks in use {m.peak_blocks}, predicted {lab.blocks_used(p, n, g, bs, True)}"
    )
    shared = lab.shared_prompt_blocks(p, bs)
    heads = {tuple(t[:shared]) for t in m.block_tables}
    assert len(heads) == 1 and all(len(set(t[shared:]) & set(m.block_tables[0][shared:])) == 0
                                   for t in m.block_tables[1:]), (
        f"every child's first {shared} block ids are child 0's, the rest are its own; tables {m.block_tables}"
    )
    if shared:
        assert m.first_block_ref_cnt == n, f"the shared first block is referenced by all {n} children"
    assert m.first_step_tokens == p + (n - 1) * (p - shared * bs), (
        f"the admission step computes child 0's whole prompt and only the unshared tail of the others: "
        f"{p + (n - 1) * (p - shared * bs)} tokens, got {m.first_step_tokens}"
    )


def test_a_prompt_longer_than_the_step_budget_is_prefilled_in_chunks():
    # 2,100 tokens against mini_vllm's 2,048-token step budget: child 0's prefill takes two steps and the
    # others wait for the second; only a child whose prompt is all computed may get a sampled token.
    try:
        m = measured(2100, 3, 3, 16)
    except ValueError as e:
        pytest.fail(f"{e} -- sample only for a child that needs a token (Scheduler.needs_sample): a child "
                    f"mid-prefill gets nothing that step")
    assert m.first_step_tokens == 2048, f"the first step is capped at the 2,048-token budget, got {m.first_step_tokens}"
    assert (m.queries, m.hits) == lab.predict_counters(2100, 3, 16) == (6300, 4192), (
        f"admitted a step later, children 1 and 2 still hit child 0's 131 full blocks; got {(m.queries, m.hits)}"
    )
    assert m.peak_blocks == lab.blocks_used(2100, 3, 3, 16, True) == 134, f"peak blocks {m.peak_blocks}, expected 134"


def test_mini_vllm_without_caching_shares_nothing():
    m = measured(100, 4, 24, 16, caching=False)
    assert (m.queries, m.hits) == (0, 0), f"caching off: no lookups at all, got {(m.queries, m.hits)}"
    assert m.peak_blocks == lab.blocks_used(100, 4, 24, 16, False) == 32, (
        f"caching off: every child holds its own 8 blocks, 32 in all; got {m.peak_blocks}"
    )
    assert m.first_step_tokens == 400, "and computes its whole prompt: 4 x 100 tokens in the first step"


# --- tier 2: the whole engine -----------------------------------------------------------------
@pytest.mark.engine
def test_real_engine_n3_hits_what_you_predict():
    from course.runtime import engine

    prompt, n, bs = lab.make_prompt(100), 3, 16
    run = engine.run_job("parallel_sampling", prompt=prompt, n=n, max_tokens=8, seed=10, block_size=bs)
    metrics = engine.metrics_from_json(run.result["metrics"])

    def total(name):
        return int(sum(m.value for m in metrics if m.name == name))

    got = (total("vllm:prefix_cache_queries"), total("vllm:prefix_cache_hits"))
    assert got == lab.predict_counters(len(prompt), n, bs) == (300, 192), (
        f"LLM.generate with n=3 counted (queries, hits) = {got}; you predict {lab.predict_counters(len(prompt), n, bs)}"
    )
    children = run.result["children"]
    assert sorted(c["index"] for c in children) == [0, 1, 2] and all(len(c["token_ids"]) == 8 for c in children)
    assert len({tuple(c["token_ids"]) for c in children}) > 1, "seeds 10, 11, 12 give the children different tails"


# --- your fan-out against mini_vllm's engine, which does it for real ---------------------------
@pytest.mark.parametrize("n, seed", [(3, 10), (5, 0), (2, None)])
def test_your_fan_out_equals_mini_vllms_engine(n, seed):
    from mini_vllm import LLMEngine, SamplingParams
    from mini_vllm.parallel_sampling import ParentRequest as EngineParent

    yours = lab.ParentRequest("req-0", n, seed=seed)
    engine_parent = EngineParent("req-0", SamplingParams(n=n, temperature=1.0, seed=seed))
    for i in range(n):
        child_id, child_seed = yours.get_child_info(i)
        want_id, want_params = engine_parent.get_child_info(i)
        assert (child_id, child_seed) == (want_id, want_params.seed), (
            f"child {i} of n={n}, seed={seed}: yours is {(child_id, child_seed)}, mini_vllm's engine queues "
            f"{(want_id, want_params.seed)} — ids are '{{index}}_{{parent id}}' and seeds seed + index"
        )
    # The engine fans the request out; its prefix cache records what you predict.
    prompt, block_size = [(7 * i + 3) % 250 for i in range(40 + 7 * n)], 8   # byte ids: the toy vocab is 257
    engine = LLMEngine(block_size=block_size, num_gpu_blocks=128, enable_prefix_caching=True)
    (result,) = engine.generate([prompt], SamplingParams(n=n, temperature=1.0, seed=seed, max_tokens=3, ignore_eos=True))
    assert [c.index for c in result.outputs] == list(range(n)) and result.finished, (
        "the engine returns one output per parent with its n completions in index order"
    )
    stats = engine.scheduler.kv_cache_manager.make_prefix_cache_stats()
    assert (stats.queries, stats.hits) == lab.predict_counters(len(prompt), n, block_size), (
        f"mini_vllm's engine recorded (queries, hits) = {(stats.queries, stats.hits)} for n={n} children of a "
        f"{len(prompt)}-token prompt at block size {block_size}; predict_counters says "
        f"{lab.predict_counters(len(prompt), n, block_size)}"
    )
