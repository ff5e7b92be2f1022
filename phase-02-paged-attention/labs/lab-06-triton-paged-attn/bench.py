"""Benchmark the paged decode kernel against gather + torch scaled_dot_product_attention.

On a CUDA machine:     python phase-02-paged-attention/labs/lab-06-triton-paged-attn/bench.py
    (--impl starter or LAB_IMPL=starter benchmarks your starter.py instead of solution.py)
Anywhere, no GPU:      python phase-02-paged-attention/labs/lab-06-triton-paged-attn/bench.py --predict
    prints the bytes each shape must move and the time that takes at each device's datasheet peak.

Decode attention is bandwidth-bound: every K and V row of every sequence is read once to produce
one token, so the figure of merit is achieved bytes/s as a fraction of the HBM peak:
    kernel bytes = 2 (K and V) x sum(seq_len) x num_kv_heads x head_dim x dtype_bytes
                   + q and out (2 x num_seqs x num_q_heads x head_dim x dtype_bytes) + block tables
The baseline first gathers K/V into a contiguous copy (read + write) and then attention reads the
copy again: at least 3x the KV traffic of the paged kernel.
"""

from __future__ import annotations

import sys

from course.runtime.bench import bench_main
from course.runtime.devices import lookup

# The devices --predict tabulates, by the name torch.cuda.get_device_name() reports for each.
PREDICT_DEVICES = ["NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB", "NVIDIA A10", "NVIDIA L4"]


# (num_seqs, seq_len) for a Llama-3-8B attention layer: 32 query heads, 8 KV heads, head_dim 128,
# block_size 16, fp16.
SHAPES = [(1, 2048), (16, 2048), (64, 2048), (16, 8192)]
HQ, HKV, D, BS, DTYPE_BYTES = 32, 8, 128, 16, 2


def kernel_bytes(num_seqs: int, seq_len: int) -> int:
    kv = 2 * num_seqs * seq_len * HKV * D * DTYPE_BYTES
    q_out = 2 * num_seqs * HQ * D * DTYPE_BYTES
    tables = num_seqs * (-(-seq_len // BS)) * 4
    return kv + q_out + tables


def predict(lab, args) -> None:
    peaks = [lookup(name) for name in PREDICT_DEVICES]
    print("predicted, not measured: time = kernel bytes / datasheet peak bandwidth")
    print("Llama-3-8B layer (32 q heads, 8 KV heads, head_dim 128, block 16, fp16)")
    header = f"{'num_seqs x seq_len':>20} {'kernel MB':>10} " + " ".join(f"{p.label + ' us':>15}" for p in peaks)
    print(header)
    for b, n in SHAPES:
        nbytes = kernel_bytes(b, n)
        cols = " ".join(f"{nbytes / p.hbm_bytes_per_s * 1e6:>15.1f}" for p in peaks)
        print(f"{f'{b} x {n}':>20} {nbytes / 1e6:>10.1f} {cols}")
    print("baseline (gather + SDPA) moves at least 3x the KV bytes (read, write the copy, read it again)")
    print("  -> at equal bandwidth efficiency the paged kernel is predicted to be >= 3x faster")
    for p in peaks:
        print(f"  {p.label}: {p.hbm_bytes_per_s / 1e12:.3g} TB/s — {p.reference}")


def measure(lab, args) -> None:
    import torch
    import torch.nn.functional as F
    import triton

    name = torch.cuda.get_device_name()
    found = lookup(name)
    print(f"device: {name}")
    if found:
        label, peak, ref = found.label, found.hbm_bytes_per_s, found.reference
        print(f"peak: {label} {peak / 1e12:.3g} TB/s — {ref}")
    else:
        peak = None
        print("peak: unknown device, add it to course/runtime/devices.py (bandwidth % column will be blank)")

    def gather_sdpa(q, k_cache, v_cache, tables, seq_len):
        b, nb = tables.shape
        k = k_cache[tables.long()].reshape(b, nb * BS, HKV, D)[:, :seq_len].transpose(1, 2)
        v = v_cache[tables.long()].reshape(b, nb * BS, HKV, D)[:, :seq_len].transpose(1, 2)
        return F.scaled_dot_product_attention(q.unsqueeze(2), k, v, enable_gqa=True).squeeze(2)

    print(f"{'num_seqs x seq_len':>20} {'kernel us':>10} {'GB/s':>8} {'% peak':>7} {'baseline us':>12} {'speedup':>8}")
    for b, n in SHAPES:
        num_blocks = b * (-(-n // BS)) + 1
        q, kc, vc, bt, sl = lab.make_problem(b, HQ, HKV, D, BS, [n] * b, num_blocks=num_blocks,
                                             dtype=torch.float16, device="cuda", seed=0)
        ref = gather_sdpa(q, kc, vc, bt, n)
        got = lab.paged_decode_attention(q, kc, vc, bt, sl)
        err = (got.float() - ref.float()).abs().max().item()
        assert err <= 1e-2, f"kernel disagrees with the baseline by {err:.2e}"
        t_k = triton.testing.do_bench(lambda q=q, kc=kc, vc=vc, bt=bt, sl=sl: lab.paged_decode_attention(q, kc, vc, bt, sl))
        t_b = triton.testing.do_bench(lambda q=q, kc=kc, vc=vc, bt=bt, n=n: gather_sdpa(q, kc, vc, bt, n))
        gbs = kernel_bytes(b, n) / (t_k * 1e-3) / 1e9
        pct = f"{100 * gbs * 1e9 / peak:.0f}%" if peak else ""
        print(f"{f'{b} x {n}':>20} {t_k * 1e3:>10.1f} {gbs:>8.0f} {pct:>7} {t_b * 1e3:>12.1f} {t_b / t_k:>7.2f}x")


if __name__ == "__main__":
    sys.exit(bench_main(__file__, __doc__, measure, predict))
