"""Benchmark the lab's Triton GEMM against torch.matmul (cuBLAS) at 4096^3 in bf16.

On a CUDA machine:   python phase-07-gemm-and-moe-kernels/labs/lab-05-triton-tiled-gemm/bench.py
                     (--impl starter benchmarks your starter.py; --shapes 4096,4096,4096 8192,8192,8192 ...)
Anywhere, no GPU:    python phase-07-gemm-and-moe-kernels/labs/lab-05-triton-tiled-gemm/bench.py --predict
                     prints the FLOPs, the time they take at the datasheet peak, and what the
                     tile-traffic model says about HBM (a prediction, not a measurement).

A GEMM of this size is compute-bound, so the figure of merit is achieved TFLOP/s = 2·M·N·K / time,
reported as a fraction of the device's dense bf16 tensor-core peak, plus the ratio against
torch.matmul on the same shape. The lab's target is a ratio of at least 0.80. The kernel is tried
with every row of GPU_CONFIGS (a hand-rolled autotune) and the fastest config is reported.
"""

from __future__ import annotations

import math
import sys
from functools import partial
from pathlib import Path

from course.runtime.bench import bench_main, device_peak

HERE = Path(__file__).resolve().parent

PREDICT = ("H100 SXM", 989e12, 3.35e12, 132)   # name, peak FLOP/s, HBM B/s, SMs (NVIDIA H100 datasheet)
TARGET = 0.80                                   # the lab's goal: >= 80 % of torch.matmul
PREDICT_TILES = [(128, 128), (128, 256), (256, 128)]   # the tile shapes of GPU_CONFIGS' big configs



def predict(lab, args) -> None:
    name, peak, bw, sms = PREDICT
    print(f"predicted for {name}: {peak / 1e12:.0f} TFLOP/s dense bf16, {bw / 1e12:.2f} TB/s HBM, {sms} SMs")
    for M, N, K in parse_shapes(args):
        flops = lab.gemm_flops(M, N, K)
        ideal = flops / peak
        operands = 2 * (M * K + K * N + M * N)
        print(f"{M}x{N}x{K} bf16: {flops / 1e9:.1f} GFLOP -> at least {ideal * 1e3:.3f} ms at peak;"
              f" operands {operands / 1e6:.1f} MB ({flops / operands:.0f} FLOP/byte if each is read once)")
        for bm, bn in PREDICT_TILES:
            loads = M * K * math.ceil(N / bn) + K * N * math.ceil(M / bm)   # lab 02's tiled_traffic
            tiles = math.ceil(M / bm) * math.ceil(N / bn)
            ra = sum(lab.panels_in_wave(M, N, bm, bn, 1, sms))
            gr = sum(lab.panels_in_wave(M, N, bm, bn, 8, sms))
            print(f"  tile {bm}x{bn}: {tiles} programs = {tiles / sms:.1f} waves of {sms};"
                  f" panels re-read from HBM if L2 kept nothing: {2 * loads / 1e9:.2f} GB = {2 * loads / bw * 1e3:.2f} ms;"
                  f" panels per wave {ra} (row-major) vs {gr} (GROUP_M=8)")
    print(f"target: Triton kernel time <= torch.matmul time / {TARGET:.2f} (>= {TARGET:.0%} of cuBLAS)")


def measure(lab, args) -> int:
    import torch
    from triton.testing import do_bench

    dev, found = device_peak(need_flops=True)
    if found is None:
        return 2
    peak, ref = found.dense_bf16_flops, found.reference
    print(f"device: {dev}; peak {peak / 1e12:.0f} TFLOP/s dense bf16 ({ref})")
    print(f"{'shape':>16} {'torch ms':>9} {'TFLOP/s':>8} {'% peak':>7} | {'triton ms':>9} {'TFLOP/s':>8} {'% peak':>7}"
          f" {'vs torch':>9}  best config (BM, BN, BK, GROUP_M, warps, stages)")
    g = torch.Generator(device="cuda").manual_seed(0)
    status = 0
    for M, N, K in parse_shapes(args):
        a = torch.randn(M, K, device="cuda", generator=g).to(torch.bfloat16)
        b = torch.randn(K, N, device="cuda", generator=g).to(torch.bfloat16)
        ref_c = torch.matmul(a, b)
        t_torch = do_bench(partial(torch.matmul, a, b)) * 1e-3
        best = None
        for cfg in lab.GPU_CONFIGS:
            try:
                c = lab.matmul(a, b, *cfg)
            except Exception as exc:  # a config can exceed shared memory on smaller GPUs
                print(f"  config {cfg} failed: {type(exc).__name__}")
                continue
            err = ((c.float() - ref_c.float()).abs().max() / ref_c.float().abs().max()).item()
            if err > 1e-2:
                print(f"  config {cfg}: wrong result (max error {err:.2e} of the largest output); not timed")
                continue
            t = do_bench(partial(lab.matmul, a, b, *cfg)) * 1e-3
            if best is None or t < best[0]:
                best = (t, cfg)
        flops = lab.gemm_flops(M, N, K)
        shape = f"{M}x{N}x{K}"
        if best is None:
            print(f"{shape:>16}: no config produced a correct result")
            status = 1
            continue
        t, cfg = best
        print(f"{shape:>16} {t_torch * 1e3:9.3f} {flops / t_torch / 1e12:8.0f} {100 * flops / t_torch / peak:6.1f}% |"
              f" {t * 1e3:9.3f} {flops / t / 1e12:8.0f} {100 * flops / t / peak:6.1f}% {t_torch / t:8.2f}x  {cfg}")
        verdict = "meets" if t_torch / t >= TARGET else "is below"
        print(f"{'':>16} the Triton kernel {verdict} the {TARGET:.0%}-of-torch.matmul target")
    return status


def parse_shapes(args) -> list[tuple[int, ...]]:
    return [tuple(int(v) for v in s.split(",")) for s in args.shapes]


def add_shapes(ap) -> None:
    ap.add_argument("--shapes", nargs="+", default=["4096,4096,4096"], help="M,N,K triples")


if __name__ == "__main__":
    sys.exit(bench_main(__file__, __doc__, measure, predict, add_arguments=add_shapes))
