"""Benchmark the lab's Gumbel-max sampler against vLLM's ``gumbel_sample`` and ``torch.multinomial``.

On a CUDA machine:   python phase-09-sampling-and-decoding-algorithms/labs/lab-05-triton-sampling/bench.py
                     (--impl starter benchmarks your starter.py)
Anywhere, no GPU:    python phase-09-sampling-and-decoding-algorithms/labs/lab-05-triton-sampling/bench.py --predict
                     prints the bytes each shape must read and the time that takes at the datasheet bandwidth
                     (a floor, not a measurement).

Shape: a decode batch of 256 rows over Llama 3's 128,256-token vocabulary, fp32 logits, every row
sampling at temperature 1 with its own seed. The sampler reads each logit once and writes one
token per row, so bytes = B·V·4 (the outputs are noise) and the kernel is bandwidth-bound:
achieved bandwidth = B·V·4 / time, reported as a fraction of the device's HBM peak. Baselines,
timed in the same run: vLLM 0.22.1's model-runner-v2 ``gumbel_sample`` (the same algorithm and RNG,
a two-stage reduction over blocks of 1024) and ``torch.multinomial(softmax(logits / T))``.
"""

from __future__ import annotations

import sys
from functools import partial

from course.runtime.bench import bench_main, device_bandwidth

PREDICT = ("H100 SXM", 3.35e12)
SHAPES = [(256, 128256), (32, 128256), (256, 32000)]


def predict(lab, args) -> None:
    name, bw = PREDICT
    print(f"predicted for {name} ({bw / 1e12:.2f} TB/s HBM): bytes = B x V x 4 (fp32 logits read once)")
    print(f"{'batch':>5} {'vocab':>7} {'MB read':>8} {'floor us':>9}")
    for b, v in SHAPES:
        nbytes = b * v * 4
        print(f"{b:>5} {v:>7} {nbytes / 1e6:8.1f} {nbytes / bw * 1e6:9.1f}")
    print("floor = bytes / bandwidth. One program per row: at batch 32 only 32 of the GPU's SMs have work, so expect "
          "that row to sit far from the floor; vLLM's kernel splits each row into blocks of 1024 (B x V/1024 programs).")


def measure(lab, args) -> int:
    import torch
    from triton.testing import do_bench
    from vllm.v1.worker.gpu.sample.gumbel import gumbel_sample as vllm_gumbel_sample

    bw = device_bandwidth()
    if bw is None:
        return 2
    print(f"{'batch':>5} {'vocab':>7} {'lab us':>8} {'% HBM':>6} {'vLLM us':>8} {'vLLM/lab':>8} "
          f"{'multinomial us':>14} {'mult/lab':>8}  same tokens as vLLM")
    for b, v in SHAPES:
        g = torch.Generator(device="cuda").manual_seed(0)
        logits = torch.randn(b, v, device="cuda", generator=g)
        temp = torch.ones(b, device="cuda")
        seeds = torch.arange(b, device="cuda", dtype=torch.int64) + 1000
        pos = torch.full((b,), 7, device="cuda", dtype=torch.int64)
        mapping = torch.arange(b, device="cuda", dtype=torch.int32)
        ours = lab.gumbel_sample(logits, temp, seeds, pos)
        theirs = vllm_gumbel_sample(logits, mapping, temp, seeds, pos, apply_temperature=True)
        same = int((ours == theirs).sum())
        t_lab = do_bench(partial(lab.gumbel_sample, logits, temp, seeds, pos)) * 1e-3
        t_vllm = do_bench(partial(vllm_gumbel_sample, logits, mapping, temp, seeds, pos, apply_temperature=True)) * 1e-3

        def multinomial(x=logits, t=temp):
            return torch.multinomial(torch.softmax(x / t[:, None], dim=-1), 1)

        t_mult = do_bench(multinomial) * 1e-3
        nbytes = b * v * 4
        print(f"{b:>5} {v:>7} {t_lab * 1e6:8.1f} {100 * nbytes / t_lab / bw:5.1f}% {t_vllm * 1e6:8.1f} "
              f"{t_vllm / t_lab:7.2f}x {t_mult * 1e6:14.1f} {t_mult / t_lab:7.2f}x  {same}/{b}")
    return 0


if __name__ == "__main__":
    sys.exit(bench_main(__file__, __doc__, measure, predict))
