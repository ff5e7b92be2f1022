"""Benchmark the lab's top-k / top-p kernel against vLLM's Triton kernel and its sort-based PyTorch path.

On a CUDA machine:   python phase-18-performance-engineering/labs/lab-03-triton-top-k-top-p/bench.py
                     (--impl starter benchmarks your starter.py)
Anywhere, no GPU:    python phase-18-performance-engineering/labs/lab-03-triton-top-k-top-p/bench.py --predict
                     prints the bytes each shape moves and the times they take at the datasheet
                     bandwidth (floors, not measurements).

Shape: a decode batch over Llama 3's 128,256-token vocabulary, fp32 logits, each row with its own
k (1..1000) and p (0.1..1.0). The useful traffic is one read and one write of the logits,
2·B·V·4 bytes; "% HBM" is that over the measured time, as a fraction of the device's peak. The
lab's kernel makes about 69 passes over each row (33 + 33 bisection passes, the max, the sum, the
write), so it only nears the floor when a row's passes hit in L2. Baselines, timed in the same
run: vLLM 0.22.1's ``apply_top_k_top_p_triton`` (pivot search, a few passes) and
``apply_top_k_top_p_pytorch`` (a full sort of every row).
"""

from __future__ import annotations

import sys
from functools import partial

from course.runtime.bench import bench_main, device_bandwidth

PREDICT = ("H100 SXM", 3.35e12)
SHAPES = [(256, 128256), (32, 128256), (256, 32000)]
PASSES = 33 + 33 + 2 + 1  # top-k bisection, top-p bisection, max + sum, the write


def predict(lab, args) -> None:
    name, bw = PREDICT
    print(f"predicted for {name} ({bw / 1e12:.2f} TB/s HBM), fp32 logits")
    print(f"{'batch':>5} {'vocab':>7} {'MB in+out':>9} {'floor us':>9} {'69 passes from HBM us':>22}")
    for b, v in SHAPES:
        useful = 2 * b * v * 4
        every_pass = (PASSES * b * v + b * v) * 4
        print(f"{b:>5} {v:>7} {useful / 1e6:9.1f} {useful / bw * 1e6:9.1f} {every_pass / bw * 1e6:22.1f}")
    print(
        "floor = 2·B·V·4 / bandwidth (read once, write once). The right column assumes every pass comes from HBM "
        "(no L2 reuse): the kernel's time should land between the two. One program per row: at batch 32 only 32 "
        "SMs have work, so expect that row far from either figure."
    )


def measure(lab, args) -> int:
    import torch
    from triton.testing import do_bench
    from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_top_p_pytorch
    from vllm.v1.sample.ops.topk_topp_triton import apply_top_k_top_p_triton

    bw = device_bandwidth()
    if bw is None:
        return 2
    print(
        f"{'batch':>5} {'vocab':>7} {'lab us':>8} {'% HBM':>6} {'vLLM triton us':>14} {'vs lab':>7} "
        f"{'vLLM sort us':>12} {'vs lab':>7}  rows with the sort path's mask"
    )
    for b, v in SHAPES:
        g = torch.Generator(device="cuda").manual_seed(0)
        logits = torch.randn(b, v, device="cuda", generator=g) * 3
        k = torch.randint(1, 1001, (b,), device="cuda", generator=g, dtype=torch.int32)
        p = torch.rand(b, device="cuda", generator=g) * 0.9 + 0.1
        mine = lab.apply_top_k_top_p(logits, k, p).isfinite()
        theirs = apply_top_k_top_p_pytorch(logits.clone(), k, p).isfinite()
        same = int((mine == theirs).all(1).sum())
        t_lab = do_bench(partial(lab.apply_top_k_top_p, logits, k, p)) * 1e-3

        def in_place(fn, x=logits, k=k, p=p):
            return fn(x.clone(), k, p)

        t_tri = do_bench(partial(in_place, apply_top_k_top_p_triton)) * 1e-3
        t_sort = do_bench(partial(in_place, apply_top_k_top_p_pytorch)) * 1e-3
        t_clone = do_bench(logits.clone) * 1e-3  # the baselines work in place: their clone is subtracted
        t_tri, t_sort = max(t_tri - t_clone, 1e-9), max(t_sort - t_clone, 1e-9)
        useful = 2 * b * v * 4
        print(
            f"{b:>5} {v:>7} {t_lab * 1e6:8.1f} {100 * useful / t_lab / bw:5.1f}% {t_tri * 1e6:14.1f} "
            f"{t_tri / t_lab:6.2f}x {t_sort * 1e6:12.1f} {t_sort / t_lab:6.2f}x  {same}/{b}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(bench_main(__file__, __doc__, measure, predict))
