"""The physical KV-cache blocks: free queue, reference counts, prefix-cache index, hashes.

Mirrors ``vllm/v1/core/block_pool.py`` (``BlockPool``) and the block half of
``vllm/v1/core/kv_cache_utils.py`` (``KVCacheBlock``, ``FreeKVCacheBlockQueue``,
``hash_block_tokens``, ``get_request_block_hasher``, ``NONE_HASH``). Same names, same
invariants:

* block 0 is the *null block*: popped at construction, never handed out, never freed;
* a block is in the free queue  ⇔  its ``ref_cnt`` is 0 (free blocks may still be cached);
* the free queue is LRU: ``get_new_blocks`` pops from the front, ``free_blocks`` appends to
  the tail, and ``touch`` unlinks a cache hit from the middle in O(1);
* reusing a cached free block evicts its hash (``_maybe_evict_cached_block``).

* one hash may name several blocks (``BlockHashToBlockMap``): two requests that prefill the
  same prefix in chunks at the same time both fill identical blocks, and both are indexed, so
  block tables stay append-only and a lookup still hits after one copy is evicted. A lookup
  returns the oldest copy still indexed.

Extra hash keys, as ``generate_block_hash_extra_keys`` upstream: the adapter's name under LoRA,
``(image identifier, offset)`` for each image a block overlaps, and the request's ``cache_salt``
on its first block; KV computed under one adapter, image or tenant is never reused for another.

Left out: KV cache groups (the hash key carries no group id), KV events, metrics,
``evict_blocks``, ``hash_block_size`` ≠ ``block_size``, prompt-embedding keys.

Hashes are real SHA-256 digests of (parent hash, token ids), chained from ``NONE_HASH``. Python's
``hash()`` is never used: ``hash(None)`` changes from process to process before Python 3.12,
and a prefix cache that forgets its keys on restart is no cache at all.
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .config import _check_bool, _check_int

if TYPE_CHECKING:
    from .request import Request

# Parent hash of the first block of every sequence (upstream seeds it from PYTHONHASHSEED).
NONE_HASH: bytes = hashlib.sha256(b"mini_vllm:NONE_HASH").digest()


def hash_block_tokens(
    parent_block_hash: bytes | None, curr_block_token_ids: Sequence[int], extra_keys: tuple = ()
) -> bytes:
    """SHA-256 of the parent hash followed by the block's token ids as little-endian int64.

    Chaining through the parent makes the hash name the whole prefix, not just this block:
    the same 16 tokens after a different history get a different hash. ``extra_keys``
    (``generate_block_hash_extra_keys``: adapter name, images, cache salt) are mixed in for what
    the token ids do not show: which adapter computed the KV, which picture sits behind
    placeholders that all share one token id, whose salt walls the prefix off.
    """
    if parent_block_hash is None:
        parent_block_hash = NONE_HASH
    data = parent_block_hash + array("q", curr_block_token_ids).tobytes()
    if extra_keys:
        data += repr(extra_keys).encode()
    return hashlib.sha256(data).digest()


class RequestBlockHasher:
    """Callable that returns the hashes of a request's *new* full blocks (upstream:
    ``get_request_block_hasher``). ``Request.update_block_hashes`` calls it as tokens arrive."""

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size

    def __call__(self, request: Request) -> list[bytes]:
        bs = self.block_size
        start = len(request.block_hashes) * bs
        tokens = request.all_token_ids
        parent = request.block_hashes[-1] if request.block_hashes else None
        new_hashes: list[bytes] = []
        while start + bs <= len(tokens):
            extra = generate_block_hash_extra_keys(request, start, start + bs)
            parent = hash_block_tokens(parent, tokens[start : start + bs], extra)
            new_hashes.append(parent)
            start += bs
        return new_hashes


def generate_block_hash_extra_keys(request: Request, start_token_idx: int, end_token_idx: int) -> tuple:
    """The extra keys of block ``[start_token_idx, end_token_idx)``, in upstream's order: the
    adapter's name (every block of a LoRA request), the images the block overlaps, the cache
    salt (first block only: the chain carries it on). ``()`` when there are none."""
    lora = getattr(request, "lora_request", None)
    keys: tuple = (lora.lora_name,) if lora is not None else ()
    features = getattr(request, "mm_features", ())
    if features:
        keys += _mm_extra_keys(features, start_token_idx, end_token_idx)
    salt = getattr(request, "cache_salt", None)
    if start_token_idx == 0 and salt:
        keys += (salt,)
    return keys


def _mm_extra_keys(features, start: int, end: int) -> tuple:
    """``(identifier, offset - start)`` for each image overlapping block ``[start, end)``
    (upstream: ``_gen_mm_extra_hash_keys``)."""
    return tuple(
        (f.identifier, f.mm_position.offset - start)
        for f in features
        if f.mm_position.offset < end and start < f.mm_position.end
    )


def get_request_block_hasher(block_size: int) -> RequestBlockHasher:
    return RequestBlockHasher(block_size)


@dataclass(slots=True, eq=False)
class KVCacheBlock:
    """Metadata of one KV block; the tensors live elsewhere (nowhere, in mini)."""

    block_id: int
    ref_cnt: int = 0
    block_hash: bytes | None = None  # set only while the block is in the prefix-cache index
    # Links of the free queue's doubly linked list; only FreeKVCacheBlockQueue touches them.
    prev_free_block: KVCacheBlock | None = None
    next_free_block: KVCacheBlock | None = None
    is_null: bool = False

    def reset_hash(self) -> None:
        self.block_hash = None

    def __repr__(self) -> str:  # ids only: the links would recurse
        prev_id = self.prev_free_block.block_id if self.prev_free_block else None
        next_id = self.next_free_block.block_id if self.next_free_block else None
        h = self.block_hash.hex()[:8] if self.block_hash else None
        return (
            f"KVCacheBlock(block_id={self.block_id}, ref_cnt={self.ref_cnt}, block_hash={h}, "
            f"prev_free_block={prev_id}, next_free_block={next_id})"
        )


class FreeKVCacheBlockQueue:
    """Doubly linked list of free blocks between two sentinels; O(1) popleft/append/remove.

    The links live in the blocks themselves, so no Python object is allocated per operation.
    Front = next to evict (least recently freed), tail = most recently freed.
    """

    def __init__(self, blocks: list[KVCacheBlock]) -> None:
        self.num_free_blocks = len(blocks)
        self.fake_free_list_head = KVCacheBlock(block_id=-1)
        self.fake_free_list_tail = KVCacheBlock(block_id=-1)
        prev = self.fake_free_list_head
        for block in blocks:
            prev.next_free_block = block
            block.prev_free_block = prev
            prev = block
        prev.next_free_block = self.fake_free_list_tail
        self.fake_free_list_tail.prev_free_block = prev

    def popleft(self) -> KVCacheBlock:
        first = self.fake_free_list_head.next_free_block
        if first is self.fake_free_list_tail or first is None:
            raise ValueError("No free blocks available")
        return self.popleft_n(1)[0]

    def popleft_n(self, n: int) -> list[KVCacheBlock]:
        if n > self.num_free_blocks:
            raise ValueError(f"cannot pop {n} blocks: only {self.num_free_blocks} are free")
        ret: list[KVCacheBlock] = []
        curr = self.fake_free_list_head.next_free_block
        for _ in range(n):
            assert curr is not None
            ret.append(curr)
            nxt = curr.next_free_block
            curr.prev_free_block = curr.next_free_block = None
            curr = nxt
        if n:
            assert curr is not None
            self.fake_free_list_head.next_free_block = curr
            curr.prev_free_block = self.fake_free_list_head
            self.num_free_blocks -= n
        return ret

    def remove(self, block: KVCacheBlock) -> None:
        """Unlink ``block`` from wherever it sits: the reason this class exists."""
        prev, nxt = block.prev_free_block, block.next_free_block
        if prev is None or nxt is None:
            raise ValueError(f"remove() called on a block that is not in the free queue: {block}")
        prev.next_free_block = nxt
        nxt.prev_free_block = prev
        block.prev_free_block = block.next_free_block = None
        self.num_free_blocks -= 1

    def append(self, block: KVCacheBlock) -> None:
        self.append_n([block])

    def append_n(self, blocks: Sequence[KVCacheBlock]) -> None:
        for block in blocks:
            if block.prev_free_block is not None or block.next_free_block is not None:
                raise ValueError(f"append() called on a block that is already in the free queue: {block}")
        last = self.fake_free_list_tail.prev_free_block
        assert last is not None
        for block in blocks:
            block.prev_free_block = last
            last.next_free_block = block
            last = block
        last.next_free_block = self.fake_free_list_tail
        self.fake_free_list_tail.prev_free_block = last
        self.num_free_blocks += len(blocks)

    def get_all_free_blocks(self) -> list[KVCacheBlock]:
        """Front-to-back list of free blocks (for tests and labs; O(n))."""
        ret = []
        curr = self.fake_free_list_head.next_free_block
        while curr is not None and curr is not self.fake_free_list_tail:
            ret.append(curr)
            curr = curr.next_free_block
        return ret


class BlockHashToBlockMap:
    """The prefix-cache index: block hash → every block registered under it.

    Mostly one block per hash, stored bare; a second block with the same hash turns the entry
    into ``{block_id: block}`` in insertion order (the bare form saves a dict per entry, as
    upstream's does). Invariant: ``block.block_hash is not None`` ⇔ the block is in the entry
    of its hash.
    """

    __slots__ = ("_cache",)

    def __init__(self) -> None:
        self._cache: dict[bytes, KVCacheBlock | dict[int, KVCacheBlock]] = {}

    def get_one_block(self, key: bytes) -> KVCacheBlock | None:
        """The first block still registered under ``key`` (the oldest copy), or None."""
        blocks = self._cache.get(key)
        if blocks is None or type(blocks) is KVCacheBlock:
            return blocks  # type: ignore[return-value]
        return next(iter(blocks.values()))  # type: ignore[union-attr]

    def get_all_blocks(self, key: bytes) -> list[KVCacheBlock]:
        """Every block registered under ``key``, oldest first (for tests and labs)."""
        blocks = self._cache.get(key)
        if blocks is None:
            return []
        return [blocks] if type(blocks) is KVCacheBlock else list(blocks.values())  # type: ignore[union-attr]

    def insert(self, key: bytes, block: KVCacheBlock) -> None:
        blocks = self._cache.get(key)
        if blocks is None:
            self._cache[key] = block
        elif type(blocks) is KVCacheBlock:
            self._cache[key] = {blocks.block_id: blocks, block.block_id: block}
        else:
            blocks[block.block_id] = block  # type: ignore[index]

    def pop(self, key: bytes, block_id: int) -> KVCacheBlock | None:
        """Unregister block ``block_id`` from ``key``; the block, or None if it was not there."""
        blocks = self._cache.get(key)
        if blocks is None:
            return None
        if type(blocks) is KVCacheBlock:
            if blocks.block_id != block_id:  # type: ignore[union-attr]
                return None
            del self._cache[key]
            return blocks  # type: ignore[return-value]
        block = blocks.pop(block_id, None)  # type: ignore[union-attr]
        if not blocks:
            del self._cache[key]
        return block

    def __contains__(self, key: object) -> bool:
        return key in self._cache

    def __len__(self) -> int:
        """Number of distinct hashes (not blocks)."""
        return len(self._cache)

    def to_dict(self) -> dict[bytes, list[int]]:
        """``{hash: [block ids, oldest first]}``: a snapshot for tests."""
        return {k: [b.block_id for b in self.get_all_blocks(k)] for k in self._cache}


class BlockPool:
    """All KV blocks of the engine: allocation, reference counting and the prefix-cache index."""

    def __init__(self, num_gpu_blocks: int, enable_caching: bool = True) -> None:
        _check_int("num_gpu_blocks", num_gpu_blocks, 1)  # upstream asserts the same
        _check_bool("enable_caching", enable_caching)
        self.num_gpu_blocks = num_gpu_blocks
        self.enable_caching = enable_caching
        self.blocks: list[KVCacheBlock] = [KVCacheBlock(i) for i in range(num_gpu_blocks)]
        self.free_block_queue = FreeKVCacheBlockQueue(self.blocks)
        self.cached_block_hash_to_block = BlockHashToBlockMap()
        # Placeholder block 0; its ref_cnt is not maintained and it is never freed.
        self.null_block = self.free_block_queue.popleft()
        self.null_block.is_null = True

    # -- prefix cache ----------------------------------------------------------------------
    def get_cached_block(self, block_hash: bytes) -> KVCacheBlock | None:
        """Any block cached under ``block_hash`` (the oldest copy), or None on a miss."""
        return self.cached_block_hash_to_block.get_one_block(block_hash)

    def cache_full_blocks(self, blocks: Sequence[KVCacheBlock], block_hashes: Sequence[bytes]) -> None:
        """Register full blocks under their hashes (the KV manager passes only newly full ones).

        A hash that already names another block gets this one as a second copy: blocks are
        never merged, so block tables stay append-only. No-op when caching is disabled.
        """
        if len(blocks) != len(block_hashes):
            raise ValueError(f"got {len(blocks)} blocks but {len(block_hashes)} hashes")
        if not self.enable_caching:
            return
        for blk in blocks:
            if blk.block_hash is not None:
                raise ValueError(f"block {blk.block_id} is already cached; full blocks are cached once")
        index = self.cached_block_hash_to_block
        for blk, block_hash in zip(blocks, block_hashes):
            if blk.is_null:
                continue
            blk.block_hash = block_hash
            index.insert(block_hash, blk)

    def _maybe_evict_cached_block(self, block: KVCacheBlock) -> bool:
        """Drop ``block`` from the prefix-cache index if it is there; True if it was."""
        block_hash = block.block_hash
        if block_hash is None:
            return False
        if self.cached_block_hash_to_block.pop(block_hash, block.block_id) is None:
            return False
        block.block_hash = None
        return True

    def reset_prefix_cache(self) -> bool:
        """Forget every cached hash; refused (False) while any block is still in use."""
        if self.get_num_free_blocks() != self.num_gpu_blocks - 1:
            return False
        self.cached_block_hash_to_block = BlockHashToBlockMap()
        for block in self.blocks:
            block.block_hash = None
        return True

    # -- allocation ------------------------------------------------------------------------
    def get_new_blocks(self, num_blocks: int) -> list[KVCacheBlock]:
        """Pop ``num_blocks`` from the front of the free queue, evicting their cached hashes."""
        if isinstance(num_blocks, bool) or not isinstance(num_blocks, int) or num_blocks < 0:
            raise ValueError(f"num_blocks must be an int >= 0, got {num_blocks!r}")
        if num_blocks > self.free_block_queue.num_free_blocks:
            raise ValueError(f"Cannot get {num_blocks} free blocks from the pool")
        ret = self.free_block_queue.popleft_n(num_blocks)
        pop = self.cached_block_hash_to_block.pop
        for block in ret:
            if block.block_hash is not None and pop(block.block_hash, block.block_id) is not None:
                block.block_hash = None  # _maybe_evict_cached_block, inlined (hot path)
            block.ref_cnt = 1
        return ret

    def touch(self, blocks: Sequence[KVCacheBlock]) -> None:
        """Take one more reference on each block (a prefix-cache hit); a free one leaves the queue."""
        for block in blocks:
            if block.is_null:
                raise ValueError("the null block is never shared")
            if block.ref_cnt == 0 and block.prev_free_block is None:
                raise ValueError(f"block {block.block_id} has ref_cnt 0 but is not in the free queue")
        queue = self.free_block_queue
        for block in blocks:
            if block.ref_cnt == 0:
                queue.remove(block)
            block.ref_cnt += 1

    def free_blocks(self, ordered_blocks: Iterable[KVCacheBlock]) -> None:
        """Drop one reference from each block; those reaching 0 join the queue tail in order.

        Pass them in eviction order (first = evicted first): the KV manager passes a request's
        blocks tail-first. Freed blocks keep their hash, so they can still be hit until evicted.
        Raises (and changes nothing) on a block that has no reference left: a double free.
        """
        blocks = list(ordered_blocks)
        freed: list[KVCacheBlock] = []  # a block reaches 0 once, so even one listed twice joins once
        for i, block in enumerate(blocks):
            if block.ref_cnt <= 0 or block.is_null:
                for undo in blocks[:i]:
                    undo.ref_cnt += 1
                what = "the null block" if block.is_null else f"block {block.block_id} (ref_cnt 0)"
                raise ValueError(f"double free: {what} cannot be freed")
            block.ref_cnt -= 1
            if not block.ref_cnt:
                freed.append(block)
        self.free_block_queue.append_n(freed)

    # -- accounting ------------------------------------------------------------------------
    def get_num_free_blocks(self) -> int:
        return self.free_block_queue.num_free_blocks

    def get_usage(self) -> float:
        """Fraction of the usable (non-null) blocks that are in use, 0.0 … 1.0."""
        total = self.num_gpu_blocks - 1
        if not total:
            return 0.0
        return 1.0 - self.get_num_free_blocks() / total
