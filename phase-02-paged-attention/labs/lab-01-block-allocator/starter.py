"""Lab 02.01 — a paged KV-block allocator (your version).

Build, in this order: FreeKVCacheBlockQueue (popleft, remove, append, get_all_free_blocks),
hash_block_tokens, then BlockPool (get_num_free_blocks, get_usage, get_new_blocks,
_maybe_evict_cached_block, touch, free_blocks, cache_full_blocks, get_cached_block).
Grade with:  LAB_IMPL=starter pytest phase-02-paged-attention/labs/lab-01-block-allocator -q

Upstream (vLLM v0.22.1 @ 0decac0, paths relative to upstream/):
  KVCacheBlock           vllm/v1/core/kv_cache_utils.py:116
  FreeKVCacheBlockQueue  vllm/v1/core/kv_cache_utils.py:164
  BlockPool              vllm/v1/core/block_pool.py:130
  hash_block_tokens      vllm/v1/core/kv_cache_utils.py:541
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import pairwise

# Root "parent" for the first block of every chain (upstream: NONE_HASH).
NONE_HASH: bytes = hashlib.sha256(b"mini-vllm/none-hash").digest()


@dataclass(eq=False)
class KVCacheBlock:
    """Metadata for one physical KV block (provided: nothing to write here)."""

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
        # Provided: the sentinels and the initial links, in block order.
        self._head = KVCacheBlock(block_id=-1)
        self._tail = KVCacheBlock(block_id=-1)
        chain = [self._head, *blocks, self._tail]
        for left, right in pairwise(chain):
            left.next_free_block = right
            right.prev_free_block = left
        self.num_free_blocks = len(blocks)

    def popleft(self) -> KVCacheBlock:
        """Remove and return the front block. Raises ValueError when the queue is empty."""
        raise NotImplementedError(
            "popleft: the front block is whatever follows self._head; when that is self._tail the "
            "queue is empty (ValueError). Otherwise reuse remove() rather than rewiring by hand")

    def remove(self, block: KVCacheBlock) -> None:
        """Unlink `block` from wherever it sits, in O(1): rewire its two neighbours."""
        raise NotImplementedError(
            "remove: the block already knows both neighbours (its two link fields); make them point "
            "at each other, clear the block's links, fix the counter. Never walk the list")

    def append(self, block: KVCacheBlock) -> None:
        """Put `block` at the back (it becomes the last eviction candidate)."""
        raise NotImplementedError(
            "append: the new block goes between the current last block (self._tail's prev) and "
            "self._tail; four link writes, then the counter")

    def get_all_free_blocks(self) -> list[KVCacheBlock]:
        """Front-to-back list of the free blocks (sentinels excluded). O(n): for tests."""
        raise NotImplementedError(
            "get_all_free_blocks: follow next_free_block from the head sentinel and stop at the "
            "tail sentinel; neither sentinel belongs in the result")


def hash_block_tokens(parent_hash: bytes | None, token_ids: Sequence[int]) -> bytes:
    """SHA-256 of (parent hash, this block's tokens). Chaining the parent in makes the hash name
    the whole prefix, not just this block: equal hashes mean equal tokens from position 0."""
    raise NotImplementedError(
        "hash_block_tokens: the first block has no parent, so stand in NONE_HASH; feed the parent's "
        "bytes AND a byte encoding of the token ids into one hashlib.sha256 and return its digest")


def block_hashes_for(token_ids: Sequence[int], block_size: int) -> list[bytes]:
    """Chained hashes of the FULL blocks of `token_ids` (a partial tail block gets none).
    Provided: it calls your hash_block_tokens."""
    hashes: list[bytes] = []
    parent = None
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        parent = hash_block_tokens(parent, token_ids[start:start + block_size])
        hashes.append(parent)
    return hashes


class BlockPool:
    """Owns every block, the free queue and the prefix-cache index (hash -> block)."""

    def __init__(self, num_gpu_blocks: int, enable_caching: bool = True) -> None:
        # Provided: it relies on your popleft() to reserve block 0 as the null block.
        if num_gpu_blocks < 1:
            raise ValueError("a pool needs at least one block (the null block)")
        self.num_gpu_blocks = num_gpu_blocks
        self.enable_caching = enable_caching
        self.blocks = [KVCacheBlock(i) for i in range(num_gpu_blocks)]
        self.free_block_queue = FreeKVCacheBlockQueue(self.blocks)
        self.cached_block_hash_to_block: dict[bytes, KVCacheBlock] = {}
        reserved = self.free_block_queue.popleft()     # block 0: the queue starts in id order
        reserved.is_null = True
        self.null_block = reserved

    def get_num_free_blocks(self) -> int:
        raise NotImplementedError("get_num_free_blocks: the queue already keeps this count")

    def get_usage(self) -> float:
        """Fraction of the usable (non-null) blocks that are taken."""
        raise NotImplementedError(
            "get_usage: the null block is taken forever, so leave it out of both the used and the "
            "total count (and return 0.0 for a pool that is only the null block)")

    def get_new_blocks(self, num_blocks: int) -> list[KVCacheBlock]:
        """Hand out `num_blocks` blocks from the front of the free queue, each with ref_cnt 1.
        A popped block may still be a cached eviction candidate: forget that first."""
        raise NotImplementedError(
            "get_new_blocks: refuse (ValueError) before popping anything if there are not enough; "
            "a popped block may still be cached, so let _maybe_evict_cached_block forget it first")

    def _maybe_evict_cached_block(self, block: KVCacheBlock) -> bool:
        """Drop `block` from the prefix-cache index (only if the index points at THIS block) and
        clear its hash. Returns True when an index entry was removed."""
        raise NotImplementedError(
            "_maybe_evict_cached_block: two blocks can carry the same hash, and the index names only "
            "one of them: drop the entry only when it names THIS block; clear the block's hash anyway")

    def touch(self, blocks: Sequence[KVCacheBlock]) -> None:
        """A prefix hit: one more user for each block. A block at ref_cnt 0 sits in the free
        queue (an eviction candidate), so it is unlinked from there first, in O(1)."""
        raise NotImplementedError(
            "touch: by I1 a block nobody references is sitting in the free queue; take it out with "
            "your O(1) remove before counting the new user (the null block is never in the queue)")

    def free_blocks(self, ordered_blocks: Iterable[KVCacheBlock]) -> None:
        """One fewer user for each block; those reaching 0 go to the back of the free queue in
        the order given (first given = first evicted). They keep their hash: still cached."""
        raise NotImplementedError(
            "free_blocks: the input may be an iterator (reversed(...)), so materialize it; reject a "
            "double free before changing anything (a block listed more times than it has users is one); "
            "only blocks nobody uses any more join the queue, once each, "
            "in the order given, and never the null block")

    def cache_full_blocks(self, blocks: Sequence[KVCacheBlock], block_hashes: Sequence[bytes],
                          num_cached_blocks: int = 0) -> None:
        """Register blocks[num_cached_blocks : len(block_hashes)] in the prefix-cache index.
        `block_hashes` holds one hash per FULL block, so a partial tail is never cached. On a
        collision (same hash already indexed to another block) the existing entry is kept."""
        raise NotImplementedError(
            "cache_full_blocks: block_hashes has one entry per FULL block, so its length tells you "
            "where to stop; give each new block its hash, and on a collision keep the index entry "
            "that is already there (one block per hash)")

    def get_cached_block(self, block_hash: bytes) -> KVCacheBlock | None:
        raise NotImplementedError("get_cached_block: a dictionary lookup that answers None on a miss")


def main() -> None:
    print("Implement the TODOs, then run solution.py to compare the printout.")


if __name__ == "__main__":
    main()
