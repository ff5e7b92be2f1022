"""Benchmark the lab's fused M-RoPE kernel against vLLM's ``MRotaryEmbedding.forward_cuda``.

On a CUDA machine:   python phase-13-multimodal-models/labs/lab-04-triton-mrope/bench.py
                     (--impl starter benchmarks your starter.py)
Anywhere, no GPU:    python phase-13-multimodal-models/labs/lab-04-triton-mrope/bench.py --predict
                     prints the bytes each path moves and the time they take at the datasheet bandwidth
                     (a floor, not a measurement).

Shapes are Qwen2-VL-7B's attention (28 query heads, 4 kv heads, head_size = rotary_dim = 128,
mrope_section [16, 24, 24]) in bf16, at a decode batch, a prefill and a long multimodal prefill.
The baseline is vLLM 0.22.1's CUDA path: gather ``cos_sin_cache[positions]`` into a (3, T, 128)
tensor, make cos and sin contiguous, then ``_triton_mrope_forward`` (four launches). The lab's
kernel gathers cos and sin from the cache inside the kernel (one launch). Both are bandwidth-bound:
RoPE does a handful of FLOPs per byte.
"""

from __future__ import annotations

import sys
from functools import partial

from course.runtime.bench import bench_main, device_bandwidth

PREDICT = ("H100 SXM", 3.35e12)
NQ, NKV, HS, RD, SECTION = 28, 4, 128, 128, [16, 24, 24]
SHAPES = [256, 4096, 16384]     # tokens per step
ELEM = 2                        # bf16


def vllm_bytes(tokens: int, elem: int = ELEM) -> int:
    """vLLM's path: the rotation (as the lab counts it), the (3, T, RD) gather written and read back by the
    contiguous copies of cos and sin, those copies written, and the kernel reading one stream per frequency."""
    rotate = 2 * tokens * (NQ + NKV) * RD * elem
    gather = 3 * tokens * 8 + 3 * tokens * RD * elem * 2           # positions + cache rows read, (3, T, RD) written
    copies = 3 * tokens * RD * elem * 2                            # cos and sin views read, contiguous copies written
    kernel = tokens * RD * elem                                    # masked loads: one stream per frequency
    return rotate + gather + copies + kernel


def predict(lab, args) -> None:
    name, bw = PREDICT
    print(f"predicted for {name}: {bw / 1e12:.2f} TB/s HBM; Qwen2-VL-7B attention ({NQ} q heads, {NKV} kv heads, "
          f"head_size {HS}, rotary_dim {RD}), bf16")
    print(f"{'tokens':>7} {'fused MB':>9} {'vLLM MB':>8} {'fused floor us':>15} {'vLLM floor us':>14} {'byte ratio':>11}")
    for t in SHAPES:
        ours, theirs = lab.mrope_bytes(t, NQ, NKV, RD, ELEM), vllm_bytes(t)
        print(f"{t:>7} {ours / 1e6:9.2f} {theirs / 1e6:8.2f} {ours / bw * 1e6:15.2f} {theirs / bw * 1e6:14.2f} "
              f"{theirs / ours:10.2f}x")
    print("floor = bytes / bandwidth. Fused: 2·T·(nq + nkv)·rd·2 B (read + write q, k) + 24·T (positions) + T·rd·2 "
          "(cos, sin).")
    print("vLLM adds the (3, T, rd) gather and the cos/sin copies, 12·T·rd·2 B, and three more launches (a few us each),")
    print("which dominate at small T. Predicted, not measured: run without --predict on a GPU.")


def measure(lab, args) -> int:
    import torch
    from triton.testing import do_bench
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.model_executor.layers.rotary_embedding.mrope import MRotaryEmbedding

    bw = device_bandwidth()
    if bw is None:
        return 2
    with set_current_vllm_config(VllmConfig()):
        rope = MRotaryEmbedding(HS, RD, 32768, 1e6, True, torch.bfloat16, mrope_section=SECTION).cuda()
    cache = rope.cos_sin_cache.to(torch.bfloat16)
    g = torch.Generator(device="cuda").manual_seed(0)
    print(f"{'tokens':>7} {'vLLM us':>8} {'fused us':>9} {'speedup':>8} {'GB/s':>7} {'% HBM':>6}")
    for t in SHAPES:
        pos = torch.randint(0, 32768, (3, t), device="cuda", generator=g)
        q = torch.randn(t, NQ * HS, device="cuda", generator=g, dtype=torch.bfloat16)
        k = torch.randn(t, NKV * HS, device="cuda", generator=g, dtype=torch.bfloat16)
        want_q, want_k = rope.forward_cuda(pos, q.clone(), k.clone())
        got_q, got_k = lab.mrope_forward(pos, q.clone(), k.clone(), cache, HS, RD, SECTION)
        err = max(((got_q - want_q).abs().max() / want_q.abs().max()).item(),
                  ((got_k - want_k).abs().max() / want_k.abs().max()).item())
        if err > 2e-2:      # bf16: both round, at different points (vLLM computes in bf16, the lab in fp32)
            print(f"{t:>7}: result differs from vLLM's by {err:.1e} of the largest value; not timed")
            return 1
        qa, ka = q.clone(), k.clone()     # both rotate in place: timing repeats the rotation, which costs the same
        t_vllm = do_bench(partial(rope.forward_cuda, pos, qa, ka)) * 1e-3
        t_ours = do_bench(partial(lab.mrope_forward, pos, qa, ka, cache, HS, RD, SECTION)) * 1e-3
        nbytes = lab.mrope_bytes(t, NQ, NKV, RD, ELEM)
        print(f"{t:>7} {t_vllm * 1e6:8.1f} {t_ours * 1e6:9.1f} {t_vllm / t_ours:7.2f}x {nbytes / t_ours / 1e9:7.0f} "
              f"{100 * nbytes / t_ours / bw:5.1f}%")
    return 0


if __name__ == "__main__":
    sys.exit(bench_main(__file__, __doc__, measure, predict))
