"""Benchmark (not a test): mini_vllm vs the real vLLM 0.22.1, same work, same process.

    python -m mini_vllm.bench

1. Block pool: one deterministic trace of ``get_new_blocks`` / ``cache_full_blocks`` /
   ``touch`` / ``free_blocks`` operations, replayed on mini's and vLLM's ``BlockPool``.
2. Scheduler: one request trace (shared prefixes, chunked prefill, preemption) driven through
   mini's ``Scheduler`` + ``KVCacheManager`` and vLLM's ``Scheduler`` + ``KVCacheManager``
   with a fake model runner; one step = ``schedule()`` + ``update_from_output()``.

Each figure is the best of several repetitions, mini and vLLM run alternately so both see the
same machine load; the ratio is mini / vLLM measured in this
run (targets: block pool <= 1.0x, scheduler step <= 0.5x). Timings vary between machines
and runs, which is why no test asserts on them and the README quotes none.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from types import SimpleNamespace

from .block_pool import BlockPool
from .kv_cache import KVCacheManager
from .request import Request
from .sampling_params import SamplingParams
from .scheduler import Scheduler
from .testing.traces import Arrival, SchedConfig, fake_token

REPEATS = 9


def best_of_interleaved(mini: Callable[[], object], real: Callable[[], object]) -> tuple[float, float]:
    """Best time of each, running them alternately so both see the same machine load."""
    best = [float("inf"), float("inf")]
    for _ in range(REPEATS):
        for i, fn in enumerate((mini, real)):
            t0 = time.perf_counter()
            fn()
            best[i] = min(best[i], time.perf_counter() - t0)
    return best[0], best[1]


# -- 1. block pool -----------------------------------------------------------------------
def block_pool_ops(num_blocks: int, num_ops: int, seed: int = 0) -> list[tuple]:
    """A replayable op list; block ids are valid because both pools allocate identically."""
    rng = random.Random(seed)
    pool = BlockPool(num_blocks)  # a mini pool only to keep the trace legal while generating it
    owners: list[list[int]] = []
    hashes: list[bytes] = []
    ops: list[tuple] = []
    while len(ops) < num_ops:
        r, free = rng.random(), pool.get_num_free_blocks()
        if r < 0.35 and free:
            n = rng.randint(1, min(16, free))
            owners.append([b.block_id for b in pool.get_new_blocks(n)])
            ops.append(("alloc", n))
        elif r < 0.65 and owners:
            ids = list(reversed(owners.pop(rng.randrange(len(owners)))))
            pool.free_blocks([pool.blocks[i] for i in ids])
            ops.append(("free", ids))
        elif r < 0.85 and owners:
            ids = [i for i in rng.choice(owners) if pool.blocks[i].block_hash is None]
            if ids:
                new = [rng.randbytes(32) for _ in ids]
                pool.cache_full_blocks([pool.blocks[i] for i in ids], new)
                hashes += new
                ops.append(("cache", ids, new))
        elif hashes:
            hit = pool.get_cached_block(rng.choice(hashes))
            if hit is not None:
                pool.touch([hit])
                owners.append([hit.block_id])
                ops.append(("touch", [hit.block_id]))
    return ops


def replay_mini(num_blocks: int, ops: list[tuple]) -> Callable[[], None]:
    def run() -> None:
        pool = BlockPool(num_blocks)
        blocks = pool.blocks
        for op in ops:
            kind = op[0]
            if kind == "alloc":
                pool.get_new_blocks(op[1])
            elif kind == "free":
                pool.free_blocks([blocks[i] for i in op[1]])
            elif kind == "cache":
                pool.cache_full_blocks([blocks[i] for i in op[1]], op[2])
            else:
                pool.touch([blocks[i] for i in op[1]])

    return run


def replay_real(real, num_blocks: int, ops: list[tuple]) -> Callable[[], None]:
    def run() -> None:
        pool = real.make_block_pool(num_blocks)
        blocks = pool.blocks
        for op in ops:
            kind = op[0]
            if kind == "alloc":
                pool.get_new_blocks(op[1])
            elif kind == "free":
                pool.free_blocks([blocks[i] for i in op[1]])
            elif kind == "cache":
                ids = op[1]
                pool.cache_full_blocks(
                    SimpleNamespace(block_hashes=op[2]), [blocks[i] for i in ids], 0, len(ids), 16, 0
                )
            else:
                pool.touch([blocks[i] for i in op[1]])

    return run


# -- 2. scheduler ------------------------------------------------------------------------
def request_trace(seed: int = 0) -> tuple[SchedConfig, list[Arrival]]:
    rng = random.Random(seed)
    system = tuple(rng.randrange(250) for _ in range(96))
    trace = []
    for i in range(34):
        if rng.random() < 0.5:
            prompt = system + tuple(rng.randrange(250) for _ in range(rng.randint(4, 40)))
        else:
            prompt = tuple(rng.randrange(250) for _ in range(rng.randint(8, 160)))
        trace.append(Arrival(rng.randint(0, 40), f"req-{i}", prompt, rng.randint(8, 40)))
    config = SchedConfig(
        num_gpu_blocks=64,
        block_size=16,
        max_num_seqs=16,
        max_num_batched_tokens=256,
        long_prefill_token_threshold=64,
        max_model_len=512,
    )
    return config, trace


def run_mini(config: SchedConfig, trace: list[Arrival]) -> int:
    kv = KVCacheManager(
        config.num_gpu_blocks, config.block_size, config.enable_prefix_caching, config.max_model_len
    )
    sched = Scheduler(
        kv,
        config.max_num_seqs,
        config.max_num_batched_tokens,
        config.long_prefill_token_threshold,
        config.max_model_len,
    )
    pending = sorted(trace, key=lambda a: a.step)
    steps = 0
    while pending or sched.has_unfinished_requests():
        while pending and pending[0].step <= steps:
            a = pending.pop(0)
            sched.add_request(
                Request(
                    a.request_id,
                    list(a.prompt_token_ids),
                    SamplingParams(max_tokens=a.max_tokens, ignore_eos=True),
                    block_hasher=kv.block_hasher,
                )
            )
        out = sched.schedule()
        sampled = {
            r.request_id: fake_token(r.request_id, r.num_output_tokens)
            for r in out.scheduled_requests
            if Scheduler.needs_sample(r, out.num_scheduled_tokens[r.request_id])
        }
        sched.update_from_output(out, sampled)
        steps += 1
    return steps


def run_real(real, config: SchedConfig, trace: list[Arrival]) -> int:
    rs = real.RealScheduler(config)
    pending = sorted(trace, key=lambda a: a.step)
    sched = rs.scheduler
    steps = 0
    while pending or sched.has_unfinished_requests():
        while pending and pending[0].step <= steps:
            a = pending.pop(0)
            rs.add_request(a.request_id, list(a.prompt_token_ids), a.max_tokens)
        out = sched.schedule()
        sched.update_from_output(out, rs.fake_model_runner_output(out))
        steps += 1
    return steps


def main() -> None:
    print("loading vLLM 0.22.1 (CPU)...", flush=True)
    from .testing import real_vllm as real

    num_blocks = 256
    ops = block_pool_ops(num_blocks, 4000)
    t_mini, t_real = best_of_interleaved(replay_mini(num_blocks, ops), replay_real(real, num_blocks, ops))
    print(
        f"\nBlock pool: {len(ops)} ops (alloc/free/cache/touch) on a {num_blocks}-block pool, best of {REPEATS}"
    )
    print(f"  mini   {t_mini / len(ops) * 1e6:8.2f} us/op")
    print(f"  vLLM   {t_real / len(ops) * 1e6:8.2f} us/op")
    print(f"  ratio  {t_mini / t_real:8.2f}x  (mini / vLLM; target <= 1.0x)")

    config, trace = request_trace()
    steps_mini = run_mini(config, trace)
    steps_real = run_real(real, config, trace)
    assert steps_mini == steps_real, f"the two schedulers took {steps_mini} vs {steps_real} steps"
    s_mini, s_real = best_of_interleaved(
        lambda: run_mini(config, trace), lambda: run_real(real, config, trace)
    )
    tokens = sum(len(a.prompt_token_ids) + a.max_tokens for a in trace)
    print(
        f"\nScheduler: {len(trace)} requests, ~{tokens} tokens, {steps_mini} steps (schedule + update_from_output), "
        f"best of {REPEATS}"
    )
    print(f"  mini   {s_mini / steps_mini * 1e6:8.1f} us/step")
    print(f"  vLLM   {s_real / steps_real * 1e6:8.1f} us/step")
    print(f"  ratio  {s_mini / s_real:8.2f}x  (mini / vLLM; target <= 0.5x)")


if __name__ == "__main__":
    main()
