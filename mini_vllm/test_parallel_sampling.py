"""Parallel sampling (n > 1): validation, the fan-out, aggregation, abort, shared prompt blocks."""

import pytest

from mini_vllm import LLMEngine, SamplingParams
from mini_vllm.outputs import CompletionOutput
from mini_vllm.parallel_sampling import ParentRequest
from mini_vllm.sampling_params import MAX_N_SEQUENCES


def cdiv(a, b):
    return -(-a // b)


@pytest.mark.parametrize(
    ("kwargs", "exc", "match"),
    [
        ({"n": 0}, ValueError, "n must be at least 1"),
        ({"n": -3}, ValueError, "n must be at least 1"),
        ({"n": 2.0}, TypeError, "n must be an int"),
        ({"n": True}, TypeError, "n must be an int"),
        ({"n": "2"}, TypeError, "n must be an int"),
        ({"n": MAX_N_SEQUENCES + 1}, ValueError, "n must be at most 16384"),
        ({"n": 2, "temperature": 0.0}, ValueError, "n must be 1 when using greedy sampling"),
        ({"n": 2, "temperature": 1e-6}, ValueError, "n must be 1 when using greedy sampling"),
    ],
)
def test_n_is_validated_as_upstream(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        SamplingParams(**kwargs)


def test_n_bounds_that_are_accepted():
    assert SamplingParams(n=MAX_N_SEQUENCES).n == MAX_N_SEQUENCES
    assert SamplingParams(n=1, temperature=0.0).n == 1, "greedy with n = 1 is fine"
    assert SamplingParams().n == 1


def test_child_ids_and_seeds_follow_upstream():
    params = SamplingParams(n=3, seed=10, top_k=5, max_tokens=7)
    parent = ParentRequest("cmpl-7", params)
    info = [parent.get_child_info(i) for i in range(3)]
    assert [cid for cid, _ in info] == ["0_cmpl-7", "1_cmpl-7", "2_cmpl-7"], "child ids are '{index}_{parent id}'"
    assert [p.seed for _, p in info] == [10, 11, 12], "child i of a seeded parent gets seed + i"
    assert all(p.n == 1 and p.top_k == 5 and p.max_tokens == 7 for _, p in info), "children copy the rest, n = 1"
    assert parent.child_requests == {"0_cmpl-7", "1_cmpl-7", "2_cmpl-7"}
    unseeded = ParentRequest("p", SamplingParams(n=2))
    assert [unseeded.get_child_info(i)[1].seed for i in range(2)] == [None, None]
    with pytest.raises(ValueError, match=r"child index must be in 0\.\.1"):
        unseeded.get_child_info(2)


def test_seed_zero_is_a_seed():
    parent = ParentRequest("p0", SamplingParams(n=3, seed=0))
    seeds = [parent.get_child_info(i)[1].seed for i in range(3)]
    assert seeds == [0, 1, 2], (
        f"a parent seeded with 0 gave its children seeds {seeds}, expected [0, 1, 2]: 0 is a seed, "
        "test 'seed is None', not the seed's truth value"
    )


def test_get_outputs_aggregates_in_index_order_and_finishes_with_the_last_child():
    parent = ParentRequest("p", SamplingParams(n=3))
    ids = [parent.get_child_info(i)[0] for i in range(3)]
    done = [CompletionOutput(i, "", [i], "length") for i in range(3)]
    outs, finished = parent.get_outputs(ids[2], done[2])
    assert (outs, finished) == ([done[2]], False), "one child of three is not the parent's end"
    outs, finished = parent.get_outputs(ids[0], done[0])
    assert (outs, finished) == ([done[0], done[2]], False)
    outs, finished = parent.get_outputs(ids[1], done[1])
    assert (outs, finished) == (done, True), "the last child finishes the parent, outputs in index order"
    with pytest.raises(ValueError, match="not a running child"):
        parent.get_outputs(ids[1], done[1])
    with pytest.raises(ValueError, match="not finished"):
        ParentRequest("q", SamplingParams(n=2)).get_outputs("0_q", CompletionOutput(0, "", [], None))


def test_seeded_children_equal_single_requests_with_seed_plus_index():
    sp = SamplingParams(n=3, seed=7, max_tokens=10, ignore_eos=True)
    (out,) = LLMEngine().generate(["parallel"], sp)
    assert out.request_id == "req-0" and out.finished and out.prompt == "parallel"
    assert [c.index for c in out.outputs] == [0, 1, 2], "one output for the parent, n completions in index order"
    for i, completion in enumerate(out.outputs):
        (ref,) = LLMEngine().generate(["parallel"], SamplingParams(seed=7 + i, max_tokens=10, ignore_eos=True))
        assert completion.token_ids == ref.token_ids, f"child {i} must sample with seed 7 + {i}"
        assert completion.finish_reason == "length" and completion.text == ref.text
    assert len({tuple(c.token_ids) for c in out.outputs}) == 3, "three seeds, three different samples"


def test_unseeded_children_differ_and_runs_reproduce():
    sp = SamplingParams(n=4, max_tokens=8, ignore_eos=True)
    a = LLMEngine(seed=3).generate(["abc", "xyz"], sp)
    b = LLMEngine(seed=3).generate(["abc", "xyz"], sp)
    assert a == b, "same engine seed, same samples"
    for out in a:
        assert len({tuple(c.token_ids) for c in out.outputs}) == 4, "unseeded children must not share a stream"
    assert [o.request_id for o in a] == ["req-0", "req-1"], "a parent takes one request id, not n"


def test_single_completion_view_still_reads_the_first_completion():
    (out,) = LLMEngine().generate(["hi"], SamplingParams(max_tokens=3, temperature=0))
    assert len(out.outputs) == 1 and out.outputs[0].index == 0
    assert out.token_ids == out.outputs[0].token_ids and out.text == out.outputs[0].text
    assert out.finish_reason == out.outputs[0].finish_reason == "length"


def test_a_child_finishing_early_does_not_finish_the_parent():
    eng = LLMEngine()
    rid = eng.add_request("abcdef", SamplingParams(n=3, seed=1, max_tokens=6, ignore_eos=True))
    eng.step()
    (partial,) = eng.abort_request("1_" + rid)
    assert partial.request_id == rid and not partial.finished, "two children still run: the parent is not done"
    assert [(c.index, c.finish_reason) for c in partial.outputs] == [(1, "abort")]
    final = []
    while eng.has_unfinished_requests():
        final += eng.step()
    assert len(final) == 2 and not final[0].finished and final[1].finished
    assert [(c.index, c.finish_reason) for c in final[1].outputs] == [(0, "length"), (1, "abort"), (2, "length")]
    assert not eng._parent_requests and not eng._parent_of, "finished parents leave no state behind"


def test_abort_of_a_parent_aborts_every_child():
    eng = LLMEngine()
    rid = eng.add_request("abcdef", SamplingParams(n=3, max_tokens=50, ignore_eos=True))
    other = eng.add_request("zz", SamplingParams(max_tokens=50, ignore_eos=True))
    eng.step()
    with pytest.raises(ValueError, match="unknown"):
        eng.abort_request([rid, "nope"])
    assert len(eng.scheduler.requests) == 4, "a failed abort changes nothing"
    (out,) = eng.abort_request(rid)
    assert out.request_id == rid and out.finished
    assert [(c.index, c.finish_reason) for c in out.outputs] == [(0, "abort"), (1, "abort"), (2, "abort")]
    assert set(eng.scheduler.requests) == {other}, "the children are gone, the other request runs on"
    with pytest.raises(ValueError, match="unknown"):
        eng.abort_request(rid)


def test_child_ids_cannot_collide_with_ids_in_use():
    eng = LLMEngine()
    eng.add_request("a", SamplingParams(max_tokens=2), request_id="1_x")
    with pytest.raises(ValueError, match="already in use"):
        eng.add_request("a", SamplingParams(n=2, max_tokens=2), request_id="x")
    assert set(eng.scheduler.requests) == {"1_x"}, "a refused request queues no child"
    eng.add_request("a", SamplingParams(max_tokens=2), request_id="0_req-1")
    rid = eng.add_request("a", SamplingParams(n=2, max_tokens=2))
    assert rid == "req-2", "the default id skips a name whose child ids are taken"
    with pytest.raises(ValueError, match="already in use"):
        eng.add_request("a", SamplingParams(max_tokens=2), request_id=rid)


@pytest.mark.parametrize("caching", [True, False])
def test_children_share_the_prompt_blocks_through_the_prefix_cache(caching):
    prompt_len, n, block_size = 64, 3, 16
    eng = LLMEngine(block_size=block_size, enable_prefix_caching=caching)
    kv = eng.scheduler.kv_cache_manager
    rid = eng.add_request(list(range(1, prompt_len + 1)), SamplingParams(n=n, seed=0, max_tokens=2, ignore_eos=True))
    eng.step()  # admits and prefills all three children
    # expectation: a later child finds the prompt's full blocks cached, never the block of the last token
    shared = (prompt_len - 1) // block_size if caching else 0
    per_child = cdiv(prompt_len, block_size)
    tables = [kv.get_block_ids(f"{i}_{rid}") for i in range(n)]
    assert all(len(t) == per_child for t in tables)
    assert all(t[:shared] == tables[0][:shared] for t in tables), "the shared prompt blocks are one set"
    used = eng.vllm_config.cache_config.num_gpu_blocks - 1 - kv.block_pool.get_num_free_blocks()
    assert used == n * per_child - (n - 1) * shared, f"{used} blocks in use: the prompt's blocks must be allocated once"
    stats = kv.make_prefix_cache_stats()
    assert (stats.queries, stats.hits) == ((n * prompt_len, (n - 1) * shared * block_size) if caching else (0, 0))


def test_unseeded_requests_and_children_each_draw_their_own_stream():
    # identical prompts, none seeded: request 1 and child 1 of request 0 would share a stream if
    # the engine keyed generators on the child index, the prompt or the engine seed alone
    eng = LLMEngine(seed=5)
    sp = SamplingParams(max_tokens=12, ignore_eos=True)
    outs = eng.generate(["same prompt"] * 3, [SamplingParams(n=3, max_tokens=12, ignore_eos=True), sp, sp])
    streams = {f"{o.request_id}/child {c.index}": tuple(c.token_ids) for o in outs for c in o.outputs}
    assert len(streams) == 5
    seen: dict[tuple, str] = {}
    for name, tokens in streams.items():
        assert tokens not in seen, (
            f"{name} drew exactly the tokens of {seen.get(tokens)}: every unseeded request and child "
            "needs its own stream (request: engine seed + its index; child: [engine seed + index, i])"
        )
        seen[tokens] = name
