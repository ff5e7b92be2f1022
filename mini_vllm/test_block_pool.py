"""BlockPool invariants, pinned on tiny pools (the habit of upstream's tests/v1/core):

I1 a block is in the free queue ⇔ its ref_cnt is 0;  I2 a block has a hash ⇔ the index lists it
under that hash;
I3 block tables are append-only;  I4 the null block is never handed out.
"""

import pytest

from mini_vllm import NONE_HASH, BlockPool, FreeKVCacheBlockQueue, KVCacheBlock, hash_block_tokens

GOLDEN = "4f29c3987603b389"  # sha256(sha256(NONE_HASH + int64[1..4]) + int64[5..8]), first 8 bytes


def ids(blocks):
    return [b.block_id for b in blocks]


def free_ids(pool):
    return ids(pool.free_block_queue.get_all_free_blocks())


def check_invariants(pool: BlockPool) -> None:
    free = pool.free_block_queue.get_all_free_blocks()
    assert len(free) == pool.get_num_free_blocks(), "num_free_blocks drifted from the list"
    in_queue = {b.block_id for b in free}
    for b in pool.blocks[1:]:
        assert b.ref_cnt >= 0, f"block {b.block_id} has a negative ref_cnt"
        assert (b.ref_cnt == 0) == (b.block_id in in_queue), f"I1 broken for block {b.block_id}"
        if b.block_hash is not None:
            assert b in pool.cached_block_hash_to_block.get_all_blocks(b.block_hash), (
                "I2: a hashed block must be listed under its hash"
            )
    for h, block_ids in pool.cached_block_hash_to_block.to_dict().items():
        assert block_ids and all(pool.blocks[i].block_hash == h for i in block_ids), (
            "I2: the index may only list blocks that carry that hash"
        )
    assert 0 not in in_queue, "I4: the null block must never be free"


def test_null_block_is_block_zero_and_never_handed_out():
    pool = BlockPool(5)
    assert pool.null_block.block_id == 0 and pool.null_block.is_null
    assert pool.get_num_free_blocks() == 4 and pool.get_usage() == 0.0
    got = pool.get_new_blocks(4)
    assert ids(got) == [1, 2, 3, 4] and pool.get_usage() == 1.0
    with pytest.raises(ValueError):
        pool.get_new_blocks(1)
    check_invariants(pool)


def test_free_queue_o1_middle_removal():
    blocks = [KVCacheBlock(i) for i in range(5)]
    queue = FreeKVCacheBlockQueue(blocks)
    queue.remove(blocks[2])
    assert ids(queue.get_all_free_blocks()) == [0, 1, 3, 4], "removing a middle block keeps the rest in order"
    assert queue.num_free_blocks == 4
    assert blocks[2].prev_free_block is None and blocks[2].next_free_block is None, (
        "a removed block is unlinked"
    )
    assert blocks[1].next_free_block is blocks[3] and blocks[3].prev_free_block is blocks[1]
    queue.append(blocks[2])
    assert ids(queue.get_all_free_blocks()) == [0, 1, 3, 4, 2], "append goes to the tail"
    assert queue.popleft() is blocks[0] and ids(queue.popleft_n(2)) == [1, 3]
    with pytest.raises(ValueError):
        queue.remove(blocks[0])  # not in the queue any more


def test_prefix_hash_is_chained():
    a = hash_block_tokens(None, [1, 2, 3, 4])
    b = hash_block_tokens(a, [5, 6, 7, 8])
    assert hash_block_tokens(None, [5, 6, 7, 8]) != b, (
        "same tokens after a different parent must hash differently"
    )
    assert hash_block_tokens(None, [1, 2, 3, 4]) == a and hash_block_tokens(NONE_HASH, [1, 2, 3, 4]) == a
    assert isinstance(a, bytes) and len(a) == 32, "a SHA-256 digest"
    assert hash_block_tokens(None, [1, 2]) != hash_block_tokens(None, [258]), (
        "the encoding must not be ambiguous"
    )


def test_hashes_are_stable_across_processes():
    # A golden value: the digest may never depend on the process (hash(None), PYTHONHASHSEED).
    h = hash_block_tokens(hash_block_tokens(None, [1, 2, 3, 4]), [5, 6, 7, 8])
    assert h.hex()[:16] == GOLDEN, "block hashes must be a pure function of the tokens"


def test_free_appends_in_given_order_and_keeps_hashes():
    pool = BlockPool(6)
    blocks = pool.get_new_blocks(3)
    pool.cache_full_blocks(blocks[:2], [b"h1", b"h2"])
    pool.free_blocks(reversed(blocks))  # the KV manager frees tail first
    assert free_ids(pool) == [4, 5, 3, 2, 1], "freed blocks join the tail in the order given"
    assert pool.get_cached_block(b"h1") is blocks[0], "a freed block stays cached until it is reused"
    check_invariants(pool)


def test_touch_unlinks_a_free_cached_block_and_reuse_evicts():
    pool = BlockPool(5)
    a = pool.get_new_blocks(2)
    pool.cache_full_blocks(a, [b"x", b"y"])
    pool.free_blocks(reversed(a))  # queue: 3 4 2 1
    pool.touch([pool.get_cached_block(b"x")])  # a prefix hit on block 1
    assert free_ids(pool) == [3, 4, 2] and a[0].ref_cnt == 1
    got = pool.get_new_blocks(3)  # 3, 4 and then block 2, which is evicted from the cache
    assert ids(got) == [3, 4, 2]
    assert pool.get_cached_block(b"y") is None and a[1].block_hash is None, "reusing a cached block evicts it"
    assert pool.get_cached_block(b"x") is a[0]
    check_invariants(pool)


def test_duplicate_hash_keeps_every_copy_and_serves_the_oldest():
    pool = BlockPool(5)
    a, b, c = pool.get_new_blocks(3)
    pool.cache_full_blocks([a], [b"same"])
    pool.cache_full_blocks([b], [b"same"])
    pool.cache_full_blocks([c], [b"same"])
    assert b.block_hash == b"same", "a duplicate is indexed too (block tables are never merged)"
    assert (
        pool.cached_block_hash_to_block.to_dict() == {b"same": [1, 2, 3]}
        and len(pool.cached_block_hash_to_block) == 1
    )
    assert pool.get_cached_block(b"same") is a, "a lookup returns the oldest copy"
    pool.free_blocks([a, c, b])  # queue: 4 1 3 2
    check_invariants(pool)
    assert ids(pool.get_new_blocks(2)) == [4, 1], "block 1 (copy a) is reused: its copy is evicted"
    assert a.block_hash is None and pool.get_cached_block(b"same") is b, (
        "after the oldest copy is evicted the next one (block 2) still serves the hash"
    )
    assert pool._maybe_evict_cached_block(b) and pool.get_cached_block(b"same") is c
    assert not pool._maybe_evict_cached_block(b), "a second eviction of the same block is a no-op"
    pool.get_new_blocks(2)  # 3 (copy c) and 2
    assert pool.get_cached_block(b"same") is None and b"same" not in pool.cached_block_hash_to_block
    check_invariants(pool)


def test_shared_block_needs_every_reference_dropped():
    pool = BlockPool(4)
    (blk,) = pool.get_new_blocks(1)
    pool.touch([blk])
    pool.free_blocks([blk])
    assert blk.ref_cnt == 1 and 1 not in free_ids(pool), "still used by one request"
    pool.free_blocks([blk])
    assert free_ids(pool)[-1] == 1
    check_invariants(pool)


def test_double_free_raises_and_changes_nothing():
    pool = BlockPool(4)
    x, y = pool.get_new_blocks(2)
    pool.free_blocks([x])
    before = (free_ids(pool), x.ref_cnt, y.ref_cnt)
    with pytest.raises(ValueError, match="double free"):
        pool.free_blocks([y, x])
    assert (free_ids(pool), x.ref_cnt, y.ref_cnt) == before
    with pytest.raises(ValueError):
        pool.free_blocks([pool.null_block])


def test_caching_disabled_never_indexes():
    pool = BlockPool(4, enable_caching=False)
    blocks = pool.get_new_blocks(2)
    pool.cache_full_blocks(blocks, [b"a", b"b"])
    assert len(pool.cached_block_hash_to_block) == 0 and all(b.block_hash is None for b in blocks)


def test_reset_prefix_cache_only_when_idle():
    pool = BlockPool(4)
    blocks = pool.get_new_blocks(1)
    pool.cache_full_blocks(blocks, [b"a"])
    assert not pool.reset_prefix_cache()
    pool.free_blocks(blocks)
    assert pool.reset_prefix_cache() and pool.get_cached_block(b"a") is None


def test_adapter_images_and_salt_key_every_block_as_upstream():
    """A 3-block prompt under adapters, the base model and a salt: blocks are shared only where the
    adapter, the images and the salt all agree; the salt keys the first block only (the chain
    carries it), the adapter every block, an image the blocks it overlaps (upstream's order)."""
    from mini_vllm.block_pool import generate_block_hash_extra_keys, get_request_block_hasher
    from mini_vllm.lora import LoRARequest
    from mini_vllm.multimodal import MultiModalFeature, PlaceholderRange
    from mini_vllm.request import Request

    hasher = get_request_block_hasher(4)
    prompt = list(range(40, 52))
    img = (MultiModalFeature("img", PlaceholderRange(6, 3)),)

    def hashes(lora=None, salt=None, mm=()):
        return Request("r", prompt, block_hasher=hasher, lora_request=lora, cache_salt=salt, mm_features=mm).block_hashes

    a1, a2, a1_again = LoRARequest("a1", 1), LoRARequest("a2", 2), LoRARequest("a1", 1, "/other/path")
    variants = {"base": hashes(), "a1": hashes(a1), "a2": hashes(a2), "salt": hashes(salt="t1"),
                "a1+salt": hashes(a1, "t1"), "image": hashes(mm=img), "a1+image": hashes(a1, mm=img)}
    for name, hs in variants.items():
        assert len(hs) == 3, f"{name}: a 12-token prompt at block size 4 has 3 full blocks, got {len(hs)} hashes"
    firsts = {name: hs[0] for name, hs in variants.items() if "image" not in name}
    assert len(set(firsts.values())) == len(firsts), f"first blocks must differ across {sorted(firsts)}"
    assert variants["image"][0] == variants["base"][0], "block 0 does not overlap the image: same key as the base"
    assert variants["image"][1] != variants["base"][1], "block 1 holds the image: its key must name it"
    assert hashes(a1_again) == variants["a1"], "one adapter name, one set of blocks (upstream keys on lora_name)"

    r = Request("r", prompt, lora_request=a1, cache_salt="t1", mm_features=img)
    assert generate_block_hash_extra_keys(r, 0, 4) == ("a1", "t1")
    assert generate_block_hash_extra_keys(r, 4, 8) == ("a1", ("img", 2)), "no salt after the first block"
    assert generate_block_hash_extra_keys(r, 8, 12) == ("a1", ("img", -2)), "the image started 2 tokens before"
    assert generate_block_hash_extra_keys(Request("b", prompt), 0, 4) == (), "the base model has no extra keys"
    # exact edges: an image that starts where a block ends, or ends where a block starts, is not in it
    edge = (
        MultiModalFeature("to4", PlaceholderRange(1, 3)),
        MultiModalFeature("at4", PlaceholderRange(4, 3)),
    )
    r = Request("e", prompt, mm_features=edge)
    got = {(s, s + 4): generate_block_hash_extra_keys(r, s, s + 4) for s in (0, 4)}
    assert got == {(0, 4): (("to4", 1),), (4, 8): (("at4", 0),)}, (
        f"block [start, end) holds an image iff offset < end and start < offset + length; got {got}"
    )


@pytest.mark.parametrize("salt", ["", 3, b"t1"])
def test_cache_salt_must_be_a_non_empty_string(salt):
    from mini_vllm.request import Request

    with pytest.raises(ValueError, match="cache_salt"):
        Request("r", [1, 2, 3], cache_salt=salt)
