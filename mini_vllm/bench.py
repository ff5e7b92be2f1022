"""Benchmark (not a test): mini_vllm vs the real vLLM 0.22.1, same work, same process.

    python -m mini_vllm.bench [--repeats 5] [--quick]

Cases, each reported as the ratio mini / vLLM (or new / baseline) with its spread:

1. Block pool: one deterministic trace of ``get_new_blocks`` / ``cache_full_blocks`` /
   ``touch`` / ``free_blocks`` on a 256-block pool; both pools are built before the clock starts.
2. Scheduler at 10, 100, 1,000 and 5,000 running requests: the same trace through both
   schedulers (``traces.run_mini_trace`` and ``real_vllm.run_trace``, which build everything
   before timing); only ``schedule()`` + ``update_from_output()`` is timed.
3. Mass abort: 5,000 running requests aborted one id per ``finish_requests`` call, in a seeded
   random order; the aborts plus the next ``schedule()`` + ``update_from_output()`` are timed.
4. Sampler, end to end: 100 requests x 128 sampled tokens (temperature 1, top-k 50, top-p 0.9)
   through ``LLMEngine`` with its sampler and with ``baseline_sample`` (the sampler mini shipped
   before it was batched: two softmaxes, a full argsort per row, ``Generator.choice``); the tokens
   must be identical.

5. Platforms (phase 17): the course checkpoint, 8 prompts x 32 greedy tokens, through
   ``LLMEngine`` on the numpy platform and on the torch-cpu platform; the tokens must be identical;
   the ratio is torch / numpy (below 1: torch is faster on this machine).

Every case runs ``--repeats`` times, mini and the reference alternating so both see the same
machine load; a ratio is taken per repetition and the median is printed with [min, max]. Times
are this process's CPU time (``time.process_time``), so other programs on a shared machine
do not land in them. Targets:
block pool <= 1.0x, scheduler <= 0.5x, sampler end to end >= 2x. Timings depend on the machine and
its load, which is why no test asserts on them and the README quotes none.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections.abc import Callable
from types import SimpleNamespace

import numpy as np

from .block_pool import BlockPool
from .engine import LLMEngine
from .sampling_params import SamplingParams
from .testing.traces import Abort, Arrival, SchedConfig, run_mini_trace

# CPU seconds of this process: on a shared machine other processes' load does not land in the
# figures (wall-clock time would charge one side for whatever else ran during its turn).
CLOCK = time.process_time


def interleaved_ratios(
    mini: Callable[[], float], ref: Callable[[], float], repeats: int
) -> tuple[list[float], list[float]]:
    """Run ``mini`` and ``ref`` alternately; each returns the seconds it measured itself."""
    a, b = [], []
    for _ in range(repeats):
        a.append(mini())
        b.append(ref())
    return a, b


def report(name: str, a: list[float], b: list[float], unit: str, per: int, target: str) -> None:
    ratios = [x / y for x, y in zip(a, b)]
    print(
        f"{name:<30} mini {statistics.median(a) / per * 1e6:9.2f} {unit}   "
        f"ref {statistics.median(b) / per * 1e6:9.2f} {unit}   "
        f"ratio {statistics.median(ratios):5.2f}x [{min(ratios):.2f}, {max(ratios):.2f}]  ({target})"
    )


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
            h = rng.choice(hashes)
            hit = pool.get_cached_block(h)
            if hit is not None:
                pool.touch([hit])
                owners.append([hit.block_id])
                ops.append(("touch", h))
    return ops


def time_mini_pool(num_blocks: int, ops: list[tuple]) -> float:
    pool = BlockPool(num_blocks)
    blocks = pool.blocks
    t0 = CLOCK()
    for op in ops:
        kind = op[0]
        if kind == "alloc":
            pool.get_new_blocks(op[1])
        elif kind == "free":
            pool.free_blocks([blocks[i] for i in op[1]])
        elif kind == "cache":
            pool.cache_full_blocks([blocks[i] for i in op[1]], op[2])
        else:
            hit = pool.get_cached_block(op[1])
            pool.touch([hit])
    return CLOCK() - t0


def time_real_pool(real, num_blocks: int, ops: list[tuple]) -> float:
    pool = real.make_block_pool(num_blocks)
    blocks = pool.blocks
    group = [0]
    t0 = CLOCK()
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
            hit = pool.get_cached_block(op[1], group)
            pool.touch(hit)
    return CLOCK() - t0


# -- 2. and 3. scheduler -----------------------------------------------------------------
def running_trace(num_requests: int, abort: bool = False) -> tuple[SchedConfig, list]:
    """``num_requests`` 12-token prompts arriving at step 0, all running together.

    With ``abort``: at step 2 every request is aborted, one id per call, in a seeded random order.
    """
    config = SchedConfig(
        num_gpu_blocks=2 * num_requests + 1,
        block_size=16,
        max_num_seqs=num_requests,
        max_num_batched_tokens=12 * num_requests,
        max_model_len=64,
    )
    rng = random.Random(num_requests)
    trace: list = [
        Arrival(0, f"r{i}", tuple(rng.randrange(250) for _ in range(12)), 16) for i in range(num_requests)
    ]
    if abort:
        ids = [f"r{i}" for i in range(num_requests)]
        rng.shuffle(ids)
        trace.append(Abort(2, tuple(ids)))
    return config, trace


def time_scheduler(run: Callable[..., list], config: SchedConfig, trace: list, step: int | None) -> float:
    timings: list[float] = []
    run(config, trace, timings=timings, clock=CLOCK, **({"record": False} if run is run_mini_trace else {}))
    return timings[step] if step is not None else sum(timings)


# -- 4. sampler --------------------------------------------------------------------------
def baseline_sample(logits: np.ndarray, params: SamplingParams, generator: np.random.Generator) -> int:
    """The sampler mini shipped before it was batched, kept only as this benchmark's baseline
    (and as the reference the equivalence test holds the new one to)."""
    logits = np.asarray(logits, dtype=np.float64)
    if params.is_greedy:
        return int(np.argmax(logits))

    def softmax(x: np.ndarray) -> np.ndarray:
        e = np.exp(x - np.max(x))
        return e / e.sum()

    x = logits / params.temperature
    k = params.top_k
    if 0 < k < x.shape[-1]:
        kth = np.partition(x, -k)[-k]
        x = np.where(x >= kth, x, -np.inf)
    if params.top_p < 1.0:
        probs = softmax(x)
        order = np.argsort(-probs, kind="stable")
        cum = np.cumsum(probs[order])
        num_keep = min(int(np.searchsorted(cum, params.top_p)) + 1, len(cum))
        out = np.full_like(x, -np.inf)
        keep = order[:num_keep]
        out[keep] = x[keep]
        x = out
    probs = softmax(x)
    return int(generator.choice(len(probs), p=probs))


class BaselineSampler:
    def sample_batch(
        self, logits, params, generators, output_token_ids=None, prompt_token_ids=None
    ) -> list[int]:
        return [baseline_sample(row, sp, g) for row, sp, g in zip(logits, params, generators)]


def time_generate(baseline: bool, out: list) -> float:
    engine = LLMEngine(num_gpu_blocks=1025, max_num_seqs=128, max_num_batched_tokens=4096)
    if baseline:
        engine.sampler = BaselineSampler()  # type: ignore[assignment]
    params = SamplingParams(max_tokens=128, temperature=1.0, top_k=50, top_p=0.9, ignore_eos=True)
    prompts = [f"request number {i}: tell me something" for i in range(100)]
    t0 = CLOCK()
    results = engine.generate(prompts, params)
    elapsed = CLOCK() - t0
    out.append([r.token_ids for r in results])
    return elapsed


def time_platform(name: str, out: list) -> float:
    """CPU seconds of one greedy run of the course checkpoint with ``name``'s platform current."""
    from pathlib import Path

    from .platforms import use_platform
    from .platforms.numpy_platform import NumpyPlatform
    from .platforms.torch_cpu import TorchCpuPlatform

    platform = {"numpy": NumpyPlatform, "torch": TorchCpuPlatform}[name]()
    with use_platform(platform):
        engine = LLMEngine(
            model=str(Path(__file__).parent / "checkpoints" / "course-llama"), num_gpu_blocks=128
        )
        prompts = [f"Story {i}: once upon a time" for i in range(8)]
        t0 = CLOCK()
        results = engine.generate(prompts, SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True))
        elapsed = CLOCK() - t0
    out.append([r.outputs[0].token_ids for r in results])
    return elapsed


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m mini_vllm.bench", description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=5, help="interleaved repetitions per case (>= 5)")
    parser.add_argument("--quick", action="store_true", help="skip the 5,000-request cases")
    args = parser.parse_args(argv)
    repeats = max(args.repeats, 1)

    print("loading vLLM 0.22.1 (CPU)...", flush=True)
    from .testing import real_vllm as real

    print(f"median of {repeats} interleaved repetitions; ratio = mini / reference [min, max]\n")
    ops = block_pool_ops(256, 4000)
    a, b = interleaved_ratios(
        lambda: time_mini_pool(256, ops), lambda: time_real_pool(real, 256, ops), repeats
    )
    report(f"block pool ({len(ops)} ops)", a, b, "us/op", len(ops), "target <= 1.0x")

    sizes = [10, 100, 1000] if args.quick else [10, 100, 1000, 5000]
    for n in sizes:
        config, trace = running_trace(n)
        steps = len(run_mini_trace(config, trace))
        a, b = interleaved_ratios(
            lambda c=config, t=trace: time_scheduler(run_mini_trace, c, t, None),
            lambda c=config, t=trace: time_scheduler(real.run_trace, c, t, None),
            repeats,
        )
        report(f"scheduler, {n} running", a, b, "us/step", steps, "target <= 0.5x")

    n = 1000 if args.quick else 5000
    config, trace = running_trace(n, abort=True)
    a, b = interleaved_ratios(
        lambda: time_scheduler(run_mini_trace, config, trace, 2),
        lambda: time_scheduler(real.run_trace, config, trace, 2),
        repeats,
    )
    report(f"mass abort, {n} one by one", a, b, "us/req", n, "target <= 0.5x")

    tokens: list = []
    a, b = interleaved_ratios(
        lambda: time_generate(False, tokens), lambda: time_generate(True, tokens), repeats
    )
    assert all(t == tokens[0] for t in tokens), "the batched sampler must draw the baseline's tokens"
    speedups = [y / x for x, y in zip(a, b)]
    print(
        f"{'sampler, 100 x 128 tokens':<30} new {100 * 128 / statistics.median(a) / 1e3:8.1f} k tok/s   "
        f"baseline {100 * 128 / statistics.median(b) / 1e3:8.1f} k tok/s   "
        f"speedup {statistics.median(speedups):5.2f}x [{min(speedups):.2f}, {max(speedups):.2f}]  "
        "(target >= 2x; same tokens)"
    )

    tokens = []
    a, b = interleaved_ratios(
        lambda: time_platform("torch", tokens), lambda: time_platform("numpy", tokens), repeats
    )
    assert all(t == tokens[0] for t in tokens), (
        "the torch-cpu platform must produce the numpy platform's tokens"
    )
    report("platform torch-cpu / numpy", a, b, "us/run", 1, "same greedy tokens")


if __name__ == "__main__":
    main()
