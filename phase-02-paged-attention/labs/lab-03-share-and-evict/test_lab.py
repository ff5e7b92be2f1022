from course.runtime import lab_module
from mini_vllm import CacheConfig, KVCacheManager

lab = lab_module(__file__)   # solution.py by default; LAB_IMPL=starter grades starter.py


BS = 4
PROMPT = list(range(100, 132))          # 32 tokens = 8 full blocks of 4


def free_queue(kv):
    return kv.block_pool.free_block_queue.get_all_free_blocks()


def test_first_request_populates_cold_cache():
    kv = KVCacheManager(CacheConfig(num_gpu_blocks=20, block_size=BS))
    a = lab.prefill(kv, PROMPT, "A")
    assert a.cached == 0, f"a cold cache has nothing to offer: cached must be 0, got {a.cached}"
    assert len(kv.get_block_ids("A")) == 8 and a.new_block_ids == kv.get_block_ids("A"), (
        "32 tokens at block_size 4 need 8 fresh blocks, all newly allocated")
    assert lab.ref_counts(kv, a.request) == [1] * 8, "each block of a lone request has exactly one user"
    assert a.request.num_computed_tokens == 32, (
        "after prefill the whole prompt is computed: set num_computed_tokens once allocation succeeded")
    assert len(kv.block_pool.cached_block_hash_to_block) == 8, "all 8 full blocks are registered in the prefix cache"


def test_identical_prompt_shares_all_but_the_tail_block():
    kv = KVCacheManager(CacheConfig(num_gpu_blocks=20, block_size=BS))
    a = lab.prefill(kv, PROMPT, "A")
    free_before = kv.block_pool.get_num_free_blocks()
    b = lab.prefill(kv, PROMPT, "B")
    assert b.cached == 28, (
        f"B may reuse at most num_tokens - 1 = 31 tokens, i.e. 7 whole blocks = 28 tokens; got {b.cached}")
    ta, tb = kv.get_block_ids("A"), kv.get_block_ids("B")
    assert tb[:7] == ta[:7], f"B's first 7 blocks must be A's physical blocks {ta[:7]}, got {tb[:7]}"
    assert tb[7] != ta[7], "B's 8th block is private: its last token must be recomputed"
    assert lab.ref_counts(kv, b.request) == [2, 2, 2, 2, 2, 2, 2, 1], (
        f"shared blocks have two users, the private tail one; got {lab.ref_counts(kv, b.request)}")
    assert free_before - kv.block_pool.get_num_free_blocks() == 1 and b.new_block_ids == [tb[7]], (
        "B must cost exactly 1 new block, not 8: hand the hit blocks to allocate_slots")
    assert a.request.num_computed_tokens == b.request.num_computed_tokens == 32


def test_diverging_prompt_shares_only_the_common_prefix():
    kv = KVCacheManager(CacheConfig(num_gpu_blocks=20, block_size=BS))
    lab.prefill(kv, PROMPT, "A")
    other = PROMPT[:16] + [7] * 16
    c = lab.prefill(kv, other, "C")
    assert c.cached == 16, f"only the first 16 tokens (4 blocks) are common; got cached={c.cached}"
    ta, tc = kv.get_block_ids("A"), kv.get_block_ids("C")
    assert tc[:4] == ta[:4] and set(tc[4:]).isdisjoint(ta), (
        "hits form one unbroken run from block 0; the first mismatching block ends the match")
    again = PROMPT[:4] + [9] * 4 + PROMPT[8:]          # differs only in block 1
    d = lab.prefill(kv, again, "D")
    assert d.cached == 4, (
        f"a prefix cache never skips a miss: block 1 differs, so blocks 2.. cannot hit even though their "
        f"tokens equal A's (their hashes chain through block 1); got cached={d.cached}")


def test_free_order_evicts_tails_before_shared_prefix():
    kv = KVCacheManager(CacheConfig(num_gpu_blocks=10, block_size=BS))   # null + A's 8 + B's private tail
    a = lab.prefill(kv, PROMPT, "A")
    b = lab.prefill(kv, PROMPT, "B")
    ta, tb = kv.get_block_ids("A"), kv.get_block_ids("B")
    assert kv.block_pool.get_num_free_blocks() == 0, "the pool is sized exactly: nothing left after B"
    kv.free(a.request)
    kv.free(b.request)
    queue = [blk.block_id for blk in free_queue(kv)]
    assert len(queue) == 9, f"all 9 usable blocks are idle after both frees, got {len(queue)}"
    assert queue == [ta[7], tb[7]] + ta[6::-1], (
        f"free() releases tail-first: A's tail, then B's tail, then the shared prefix from block 6 down "
        f"to block 0 -> {[ta[7], tb[7]] + ta[6::-1]}; got {queue}")
    assert all(kv.block_pool.blocks[i].block_hash is not None for i in ta), "idle blocks keep their hashes"
    taken = kv.block_pool.get_new_blocks(2)
    assert sorted(blk.block_id for blk in taken) == sorted([ta[7], tb[7]]), (
        "demanding 2 blocks must evict the two private tails first")
    survivors = [blk for blk in free_queue(kv) if blk.block_hash is not None]
    assert survivors[-1].block_id == ta[0], "the shared prefix's first block is the last cached block to go"


def test_cached_free_blocks_are_revived_not_recomputed():
    kv = KVCacheManager(CacheConfig(num_gpu_blocks=16, block_size=BS))
    a = lab.prefill(kv, PROMPT, "A")
    ta = kv.get_block_ids("A")
    kv.free(a.request)
    assert kv.block_pool.get_num_free_blocks() == 15, "after free(A) every usable block is idle"
    d = lab.prefill(kv, PROMPT, "D")
    td = kv.get_block_ids("D")
    assert d.cached == 28 and td[:7] == ta[:7], (
        f"D must find A's idle-but-cached blocks: cached={d.cached}, table={td}, A had {ta}")
    assert lab.ref_counts(kv, d.request) == [1] * 8, "revived blocks go from ref_cnt 0 back to 1 (touch)"
    queue = [blk.block_id for blk in free_queue(kv)]
    assert not set(ta[:7]) & set(queue), "touch must have pulled the revived blocks out of the free queue"


def test_prefill_that_does_not_fit_raises_and_changes_nothing():
    kv = KVCacheManager(CacheConfig(num_gpu_blocks=10, block_size=BS))       # 9 usable blocks
    lab.prefill(kv, PROMPT, "A")                                   # takes 8
    other = [7] * 32                                               # no hit possible: needs 8 more
    try:
        lab.prefill(kv, other, "C")
    except MemoryError:
        pass
    else:
        raise AssertionError("allocate_slots returned None (8 blocks needed, 1 free): prefill must raise "
                             "MemoryError instead of admitting the request")
    assert kv.get_block_ids("C") == [] and kv.block_pool.get_num_free_blocks() == 1, (
        "a refused admission must leave no trace: no table for C, the one free block still free")


def test_caching_disabled_means_no_sharing():
    kv = KVCacheManager(CacheConfig(num_gpu_blocks=20, block_size=BS, enable_prefix_caching=False))
    a = lab.prefill(kv, PROMPT, "A")
    b = lab.prefill(kv, PROMPT, "B")
    assert a.cached == b.cached == 0, "with enable_caching=False nothing is ever a hit"
    assert set(kv.get_block_ids("A")).isdisjoint(kv.get_block_ids("B")), "no caching -> no shared blocks"
    assert lab.ref_counts(kv, b.request) == [1] * 8


def test_partial_tail_block_at_block_size_8():
    kv = KVCacheManager(CacheConfig(num_gpu_blocks=12, block_size=8))
    prompt = list(range(200, 230))                       # 30 tokens: 3 full blocks of 8 + 6 in the tail
    a = lab.prefill(kv, prompt, "A")
    assert len(kv.get_block_ids("A")) == 4 and a.cached == 0, "30 tokens at block size 8 need 4 blocks"
    assert a.request.num_computed_tokens == 30, (
        f"num_computed_tokens counts TOKENS (the whole 30-token prompt), not table length x block size; "
        f"got {a.request.num_computed_tokens}")
    b = lab.prefill(kv, prompt, "B")
    assert b.cached == 24, f"3 full blocks of 8 are cached, so B reuses 24 tokens; got {b.cached}"
    assert lab.ref_counts(kv, b.request) == [2, 2, 2, 1], (
        f"B shares A's 3 full blocks and owns a private tail; got {lab.ref_counts(kv, b.request)}")
    assert b.request.num_computed_tokens == 30 and len(b.new_block_ids) == 1


def test_ref_counts_follow_the_table_order_not_the_block_ids():
    # A filler takes blocks 1-6, A takes 7, 8, 9, the filler leaves (queue 6, 5, ..., 1). B shares
    # A's first two blocks and gets a fresh tail from the queue front: block 6, a LOWER id than its
    # prefix. Its table is [7, 8, 6], so ref counts in table order are [2, 2, 1].
    kv = KVCacheManager(CacheConfig(num_gpu_blocks=10, block_size=4))
    filler = lab.prefill(kv, list(range(500, 524)), "F")
    a_prompt = list(range(100, 112))
    lab.prefill(kv, a_prompt, "A")
    kv.free(filler.request)
    b = lab.prefill(kv, a_prompt[:8] + [900, 901, 902, 903], "B")
    table = kv.get_block_ids("B")
    assert table == [7, 8, 6], f"setup: B's table should be [7, 8, 6], got {table}"
    got = lab.ref_counts(kv, b.request)
    assert got == [2, 2, 1], (
        f"ref_counts must list the blocks in the request's table order ({table}): expected [2, 2, 1], got {got}; "
        f"walk kv.get_block_ids(request_id), do not filter the pool (that is block-id order)"
    )
