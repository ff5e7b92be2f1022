"""Benchmark the fused int4 dequant-matmul against an fp16 torch.matmul at decode batch sizes.

On a CUDA machine:   python phase-06-quantization/labs/lab-05-triton-int4-matmul/bench.py
                     (--impl starter benchmarks your starter.py instead of solution.py)
Anywhere, no GPU:    python phase-06-quantization/labs/lab-05-triton-int4-matmul/bench.py --predict
                     prints the bytes each shape must move and the roofline time and speedup they
                     predict on the device's datasheet peaks (a bound, not a measurement).

Decode multiplies a few activation rows by a large weight matrix, so both kernels are limited by
how fast the weight streams out of HBM. The figure of merit is achieved bytes/s as a fraction of the
HBM peak, with bytes = weight (fp16: 2 B per weight; int4: 0.5 B + one fp16 scale per group) +
x + y (`matmul_bytes` in solution.py). The baseline is `x @ W.T` in fp16 with W already dequantized
(cuBLAS through torch.matmul); the predicted speedup is the roofline ratio of the two.
"""

from __future__ import annotations

import sys
from pathlib import Path

from course.runtime import use_lab
from course.runtime.bench import bench_main, device_peak
from course.runtime.devices import lookup

HERE = Path(__file__).resolve().parent

PREDICT_DEVICE = "NVIDIA H100 80GB HBM3"   # torch.cuda.get_device_name() of an H100 SXM
# The citation --predict prints (pinned in README.md); the figures themselves come from course/runtime/devices.py.
PREDICT_REF = "NVIDIA H100 Tensor Core GPU datasheet, H100 SXM (3.35 TB/s HBM3, 1,979 TFLOP/s sparse)"

# Llama-3-8B's projections (N = out_features, K = in_features), int4 weights with group 128.
LAYERS = [("o_proj", 4096, 4096), ("gate_up_proj", 28672, 4096), ("down_proj", 4096, 14336)]
BATCHES = [1, 4, 16, 64, 256]
GROUP = 128
CONFIGS = [(32, 128, 4), (64, 128, 4), (128, 128, 4), (64, 64, 4), (128, 128, 8)]   # (block_n, block_k, warps)



def predict(lab, args) -> None:
    peak = lookup(PREDICT_DEVICE)
    bw, flops, ref = peak.hbm_bytes_per_s, peak.dense_bf16_flops, PREDICT_REF
    print(f"predicted for {peak.label}: {bw / 1e12:.2f} TB/s, {flops / 1e12:.0f} TFLOP/s dense fp16 ({ref})")
    print(f"Llama-3-8B projections, int4 g{GROUP} vs fp16; time = max(bytes / bandwidth, 2*M*N*K / peak)")
    print(f"{'layer':<13} {'N x K':>12} {'M':>4} {'fp16 MB':>8} {'int4 MB':>8} {'fp16 us':>8} {'int4 us':>8} {'speedup':>8}")
    for name, n, k in LAYERS:
        for m in BATCHES:
            t16 = lab.predicted_time(m, n, k, "fp16", bw, flops, GROUP)
            t4 = lab.predicted_time(m, n, k, "int4", bw, flops, GROUP)
            print(f"{name:<13} {f'{n}x{k}':>12} {m:>4} {lab.matmul_bytes(m, n, k, 'fp16', GROUP) / 1e6:>8.2f} "
                  f"{lab.matmul_bytes(m, n, k, 'int4', GROUP) / 1e6:>8.2f} {t16 * 1e6:>8.1f} {t4 * 1e6:>8.1f} "
                  f"{t16 / t4:>7.2f}x")
    print("These times assume 100% of the HBM peak; real kernels land below it, and the measured run")
    print("(no --predict, on a GPU) reports how far below in its %peak columns.")


def measure(lab, args) -> int:
    import numpy as np
    import torch
    from triton.testing import do_bench

    dev, found = device_peak(need_flops=True)
    if found is None:
        return 2
    bw, flops, ref = found.hbm_bytes_per_s, found.dense_bf16_flops, found.reference
    lab03 = use_lab("phase-06/lab-02-int4-groups-and-packing")
    print(f"device: {dev}; peak {bw / 1e12:.2f} TB/s, {flops / 1e12:.0f} TFLOP/s dense fp16 ({ref})")
    print("baseline: torch.matmul(x, W.T) in fp16 (cuBLAS), W = the same int4 weights dequantized")
    print(f"{'layer':<13} {'M':>4} {'config':>11} {'int4 us':>8} {'GB/s':>6} {'%peak':>6} "
          f"{'fp16 us':>8} {'%peak':>6} {'speedup':>8} {'predicted':>9}")
    for name, n, k in LAYERS:
        packed, scales = lab.random_int4_weight(n, k, GROUP, seed=0, device="cuda")
        q = lab03.unpack_int4(packed.cpu().numpy()).astype(np.float32)
        w = torch.from_numpy(lab03.dequantize_grouped(q, scales.cpu().numpy(), GROUP)).to("cuda", torch.float16)
        for m in BATCHES:
            x = torch.randn(m, k, device="cuda", dtype=torch.float16)
            ref_y = x @ w.T
            best = None
            for bn, bk, warps in CONFIGS:
                y = lab.int4_matmul(x, packed, scales, GROUP, block_n=bn, block_k=bk, num_warps=warps)
                rel = ((y.float() - ref_y.float()).norm() / ref_y.float().norm()).item()
                if rel > 2e-3:
                    print(f"  {name} M={m} config {(bn, bk, warps)}: wrong result (rel err {rel:.1e}); skipped")
                    continue
                t = do_bench(lambda x=x, p=packed, s=scales, bn=bn, bk=bk, nw=warps:
                             lab.int4_matmul(x, p, s, GROUP, block_n=bn, block_k=bk, num_warps=nw)) * 1e-3
                if best is None or t < best[0]:
                    best = (t, (bn, bk, warps))
            if best is None:
                continue
            t4, cfg = best
            t16 = do_bench(lambda x=x, w=w: x @ w.T) * 1e-3
            b4 = lab.matmul_bytes(m, n, k, "int4", GROUP)
            b16 = lab.matmul_bytes(m, n, k, "fp16", GROUP)
            print(f"{name:<13} {m:>4} {cfg!s:>11} {t4 * 1e6:>8.1f} {b4 / t4 / 1e9:>6.0f} {100 * b4 / t4 / bw:>5.1f}% "
                  f"{t16 * 1e6:>8.1f} {100 * b16 / t16 / bw:>5.1f}% {t16 / t4:>7.2f}x "
                  f"{lab.predicted_speedup(m, n, k, bw, flops, GROUP):>8.2f}x")
    print("speedup = fp16 time / int4 time (measured); predicted = the roofline ratio on this device's peaks.")
    return 0


if __name__ == "__main__":
    sys.exit(bench_main(__file__, __doc__, measure, predict))
