"""Per-request block tables on top of the block pool: prefix hits, allocation, freeing.

Mirrors ``vllm/v1/core/kv_cache_manager.py`` (``KVCacheManager``) folded together with the
parts of ``vllm/v1/core/kv_cache_coordinator.py`` and ``single_type_kv_cache_manager.py``
(``FullAttentionManager``) that a single full-attention KV group uses. The scheduler talks to
this class only; the pool's blocks are never touched by policy code.

Left out: several KV cache groups (hybrid models, sliding window, Mamba), ``KVCacheBlocks``
(a plain ``list[KVCacheBlock]`` stands in for the one group), external (connector) tokens,
encoder tokens, EAGLE's dropped last hit, KV events.

Same behaviour as upstream, on purpose:

* ``get_computed_blocks`` walks the request's chained hashes from block 0 and stops at the
  first miss, and never returns more than ``num_tokens - 1`` tokens in whole blocks: the last
  token must be computed to get logits.
* ``allocate_slots`` checks capacity first (counting hit blocks that sit in the free queue,
  because touching them takes them out of it) and returns ``None`` with nothing changed when
  the blocks do not fit — the OOM signal the scheduler preempts on.
* Full blocks are registered in the prefix cache *at allocation time*, before their KV is
  computed, so a request admitted later in the same step already hits them.
* ``free`` releases a request's blocks tail-first, so the tail of a prefix is evicted first.
* Speculative decoding: a request may be scheduled past ``num_tokens`` (its drafts count, up to
  ``num_tokens_with_spec``), ``num_lookahead_tokens`` more slots are reserved behind them
  (capped at ``max_model_len``), and only real tokens are ever hashed and cached. Blocks a
  rejected draft occupied stay with the request and are reused by the next step.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .block_pool import BlockPool, KVCacheBlock, RequestBlockHasher
from .config import CacheConfig
from .request import Request


@dataclass
class PrefixCacheStats:
    """Token-level hit counters, split like upstream's (``vllm/v1/metrics/stats.py``)."""

    requests: int = 0  # lookups for requests never preempted
    queries: int = 0  # their tokens looked up
    hits: int = 0  # their tokens found cached
    preempted_requests: int = 0  # lookups for re-admitted (preempted) requests
    preempted_queries: int = 0
    preempted_hits: int = 0

    def record(self, num_tokens: int, num_hits: int, preempted: bool) -> None:
        if preempted:
            self.preempted_requests += 1
            self.preempted_queries += num_tokens
            self.preempted_hits += num_hits
        else:
            self.requests += 1
            self.queries += num_tokens
            self.hits += num_hits


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


class KVCacheManager:
    """Block tables (``req_to_blocks``) for every request holding KV, over one ``BlockPool``."""

    def __init__(self, cache_config: CacheConfig, max_model_len: int | None = None) -> None:
        """``max_model_len`` caps the slots one request can take (default: the whole pool)."""
        if not isinstance(cache_config, CacheConfig):
            raise TypeError(f"cache_config must be a CacheConfig, got {type(cache_config).__name__}")
        self.cache_config = cache_config
        self.block_size = cache_config.block_size
        self.enable_caching = cache_config.enable_prefix_caching
        self.max_model_len = cache_config.num_usable_tokens if max_model_len is None else max_model_len
        self.block_pool = BlockPool(cache_config.num_gpu_blocks, self.enable_caching)
        self.block_hasher = RequestBlockHasher(self.block_size)
        self.req_to_blocks: dict[str, list[KVCacheBlock]] = {}
        # How many leading blocks of each request are already in the prefix-cache index.
        self.num_cached_block: dict[str, int] = {}
        self.prefix_cache_stats = PrefixCacheStats()

    @property
    def usage(self) -> float:
        return self.block_pool.get_usage()

    def _ensure_hashes(self, request: Request) -> None:
        """Give a request built without a hasher ours; refuse one hashed at another block size."""
        hasher = request.block_hasher
        if hasher is None:
            request.set_block_hasher(self.block_hasher)
        elif getattr(hasher, "block_size", self.block_size) != self.block_size:
            raise ValueError(
                f"request {request.request_id} hashes blocks of {hasher.block_size} tokens, "
                f"this KV cache uses {self.block_size}"
            )

    # -- prefix cache lookup ---------------------------------------------------------------
    def get_computed_blocks(self, request: Request) -> tuple[list[KVCacheBlock], int]:
        """Longest cached prefix of ``request`` in whole blocks, capped at ``num_tokens - 1``.

        Returns ``(blocks, num_computed_tokens)``; ref counts are untouched (``allocate_slots``
        takes the references). Caching off → ``([], 0)``.
        """
        if not isinstance(request, Request):
            raise TypeError(f"expected a Request, got {type(request).__name__}")
        if not self.enable_caching or request.skip_reading_prefix_cache:
            return [], 0
        self._ensure_hashes(request)
        max_num_blocks = (request.num_tokens - 1) // self.block_size
        get_one_block = self.block_pool.cached_block_hash_to_block.get_one_block
        computed: list[KVCacheBlock] = []
        for block_hash in request.block_hashes[:max_num_blocks]:
            block = get_one_block(block_hash)
            if block is None:
                break  # hashes are chained: nothing after a miss can hit
            computed.append(block)
        num_hit_tokens = len(computed) * self.block_size
        self.prefix_cache_stats.record(request.num_tokens, num_hit_tokens, request.num_preemptions > 0)
        return computed, num_hit_tokens

    def make_prefix_cache_stats(self) -> PrefixCacheStats:
        """Return the stats gathered since the last call and start fresh ones (as upstream)."""
        stats, self.prefix_cache_stats = self.prefix_cache_stats, PrefixCacheStats()
        return stats

    # -- allocation ------------------------------------------------------------------------
    def _num_blocks_to_allocate(
        self, req_blocks: Sequence[KVCacheBlock], num_tokens: int, new_computed_blocks: Sequence[KVCacheBlock]
    ) -> int:
        num_new = max(cdiv(num_tokens, self.block_size) - len(req_blocks) - len(new_computed_blocks), 0)
        if not new_computed_blocks:
            return num_new
        # A hit block with ref_cnt 0 sits in the free queue: touching it uses up a free block.
        return num_new + sum(1 for b in new_computed_blocks if b.ref_cnt == 0)

    def allocate_slots(
        self,
        request: Request,
        num_new_tokens: int,
        num_new_computed_tokens: int = 0,
        new_computed_blocks: Sequence[KVCacheBlock] | None = None,
        full_sequence_must_fit: bool = False,
        num_lookahead_tokens: int = 0,
        delay_cache_blocks: bool = False,
    ) -> list[KVCacheBlock] | None:
        """Give ``request`` slots for ``num_new_tokens`` more tokens; the new blocks, or None.

        ``num_lookahead_tokens`` more slots are reserved behind them (speculative decoding
        proposers that write KV while drafting), never past ``max_model_len``.

        ``num_new_computed_tokens``/``new_computed_blocks`` are this admission's prefix hits
        (from ``get_computed_blocks``); ``request.num_computed_tokens`` does not include them
        yet — the scheduler adds them after a successful allocation, as upstream does.
        ``full_sequence_must_fit`` (admission) also requires room for the whole current
        sequence, not just this chunk. ``None`` means "does not fit" and nothing was changed.
        An empty list is a success that needed no new block: test with ``is None``.
        ``delay_cache_blocks`` (a KV connector still loading these blocks) registers no block
        for prefix caching yet; the scheduler calls ``cache_blocks`` once the load has landed.
        """
        if not isinstance(request, Request):
            raise TypeError(f"expected a Request, got {type(request).__name__}")
        if type(num_new_tokens) is not int or num_new_tokens < 1:
            raise ValueError(f"num_new_tokens must be an int >= 1, got {num_new_tokens!r}")
        if type(num_lookahead_tokens) is not int or num_lookahead_tokens < 0:
            raise ValueError(f"num_lookahead_tokens must be an int >= 0, got {num_lookahead_tokens!r}")
        new_computed = new_computed_blocks or ()
        if num_new_computed_tokens != len(new_computed) * self.block_size:
            raise ValueError(
                f"num_new_computed_tokens={num_new_computed_tokens} does not match "
                f"{len(new_computed)} hit blocks of {self.block_size} tokens"
            )
        rid = request.request_id
        req_blocks = self.req_to_blocks.get(rid, [])
        if new_computed and req_blocks:
            raise ValueError(f"request {rid} already holds blocks; prefix hits are only taken at admission")
        num_computed = request.num_computed_tokens + num_new_computed_tokens
        if num_computed + num_new_tokens > request.num_tokens_with_spec:
            raise ValueError(
                f"request {rid}: {num_computed} computed + {num_new_tokens} new tokens exceeds "
                f"its {request.num_tokens_with_spec} tokens (drafts included)"
            )
        if self.enable_caching and not req_blocks:
            self._ensure_hashes(request)  # a request holding blocks was checked when it got them
        return self._allocate_slots(
            request, num_new_tokens, num_new_computed_tokens, new_computed, full_sequence_must_fit,
            num_lookahead_tokens, delay_cache_blocks,
        )

    def _allocate_slots(
        self,
        request: Request,
        num_new_tokens: int,
        num_new_computed_tokens: int,
        new_computed: Sequence[KVCacheBlock],
        full_sequence_must_fit: bool,
        num_lookahead_tokens: int = 0,
        delay_cache_blocks: bool = False,
    ) -> list[KVCacheBlock] | None:
        """``allocate_slots`` without the argument checks: the scheduler's hot path."""
        rid = request.request_id
        req_blocks = self.req_to_blocks.get(rid)
        num_computed = request.num_computed_tokens + num_new_computed_tokens
        if req_blocks is not None and not new_computed and not full_sequence_must_fit:
            # A running request growing by a chunk or a decode token: the same rules, fewer calls.
            end = num_computed + num_new_tokens
            need = min(end + num_lookahead_tokens, self.max_model_len)
            num_new_blocks = -(-need // self.block_size) - len(req_blocks)
            new_blocks = []
            if num_new_blocks > 0:  # most decode steps fit in the last block
                if num_new_blocks > self.block_pool.free_block_queue.num_free_blocks:
                    return None
                new_blocks = self.block_pool.get_new_blocks(num_new_blocks)
                req_blocks.extend(new_blocks)
            # cache_blocks' early exit, tested first on an upper bound (end may count drafts):
            # most steps fill no block, and then the call is skipped
            if self.enable_caching and end // self.block_size > self.num_cached_block.get(rid, 0):
                self.cache_blocks(request, min(end, request.num_tokens))
            return new_blocks
        num_free = self.block_pool.free_block_queue.num_free_blocks
        req_blocks = req_blocks if req_blocks is not None else []

        if full_sequence_must_fit:
            full = min(request.num_tokens, self.max_model_len)
            if self._num_blocks_to_allocate(req_blocks, full, new_computed) > num_free:
                return None
        num_tokens_need_slot = min(num_computed + num_new_tokens + num_lookahead_tokens, self.max_model_len)
        if self._num_blocks_to_allocate(req_blocks, num_tokens_need_slot, new_computed) > num_free:
            return None

        # It fits: commit. Hits first (touch takes them out of the free queue), then new blocks.
        req_blocks = self.req_to_blocks.setdefault(rid, req_blocks)
        if new_computed:
            self.block_pool.touch(new_computed)
            req_blocks.extend(new_computed)
            self.num_cached_block[rid] = len(req_blocks)
        num_new_blocks = cdiv(num_tokens_need_slot, self.block_size) - len(req_blocks)
        new_blocks = self.block_pool.get_new_blocks(num_new_blocks) if num_new_blocks > 0 else []
        req_blocks.extend(new_blocks)

        if self.enable_caching and not delay_cache_blocks:
            # Cache every block that will be full once this step's tokens are computed.
            self.cache_blocks(request, min(num_computed + num_new_tokens, request.num_tokens))
        return new_blocks

    def cache_blocks(self, request: Request, num_computed_tokens: int) -> None:
        """Register the request's blocks that are full within ``num_computed_tokens``."""
        rid = request.request_id
        num_cached = self.num_cached_block.get(rid, 0)
        num_full = num_computed_tokens // self.block_size
        if num_cached >= num_full:
            return
        blocks = self.req_to_blocks[rid]
        self.block_pool.cache_full_blocks(
            blocks[num_cached:num_full], request.block_hashes[num_cached:num_full]
        )
        self.num_cached_block[rid] = num_full

    def free(self, request: Request) -> None:
        """Release every block of ``request``, tail first, so its prefix outlives its suffix.

        A request that holds no blocks (never admitted, or already freed) is a no-op, as
        upstream: aborting a waiting request must not fail.
        """
        rid = request.request_id
        blocks = self.req_to_blocks.pop(rid, [])
        self.block_pool.free_blocks(reversed(blocks))
        self.num_cached_block.pop(rid, None)

    # -- inspection ------------------------------------------------------------------------
    def get_blocks(self, request_id: str) -> list[KVCacheBlock]:
        return list(self.req_to_blocks.get(request_id, ()))

    def get_block_ids(self, request_id: str) -> list[int]:
        """The request's block table (physical block ids, in logical order); [] if none."""
        return [b.block_id for b in self.req_to_blocks.get(request_id, ())]

    def reset_prefix_cache(self) -> bool:
        return self.block_pool.reset_prefix_cache()
