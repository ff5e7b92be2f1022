"""Benchmark (not a test): mini_vllm against the real vLLM 0.22.1 and Hugging Face, same work.

    python -m mini_vllm.bench [--repeats 5] [--quick]     # every case, about three minutes
    python -m mini_vllm.bench --only generate [--work]    # the checkpoint case alone
    python -m mini_vllm.bench --only engine               # the same, against vLLM's CPU engine
    python -m mini_vllm.bench --only speculation          # n-gram drafts against none (toy model)
    python -m mini_vllm.bench --only speculation-checkpoint   # the same on checkpoints/course-llama

Cases, each a ratio taken per repetition (mini and the reference alternating), median [min, max]:
block pool and scheduler (10 to 5,000 running) and a mass abort against vLLM's own classes on
one trace (targets <= 1.0x, <= 0.33x against ``log_stats=False``, <= 0.5x); the sampler against
vLLM's ``Sampler.forward`` on one batch of logits; n-gram speculation against none on repetitive
text (same tokens); and decode on the trained checkpoint
(``checkpoints/course-llama``): 32 prompts x 64 greedy tokens through ``LLMEngine`` against
Hugging Face ``generate`` one prompt at a time (target >= 3x: continuous batching must
show). ``--work`` prints only what a clock does not change (forwards, agreement);
``--profile`` adds where mini's time goes. Times are this process's CPU seconds
(``time.process_time``), so a shared machine's load lands on neither side; they depend on the
machine, which is why no test asserts on them. README.md ("Benchmark") explains each case.
``--only engine`` runs the decode case against the real vLLM CPU engine (tier 2), in wall
seconds (its model runs in a worker process).
The platform case (phase 17): the course checkpoint, 8 prompts x 32 greedy tokens, on the numpy
platform and on the torch-cpu platform; identical tokens; the ratio is torch / numpy.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections.abc import Callable
from pathlib import Path
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
        f"{name:<36} mini {statistics.median(a) / per * 1e6:9.2f} {unit}   "
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


def time_scheduler(
    run: Callable[..., list], config: SchedConfig, trace: list, step: int | None, log_stats: bool = False
) -> float:
    """``log_stats=False``: the real scheduler as offline ``LLM()`` builds it (no per-step stats)."""
    timings: list[float] = []
    extra = {"record": False} if run is run_mini_trace else {"log_stats": log_stats}
    run(config, trace, timings=timings, clock=CLOCK, **extra)
    return timings[step] if step is not None else sum(timings)


# -- 4. sampler ------------------------------------------------------------------------
SAMPLER_ROWS, SAMPLER_REPS = 100, 10


class SamplerCase:
    """One batch of logits (100 rows; temperature 1, top-k 50, top-p 0.9 on every row) through
    mini's ``Sampler.sample_batch`` and vLLM's ``Sampler.forward`` on CPU torch tensors."""

    def __init__(self, vocab: int) -> None:
        import torch

        from .sampler import Sampler
        from .testing import real_spec_decode as rs

        torch.set_num_threads(1)
        self.vocab = vocab
        self.logits = np.random.default_rng(vocab).normal(0.0, 2.0, (SAMPLER_ROWS, vocab)).astype(np.float32)
        self.torch_logits = torch.from_numpy(self.logits)
        self.metadata = rs.sampling_metadata([1.0] * SAMPLER_ROWS, None, top_k=50, top_p=0.9)
        self.real = rs.VllmSampler()
        self.mini = Sampler()
        self.params = [SamplingParams(temperature=1.0, top_k=50, top_p=0.9)] * SAMPLER_ROWS

    def run_mini(self) -> float:
        gens = [np.random.default_rng(i) for i in range(SAMPLER_ROWS)]
        t0 = CLOCK()
        for _ in range(SAMPLER_REPS):
            self.mini.sample_batch(self.logits, self.params, gens)
        return CLOCK() - t0

    def run_real(self) -> float:
        t0 = CLOCK()
        for _ in range(SAMPLER_REPS):
            self.real.forward(self.torch_logits.clone(), self.metadata)  # forward may write in place
        return CLOCK() - t0


# -- 4b. n-gram speculation on repetitive text ----------------------------------------------
SPEC_PROMPTS, SPEC_TOKENS = 16, 512


def time_speculation(spec: bool, out: list, model: str | None = None) -> float:
    """The toy engine, greedy, with n-gram drafts or without. The toy's greedy output falls into a
    cycle of period 64 (``test_spec_engine.py`` relies on it), so most of 512 tokens repeat.
    ``model``: a checkpoint instead of the toy, so each step costs a real forward."""
    kwargs: dict = {"speculative_config": {"method": "ngram", "num_speculative_tokens": 4}} if spec else {}
    if model is not None:
        kwargs["model"] = model
    engine = LLMEngine(num_gpu_blocks=1025, max_num_seqs=SPEC_PROMPTS, max_num_batched_tokens=4096, **kwargs)
    params = SamplingParams(max_tokens=SPEC_TOKENS, temperature=0, ignore_eos=True)
    prompts = [f"request {i}: the cat sat on the mat" for i in range(SPEC_PROMPTS)]
    t0 = CLOCK()
    results = engine.generate(prompts, params)
    elapsed = CLOCK() - t0
    out.append(([r.token_ids for r in results], engine.num_steps))
    return elapsed


def speculation_case(repeats: int, model: str | None = None) -> None:
    tokens: list = []
    a, b = interleaved_ratios(
        lambda: time_speculation(True, tokens, model), lambda: time_speculation(False, tokens, model), repeats
    )
    assert all(t[0] == tokens[0][0] for t in tokens), (
        "greedy speculation must emit the tokens plain decoding does"
    )
    where = "" if model is None else f", {Path(model).name}"
    report(
        f"speculation{where} ({tokens[0][1]} vs {tokens[1][1]} steps)",
        a,
        b,
        "us/tok",
        SPEC_PROMPTS * SPEC_TOKENS,
        "spec / no spec, target < 1.0x",
    )


# -- 5. decode on the trained checkpoint: continuous batching vs one request at a time --------
CHECKPOINT = Path(__file__).parent / "checkpoints" / "course-llama"
NUM_PROMPTS, NUM_TOKENS = 32, 64


def decode_prompts(tokenizer, n: int = NUM_PROMPTS) -> list[list[int]]:
    """The first ``n`` prose lines of the held-out text, each cut to its first 4 to 12 tokens."""
    lines = [ln.strip() for ln in (CHECKPOINT / "heldout.txt").read_text(encoding="utf-8").splitlines()]
    lines = [ln for ln in lines if len(ln) > 30 and ln[0].isalpha()]
    return [tokenizer.encode(ln)[: 4 + i % 9] for i, ln in enumerate(lines[:n])]


class DecodeCase:
    """Both sides built once (weights loaded, tokenizer read); each run only generates."""

    def __init__(self) -> None:
        import torch
        from transformers import LlamaForCausalLM

        torch.set_num_threads(1)  # one thread each: the figures are CPU seconds of comparable work
        self.torch = torch
        self.engine = LLMEngine(model=str(CHECKPOINT), max_num_seqs=NUM_PROMPTS)
        self.prompts = decode_prompts(self.engine.tokenizer)
        self.hf = LlamaForCausalLM.from_pretrained(CHECKPOINT, dtype=torch.float32).eval()
        self.params = SamplingParams(max_tokens=NUM_TOKENS, temperature=0, ignore_eos=True)
        self.forwards = {"mini": 0, "hf": 0}
        self.mini_tokens: list[list[int]] = []
        self.hf_tokens: list[list[int]] = []

    def run_mini(self) -> float:
        steps = self.engine.num_steps
        t0 = CLOCK()
        self.mini_tokens = [o.token_ids for o in self.engine.generate(self.prompts, self.params)]
        elapsed = CLOCK() - t0
        self.forwards["mini"] = self.engine.num_steps - steps
        return elapsed

    def run_hf(self) -> float:
        out, t0 = [], CLOCK()
        with self.torch.no_grad():
            for p in self.prompts:
                ids = self.hf.generate(
                    self.torch.tensor([p]), max_new_tokens=NUM_TOKENS, min_new_tokens=NUM_TOKENS,
                    do_sample=False, pad_token_id=2,
                )  # fmt: skip
                out.append(ids[0, len(p) :].tolist())
        elapsed = CLOCK() - t0
        self.hf_tokens, self.forwards["hf"] = out, NUM_TOKENS * len(self.prompts)
        return elapsed

    def work(self) -> None:
        same = sum(a == b for a, b in zip(self.mini_tokens, self.hf_tokens))
        first = [next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), NUM_TOKENS)
                 for a, b in zip(self.mini_tokens, self.hf_tokens)]  # fmt: skip
        n = len(self.prompts)
        print(f"decode on {CHECKPOINT.name}: {n} prompts of {min(map(len, self.prompts))}-"
              f"{max(map(len, self.prompts))} tokens, {NUM_TOKENS} greedy tokens each")  # fmt: skip
        print(f"  mini_vllm LLMEngine.generate : {self.forwards['mini']:5d} forwards "
              f"({n * NUM_TOKENS / self.forwards['mini']:.1f} new tokens per forward)")  # fmt: skip
        print(f"  Hugging Face generate, 1 by 1: {self.forwards['hf']:5d} forwards (1 new token per forward)")
        where = "" if same == n else f"; the earliest difference at new token {min(first)}"
        print(f"  identical {NUM_TOKENS}-token continuations, mini vs Hugging Face: {same} of {n}{where}")


def profile_mini(case: DecodeCase, top: int = 8) -> None:
    """Where mini's decode time goes: the functions with the most CPU time of their own."""
    import cProfile
    import pstats

    prof = cProfile.Profile(CLOCK)
    prof.runcall(case.run_mini)
    stats = pstats.Stats(prof)
    total = sum(v[2] for v in stats.stats.values())
    rows = sorted(stats.stats.items(), key=lambda kv: kv[1][2], reverse=True)[:top]
    print(f"  where mini's time goes (own CPU time, top {top}):")
    for (file, line, func), v in rows:
        print(f"    {100 * v[2] / total:5.1f}%  {Path(file).name}:{line} {func}")


def decode_case(repeats: int, work_only: bool, profile: bool) -> None:
    case = DecodeCase()
    if work_only:  # one run each, clock-free figures only: a timing (or a verdict on one) would make
        case.run_mini()  # the README's generated block change from run to run and machine to machine
        case.run_hf()
        case.work()
        return
    a, b = interleaved_ratios(case.run_mini, case.run_hf, repeats)
    case.work()
    tokens = NUM_PROMPTS * NUM_TOKENS
    speedups = [y / x for x, y in zip(a, b)]
    print(
        f"{'decode, 32 x 64 greedy tokens':<30} mini {tokens / statistics.median(a):8.0f} tok/s   "
        f"HF generate {tokens / statistics.median(b):8.0f} tok/s   "
        f"speedup {statistics.median(speedups):5.2f}x [{min(speedups):.2f}, {max(speedups):.2f}]  (target >= 3x)"
    )
    if profile:
        profile_mini(case)


def engine_case(repeats: int) -> None:
    """The decode case against the real vLLM CPU engine (tier 2: ``make engine``), same checkpoint,
    prompts and greedy settings. vLLM's model runs in a worker process, so both sides are timed in
    wall seconds, back to back, one thread each (``OMP_NUM_THREADS=1``, no thread binding)."""
    from course.runtime import engine as tier2

    missing = tier2.missing_reason()
    if missing:
        print(f"{'decode vs vLLM CPU engine':<30} skipped: {missing}")
        return
    mini = LLMEngine(model=str(CHECKPOINT), max_num_seqs=NUM_PROMPTS)
    prompts = decode_prompts(mini.tokenizer)
    env = tier2.engine_env(OMP_NUM_THREADS="1", VLLM_CPU_OMP_THREADS_BIND="nobind")
    run = tier2.run_job("decode_timing", env=env, model=str(CHECKPOINT), prompts=prompts,
                        max_tokens=NUM_TOKENS, repeats=repeats)  # fmt: skip
    params = SamplingParams(max_tokens=NUM_TOKENS, temperature=0, ignore_eos=True)
    tokens = [o.token_ids for o in mini.generate(prompts, params)]  # warm-up, as vLLM's side had
    seconds = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        mini.generate(prompts, params)
        seconds.append(time.perf_counter() - t0)
    same = sum(a == b for a, b in zip(tokens, run.result["tokens"]))
    work = NUM_PROMPTS * NUM_TOKENS
    ours, theirs = statistics.median(seconds), statistics.median(run.result["seconds"])
    print(
        f"{'decode vs vLLM CPU engine':<30} mini {work / ours:8.0f} tok/s   vLLM {work / theirs:8.0f} tok/s   "
        f"ratio {theirs / ours:5.2f}x (wall, median of {repeats}; {same} of {len(prompts)} continuations identical)"
    )


def time_platform(name: str, out: list) -> float:
    """CPU seconds of one greedy run of the course checkpoint with ``name``'s platform current."""
    from .platforms import use_platform
    from .platforms.numpy_platform import NumpyPlatform
    from .platforms.torch_cpu import TorchCpuPlatform

    platform = {"numpy": NumpyPlatform, "torch": TorchCpuPlatform}[name]()
    with use_platform(platform):
        engine = LLMEngine(model=str(CHECKPOINT), num_gpu_blocks=128)
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
    parser.add_argument(
        "--only", choices=["generate", "engine", "speculation", "speculation-checkpoint"], help="run one case"
    )
    parser.add_argument("--work", action="store_true", help="the decode case's clock-free figures only")
    parser.add_argument("--profile", action="store_true", help="where mini's decode time goes")
    args = parser.parse_args(argv)
    repeats = max(args.repeats, 1)
    if args.only == "engine":
        engine_case(repeats)
        return
    if args.only == "speculation":
        speculation_case(repeats)
        return
    if args.only == "speculation-checkpoint":  # the same case with a real forward per step
        speculation_case(repeats, str(CHECKPOINT))
        return
    if args.only == "generate" or args.work:
        decode_case(repeats, args.work, args.profile)
        return

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
        for log_stats in (False, True):
            a, b = interleaved_ratios(
                lambda c=config, t=trace: time_scheduler(run_mini_trace, c, t, None),
                lambda c=config, t=trace, s=log_stats: time_scheduler(real.run_trace, c, t, None, s),
                repeats,
            )
            label = "" if not log_stats else ", log_stats"
            report(f"scheduler, {n} running{label}", a, b, "us/step", steps, "target <= 0.33x")

    n = 1000 if args.quick else 5000
    config, trace = running_trace(n, abort=True)
    a, b = interleaved_ratios(
        lambda: time_scheduler(run_mini_trace, config, trace, 2),
        lambda: time_scheduler(real.run_trace, config, trace, 2),
        repeats,
    )
    report(f"mass abort, {n} one by one", a, b, "us/req", n, "target <= 0.5x")

    for vocab in (257, 32000):
        case = SamplerCase(vocab)
        a, b = interleaved_ratios(case.run_mini, case.run_real, repeats)
        report(
            f"sampler, {SAMPLER_ROWS} rows x {vocab} vocab",
            a,
            b,
            "us/row",
            SAMPLER_ROWS * SAMPLER_REPS,
            "target <= 1.0x",
        )

    speculation_case(repeats)
    decode_case(repeats, False, args.profile)
    engine_case(repeats)

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
