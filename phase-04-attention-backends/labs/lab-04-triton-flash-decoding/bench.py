"""Benchmark split-KV (flash-decoding) against a single-pass paged decode kernel.

On a CUDA machine:   python phase-04-attention-backends/labs/lab-04-triton-flash-decoding/bench.py
                     (--impl starter benchmarks your starter.py instead of solution.py)
Anywhere, no GPU:    python phase-04-attention-backends/labs/lab-04-triton-flash-decoding/bench.py --predict
                     prints the bytes each shape must move, the grid each kernel launches, and the
                     time those bytes take at the device's datasheet peak (a lower bound, not a measurement).

Decode attention is bandwidth-bound, so the figure of merit is achieved bytes/s as a fraction of the
HBM peak. Bytes = K and V rows once + q/out + block-table entries + (S > 1) the fp32 partials
written and read back (`decode_bytes` in solution.py).

The baseline is Phase 02 lab 06's single-pass kernel (`paged_decode_attention`, one program per
sequence and KV head) when that lab is present; otherwise this lab's own kernel run with S = 1
(one program per sequence and query head, no merge). The output says which one ran.
"""

from __future__ import annotations

import sys
from functools import partial
from pathlib import Path

from course.runtime import use_lab
from course.runtime.bench import bench_main, device_peak

HERE = Path(__file__).resolve().parent

PREDICT_DEVICE = ("H100 SXM", 3.35e12, 132)   # name, peak bytes/s (H100 datasheet), SMs (H100 SXM5: 132, NVIDIA H100 architecture whitepaper)

# Llama-3.1-8B attention: 32 query heads, 8 KV heads, head_dim 128; fp16 cache, block_size 16.
H, H_KV, D, BLOCK, ELEM = 32, 8, 128, 16, 2
SHAPES = [(1, 8192), (1, 32768), (1, 131072), (4, 32768), (64, 4096)]   # (batch, seq_len)



def predict(lab, args) -> None:
    name, peak, sms = PREDICT_DEVICE
    print(f"predicted for {name}: {peak / 1e12:.2f} TB/s peak, {sms} SMs; Llama-3.1-8B attention "
          f"(H={H}, H_kv={H_KV}, D={D}), fp16, block_size={BLOCK}")
    print(f"{'batch':>5} {'seq_len':>7} {'blocks/seq':>10} {'S':>3} {'KV MB':>8} {'bytes (split)':>14} "
          f"{'ideal us':>9} {'1-pass grid B*H_kv':>19} {'split grid B*H*S':>17}")
    for batch, seq in SHAPES:
        s = lab.choose_num_splits(batch, H, seq, sms)
        nbytes = lab.decode_bytes([seq] * batch, H, H_KV, D, ELEM, s, BLOCK)
        kv_mb = 2 * batch * seq * H_KV * D * ELEM / 1e6
        print(f"{batch:5d} {seq:7d} {-(-seq // BLOCK):10d} {s:3d} {kv_mb:8.1f} {nbytes:14,d} "
              f"{nbytes / peak * 1e6:9.1f} {batch * H_KV:19d} {batch * H * s:17d}")
    print("ideal us = bytes / peak: the floor any kernel can reach. A kernel whose grid covers only a "
          "fraction of the SMs cannot pull the full bandwidth, which is what splitting fixes.")


def baseline(lab):
    """(label, fn) for the single-pass comparison kernel."""
    try:
        fn = use_lab("phase-02/lab-06-triton-paged-attn").paged_decode_attention
        return "Phase 02 lab 06 paged_decode_attention (single pass, grid B x H_kv)", fn
    except (ImportError, AttributeError, FileNotFoundError) as exc:
        print(f"(could not load Phase 02 lab 06: {exc}; using the fallback)")

    def single_pass(q, k, v, tables, lens):
        return lab.flash_decode(q, k, v, tables, lens, 1)
    return "FALLBACK: this lab's kernel with S=1 (single pass, grid B x H, no merge)", single_pass


def measure(lab, args) -> int:
    import torch
    from triton.testing import do_bench

    dev, found = device_peak(need_flops=False)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    if found is None:
        return 2
    peak, ref = found.hbm_bytes_per_s, found.reference
    label, base_fn = baseline(lab)
    print(f"device: {dev}, {sms} SMs; peak {peak / 1e12:.2f} TB/s ({ref})")
    print(f"baseline: {label}")
    print(f"{'batch':>5} {'seq_len':>7} {'S':>3} {'split us':>9} {'GB/s':>7} {'% peak':>7} "
          f"{'base us':>8} {'% peak':>7} {'speedup':>8}")
    g = torch.Generator(device="cuda").manual_seed(0)
    for batch, seq in SHAPES:
        nblk = -(-seq // BLOCK)
        tables = torch.randperm(batch * nblk, device="cuda", generator=g).view(batch, nblk).to(torch.int32)
        lens = torch.full((batch,), seq, dtype=torch.int32, device="cuda")
        q = torch.randn(batch, H, D, device="cuda", dtype=torch.float16, generator=g)
        k = torch.randn(batch * nblk, BLOCK, H_KV, D, device="cuda", dtype=torch.float16, generator=g)
        v = torch.randn_like(k)
        s = lab.choose_num_splits(batch, H, seq, sms)
        out = lab.flash_decode(q, k, v, tables, lens, s)
        ref_out = base_fn(q, k, v, tables, lens)
        err = (out.float() - ref_out.float()).abs().max().item()
        if err > 1e-2:
            print(f"  batch={batch} seq={seq}: split and baseline disagree by {err:.2e}; not timing")
            continue
        t_split = do_bench(partial(lab.flash_decode, q, k, v, tables, lens, s)) * 1e-3
        t_base = do_bench(partial(base_fn, q, k, v, tables, lens)) * 1e-3
        b_split = lab.decode_bytes([seq] * batch, H, H_KV, D, ELEM, s, BLOCK)
        b_base = lab.decode_bytes([seq] * batch, H, H_KV, D, ELEM, 1, BLOCK)
        print(f"{batch:5d} {seq:7d} {s:3d} {t_split * 1e6:9.1f} {b_split / t_split / 1e9:7.0f} "
              f"{100 * b_split / t_split / peak:6.1f}% {t_base * 1e6:8.1f} {100 * b_base / t_base / peak:6.1f}% "
              f"{t_base / t_split:7.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(bench_main(__file__, __doc__, measure, predict))
