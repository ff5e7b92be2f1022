"""Lab 03-05 benchmark: the decoder step, eager vs CUDA-graph replay, measured on a real GPU.

    python phase-05-cuda-graphs-and-torch-compile/labs/lab-05-graph-vs-eager-real/bench.py
    python .../bench.py --impl starter          # time YOUR GraphedStep / cuda_graph_backend
    python .../bench.py --batches 1 2 4 8 16 32 64 --iters 300

For each batch size it builds the step's KV cache, times ``--iters`` eager steps and ``--iters``
replays with CUDA events (the events bracket the whole loop, so GPU idle time between launches
counts, which is the point), and prints the measured times, the speedup, and lab-02's model
fitted to them (``compare_with_model``). It also counts the kernels of one step with the CUDA
profiler and prints the roofline prediction (``predict_rows``) for the device when its peak is
in ``course/runtime/devices.py``. Needs CUDA; nothing here runs in the CPU test suite.
"""

from __future__ import annotations

import sys

from course.runtime.bench import bench_main
from course.runtime.devices import lookup


def time_us(fn, iters: int, warmup: int) -> float:
    import torch

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1000.0 / iters


def cuda_kernels_per_step(step, tokens) -> int:
    import torch
    from torch.profiler import ProfilerActivity, profile

    with torch.no_grad():
        step(tokens)  # warm up first: cuBLAS handles and lazy init must not be counted
    with torch.no_grad(), profile(activities=[ProfilerActivity.CUDA]) as prof:
        step(tokens)
        torch.cuda.synchronize()
    return sum(1 for e in prof.events() if e.device_type.name == "CUDA")


def measure_batch(lab, model, cfg, batch: int, iters: int, warmup: int) -> tuple[tuple[float, float], int]:
    """((eager_us, graph_us), CUDA kernels per step) for one batch size; the KV cache is freed after."""
    import torch

    k, v = lab.make_kv_cache(cfg, batch, device="cuda")

    def step(tokens):
        return model(tokens, k, v)

    tokens = lab.make_tokens(cfg, batch, device="cuda")
    kernels = cuda_kernels_per_step(step, tokens)
    with torch.no_grad():
        eager = time_us(lambda: step(tokens), iters, warmup)
    graphed = lab.GraphedStep(step, tokens)
    graph = time_us(lambda: graphed(tokens), iters, warmup)  # includes the copy_ of the tokens
    return (eager, graph), kernels


def add_arguments(ap) -> None:
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8, 64])
    ap.add_argument("--iters", type=int, default=200)
    ap.add_argument("--warmup", type=int, default=20)


def measure(lab, args) -> None:
    import torch

    cfg = lab.DecoderConfig()
    model = lab.build_decoder(cfg, device="cuda")
    name = torch.cuda.get_device_name()
    print(f"device: {name}; torch {torch.__version__}; model {cfg}")

    measured, n_cuda = {}, None
    for b in args.batches:
        measured[b], kernels = measure_batch(lab, model, cfg, b, args.iters, args.warmup)
        n_cuda = n_cuda or kernels
        torch.cuda.empty_cache()

    n_dispatch = lab.kernels_per_step(cfg)[2]
    print(f"kernels per step: {n_cuda} (CUDA profiler), {n_dispatch} (aten ops counted on CPU)")
    if not n_cuda:  # the profiler saw no GPU activity (e.g. CUPTI unavailable): fall back to the CPU count
        print("  the CUDA profiler recorded no kernels here; using the CPU count for the model")
        n_cuda = n_dispatch
    print(f"\nmeasured, and lab-02's model fitted at batch {min(measured)} (launch cost = eager / kernels)")
    print(f"{'batch':>5} {'eager_us':>9} {'graph_us':>9} {'speedup':>8} {'model_eager':>12} {'model_x':>8}")
    for r in lab.compare_with_model(n_cuda, measured):
        print(f"{r['batch']:>5} {r['eager_us']:>9.1f} {r['graph_us']:>9.1f} {r['speedup']:>7.2f}x "
              f"{r['predicted_eager_us']:>12.1f} {r['predicted_speedup']:>7.2f}x")
    print(f"fitted launch cost: {lab.compare_with_model(n_cuda, measured)[0]['launch_us']:.2f} us per kernel")

    peak = lookup(name)
    if peak and peak.dense_bf16_flops:
        key = peak.label
        # lab-02's predict_rows takes TB/s and TFLOP/s (dense FP16/BF16 tensor core).
        p = {"hbm_tb_s": peak.hbm_bytes_per_s / 1e12, "peak_tflops": peak.dense_bf16_flops / 1e12}
        print(f"\nroofline prediction for {key} (launch 5 us, kernel floor 2 us), for comparison")
        for r in lab.predict_rows(n_cuda, cfg, tuple(args.batches), **p):
            print(f"{r['batch']:>5} gpu {r['gpu_us']:>7.0f} us   eager {r['eager_us']:>7.0f} us   "
                  f"graph {r['graph_us']:>7.0f} us   {r['speedup']:.2f}x")
        for b, (_eager, graph) in sorted(measured.items()):
            nbytes = 2 * (cfg.weight_params + cfg.kv_elems(b))
            print(f"batch {b:>3}: graph step moves {nbytes / 1e6:.0f} MB -> {nbytes / graph / 1e6:.2f} TB/s "
                  f"= {nbytes / graph / 1e6 / p['hbm_tb_s']:.0%} of the {p['hbm_tb_s']} TB/s peak")


if __name__ == "__main__":
    sys.exit(bench_main(__file__, __doc__, measure, add_arguments=add_arguments))
