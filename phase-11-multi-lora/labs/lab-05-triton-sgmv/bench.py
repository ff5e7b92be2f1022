"""Benchmark the lab's SGMV shrink + expand against vLLM's own Triton LoRA kernels.

On a CUDA machine:   python phase-11-multi-lora/labs/lab-05-triton-sgmv/bench.py
                     (--impl starter benchmarks your starter.py)
Anywhere, no GPU:    python phase-11-multi-lora/labs/lab-05-triton-sgmv/bench.py --predict
                     prints bytes, FLOPs and the time they take at the datasheet peaks (a floor).

Shape: one LoRA-wrapped 4096 x 4096 projection (Llama-3-8B's o_proj), rank 16, bf16 weights,
8 slots all occupied, rows dealt round-robin to the base and the 8 adapters (1 row in 9 on the base).
Both sides run shrink into a float32 buffer, then expand added into y (vLLM's add_lora_linear
for one slice). The kernels are bandwidth-bound: bytes = x read + the active adapters' A and B
+ the float32 buffer written and read + y read and written; FLOPs = 4 · (adapter rows) · H · R.
"""

from __future__ import annotations

import sys
from functools import partial

from course.runtime.bench import bench_main, device_bandwidth

PREDICT = ("H100 SXM", 989e12, 3.35e12)
H, R, SLOTS = 4096, 16, 8
SHAPES = [16, 256, 4096]        # tokens in the batch: decode, mixed, prefill


def cost(tokens: int, elem: int = 2) -> tuple[int, int]:
    """(FLOPs, bytes) of shrink + expand for ``tokens`` rows, 1 in 9 on the base (``slots_for``)."""
    lora_rows = tokens - -(-tokens // (SLOTS + 1))
    active = min(SLOTS, lora_rows)
    flops = 4 * lora_rows * H * R
    nbytes = (tokens * H * elem                     # x
              + active * 2 * R * H * elem           # A and B of each adapter with rows
              + 2 * tokens * R * 4                  # the float32 shrink buffer, written then read
              + 2 * lora_rows * H * elem)           # y rows read and written by the expand
    return flops, nbytes


def slots_for(tokens: int, device="cpu"):
    import torch
    s = torch.arange(tokens, device=device) % (SLOTS + 1) - 1        # -1, 0, 1, ..., 7, -1, ...
    return s.to(torch.int32)


def predict(lab, args) -> None:
    name, peak, bw = PREDICT
    print(f"predicted for {name}: {bw / 1e12:.2f} TB/s HBM, {peak / 1e12:.0f} TFLOP/s dense bf16; "
          f"H={H}, rank {R}, {SLOTS} slots, bf16")
    print(f"{'tokens':>6} {'MFLOP':>8} {'MB moved':>9} {'FLOP/byte':>10} {'floor us':>9}  bound")
    for tokens in SHAPES:
        flops, nbytes = cost(tokens)
        t = max(flops / peak, nbytes / bw)
        bound = "compute" if flops / peak > nbytes / bw else "bandwidth"
        print(f"{tokens:>6} {flops / 1e6:8.1f} {nbytes / 1e6:9.2f} {flops / nbytes:10.2f} {t * 1e6:9.2f}  {bound}")
    print("floor = max(FLOPs / peak, bytes / bandwidth). At a few FLOPs per byte both kernels are bandwidth-bound")
    print("at every batch: compare the fraction of HBM bandwidth reached, and the ratio to vLLM.")


def vllm_pair(x, a, b, y, meta_args, buf, fresh=False):
    """vLLM's shrink then expand into y (into a copy of y when ``fresh``, as the timed calls do)."""
    from vllm.lora.ops.triton_ops.lora_expand_op import _lora_expand
    from vllm.lora.ops.triton_ops.lora_shrink_op import _lora_shrink
    y = y.clone() if fresh else y
    _lora_shrink(x, [a], buf, *meta_args, 1.0)
    _lora_expand(buf, [b], y, *meta_args, offset_start=0, add_inputs=True)


def lab_pair(lab, x, a, b, y, meta, shrink_cfg, expand_cfg, fresh=False):
    y = y.clone() if fresh else y
    bm, bn, bk, w = shrink_cfg
    s = lab.lora_shrink(x, a, meta, 1.0, block_m=bm, block_n=bn, block_k=bk, num_warps=w)
    bm, bn, bk, w = expand_cfg
    lab.lora_expand(s, b, meta, y, add_inputs=True, block_m=bm, block_n=bn, block_k=bk, num_warps=w)


def measure(lab, args) -> int:
    import torch
    from triton.testing import do_bench
    from vllm.lora.ops.triton_ops import LoRAKernelMeta

    bw = device_bandwidth()
    if bw is None:
        return 2
    g = torch.Generator(device="cuda").manual_seed(0)
    a = (torch.randn(SLOTS, R, H, device="cuda", generator=g) / H ** 0.5).to(torch.bfloat16)
    b = (torch.randn(SLOTS, H, R, device="cuda", generator=g) / R ** 0.5).to(torch.bfloat16)
    print(f"{'tokens':>6} {'vLLM us':>8} {'lab us':>8} {'vLLM/lab':>9} {'lab GB/s':>9} {'% HBM':>6}  best configs")
    for tokens in SHAPES:
        x = torch.randn(tokens, H, device="cuda", generator=g).to(torch.bfloat16)
        y0 = torch.randn(tokens, H, device="cuda", generator=g).to(torch.bfloat16)
        slots = slots_for(tokens, "cuda")
        vmeta = LoRAKernelMeta.make(max_loras=SLOTS, max_num_tokens=tokens, device="cuda")
        vmeta.prepare_tensors(slots)
        vargs = vmeta.meta_args(tokens, specialize_active_lora=False)
        buf = torch.zeros(1, tokens, R, dtype=torch.float32, device="cuda")
        ref = y0.clone()
        vllm_pair(x, a, b, ref, vargs, buf)
        t_vllm = do_bench(partial(vllm_pair, x, a, b, y0, vargs, buf, fresh=True)) * 1e-3
        meta = lab.sgmv_metadata(slots, SLOTS)
        best = None
        for sc in lab.GPU_SHRINK_CONFIGS:
            for ec in lab.GPU_EXPAND_CONFIGS:
                y = y0.clone()
                try:
                    lab_pair(lab, x, a, b, y, meta, sc, ec)
                except Exception as exc:
                    print(f"  configs {sc} / {ec} failed: {type(exc).__name__}")
                    continue
                if ((y.float() - ref.float()).abs().max() / ref.float().abs().max()).item() > 2e-2:
                    print(f"  configs {sc} / {ec}: wrong result; not timed")
                    continue
                t = do_bench(partial(lab_pair, lab, x, a, b, y0, meta, sc, ec, fresh=True)) * 1e-3
                if best is None or t < best[0]:
                    best = (t, sc, ec)
        if best is None:
            print(f"{tokens:>6}: no config produced a correct result")
            return 1
        t, sc, ec = best
        _, nbytes = cost(tokens)
        print(f"{tokens:>6} {t_vllm * 1e6:8.1f} {t * 1e6:8.1f} {t_vllm / t:8.2f}x {nbytes / t / 1e9:9.0f}"
              f" {100 * nbytes / t / bw:5.1f}%  {sc} / {ec}")
    print("Both timings include a y0.clone() (the same on both sides). vLLM/lab > 1: the lab's kernels are faster.")
    return 0


if __name__ == "__main__":
    sys.exit(bench_main(__file__, __doc__, measure, predict))
