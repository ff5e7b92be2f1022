"""Lab 02.01 — a paged KV-block allocator, reference solution.

Mirrors three upstream pieces (vLLM v0.22.1 @ 0decac0, paths relative to upstream/):
  KVCacheBlock           vllm/v1/core/kv_cache_utils.py:116
  FreeKVCacheBlockQueue  vllm/v1/core/kv_cache_utils.py:164
  BlockPool              vllm/v1/core/block_pool.py:130
  hash_block_tokens      vllm/v1/core/kv_cache_utils.py:541

Left out on purpose: KV-cache groups (hybrid models), KV events, metrics, popleft_n/append_n
batching, and the several-blocks-per-hash map (we keep one block per hash, first one wins).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

# Root "parent" for the first block of every chain (upstream: NONE_HASH). A fixed constant keeps
# hashes identical across processes, which Python's built-in hash() would not promise.
NONE_HASH: bytes = hashlib.sha256(b"mini-vllm/none-hash").digest()


@dataclass(eq=False)
class KVCacheBlock:
    """Metadata for one physical KV block. The K/V numbers themselves live elsewhere (a big
    tensor indexed by block_id); this object only says who uses the block and what it holds."""

    block_id: int
    ref_cnt: int = 0
    block_hash: bytes | None = None  # set once, when the block is full and cached
    # Links for the free queue. Only FreeKVCacheBlockQueue may touch these two.
    prev_free_block: KVCacheBlock | None = None
    next_free_block: KVCacheBlock | None = None
    is_null: bool = False

    def reset_hash(self) -> None:
        """Forget the cached identity (called when the block is evicted for reuse)."""
        self.block_hash = None


class FreeKVCacheBlockQueue:
    """Doubly linked list of free blocks, threaded through the blocks themselves.

    Front = next to be handed out (and so evicted); back = most recently freed. Two sentinel
    blocks (`_head`, `_tail`, block_id -1) mean no operation special-cases an empty list or the
    first/last element. Every operation is O(1) except get_all_free_blocks (a test helper).
    """

    def __init__(self, blocks: list[KVCacheBlock]) -> None:
        self._head = KVCacheBlock(block_id=-1)
        self._tail = KVCacheBlock(block_id=-1)
        self._head.next_free_block = self._tail
        self._tail.prev_free_block = self._head
        self.num_free_blocks = 0
        for block in blocks:
            self.append(block)

    def popleft(self) -> KVCacheBlock:
        """Remove and return the front block. Raises ValueError when the queue is empty."""
        first = self._head.next_free_block
        if first is self._tail:
            raise ValueError("no free blocks available")
        self.remove(first)
        return first

    def remove(self, block: KVCacheBlock) -> None:
        """Unlink `block` from wherever it sits, in O(1): rewire its two neighbours."""
        before, after = block.prev_free_block, block.next_free_block
        if before is None or after is None:
            raise RuntimeError(f"block {block.block_id} is not in the free queue")
        before.next_free_block, after.prev_free_block = after, before   # neighbours skip `block`
        block.prev_free_block = None                                    # a free-standing block again
        block.next_free_block = None
        self.num_free_blocks -= 1

    def append(self, block: KVCacheBlock) -> None:
        """Put `block` at the back (it becomes the last eviction candidate)."""
        last = self._tail.prev_free_block
        last.next_free_block = block
        block.prev_free_block = last
        block.next_free_block = self._tail
        self._tail.prev_free_block = block
        self.num_free_blocks += 1

    def get_all_free_blocks(self) -> list[KVCacheBlock]:
        """Front-to-back list of the free blocks (sentinels excluded). O(n): for tests."""
        out = []
        node = self._head.next_free_block
        while node is not self._tail:
            out.append(node)
            node = node.next_free_block
        return out


def hash_block_tokens(parent_hash: bytes | None, token_ids: Sequence[int]) -> bytes:
    """SHA-256 of (parent hash, this block's tokens). Chaining the parent in makes the hash name
    the whole prefix, not just this block: equal hashes mean equal tokens from position 0."""
    parent = NONE_HASH if parent_hash is None else parent_hash
    payload = parent + repr(tuple(int(t) for t in token_ids)).encode()
    return hashlib.sha256(payload).digest()


def block_hashes_for(token_ids: Sequence[int], block_size: int) -> list[bytes]:
    """Chained hashes of the FULL blocks of `token_ids` (a partial tail block gets none)."""
    hashes: list[bytes] = []
    parent = None
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        parent = hash_block_tokens(parent, token_ids[start:start + block_size])
        hashes.append(parent)
    return hashes


class BlockPool:
    """Owns every block, the free queue and the prefix-cache index (hash -> block)."""

    def __init__(self, num_gpu_blocks: int, enable_caching: bool = True) -> None:
        if num_gpu_blocks < 1:
            raise ValueError("a pool needs at least one block (the null block)")
        self.num_gpu_blocks = num_gpu_blocks
        self.enable_caching = enable_caching
        self.blocks = [KVCacheBlock(i) for i in range(num_gpu_blocks)]
        self.free_block_queue = FreeKVCacheBlockQueue(self.blocks)
        self.cached_block_hash_to_block: dict[bytes, KVCacheBlock] = {}
        # The queue starts in id order, so this takes block 0: the placeholder for "no real KV
        # here". It never goes back to the queue, so it is never handed out.
        reserved = self.free_block_queue.popleft()
        reserved.is_null = True
        self.null_block = reserved

    def get_num_free_blocks(self) -> int:
        return self.free_block_queue.num_free_blocks

    def get_usage(self) -> float:
        """Fraction of the usable (non-null) blocks that are taken."""
        usable = self.num_gpu_blocks - 1
        return 0.0 if usable == 0 else 1.0 - self.get_num_free_blocks() / usable

    def get_new_blocks(self, num_blocks: int) -> list[KVCacheBlock]:
        """Hand out `num_blocks` blocks from the front of the free queue, each with ref_cnt 1.
        A popped block may still be a cached eviction candidate: forget that first."""
        available = self.get_num_free_blocks()
        if num_blocks > available:        # check before popping anything: a refusal changes nothing
            raise ValueError(f"cannot get {num_blocks} free blocks from the pool ({available} free)")
        out = []
        for _ in range(num_blocks):
            block = self.free_block_queue.popleft()
            if self.enable_caching:       # it may be cached-idle (I4): invalidate the old content
                self._maybe_evict_cached_block(block)
            assert block.ref_cnt == 0, f"block {block.block_id} was free with ref_cnt {block.ref_cnt}"
            block.ref_cnt = 1
            out.append(block)
        return out

    def _maybe_evict_cached_block(self, block: KVCacheBlock) -> bool:
        """Drop `block` from the prefix-cache index (only if the index points at THIS block) and
        clear its hash. Returns True when an index entry was removed."""
        if block.block_hash is None:
            return False
        evicted = self.cached_block_hash_to_block.get(block.block_hash) is block
        if evicted:
            del self.cached_block_hash_to_block[block.block_hash]
        block.reset_hash()
        return evicted

    def touch(self, blocks: Sequence[KVCacheBlock]) -> None:
        """A prefix hit: one more user for each block. A block at ref_cnt 0 sits in the free
        queue (an eviction candidate), so it is unlinked from there first, in O(1)."""
        for block in blocks:
            idle = block.ref_cnt == 0 and not block.is_null   # idle blocks live in the queue (I1)
            if idle:
                self.free_block_queue.remove(block)            # O(1), wherever it sits
            block.ref_cnt += 1

    def free_blocks(self, ordered_blocks: Iterable[KVCacheBlock]) -> None:
        """One fewer user for each block; those reaching 0 go to the back of the free queue in
        the order given (first given = first evicted). They keep their hash: still cached."""
        blocks = list(ordered_blocks)
        times: dict[int, int] = {}  # a block listed twice gives back two references
        for block in blocks:
            times[id(block)] = times.get(id(block), 0) + 1
            if not block.is_null and block.ref_cnt < times[id(block)]:
                raise ValueError(f"double free of block {block.block_id}")
        for block in blocks:
            block.ref_cnt -= 1
            # The null block's count is not maintained: whatever it reads, it never joins the queue.
            if block.ref_cnt == 0 and not block.is_null:  # reaches 0 once, so it is queued once
                self.free_block_queue.append(block)

    def cache_full_blocks(self, blocks: Sequence[KVCacheBlock], block_hashes: Sequence[bytes],
                          num_cached_blocks: int = 0) -> None:
        """Register blocks[num_cached_blocks : len(block_hashes)] in the prefix-cache index.
        `block_hashes` holds one hash per FULL block, so a partial tail is never cached. On a
        collision (same hash already indexed to another block) the existing entry is kept."""
        if not self.enable_caching:
            return
        for i in range(num_cached_blocks, len(block_hashes)):
            block = blocks[i]
            if block.is_null:
                continue
            assert block.block_hash is None, f"block {block.block_id} already has a hash"
            block.block_hash = block_hashes[i]
            self.cached_block_hash_to_block.setdefault(block_hashes[i], block)

    def get_cached_block(self, block_hash: bytes) -> KVCacheBlock | None:
        return self.cached_block_hash_to_block.get(block_hash)


def main() -> None:
    pool = BlockPool(num_gpu_blocks=10)
    print(f"pool of 10 blocks: null block id={pool.null_block.block_id}, "
          f"free={pool.get_num_free_blocks()}, usage={pool.get_usage():.2f}")
    tokens = list(range(10))                     # 10 tokens, block_size 4 -> 2 full + 1 partial
    hashes = block_hashes_for(tokens, 4)
    table = pool.get_new_blocks(3)
    pool.cache_full_blocks(table, hashes)
    print(f"request A: table={[b.block_id for b in table]} "
          f"hashed={[b.block_hash is not None for b in table]}")
    other = pool.get_new_blocks(2)
    print(f"request B: table={[b.block_id for b in other]}; free={pool.get_num_free_blocks()}")
    pool.free_blocks(reversed(table))            # tail first, like KVCacheManager.free
    print(f"free A (reversed): queue={[b.block_id for b in pool.free_block_queue.get_all_free_blocks()]}")
    hit = pool.get_cached_block(hashes[0])
    pool.touch([hit])
    print(f"prefix hit on block {hit.block_id}: ref_cnt={hit.ref_cnt}, "
          f"queue={[b.block_id for b in pool.free_block_queue.get_all_free_blocks()]}")
    reused = pool.get_new_blocks(pool.get_num_free_blocks())
    print(f"take every free block: got {[b.block_id for b in reused]}; "
          f"block {table[1].block_id} still cached? {pool.get_cached_block(hashes[1]) is not None}")
    print(f"usage={pool.get_usage():.3f}")


if __name__ == "__main__":
    main()
