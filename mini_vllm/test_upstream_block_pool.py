"""Differential test: the same operation sequence through mini's and vLLM 0.22.1's BlockPool.

Checked after every operation: the block ids handed out, ref counts, the free queue's order
(so LRU order and tail-first frees), and which hashes are cached where (so evictions).
"""

import importlib
import random
from types import SimpleNamespace

import pytest

from mini_vllm import BlockPool

pytestmark = pytest.mark.upstream


@pytest.fixture(scope="module")
def real():
    return importlib.import_module("mini_vllm.testing.real_vllm")


def snapshot_mini(pool):
    return (
        [b.ref_cnt for b in pool.blocks[1:]],
        [b.block_id for b in pool.free_block_queue.get_all_free_blocks()],
        pool.cached_block_hash_to_block.to_dict(),
    )


def snapshot_real(pool):
    cached = {}
    for key, value in pool.cached_block_hash_to_block._cache.items():
        blocks = [value] if not isinstance(value, dict) else list(value.values())
        cached[key[:-4]] = [b.block_id for b in blocks]  # strip the 4-byte group id
    return (
        [b.ref_cnt for b in pool.blocks[1:]],
        [b.block_id for b in pool.free_block_queue.get_all_free_blocks()],
        cached,
    )


class Twin:
    """Applies each operation to both pools and compares the results."""

    def __init__(self, real, num_blocks, enable_caching=True):
        self.mini = BlockPool(num_blocks, enable_caching)
        self.real = real.make_block_pool(num_blocks, enable_caching, block_size=16)
        assert snapshot_mini(self.mini) == snapshot_real(self.real)

    def check(self, what):
        assert snapshot_mini(self.mini) == snapshot_real(self.real), f"pools diverged after {what}"

    def alloc(self, n):
        a = [b.block_id for b in self.mini.get_new_blocks(n)]
        b = [b.block_id for b in self.real.get_new_blocks(n)]
        assert a == b, f"get_new_blocks({n}) handed out different blocks"
        self.check(f"alloc {n}")
        return a

    def free(self, ids):
        self.mini.free_blocks([self.mini.blocks[i] for i in ids])
        self.real.free_blocks([self.real.blocks[i] for i in ids])
        self.check(f"free {ids}")

    def touch(self, ids):
        self.mini.touch([self.mini.blocks[i] for i in ids])
        self.real.touch([self.real.blocks[i] for i in ids])
        self.check(f"touch {ids}")

    def cache(self, ids, hashes):
        self.mini.cache_full_blocks([self.mini.blocks[i] for i in ids], hashes)
        self.real.cache_full_blocks(
            request=SimpleNamespace(block_hashes=hashes),
            blocks=[self.real.blocks[i] for i in ids],
            num_cached_blocks=0,
            num_full_blocks=len(ids),
            block_size=16,
            kv_cache_group_id=0,
        )
        self.check(f"cache {ids}")

    def lookup(self, block_hash):
        m = self.mini.get_cached_block(block_hash)
        r = self.real.get_cached_block(block_hash, [0])
        assert (m.block_id if m else None) == (r[0].block_id if r else None), "lookup disagrees"
        return m.block_id if m else None


def test_alloc_free_touch_evict_by_hand(real):
    t = Twin(real, 8)
    a = t.alloc(3)  # [1, 2, 3]
    t.cache(a[:2], [b"A" * 32, b"B" * 32])
    b = t.alloc(2)  # [4, 5]
    t.free(list(reversed(a)))  # tail first: 3 2 1 join the tail
    t.touch([t.lookup(b"A" * 32)])  # a prefix hit pulls block 1 out of the middle of the queue
    t.alloc(4)  # 6 7, then 3 and 2: block 2's hash B is evicted
    assert t.lookup(b"B" * 32) is None and t.lookup(b"A" * 32) == 1
    t.free(b + [1])
    assert t.mini.get_usage() == t.real.get_usage()


@pytest.mark.parametrize("seed", range(6))
def test_random_op_traces_agree(real, seed):
    rng = random.Random(seed)
    t = Twin(real, rng.randint(4, 24), enable_caching=rng.random() < 0.8)
    owners: list[list[int]] = []  # one list per "request": blocks it holds, in order
    hashes: list[bytes] = []
    for step in range(120):
        op = rng.random()
        free = t.mini.get_num_free_blocks()
        if op < 0.35 and free:
            owners.append(t.alloc(rng.randint(1, free)))
        elif op < 0.6 and owners:
            t.free(list(reversed(owners.pop(rng.randrange(len(owners))))))
        elif op < 0.8 and owners:
            ids = [i for i in rng.choice(owners) if t.mini.blocks[i].block_hash is None]
            new = [f"h{seed}-{step}-{k}".encode().ljust(32, b".") for k in range(len(ids))]
            if ids and t.mini.enable_caching:
                t.cache(ids, new)
                hashes += new
        elif hashes:
            hit = t.lookup(rng.choice(hashes))
            if hit is not None:
                t.touch([hit])
                owners.append([hit])
    while owners:
        t.free(list(reversed(owners.pop())))
    assert t.mini.get_num_free_blocks() == t.real.get_num_free_blocks() == t.mini.num_gpu_blocks - 1


def test_duplicate_hashes_are_indexed_and_evicted_like_upstream(real):
    """Several blocks under one hash: both pools index every copy, serve the oldest, and keep
    serving the hash from the next copy after the oldest is evicted."""
    t = Twin(real, 5)
    x, y, z = t.alloc(1)[0], t.alloc(1)[0], t.alloc(1)[0]
    h = b"D" * 32
    for blk in (x, y, z):
        t.cache([blk], [h])
    assert t.mini.cached_block_hash_to_block.to_dict() == {h: [x, y, z]}
    assert t.lookup(h) == x, "both return the oldest copy while it is cached"
    t.free([x, z, y])
    assert t.alloc(2) == [4, x], "reusing block x evicts that copy only"
    assert t.lookup(h) == y, "the next copy still serves the hash"
    t.alloc(1)  # z
    assert t.lookup(h) == y
    t.alloc(1)  # y: the last copy
    assert t.lookup(h) is None
