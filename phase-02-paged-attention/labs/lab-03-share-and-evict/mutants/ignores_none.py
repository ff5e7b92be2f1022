"""MUTANT: prefill never checks allocate_slots for None and reports a refused admission as a success.

Lab 02.03 — share and evict: drive mini_vllm's KVCacheManager by hand (reference solution).

No scheduler, no engine: you play the scheduler's part for one admission (prefill) and watch what
the block pool does with ref counts, the prefix-cache index and the free queue.

Upstream: the admission order below is what Scheduler.schedule does for a waiting request
(vllm/v1/core/sched/scheduler.py), through vllm/v1/core/kv_cache_manager.py:194 —
KVCacheManager.get_computed_blocks and vllm/v1/core/kv_cache_manager.py:236 —
KVCacheManager.allocate_slots.

Run: python phase-02-paged-attention/labs/lab-03-share-and-evict/solution.py
"""

from __future__ import annotations

from typing import NamedTuple

from mini_vllm import CacheConfig, KVCacheManager, Request, SamplingParams


class Prefilled(NamedTuple):
    request: Request          # the admitted request, prompt fully computed
    cached: int               # prompt tokens served by the prefix cache (not recomputed)
    new_block_ids: list[int]  # physical blocks allocated fresh for this request


def prefill(kv: KVCacheManager, token_ids: list[int], request_id: str) -> Prefilled:
    """Admit one request and compute its whole prompt, the way the scheduler would:

    1. build the Request;
    2. ask the prefix cache how much of the prompt is already there: get_computed_blocks;
    3. allocate_slots for the REMAINING tokens, handing over the hit blocks and their token count
       (request.num_computed_tokens is still 0 here: allocate_slots adds the hits itself);
    4. only after a successful allocation, advance request.num_computed_tokens to the whole
       prompt (the hits plus what this step computes);
    5. return the request, the hit count and the fresh block ids.
    A None from allocate_slots means "does not fit": raise MemoryError (nothing was changed).
    """
    request = Request(request_id, token_ids, SamplingParams(max_tokens=1))
    hit_blocks, cached = kv.get_computed_blocks(request)
    new_blocks = kv.allocate_slots(request, request.num_tokens - cached, cached, hit_blocks)
    request.num_computed_tokens = request.num_tokens
    return Prefilled(request, cached, [b.block_id for b in new_blocks or []])


def ref_counts(kv: KVCacheManager, request: Request) -> list[int]:
    """ref_cnt of every block in the request's block table, in logical order."""
    return [kv.block_pool.blocks[b].ref_cnt for b in kv.get_block_ids(request.request_id)]


def main() -> None:
    prompt = list(range(100, 132))                      # 32 tokens = 8 full blocks of 4
    kv = KVCacheManager(CacheConfig(num_gpu_blocks=10, block_size=4))
    a = prefill(kv, prompt, "A")
    print(f"A: cached={a.cached} table={kv.get_block_ids('A')} ref={ref_counts(kv, a.request)}")
    b = prefill(kv, prompt, "B")
    print(f"B: cached={b.cached} table={kv.get_block_ids('B')} ref={ref_counts(kv, b.request)} "
          f"new blocks={b.new_block_ids}")
    print(f"free blocks left: {kv.block_pool.get_num_free_blocks()}")
    kv.free(a.request)
    kv.free(b.request)
    queue = kv.block_pool.free_block_queue.get_all_free_blocks()
    print(f"after free(A), free(B): queue front->back = {[blk.block_id for blk in queue]}")
    print(f"  cached (hash kept) = {[blk.block_id for blk in queue if blk.block_hash is not None]}")
    taken = kv.block_pool.get_new_blocks(2)
    queue = kv.block_pool.free_block_queue.get_all_free_blocks()
    print(f"2 new blocks evict {[blk.block_id for blk in taken]} (the two tails); "
          f"last cached survivor = {queue[-1].block_id}")
    kv.block_pool.free_blocks(taken)
    d = prefill(kv, prompt, "D")
    print(f"D (same prompt, after the evictions): cached={d.cached} table={kv.get_block_ids('D')} "
          f"ref={ref_counts(kv, d.request)}")


if __name__ == "__main__":
    main()
