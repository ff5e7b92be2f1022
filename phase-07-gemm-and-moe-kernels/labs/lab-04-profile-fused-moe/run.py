"""Lab 07-04 on the real engine: profile vLLM 0.22.1 serving a small MoE model (needs a GPU + vllm).

    python phase-07-gemm-and-moe-kernels/labs/lab-04-profile-fused-moe/run.py
    python .../run.py --model Qwen/Qwen1.5-MoE-A2.7B --batch 8 --max-tokens 32 --enforce-eager

What it does (write your predicted shares down before you run it):

1. builds ``vllm.LLM`` for the model with ``gpu_memory_utilization=0.6``, ``max_model_len=1024``;
2. warms up: 4 copies of "warmup", ``max_tokens=8`` (absorbs compilation, CUDA-graph capture,
   Triton autotuning and cache effects, none of which belong in the profile);
3. profiles, with ``torch.profiler`` and ``ProfilerActivity.CUDA`` (+ CPU with ``--cpu``), one
   ``generate`` of ``--batch`` copies of "Explain MoE in one line:" at ``temperature=0``;
4. prints the profiler's table sorted by ``cuda_time_total`` (15 rows), then buckets every
   kernel by name into the rows the lab asks about and prints each bucket's share of GPU time.

The engine core must run in this process for the profiler to see its kernels, so the script sets
``VLLM_ENABLE_V1_MULTIPROCESSING=0`` before importing vLLM. With CUDA graphs on (the default) the
kernels are still recorded, but ``--enforce-eager`` gives a cleaner one-launch-per-op picture.
Kernel names drift between versions and GPUs; anchor on the structure (one big grouped GEMM per
MoE projection, one align/sort pass, one tiny gate GEMM), not on exact names. The gate is a plain
dense GEMM, so it lands in "other GEMMs" together with the attention projections.
"""

from __future__ import annotations

import argparse
import os
import re

# Kernel-name patterns -> bucket (first match wins).
BUCKETS = [
    ("fused MoE grouped GEMM", r"fused_moe_kernel|fused_moe|moe_gemm|grouped_gemm|cutlass.*moe|marlin_moe"),
    ("align / permute / sort", r"moe_align|align_block|permute|sort|count_and_sort|moe_sum"),
    ("router top-k / softmax", r"topk_softmax|topk|gating"),
    ("attention", r"flash|attn|attention|fmha|paged"),
    ("activation (SiLU and mul)", r"silu|act_and_mul|swiglu|gelu"),
    ("norm / residual", r"rms_norm|layernorm|layer_norm|fused_add"),
    ("other GEMMs (qkv, o, gate, lm_head)", r"gemm|sm90|sm80|nvjet|cutlass|xmma|ampere|hopper|cublas"),
    ("all-to-all / communication", r"nccl|all_to_all|alltoall|deep_ep|dispatch|combine"),
]


def bucket_of(name: str) -> str:
    low = name.lower()
    for label, pattern in BUCKETS:
        if re.search(pattern, low):
            return label
    return "other"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="Qwen/Qwen1.5-MoE-A2.7B", help="any small MoE checkpoint")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--max-model-len", type=int, default=1024)
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.6)
    ap.add_argument("--enforce-eager", action="store_true", help="no CUDA graphs: one launch per op")
    ap.add_argument("--cpu", action="store_true", help="also record CPU activity (launch overhead)")
    ap.add_argument("--trace", help="also write a Chrome trace to this path (open in Perfetto)")
    args = ap.parse_args()

    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")   # engine core in this process
    import torch
    from torch.profiler import ProfilerActivity, profile
    from vllm import LLM, SamplingParams

    if not torch.cuda.is_available():
        raise SystemExit("run.py needs a CUDA GPU; the CPU path of this lab is solution.py / test_lab.py")
    llm = LLM(model=args.model, gpu_memory_utilization=args.gpu_memory_utilization,
              max_model_len=args.max_model_len, enforce_eager=args.enforce_eager, seed=0)
    llm.generate(["warmup"] * 4, SamplingParams(max_tokens=8), use_tqdm=False)
    torch.cuda.synchronize()

    activities = [ProfilerActivity.CUDA] + ([ProfilerActivity.CPU] if args.cpu else [])
    params = SamplingParams(max_tokens=args.max_tokens, temperature=0.0)
    with profile(activities=activities) as prof:
        llm.generate(["Explain MoE in one line:"] * args.batch, params, use_tqdm=False)
        torch.cuda.synchronize()

    print(f"device: {torch.cuda.get_device_name()}  model: {args.model}  batch {args.batch}, "
          f"{args.max_tokens} tokens, {'eager' if args.enforce_eager else 'CUDA graphs'}")
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=15))

    totals: dict[str, float] = {}
    for ev in prof.key_averages():
        t = getattr(ev, "self_device_time_total", None)
        if t is None:
            t = getattr(ev, "self_cuda_time_total", 0.0)
        if t and ev.device_type is not None and "cuda" in str(ev.device_type).lower():
            totals[bucket_of(ev.key)] = totals.get(bucket_of(ev.key), 0.0) + t
    grand = sum(totals.values()) or 1.0
    print("share of GPU kernel time by bucket:")
    for label, t in sorted(totals.items(), key=lambda kv: -kv[1]):
        print(f"  {label:<38} {t / grand:6.1%}  ({t / 1e3:.2f} ms)")
    if args.cpu:
        cpu = sum(ev.self_cpu_time_total for ev in prof.key_averages())
        print(f"CPU time {cpu / 1e3:.1f} ms vs GPU kernel time {grand / 1e3:.1f} ms"
              f" (CPU >> GPU at small batch means launch-bound: Phase 05's CUDA graphs)")
    if args.trace:
        prof.export_chrome_trace(args.trace)
        print(f"trace written to {args.trace}")


if __name__ == "__main__":
    main()
