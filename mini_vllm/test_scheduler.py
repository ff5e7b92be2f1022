import pytest

from mini_vllm import (
    CacheConfig,
    Request,
    RequestStatus,
    SamplingParams,
    Scheduler,
    SchedulerConfig,
    VllmConfig,
)


def make(num_blocks=64, block_size=16, caching=True, **kw):
    return Scheduler(VllmConfig(CacheConfig(block_size, num_blocks, caching), SchedulerConfig(**kw)))


def add(sched, rid, n, max_tokens=4, first=0):
    r = Request(
        rid, [(first + i) % 250 for i in range(n)], SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    )
    sched.add_request(r)
    return r


def step(sched, token=7):
    """schedule → sample a fixed token where needed → update; returns (output, finished ids)."""
    out = sched.schedule()
    sampled = {
        r.request_id: token
        for r in out.scheduled_requests
        if Scheduler.needs_sample(r, out.num_scheduled_tokens[r.request_id])
    }
    return out, [r.request_id for r in sched.update_from_output(out, sampled)]


def test_chunked_prefill_follows_the_budget():
    sched = make(max_num_batched_tokens=32)
    add(sched, "a", 100, max_tokens=3)
    plan = [step(sched)[0].num_scheduled_tokens for _ in range(6)]
    assert plan == [{"a": 32}, {"a": 32}, {"a": 32}, {"a": 4}, {"a": 1}, {"a": 1}], (
        "100-token prompt at budget 32: 32+32+32+4, then one token per decode step"
    )
    assert not sched.has_unfinished_requests()


def test_long_prefill_threshold_caps_one_request():
    sched = make(long_prefill_token_threshold=16)
    add(sched, "a", 100)
    assert step(sched)[0].num_scheduled_tokens == {"a": 16}


def test_budget_caps_total_tokens():
    sched = make(max_num_batched_tokens=10)
    for rid in "abc":
        add(sched, rid, 8)
    out, _ = step(sched)
    assert out.num_scheduled_tokens == {"a": 8, "b": 2}, (
        "second chunked to the leftover budget, third not admitted"
    )
    assert [r.request_id for r in sched.waiting] == ["c"]


def test_running_requests_are_served_before_waiting_ones():
    sched = make(max_num_batched_tokens=8)
    add(sched, "a", 4)
    step(sched)
    add(sched, "b", 20)
    out, _ = step(sched)
    assert list(out.num_scheduled_tokens.items()) == [("a", 1), ("b", 7)], (
        "the decode goes first, the prefill gets the rest"
    )
    assert out.scheduled_running_reqs[0].request_id == "a" and out.scheduled_new_reqs[0].request_id == "b"


def test_max_num_seqs_caps_running():
    sched = make(max_num_seqs=4)
    for i in range(10):
        add(sched, f"r{i}", 3)
    out, _ = step(sched)
    assert len(out.num_scheduled_tokens) == 4 and len(sched.running) == 4 and len(sched.waiting) == 6


def test_mid_prefill_chunk_samples_nothing():
    sched = make(max_num_batched_tokens=8)
    r = add(sched, "a", 12)
    out = sched.schedule()
    assert not Scheduler.needs_sample(r, out.num_scheduled_tokens["a"])
    with pytest.raises(ValueError, match="mid-prefill"):
        sched.update_from_output(out, {"a": 5})
    sched.update_from_output(out, {})
    assert r.num_computed_tokens == 8 and r.num_output_tokens == 0, (
        "a chunk advances the counter and emits nothing"
    )


def test_preempts_the_last_running_request_and_requeues_it_first():
    sched = make(num_blocks=5, block_size=4)  # 4 usable blocks = 16 slots
    a = add(sched, "a", 8, max_tokens=8)
    b = add(sched, "b", 8, max_tokens=8, first=100)
    step(sched)  # both admitted, 2 blocks each, each samples one token (9 tokens now)
    out, _ = step(sched)  # a needs a 3rd block: none free → b is preempted
    assert out.preempted_req_ids == {"b"} and out.num_scheduled_tokens == {"a": 1}
    assert b.status == RequestStatus.PREEMPTED and b.num_computed_tokens == 0 and b.num_preemptions == 1
    assert b.output_token_ids == [7], "outputs survive a preemption: only the KV is dropped"
    assert list(sched.waiting) == [b] and sched.running == [a]
    assert sched.kv_cache_manager.get_block_ids("b") == []
    while sched.has_unfinished_requests():
        step(sched)
    assert a.num_output_tokens == 8 and b.num_output_tokens == 8


def test_a_request_can_preempt_itself():
    sched = make(num_blocks=5, block_size=4)  # 4 usable blocks
    add(sched, "a", 6, max_tokens=4)
    add(sched, "b", 8, max_tokens=4, first=100)
    step(sched)  # a holds 2 blocks (room for 8), b holds 2 (full)
    out, _ = step(sched)
    assert out.preempted_req_ids == {"b"} and out.num_scheduled_tokens == {"a": 1}, (
        "b needs a 3rd block, none is free and b is the last running request: it preempts itself"
    )


def test_no_admission_in_a_step_that_preempted():
    sched = make(num_blocks=5, block_size=4)
    add(sched, "a", 8, max_tokens=8)
    add(sched, "b", 8, max_tokens=8, first=100)
    step(sched)
    add(sched, "c", 1)  # fits in the budget and would fit after b's blocks were freed
    sched.kv_cache_manager.make_prefix_cache_stats()  # start counting lookups afresh
    out, _ = step(sched)
    assert out.preempted_req_ids == {"b"} and "c" not in out.num_scheduled_tokens
    stats = sched.kv_cache_manager.make_prefix_cache_stats()
    assert stats.requests == stats.preempted_requests == 0, (
        "a step that preempts must not even look at the waiting queue (no prefix-cache lookup)"
    )


def test_admission_needs_room_for_the_whole_sequence():
    sched = make(num_blocks=5, block_size=4, max_num_batched_tokens=4)  # 16 slots
    add(sched, "a", 8)
    add(sched, "b", 9, first=50)  # needs 3 blocks; only 2 left once a holds 2
    out, _ = step(sched)
    assert out.num_scheduled_tokens == {"a": 4}
    out, _ = step(sched)
    assert "b" not in out.num_scheduled_tokens, "b's first chunk would fit, but its whole prompt does not"


def test_head_of_line_blocking_is_fcfs():
    sched = make(num_blocks=5, block_size=4)
    add(sched, "big", 12)
    add(sched, "huge", 13, first=30)  # cannot fit next to big
    add(sched, "tiny", 1, first=60)  # would fit, but must not jump the queue
    out, _ = step(sched)
    assert list(out.num_scheduled_tokens) == ["big"]


def test_preempted_request_recovers_what_is_still_cached():
    sched = make(num_blocks=5, block_size=4)
    add(sched, "a", 8, max_tokens=4)  # a ends at 12 tokens: it never needs a 4th block
    b = add(sched, "b", 8, max_tokens=8, first=100)
    step(sched)
    step(sched)  # b preempted; its blocks were freed tail first, and a took the tail one
    sched.kv_cache_manager.make_prefix_cache_stats()
    out, _ = step(sched)
    while not out.scheduled_resumed_reqs:
        out, _ = step(sched)
    assert out.scheduled_resumed_reqs == [b]
    assert out.num_scheduled_tokens["b"] == 5, (
        "b has 9 tokens; its first block (4 tokens) survived in the cache"
    )
    stats = sched.kv_cache_manager.make_prefix_cache_stats()
    assert stats.preempted_hits >= 4 and stats.preempted_requests >= 1


def test_finished_requests_free_blocks_and_are_reported_next_step():
    sched = make()
    add(sched, "a", 5, max_tokens=2)
    step(sched)
    out, finished = step(sched)
    assert finished == ["a"] and sched.kv_cache_manager.block_pool.get_num_free_blocks() == 63
    out, _ = step(sched)
    assert out.finished_req_ids == {"a"}


def test_abort_running_and_waiting():
    sched = make(max_num_seqs=1)
    add(sched, "a", 5)
    add(sched, "b", 5)
    step(sched)
    done = sched.finish_requests(["a", "b"])
    assert [r.get_finished_reason() for r in done] == ["abort", "abort"]
    assert (
        not sched.has_unfinished_requests() and sched.kv_cache_manager.block_pool.get_num_free_blocks() == 63
    )


def test_several_aborts_in_one_call_free_in_caller_order():
    """vLLM frees such a batch in ``set`` order, which follows the process's string-hash seed,
    so no implementation can match it; mini frees in the order given (duplicates once)."""
    sched = make(num_blocks=8, block_size=4)
    for rid, first in (("a", 0), ("b", 50), ("c", 100)):
        add(sched, rid, 4, first=first)
    step(sched)
    blocks = {rid: sched.kv_cache_manager.get_block_ids(rid) for rid in "abc"}
    pool = sched.kv_cache_manager.block_pool
    done = sched.finish_requests(["c", "a", "c", "b"])
    assert [r.request_id for r in done] == ["c", "a", "b"]
    want = blocks["c"][::-1] + blocks["a"][::-1] + blocks["b"][::-1]
    tail = [b.block_id for b in pool.free_block_queue.get_all_free_blocks()][-len(want) :]
    assert tail == want, (
        f"freed blocks join the queue request by request in the order given: {tail} != {want}"
    )


def test_abort_is_seen_by_every_reader_before_the_next_step():
    sched = make(max_num_seqs=2)
    for rid in "abc":
        add(sched, rid, 5)
    step(sched)
    sched.finish_requests("a")
    sched.finish_requests("c")  # still waiting
    assert [r.request_id for r in sched.running] == ["b"] and list(sched.waiting) == []
    assert sched.get_request_counts() == (1, 0) and sched.get_num_unfinished_requests() == 1
    out, _ = step(sched)
    assert list(out.num_scheduled_tokens) == ["b"]


def test_update_from_output_once_per_schedule():
    sched = make()
    add(sched, "a", 5)
    out = sched.schedule()
    with pytest.raises(RuntimeError):
        sched.schedule()
    sched.update_from_output(out, {"a": 1})
    with pytest.raises(ValueError):
        sched.update_from_output(out, {"a": 1})


def test_counters_move_in_update_from_output():
    """A deliberate difference: vLLM advances num_computed_tokens at the end of schedule() (for
    async scheduling); mini advances it in update_from_output, so between the two calls a request
    still shows the state before the step, which is what needs_sample reads."""
    sched = make()
    r = add(sched, "a", 5)
    out = sched.schedule()
    assert r.num_computed_tokens == 0 and Scheduler.needs_sample(r, out.num_scheduled_tokens["a"])
    sched.update_from_output(out, {"a": 7})
    assert (r.num_computed_tokens, r.num_tokens) == (5, 6)


def test_requests_skipped_for_max_loras_go_ahead_of_a_later_preemption():
    """max_loras=1: B (adapter 2) is skipped while A and C (adapter 1) run; C is then preempted.
    Upstream parks B in ``skipped_waiting``, walked before ``waiting``, so once A finishes B runs
    before C (one queue with both at its front would run C first)."""
    from mini_vllm.config import LoRAConfig
    from mini_vllm.lora import LoRARequest

    sched = Scheduler(VllmConfig(CacheConfig(4, 5, True), SchedulerConfig(max_num_batched_tokens=16, max_model_len=16),
                                 lora_config=LoRAConfig(max_loras=1)))
    for rid, first, n, lora in (("A", 10, 6, 1), ("C", 20, 11, 1), ("B", 30, 2, 2)):
        sched.add_request(Request(rid, list(range(first, first + 4)), SamplingParams(max_tokens=n, ignore_eos=True),
                                  lora_request=LoRARequest(f"a{lora}", lora)))
    out, _ = step(sched)
    assert list(out.num_scheduled_tokens) == ["A", "C"] and [r.request_id for r in sched.skipped_waiting] == ["B"]
    assert sched.get_request_counts() == (2, 1), "the skipped request counts as waiting"
    order = []
    for _ in range(30):
        if not sched.has_unfinished_requests():
            break
        out, _ = step(sched)
        order += [r.request_id for r in out.scheduled_new_reqs + out.scheduled_resumed_reqs]
    assert order == ["B", "C"], f"B was skipped before C was preempted, so B must be admitted first; got {order}"


def test_a_bad_block_ahead_of_the_computed_tokens_never_moves_them_forward():
    # A failed KV load sends a request back to the start of its first bad block: never past what it
    # has computed. Here the bad block is the second of a first chunk, computed by nobody yet.
    from mini_vllm.outputs import KVConnectorOutput

    sched = make(block_size=4, max_num_batched_tokens=8)
    r = add(sched, "a", 10)
    out = sched.schedule()
    assert out.num_scheduled_tokens == {"a": 8} and r.num_computed_tokens == 0
    bad = sched.kv_cache_manager.get_block_ids("a")[1]
    sched.update_from_output(out, {}, kv_connector_output=KVConnectorOutput(invalid_block_ids={bad}))
    assert r.num_computed_tokens == 0, (
        f"num_computed_tokens became {r.num_computed_tokens} after block index 1 failed to load with 0 tokens "
        "computed: fall back to min(num_computed_tokens, first bad block * block_size), never forward"
    )
    out = sched.schedule()
    assert out.num_scheduled_tokens == {"a": 8}, (
        f"the request must restart at token 0, got {out.num_scheduled_tokens}"
    )
