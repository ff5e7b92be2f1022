"""Property-based tests: random request traces through the scheduler, invariants every step."""

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mini_vllm import (
    CacheConfig,
    KVCacheManager,
    LLMEngine,
    Request,
    SamplingParams,
    Scheduler,
    SchedulerConfig,
    VllmConfig,
)
from mini_vllm.testing.traces import fake_token

SETTINGS = settings(
    max_examples=40, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow]
)


@st.composite
def traces(draw):
    block_size = draw(st.sampled_from([1, 2, 4, 16]))
    num_blocks = draw(st.integers(3, 24))
    max_model_len = (num_blocks - 1) * block_size
    config = {
        "max_num_seqs": draw(st.integers(1, 6)),
        "max_num_batched_tokens": draw(st.integers(1, 40)),
        "long_prefill_token_threshold": draw(st.sampled_from([0, 0, 1, 3, 8])),
    }
    caching = draw(st.booleans())
    vocab = draw(st.sampled_from([2, 5, 250]))  # a tiny vocab makes shared prefixes likely
    arrivals = []
    for i in range(draw(st.integers(1, 8))):
        plen = draw(st.integers(1, max(1, min(30, max_model_len - 1))))
        prompt = draw(st.lists(st.integers(0, vocab - 1), min_size=plen, max_size=plen))
        arrivals.append((draw(st.integers(0, 6)), f"r{i}", prompt, draw(st.integers(1, 12))))
    aborts = draw(st.lists(st.tuples(st.integers(0, 30), st.integers(0, 7)), max_size=2))
    return num_blocks, block_size, caching, max_model_len, config, arrivals, aborts


def check_pool(kv: KVCacheManager) -> None:
    pool = kv.block_pool
    free = pool.free_block_queue.get_all_free_blocks()
    assert len(free) == pool.get_num_free_blocks()
    free_ids = {b.block_id for b in free}
    for b in pool.blocks[1:]:
        assert b.ref_cnt >= 0, f"negative ref_cnt on block {b.block_id}"
        assert (b.ref_cnt == 0) == (b.block_id in free_ids), "free ⇔ ref_cnt == 0"
        if b.block_hash is not None:
            assert b in pool.cached_block_hash_to_block.get_all_blocks(b.block_hash), "a hashed block is indexed"
    held: dict[int, int] = {}
    for blocks in kv.req_to_blocks.values():
        for b in blocks:
            held[b.block_id] = held.get(b.block_id, 0) + 1
    assert all(pool.blocks[i].ref_cnt == n for i, n in held.items()), "ref_cnt == number of tables holding it"
    assert 0 not in held, "the null block is never in a block table"


@SETTINGS
@given(traces())
def test_random_traces_keep_every_invariant(trace):
    num_blocks, block_size, caching, max_model_len, config, arrivals, aborts = trace
    sched = Scheduler(
        VllmConfig(
            CacheConfig(block_size, num_blocks, caching), SchedulerConfig(max_model_len=max_model_len, **config)
        )
    )
    kv = sched.kv_cache_manager
    pending = sorted(arrivals)
    tables: dict[str, list[int]] = {}
    step = 0
    while pending or sched.has_unfinished_requests():
        while pending and pending[0][0] <= step:
            _, rid, prompt, max_tokens = pending.pop(0)
            sched.add_request(Request(rid, prompt, SamplingParams(max_tokens=max_tokens, ignore_eos=True)))
        for when, which in aborts:
            if when == step and f"r{which}" in sched.requests:
                sched.finish_requests(f"r{which}")
        out = sched.schedule()
        assert out.total_num_scheduled_tokens <= config["max_num_batched_tokens"], "token budget exceeded"
        assert len(sched.running) <= config["max_num_seqs"]
        assert not ({r.request_id for r in sched.running} & {r.request_id for r in sched.waiting}), (
            "one queue each"
        )
        for rid in out.preempted_req_ids:
            tables.pop(rid, None)  # recompute: the table starts over
        for rid in sched.kv_cache_manager.req_to_blocks:
            ids = sched.kv_cache_manager.get_block_ids(rid)
            assert ids[: len(tables.get(rid, []))] == tables.get(rid, []), "block tables are append-only"
            tables[rid] = ids
        check_pool(kv)
        sampled = {
            r.request_id: fake_token(r.request_id, r.num_output_tokens)
            for r in out.scheduled_requests
            if Scheduler.needs_sample(r, out.num_scheduled_tokens[r.request_id])
        }
        for r in sched.update_from_output(out, sampled):
            tables.pop(r.request_id, None)
        check_pool(kv)
        step += 1
        assert step < 2000, "the trace must finish: no deadlock, no livelock"
    assert kv.req_to_blocks == {}
    assert kv.block_pool.get_num_free_blocks() == num_blocks - 1, (
        "every block comes back when all requests finish"
    )
    assert all(b.ref_cnt == 0 for b in kv.block_pool.blocks[1:])


@settings(max_examples=15, deadline=None, derandomize=True)
@given(
    st.lists(st.text(alphabet="ab ", min_size=1, max_size=40), min_size=1, max_size=4),
    st.integers(1, 9),
    st.integers(2, 40),
)
def test_scheduling_knobs_never_change_greedy_tokens(prompts, threshold, budget):
    params = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
    ref = [o.token_ids for o in LLMEngine(block_size=4).generate(prompts, params)]
    other = LLMEngine(
        num_gpu_blocks=30,
        block_size=4,
        long_prefill_token_threshold=threshold,
        max_num_batched_tokens=budget,
        enable_prefix_caching=budget % 2 == 0,
        max_num_seqs=2,
    )
    assert [o.token_ids for o in other.generate(prompts, params)] == ref
