import pytest

from mini_vllm import CacheConfig, KVCacheManager, Request, SamplingParams


def kvm(num_gpu_blocks, block_size, enable_caching=True):
    # max_model_len far above the pool: these tests reason about raw block capacity
    return KVCacheManager(CacheConfig(block_size, num_gpu_blocks, enable_caching), max_model_len=10_000)


def req(rid, tokens, max_tokens=4):
    return Request(rid, tokens, SamplingParams(max_tokens=max_tokens))


def admit(kv, r, n=None):
    """What the scheduler does at admission: hits, allocate, then set the counter."""
    hits, num_hit = kv.get_computed_blocks(r)
    n = n if n is not None else r.num_tokens - num_hit
    new = kv.allocate_slots(r, n, num_hit, hits, full_sequence_must_fit=True)
    if new is not None:
        r.num_computed_tokens = num_hit
    return new, num_hit


def test_allocate_rounds_up_to_blocks_and_tables_are_append_only():
    kv = kvm(10, 4)
    r = req("a", list(range(10)))
    new, _ = admit(kv, r)
    assert [b.block_id for b in new] == [1, 2, 3] and kv.get_block_ids("a") == [1, 2, 3]
    r.num_computed_tokens = 10
    r.append_output_token_ids([1, 2])
    assert kv.allocate_slots(r, 2) == [], "12 tokens still fit in 3 blocks"
    r.num_computed_tokens = 12
    r.append_output_token_ids(3)
    assert [b.block_id for b in kv.allocate_slots(r, 1)] == [4]
    assert kv.get_block_ids("a") == [1, 2, 3, 4], "a block table only ever grows at the end"


def test_prefix_hit_capped_so_one_token_is_computed():
    kv = kvm(10, 4)
    a = req("a", list(range(8)))
    admit(kv, a)
    b = req("b", list(range(8)))
    hits, num_hit = kv.get_computed_blocks(b)
    assert num_hit == 4 and len(hits) == 1, (
        "8 cached tokens but the 8th must be recomputed: hit 1 block, not 2"
    )
    c = req("c", list(range(9)))
    assert kv.get_computed_blocks(c)[1] == 8


def test_full_blocks_cached_at_allocation_so_same_step_requests_hit():
    kv = kvm(20, 4)
    shared = list(range(12))
    admit(kv, req("a", shared + [100]))
    _new, num_hit = admit(kv, req("b", shared + [200]))
    assert num_hit == 12, "a's blocks are indexed as soon as they are allocated, before any compute"
    assert kv.get_block_ids("b")[:3] == kv.get_block_ids("a")[:3]
    assert [kv.block_pool.blocks[i].ref_cnt for i in kv.get_block_ids("a")[:3]] == [2, 2, 2]


def test_allocate_returns_none_and_changes_nothing_when_full():
    kv = kvm(4, 4)  # 3 usable blocks
    a = req("a", list(range(8)))
    admit(kv, a)
    kv.free(a)
    # a's two blocks are free but cached; b hits the first and needs 4 blocks in all
    b = req("b", list(range(4)) + [50] * 9)
    pool = kv.block_pool
    before = (
        [blk.ref_cnt for blk in pool.blocks],
        [x.block_id for x in pool.free_block_queue.get_all_free_blocks()],
    )
    hits, num_hit = kv.get_computed_blocks(b)
    assert num_hit == 4
    assert kv.allocate_slots(b, b.num_tokens - num_hit, num_hit, hits) is None, (
        "1 free hit + 3 new blocks > 3 free blocks"
    )
    after = (
        [blk.ref_cnt for blk in pool.blocks],
        [x.block_id for x in pool.free_block_queue.get_all_free_blocks()],
    )
    assert after == before and kv.get_block_ids("b") == [], "a None allocation must leave no trace"


def test_hit_blocks_in_the_free_queue_count_against_capacity():
    kv = kvm(4, 4)
    a = req("a", list(range(8)))
    admit(kv, a)
    kv.free(a)
    b = req("b", list(range(8)) + [9])  # hits 2 blocks, both free → touching them uses 2 of 3 free
    new, num_hit = admit(kv, b)
    assert num_hit == 8 and [x.block_id for x in new] == [3]
    assert kv.block_pool.get_num_free_blocks() == 0


def test_free_is_tail_first():
    kv = kvm(6, 4)
    r = req("a", list(range(12)))
    admit(kv, r)
    kv.free(r)
    assert [b.block_id for b in kv.block_pool.free_block_queue.get_all_free_blocks()] == [4, 5, 3, 2, 1]
    kv.free(r)  # freeing a request with no blocks is a no-op, as upstream
    assert kv.block_pool.get_num_free_blocks() == 5


def test_full_sequence_must_fit_at_admission():
    kv = kvm(4, 4)  # 3 usable blocks = 12 slots
    r = req("a", list(range(13)))
    assert kv.allocate_slots(r, 4, full_sequence_must_fit=True) is None, "13 tokens need 4 blocks"
    assert kv.allocate_slots(r, 4) is not None, "without the gate the first chunk alone fits"


def test_caching_disabled():
    kv = kvm(10, 4, False)
    admit(kv, req("a", list(range(8))))
    assert kv.get_computed_blocks(req("b", list(range(9)))) == ([], 0)


def test_prefix_cache_stats_record_every_lookup():
    kv = kvm(10, 4)
    admit(kv, req("a", list(range(8))))
    admit(kv, req("b", list(range(9))))
    s = kv.make_prefix_cache_stats()
    assert (s.requests, s.queries, s.hits) == (2, 17, 8)
    assert kv.make_prefix_cache_stats().requests == 0, "make_prefix_cache_stats resets"


def test_request_hashed_at_another_block_size_is_refused():
    from mini_vllm.block_pool import get_request_block_hasher

    kv = kvm(10, 4)
    r = Request("a", list(range(8)), block_hasher=get_request_block_hasher(8))
    with pytest.raises(ValueError, match="block"):
        kv.get_computed_blocks(r)


def test_lookup_stops_at_the_first_miss():
    # the head block's hash leaves the index while later blocks stay cached: a block after a miss
    # must not count (its KV belongs after tokens that are not cached), the hit is the prefix before it
    kv = kvm(20, 4)
    a = req("a", list(range(13)))
    admit(kv, a)
    ids = kv.get_block_ids("a")
    kv.free(a)
    pool = kv.block_pool
    for victim, want in ((1, 4), (0, 0)):
        assert pool._maybe_evict_cached_block(pool.blocks[ids[victim]]), "the block was cached"
        hits, num_hit = kv.get_computed_blocks(req("b", list(range(13))))
        assert num_hit == want and [b.block_id for b in hits] == ids[: want // 4], (
            f"block {victim} of 3 evicted: {num_hit} tokens hit ({[b.block_id for b in hits]}), want {want}: "
            "stop the lookup at the first miss, later blocks cannot be used without it"
        )


def test_lookahead_slots_never_pass_max_model_len_on_either_path():
    # max_model_len 12 at block size 4: no request ever needs more than 3 blocks, lookahead included
    kv = KVCacheManager(CacheConfig(4, 20, True), max_model_len=12)
    r = req("a", list(range(9)), max_tokens=3)
    new = kv.allocate_slots(r, 9, full_sequence_must_fit=True, num_lookahead_tokens=4)
    assert new is not None and len(kv.get_block_ids("a")) == 3, (
        f"admission: 9 tokens + 4 lookahead capped at max_model_len=12 is 3 blocks, got {kv.get_block_ids('a')}"
    )
    r.num_computed_tokens = 9
    r.append_output_token_ids(1)
    kv.allocate_slots(r, 1, num_lookahead_tokens=4)
    assert len(kv.get_block_ids("a")) == 3, (
        f"a running request: 10 tokens + 4 lookahead capped at max_model_len=12 is 3 blocks, "
        f"got {kv.get_block_ids('a')} (cap the lookahead on the decode path too)"
    )
