"""Benchmark the lab's grouped MoE (two Triton launches) against a per-expert torch loop.

On a CUDA machine:   python phase-07-gemm-and-moe-kernels/labs/lab-06-triton-grouped-moe/bench.py
                     (--impl starter benchmarks your starter.py)
Anywhere, no GPU:    python phase-07-gemm-and-moe-kernels/labs/lab-06-triton-grouped-moe/bench.py --predict
                     prints FLOPs, expert-weight bytes and padding per shape and the time those take
                     at the datasheet peaks (a floor, not a measurement).

Shapes are Mixtral-8x7B's expert MLP (d = 4096, f = 14336, 8 experts, top-2) with the lab's ReLU
expert (two GEMMs per expert), at a decode batch, a large decode batch and a prefill. The
baseline is the lab-01 algorithm in torch: sort by expert, then one pair of torch.matmul calls per
expert (2·E launches plus the gather/scatter). Useful FLOPs = 4·T·k·d·f (padding rows excluded);
bytes = the weights of every expert that received a row (each read once) plus activations.
"""

from __future__ import annotations

import sys
from functools import partial
from pathlib import Path

from course.runtime.bench import bench_main, device_peak

HERE = Path(__file__).resolve().parent

PREDICT = ("H100 SXM", 989e12, 3.35e12)
D, F, E, K = 4096, 14336, 8, 2
SHAPES = [8, 64, 4096]          # tokens per step



def routing(tokens: int, device="cpu"):
    import torch
    g = torch.Generator(device=device).manual_seed(0)
    logits = torch.randn(tokens, E, device=device, generator=g)
    vals, ids = torch.topk(logits, K, dim=-1)
    return ids, torch.softmax(vals, dim=-1)


def cost(lab, ids, block_m: int, elem: int = 2) -> tuple[int, int, int, int]:
    """(useful FLOPs, bytes, valid rows, padded rows) for one forward."""
    import torch
    tokens = ids.shape[0]
    active = int((torch.bincount(ids.reshape(-1).cpu(), minlength=E) > 0).sum())
    flops = 4 * tokens * K * D * F
    nbytes = active * 2 * D * F * elem + tokens * D * elem * 2 + tokens * K * (F + D) * elem * 2
    valid, padded = lab.padding_waste(ids.cpu(), E, block_m)
    return flops, nbytes, valid, padded


def predict(lab, args) -> None:
    name, peak, bw = PREDICT
    print(f"predicted for {name}: {peak / 1e12:.0f} TFLOP/s dense bf16, {bw / 1e12:.2f} TB/s; "
          f"Mixtral experts d={D}, f={F}, E={E}, top-{K}, bf16, ReLU expert (2 GEMMs)")
    print(f"{'tokens':>6} {'GFLOP':>8} {'weights+act MB':>15} {'FLOP/byte':>10} {'floor us':>9}  bound       rows valid -> computed (block 16 / 64)")
    for tokens in SHAPES:
        ids, _ = routing(tokens)
        flops, nbytes, v, p16 = cost(lab, ids, 16)
        _, _, _, p64 = cost(lab, ids, 64)
        t = max(flops / peak, nbytes / bw)
        bound = "compute" if flops / peak > nbytes / bw else "bandwidth"
        print(f"{tokens:>6} {flops / 1e9:8.1f} {nbytes / 1e6:15.1f} {flops / nbytes:10.1f} {t * 1e6:9.1f}  {bound:<10}  {v} -> {p16} / {p64}")
    print("floor = max(FLOPs / peak, bytes / bandwidth). Decode reads nearly every expert's weights to do little math;"
          " the prefill is compute-bound and padding is a small fraction there.")


def torch_loop(x, w1, w2, ids, w):
    import torch
    T, k = ids.shape
    flat = ids.reshape(-1)
    order = torch.argsort(flat, stable=True)
    counts = torch.bincount(flat, minlength=w1.shape[0]).tolist()
    xs = x[order // k]
    ys, start = [], 0
    for e, c in enumerate(counts):
        if c:
            ys.append(torch.relu(xs[start:start + c] @ w1[e]) @ w2[e])
        start += c
    y = torch.empty_like(xs)
    y[order] = torch.cat(ys)
    return (y.view(T, k, -1) * w.to(x.dtype).unsqueeze(-1)).sum(1)


def measure(lab, args) -> int:
    import torch
    from triton.testing import do_bench

    dev, found = device_peak(need_flops=True)
    if found is None:
        return 2
    peak, bw, ref = found.dense_bf16_flops, found.hbm_bytes_per_s, found.reference
    print(f"device: {dev}; {ref}")
    g = torch.Generator(device="cuda").manual_seed(0)
    w1 = (torch.randn(E, D, F, device="cuda", generator=g) / D ** 0.5).to(torch.bfloat16)
    w2 = (torch.randn(E, F, D, device="cuda", generator=g) / F ** 0.5).to(torch.bfloat16)
    print(f"{'tokens':>6} {'loop us':>9} {'grouped us':>11} {'speedup':>8} {'TFLOP/s':>8} {'% peak':>7} {'GB/s':>7} {'% HBM':>6}  best config")
    for tokens in SHAPES:
        x = torch.randn(tokens, D, device="cuda", generator=g).to(torch.bfloat16)
        ids, w = routing(tokens, "cuda")
        ref_out = torch_loop(x, w1, w2, ids, w).float()
        t_loop = do_bench(partial(torch_loop, x, w1, w2, ids, w)) * 1e-3
        best = None
        for cfg in lab.GPU_CONFIGS:
            try:
                out = lab.grouped_moe_forward(x, w1, w2, ids, w, *cfg).float()
            except Exception as exc:
                print(f"  config {cfg} failed: {type(exc).__name__}")
                continue
            if ((out - ref_out).abs().max() / ref_out.abs().max()).item() > 2e-2:
                print(f"  config {cfg}: wrong result; not timed")
                continue
            t = do_bench(partial(lab.grouped_moe_forward, x, w1, w2, ids, w, *cfg)) * 1e-3
            if best is None or t < best[0]:
                best = (t, cfg)
        if best is None:
            print(f"{tokens:>6}: no config produced a correct result")
            return 1
        t, cfg = best
        flops, nbytes, _, _ = cost(lab, ids, cfg[0])
        print(f"{tokens:>6} {t_loop * 1e6:9.1f} {t * 1e6:11.1f} {t_loop / t:7.2f}x {flops / t / 1e12:8.1f}"
              f" {100 * flops / t / peak:6.1f}% {nbytes / t / 1e9:7.0f} {100 * nbytes / t / bw:5.1f}%  {cfg}")
    return 0


if __name__ == "__main__":
    sys.exit(bench_main(__file__, __doc__, measure, predict))
