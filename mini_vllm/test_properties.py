"""Property-based tests: random request traces through the scheduler, invariants every step."""

import pytest
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
from mini_vllm.testing.traces import Abort, Arrival, SchedConfig, fake_token, run_mini_trace

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
            assert b in pool.cached_block_hash_to_block.get_all_blocks(b.block_hash), (
                "a hashed block is indexed"
            )
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
            CacheConfig(block_size, num_blocks, caching),
            SchedulerConfig(max_model_len=max_model_len, **config),
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


@st.composite
def configs_and_traces(draw):
    """Any configuration ``VllmConfig`` accepts, and a trace with arrivals, aborts and EOS."""
    block_size = draw(st.sampled_from([1, 2, 3, 4, 16]))
    num_gpu_blocks = draw(st.integers(2 if block_size > 1 else 3, 12))
    max_model_len = draw(st.integers(2, (num_gpu_blocks - 1) * block_size))
    chunked = draw(st.booleans())
    low_budget = 1 if chunked else max_model_len
    config = SchedConfig(
        num_gpu_blocks=num_gpu_blocks,
        block_size=block_size,
        max_num_seqs=draw(st.integers(1, 5)),
        max_num_batched_tokens=draw(st.integers(low_budget, low_budget + 24)),
        long_prefill_token_threshold=draw(st.sampled_from([0, 1, 3, 7])),
        enable_prefix_caching=draw(st.booleans()),
        max_model_len=max_model_len,
        enable_chunked_prefill=chunked,
    )
    trace: list = []
    for i in range(draw(st.integers(1, 7))):
        n = draw(st.integers(1, max_model_len - 1))
        prompt = tuple(draw(st.lists(st.integers(0, 2), min_size=n, max_size=n)))  # shared prefixes
        eos_at = draw(st.one_of(st.none(), st.integers(0, 4)))
        trace.append(Arrival(draw(st.integers(0, 5)), f"r{i}", prompt, draw(st.integers(1, 20)), eos_at))
    for _ in range(draw(st.integers(0, 3))):
        trace.append(Abort(draw(st.integers(0, 12)), (f"r{draw(st.integers(0, 6))}",)))
    return config, trace


@settings(max_examples=60, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(configs_and_traces())
def test_every_valid_configuration_finishes_every_request(case):
    """Liveness: whatever constructs cannot hang. Each request stops (EOS, length) or is aborted
    within a step bound, and the pool ends with every block free."""
    config, trace = case
    config.to_vllm_config()  # valid by construction
    arrivals = [a for a in trace if isinstance(a, Arrival)]
    # Generous but finite: every token of every request, recomputed once per other request.
    last_event = max(e.step for e in trace)  # the driver runs until the last abort is due
    bound = (
        last_event + 6 + sum(len(a.prompt_token_ids) + a.max_tokens for a in arrivals) * (len(arrivals) + 1)
    )
    records = run_mini_trace(config, trace, max_steps=bound)
    done = [rid for r in records for rid, _ in r.finished] + [rid for r in records for rid in r.aborted]
    assert sorted(done) == sorted(a.request_id for a in arrivals), "each request ends exactly once"
    assert records[-1].num_free_blocks == config.num_gpu_blocks - 1, "every block is free at the end"
    assert records[-1].block_ids == {}


def test_the_self_preempting_configuration_is_refused():
    """A 10-token prompt wanting 16 outputs in 4 blocks of 4 would preempt itself forever if
    max_model_len were unbounded: the config refuses that, and the default caps it at 16."""
    with pytest.raises(ValueError, match="max seq len"):
        VllmConfig(CacheConfig(block_size=4, num_gpu_blocks=5), SchedulerConfig(max_model_len=2**62))
    config = SchedConfig(num_gpu_blocks=5, block_size=4, max_num_seqs=1, max_model_len=16)
    records = run_mini_trace(config, [Arrival(0, "a", tuple(range(10)), 16)], max_steps=50)
    assert records[-1].finished == [("a", "length")] and len(records) == 6, "10 + 6 tokens = max_model_len"
