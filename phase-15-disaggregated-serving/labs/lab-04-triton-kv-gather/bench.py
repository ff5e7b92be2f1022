"""Benchmark the KV gather kernel against torch indexing (one gather per layer, then a stack).

On a CUDA machine:     python phase-15-disaggregated-serving/labs/lab-04-triton-kv-gather/bench.py
    (--impl starter or LAB_IMPL=starter benchmarks your starter.py instead of solution.py)
Anywhere, no GPU:      python phase-15-disaggregated-serving/labs/lab-04-triton-kv-gather/bench.py --predict
    prints the bytes each shape moves and the time that takes at each device's datasheet peak.

A gather is pure data movement: every selected row is read once and written once, so
    kernel bytes   = 2 (read + write) x layers x 2 (K, V) x tokens x hidden x dtype_bytes
    baseline bytes = the same gather per layer, plus the stack: read + write the rows again (2x)
and the figure of merit is achieved bytes/s as a fraction of the HBM peak.
"""

from __future__ import annotations

import sys

from course.runtime.bench import bench_main
from course.runtime.devices import lookup

PREDICT_DEVICES = ["NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB", "NVIDIA L4"]
# (layers, tokens) of a Llama-3-8B request (8 KV heads x 128 dims = 1,024 values a row), fp16,
# scattered over a 4,096-block pool of 16-token blocks.
SHAPES = [(32, 512), (32, 2048), (32, 8192)]
HIDDEN, BS, NUM_BLOCKS, DTYPE_BYTES = 1024, 16, 4096, 2


def kernel_bytes(layers: int, tokens: int) -> int:
    return 2 * layers * 2 * tokens * HIDDEN * DTYPE_BYTES


def predict(lab, args) -> None:
    peaks = [lookup(name) for name in PREDICT_DEVICES]
    print("predicted, not measured: time = kernel bytes / datasheet peak bandwidth")
    print("Llama-3-8B request (32 layers, 1,024 values a row, fp16)")
    print(f"{'layers x tokens':>16} {'payload MiB':>12} " + " ".join(f"{p.label + ' us':>15}" for p in peaks))
    for layers, tokens in SHAPES:
        nbytes = kernel_bytes(layers, tokens)
        cols = " ".join(f"{nbytes / p.hbm_bytes_per_s * 1e6:>15.1f}" for p in peaks)
        print(f"{f'{layers} x {tokens}':>16} {nbytes / 2 / 2**20:>12.0f} {cols}")
    print("torch baseline moves 2x the bytes (gather per layer, then the stack copies again):")
    print("  at equal bandwidth efficiency the kernel is predicted to be about 2x faster,")
    print("  more for short requests, where the baseline's 32 launches dominate")
    for p in peaks:
        print(f"  {p.label}: {p.hbm_bytes_per_s / 1e12:.3g} TB/s — {p.reference}")


def measure(lab, args) -> None:
    import torch
    import triton

    name = torch.cuda.get_device_name()
    found = lookup(name)
    peak = found.hbm_bytes_per_s if found else None
    print(
        f"device: {name}"
        + (f"; peak {peak / 1e12:.3g} TB/s — {found.reference}" if found else "; peak unknown")
    )
    print(
        f"{'layers x tokens':>16} {'kernel us':>10} {'GB/s':>8} {'% peak':>7} {'torch us':>9} {'speedup':>8}"
    )
    for layers, tokens in SHAPES:
        g = torch.Generator(device="cuda").manual_seed(0)
        caches = [
            torch.randn(2, NUM_BLOCKS, BS, 8, 128, device="cuda", dtype=torch.float16, generator=g)
            for _ in range(layers)
        ]
        slots = torch.randperm(NUM_BLOCKS * BS, device="cuda", generator=g)[:tokens].to(torch.int64)
        assert torch.equal(lab.gather_kv(caches, slots), lab.gather_kv_torch(caches, slots))
        t_k = triton.testing.do_bench(lambda c=caches, s=slots: lab.gather_kv(c, s))
        t_b = triton.testing.do_bench(lambda c=caches, s=slots: lab.gather_kv_torch(c, s))
        gbs = kernel_bytes(layers, tokens) / (t_k * 1e-3) / 1e9
        pct = f"{100 * gbs * 1e9 / peak:.0f}%" if peak else ""
        print(
            f"{f'{layers} x {tokens}':>16} {t_k * 1e3:>10.1f} {gbs:>8.0f} {pct:>7} {t_b * 1e3:>9.1f} {t_b / t_k:>7.2f}x"
        )


if __name__ == "__main__":
    sys.exit(bench_main(__file__, __doc__, measure, predict))
