from itertools import pairwise

import numpy as np
import pytest

from course.runtime import lab_module

lab = lab_module(__file__)   # solution.py by default; LAB_IMPL=starter grades starter.py


LINKS = ("prev_free_block", "next_free_block")


def ids(blocks):
    return [b.block_id for b in blocks]


def queue_ids(pool):
    return ids(pool.free_block_queue.get_all_free_blocks())


def check_invariants(pool):
    """I1 both ways, the null block rule, and an honest prefix-cache index."""
    free = pool.free_block_queue.get_all_free_blocks()
    free_set = {id(b) for b in free}
    assert len(free) == pool.get_num_free_blocks(), (
        f"num_free_blocks says {pool.get_num_free_blocks()} but the queue holds {len(free)}: "
        f"update the counter in popleft/remove/append")
    assert id(pool.null_block) not in free_set, "the null block must never sit in the free queue"
    for b in pool.blocks:
        if b.is_null:
            continue
        in_queue = id(b) in free_set
        assert in_queue == (b.ref_cnt == 0), (
            f"I1 broken for block {b.block_id}: ref_cnt={b.ref_cnt}, in free queue={in_queue}; "
            f"a block is free exactly when nobody references it")
    for h, b in pool.cached_block_hash_to_block.items():
        assert b.block_hash == h, (
            f"index maps a hash to block {b.block_id}, whose own hash differs: evict index entries "
            f"when a block is reused (_maybe_evict_cached_block)")


def test_free_queue_keeps_order_and_count():
    blocks = [lab.KVCacheBlock(i) for i in range(6)]
    q = lab.FreeKVCacheBlockQueue(blocks)
    assert ids(q.get_all_free_blocks()) == [0, 1, 2, 3, 4, 5], "the queue starts in block-id order"
    assert q.num_free_blocks == 6
    first = q.popleft()
    assert first.block_id == 0, f"popleft must take the FRONT block, got {first.block_id}"
    assert first.prev_free_block is None and first.next_free_block is None, (
        "a popped block must have both links cleared")
    q.remove(blocks[3])
    q.append(first)
    q.append(blocks[3])
    order = q.get_all_free_blocks()
    assert ids(order) == [1, 2, 4, 5, 0, 3], (
        f"after popleft/remove/append the order should be [1, 2, 4, 5, 0, 3], got {ids(order)}")
    assert q.num_free_blocks == 6, f"num_free_blocks must stay exact, got {q.num_free_blocks}"
    assert all(b.block_id >= 0 for b in order), "sentinel nodes (block_id -1) must never be returned"
    for a, b in pairwise(order):
        assert a.next_free_block is b and b.prev_free_block is a, (
            f"links between {a.block_id} and {b.block_id} are inconsistent: the list must be threaded "
            f"through prev_free_block/next_free_block on the blocks themselves")
    while q.num_free_blocks:
        q.popleft()
    with pytest.raises(ValueError):
        q.popleft()


def _counting_block_class():
    counts = {"links": 0, "eq": 0}

    class CountingBlock(lab.KVCacheBlock):
        def __getattribute__(self, name):
            if name in LINKS:
                counts["links"] += 1
            return object.__getattribute__(self, name)

        def __setattr__(self, name, value):
            if name in LINKS:
                counts["links"] += 1
            object.__setattr__(self, name, value)

        def __eq__(self, other):
            counts["eq"] += 1
            return self is other

        __hash__ = object.__hash__

    return CountingBlock, counts


@pytest.mark.parametrize("n", [16, 2048])
def test_remove_from_middle_is_constant_time(n):
    Block, counts = _counting_block_class()
    blocks = [Block(i) for i in range(n)]
    q = lab.FreeKVCacheBlockQueue(blocks)
    counts["links"] = counts["eq"] = 0
    q.remove(blocks[n // 2])
    work = counts["links"] + counts["eq"]
    assert work <= 12, (
        f"remove() from the middle of a {n}-block queue touched {counts['links']} link fields and made "
        f"{counts['eq']} comparisons; it must rewire the block's two neighbours directly (O(1)), "
        f"never walk or search the list")
    assert ids(q.get_all_free_blocks()) == [i for i in range(n) if i != n // 2], (
        "removing a middle block must leave every other block in its original order")


def test_null_block_is_reserved():
    pool = lab.BlockPool(num_gpu_blocks=5)
    assert pool.null_block.block_id == 0 and pool.null_block.is_null, (
        "block 0 must become the null block (is_null=True) at construction")
    assert pool.get_num_free_blocks() == 4, "5 blocks minus the null block leaves 4 free"
    assert pool.get_usage() == 0.0, "with only the null block taken, usage must be 0.0"
    got = pool.get_new_blocks(4)
    assert 0 not in ids(got), "the null block must never be handed out"
    assert pool.get_usage() == 1.0, "with every usable block taken, usage must be 1.0 (null block excluded)"
    check_invariants(pool)


def test_allocate_free_cycles_keep_invariant_I1():
    rng = np.random.default_rng(0)
    pool = lab.BlockPool(num_gpu_blocks=17)
    live = []
    for _ in range(200):
        if live and (rng.random() < 0.45 or pool.get_num_free_blocks() == 0):
            table = live.pop(int(rng.integers(len(live))))
            pool.free_blocks(reversed(table))
        else:
            n = int(rng.integers(1, 5))
            if n > pool.get_num_free_blocks():
                before = queue_ids(pool)
                with pytest.raises(ValueError):
                    pool.get_new_blocks(n)
                assert queue_ids(pool) == before, "a refused allocation must leave the free queue untouched"
                continue
            table = pool.get_new_blocks(n)
            assert all(b.ref_cnt == 1 for b in table), "fresh blocks start with ref_cnt == 1"
            live.append(table)
        check_invariants(pool)
    pool = lab.BlockPool(num_gpu_blocks=3)
    (block,) = pool.get_new_blocks(1)
    pool.free_blocks([block])
    with pytest.raises(ValueError):
        pool.free_blocks([block])          # nobody holds it any more: a second free is a bug
    assert queue_ids(pool) == [2, 1], (
        f"a refused double free must change nothing (the block must not be queued twice); queue {queue_ids(pool)}")


def test_null_block_in_a_table_is_never_queued():
    pool = lab.BlockPool(num_gpu_blocks=6)
    table = [pool.null_block, *pool.get_new_blocks(2)]   # a placeholder slot, as a sliding window leaves
    pool.touch(table)                                    # a second request shares the whole table
    assert [b.ref_cnt for b in table[1:]] == [2, 2], "touch adds one user to every real block"
    pool.free_blocks(reversed(table))                    # first owner leaves
    assert pool.null_block not in pool.free_block_queue.get_all_free_blocks(), (
        "the null block's ref_cnt is not maintained: free_blocks must never append it to the free "
        "queue, whatever its counter reads (skip blocks with is_null)")
    pool.free_blocks(reversed(table))                    # second owner leaves
    assert queue_ids(pool) == [3, 4, 5, 2, 1], (
        f"after both frees the queue holds the 5 usable blocks and never block 0; got {queue_ids(pool)}")
    check_invariants(pool)



def test_null_block_in_a_table_is_never_cached():
    pool = lab.BlockPool(num_gpu_blocks=6)
    hashes = lab.block_hashes_for(list(range(12)), 4)
    table = [pool.null_block, *pool.get_new_blocks(2)]   # block 0 of the sequence slid out of the window
    pool.cache_full_blocks(table, hashes)
    assert pool.null_block.block_hash is None and pool.get_cached_block(hashes[0]) is None, (
        "the null block holds no KV: cache_full_blocks must skip it (is_null), never hash or index it, or a later "
        "request with this prefix would 'hit' an empty placeholder")
    assert [pool.get_cached_block(h) for h in hashes[1:]] == table[1:], "the real blocks after it are indexed"
    check_invariants(pool)

def test_identical_content_gets_distinct_blocks_I2():
    pool = lab.BlockPool(num_gpu_blocks=10)
    tokens = [7, 7, 7, 7, 8, 8, 8, 8]
    hashes = lab.block_hashes_for(tokens, 4)
    a = pool.get_new_blocks(2)
    b = pool.get_new_blocks(2)
    pool.cache_full_blocks(a, hashes)
    a_ids, b_ids = ids(a), ids(b)
    pool.cache_full_blocks(b, hashes)
    assert set(a_ids).isdisjoint(b_ids), "two requests always get distinct physical blocks"
    assert ids(a) == a_ids and ids(b) == b_ids, "caching must never change a block table (I2: append-only)"
    assert pool.get_cached_block(hashes[0]) is a[0], (
        "with one block per hash, the block indexed FIRST keeps the entry (no de-duplication)")
    assert all(blk.ref_cnt == 1 for blk in a + b), "caching must not change reference counts"
    check_invariants(pool)
    pool.free_blocks(reversed(b))                       # b's duplicates go idle, then get reused
    pool.get_new_blocks(pool.get_num_free_blocks())
    assert pool.get_cached_block(hashes[0]) is a[0] and pool.get_cached_block(hashes[1]) is a[1], (
        "reusing a duplicate block must not evict the OTHER block that owns the index entry: "
        "_maybe_evict_cached_block may delete the entry only when it points at the block being reused")
    check_invariants(pool)


def test_partial_blocks_are_never_cached_I3():
    pool = lab.BlockPool(num_gpu_blocks=8)
    tokens = list(range(10))                       # block_size 4: two full blocks + 2 tokens
    hashes = lab.block_hashes_for(tokens, 4)
    assert len(hashes) == 2, f"10 tokens at block_size 4 make 2 full blocks, so 2 hashes; got {len(hashes)}"
    table = pool.get_new_blocks(3)
    pool.cache_full_blocks(table, hashes)
    assert table[0].block_hash == hashes[0] and table[1].block_hash == hashes[1]
    assert table[2].block_hash is None, "the partial tail block is still being written: it must get no hash"
    assert len(pool.cached_block_hash_to_block) == 2, "only the two full blocks may be indexed"
    # Two more tokens fill the tail: now it may be cached, and the earlier ones are not redone.
    hashes = lab.block_hashes_for(tokens + [10, 11], 4)
    pool.cache_full_blocks(table, hashes, num_cached_blocks=2)
    assert table[2].block_hash == hashes[2], "once full, the tail block gets its hash"


def test_prefix_hash_is_chained():
    h_cd_after_ab = lab.block_hashes_for([1, 2, 3, 4], 2)[1]
    h_cd_after_xy = lab.block_hashes_for([9, 9, 3, 4], 2)[1]
    assert h_cd_after_ab != h_cd_after_xy, (
        "the same tokens [3, 4] after different prefixes must hash differently: fold the parent hash in")
    assert lab.hash_block_tokens(None, [3, 4]) == lab.hash_block_tokens(None, [3, 4]), "hashes must be deterministic"
    assert isinstance(lab.hash_block_tokens(None, [3, 4]), bytes), "return the digest as bytes"
    parent = lab.hash_block_tokens(None, [1, 2])
    assert lab.hash_block_tokens(parent, [3, 4]) == h_cd_after_ab, (
        "block_hashes_for must chain hash_block_tokens from a None parent")


def test_touch_revives_a_cached_free_block_from_the_middle_I4():
    pool = lab.BlockPool(num_gpu_blocks=10)
    tokens = list(range(12))
    hashes = lab.block_hashes_for(tokens, 4)
    table = pool.get_new_blocks(3)
    pool.cache_full_blocks(table, hashes)
    pool.free_blocks(reversed(table))                 # queue: 4..9, then 3, 2, 1
    assert queue_ids(pool) == [4, 5, 6, 7, 8, 9, 3, 2, 1], (
        f"free_blocks must append in the order given (reversed table -> 3, 2, 1); got {queue_ids(pool)}")
    hit = pool.get_cached_block(hashes[1])
    assert hit is table[1], "a freed block keeps its hash and stays findable (cached != unusable)"
    pool.touch([hit])
    assert hit.ref_cnt == 1, "touch must add a reference"
    assert queue_ids(pool) == [4, 5, 6, 7, 8, 9, 3, 1], (
        f"touch must unlink the revived block from the middle and keep everyone else in order; got {queue_ids(pool)}")
    assert pool.get_cached_block(hashes[1]) is hit, "reviving must keep the block cached"
    check_invariants(pool)


def test_reusing_a_cached_block_evicts_its_index_entry():
    pool = lab.BlockPool(num_gpu_blocks=4)            # 3 usable blocks
    hashes = lab.block_hashes_for(list(range(8)), 4)
    table = pool.get_new_blocks(2)
    pool.cache_full_blocks(table, hashes)
    pool.free_blocks(reversed(table))                 # queue: 3, 2, 1 (all idle, 2 and 1 cached)
    got = pool.get_new_blocks(3)
    assert ids(got) == [3, 2, 1], f"allocation pops from the front of the queue; got {ids(got)}"
    assert pool.get_cached_block(hashes[0]) is None and pool.get_cached_block(hashes[1]) is None, (
        "a cached block handed to a new owner must leave the prefix-cache index (_maybe_evict_cached_block)")
    assert all(b.block_hash is None for b in got), "a reused block must have its hash reset"
    assert all(b.ref_cnt == 1 for b in got)
    check_invariants(pool)


def test_refused_double_free_in_a_batch_changes_nothing():
    pool = lab.BlockPool(num_gpu_blocks=5)
    held, gone = pool.get_new_blocks(2)
    pool.free_blocks([gone])
    before = queue_ids(pool)
    with pytest.raises(ValueError):
        pool.free_blocks([held, gone])     # `gone` is a double free; `held` is still owned
    assert held.ref_cnt == 1, (
        f"the batch was refused, so block {held.block_id} must keep ref_cnt 1, got {held.ref_cnt}: check "
        f"EVERY block for a double free before decrementing any of them")
    assert queue_ids(pool) == before, (
        f"a refused free_blocks must leave the free queue as it was ({before}), got {queue_ids(pool)}")
    check_invariants(pool)
    pool.free_blocks([held])               # the real owner's free still works, exactly once
    assert queue_ids(pool) == before + [held.block_id], (
        f"after the refusal, freeing the held block must queue it once at the back; got {queue_ids(pool)}")
    check_invariants(pool)


def test_refused_allocation_keeps_cached_blocks_findable():
    pool = lab.BlockPool(num_gpu_blocks=5)            # 4 usable blocks
    hashes = lab.block_hashes_for(list(range(8)), 4)
    table = pool.get_new_blocks(2)
    pool.cache_full_blocks(table, hashes)
    pool.free_blocks(reversed(table))                 # idle but cached: eviction candidates
    before = queue_ids(pool)
    with pytest.raises(ValueError):
        pool.get_new_blocks(5)                        # only 4 free: refused
    assert queue_ids(pool) == before, f"a refused allocation must not reorder the queue; got {queue_ids(pool)}"
    for i, h in enumerate(hashes):
        assert pool.get_cached_block(h) is table[i], (
            f"a refused allocation evicted cached block {table[i].block_id}: decide the refusal (enough "
            f"free blocks?) BEFORE popping anything, so no cached prefix is lost")
    assert all(b.ref_cnt == 0 for b in table)
    pool.touch([pool.get_cached_block(hashes[0])])    # the prefix is still a hit afterwards
    assert table[0].ref_cnt == 1
    check_invariants(pool)


def test_caching_disabled_never_indexes_or_evicts():
    pool = lab.BlockPool(num_gpu_blocks=4, enable_caching=False)
    hashes = lab.block_hashes_for(list(range(8)), 4)
    table = pool.get_new_blocks(2)
    pool.cache_full_blocks(table, hashes)
    assert pool.get_cached_block(hashes[0]) is None and not pool.cached_block_hash_to_block, (
        "with enable_caching=False, cache_full_blocks must do nothing: no index entries")
    assert all(b.block_hash is None for b in table), "with caching disabled no block gets a hash"
    pool.free_blocks(reversed(table))
    assert ids(pool.get_new_blocks(3)) == [3, 2, 1], "allocation order does not depend on caching"
    check_invariants(pool)


def test_a_block_hash_names_its_tokens_exactly():
    # Same-length blocks whose decimal digits glue into the same string must still differ: a
    # collision here would hand one request another request's KV.
    for a, b in (([1, 23, 4], [12, 3, 4]), ([11, 1], [1, 11])):
        assert lab.hash_block_tokens(None, a) != lab.hash_block_tokens(None, b), (
            f"blocks {a} and {b} hash the same: serialise the token ids so that different sequences give "
            f"different bytes (keep the separators, e.g. repr of a tuple of ints)"
        )
    # The same tokens as numpy integers (how a model's sampled ids often arrive) name the same block.
    as_list = lab.block_hashes_for(list(range(8)), 4)
    as_numpy = lab.block_hashes_for(np.arange(8, dtype=np.int64), 4)
    assert as_numpy == as_list, (
        "block_hashes_for(np.arange(8), 4) differs from block_hashes_for(list(range(8)), 4): convert each "
        "token id to a plain int before serialising, or a numpy prompt never hits the prefix cache"
    )


def test_a_pool_of_only_the_null_block_reports_zero_usage():
    pool = lab.BlockPool(num_gpu_blocks=1)
    free = pool.get_num_free_blocks()
    assert free == 0, f"one block is the null block: 0 free, got {free}"
    try:
        usage = pool.get_usage()
    except ZeroDivisionError:
        usage = "ZeroDivisionError"
    assert usage == 0.0, f"a pool with no usable block has nothing in use: usage 0.0, got {usage}"


def test_a_block_listed_twice_in_one_free_is_counted_twice():
    pool = lab.BlockPool(num_gpu_blocks=5)
    (b,) = pool.get_new_blocks(1)  # one user
    before = queue_ids(pool)
    with pytest.raises(ValueError):
        pool.free_blocks([b, b])  # two references given back, only one held
        pytest.fail(f"free_blocks([b, b]) holding 1 reference must raise a double free; ref_cnt {b.ref_cnt}")
    assert b.ref_cnt == 1 and queue_ids(pool) == before, (
        f"the refused free must change nothing: ref_cnt {b.ref_cnt} (want 1), queue {queue_ids(pool)} (want {before})"
    )
    pool.touch([b])  # now two users: giving back two is legal
    pool.free_blocks([b, b])
    assert b.ref_cnt == 0 and queue_ids(pool).count(b.block_id) == 1, (
        f"two users, freed twice in one call: ref_cnt 0 and block {b.block_id} queued exactly once; "
        f"got ref_cnt {b.ref_cnt}, queue {queue_ids(pool)}"
    )
    check_invariants(pool)
