"""Lab 03-05 on the real engine: vLLM 0.22.1 with and without CUDA graphs (needs a GPU + vllm).

    python phase-05-cuda-graphs-and-torch-compile/labs/lab-05-graph-vs-eager-real/run.py
    python .../run.py --modes eager default compile-only graphs-only --batches 1 8 64

Each mode runs in its own child process (a fresh engine and a clean GPU), generates
``--max-tokens`` tokens for ``batch`` copies of one prompt with greedy sampling, and prints
``mode=<m> batch=<b>: <tok/s> tok/s``. The modes:

* ``eager``        ``enforce_eager=True``: no torch.compile, no CUDA graphs;
* ``default``      the V1 default: VLLM_COMPILE + FULL_AND_PIECEWISE graphs;
* ``compile-only`` ``cudagraph_mode=NONE``: compiled kernels, every kernel launched one by one;
* ``graphs-only``  compilation off, ``cudagraph_mode=FULL_DECODE_ONLY``: graphs without compile.

``eager`` vs ``default`` bundles both effects; ``compile-only`` vs ``default`` isolates the
graphs. Watch the start-up log for the "Capturing CUDA graphs (...)" bars and the
"Graph capturing finished in N secs, took X GiB" line.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time

MODES = {
    "eager": {"enforce_eager": True},
    "default": {},
    "compile-only": {"compilation_config": {"cudagraph_mode": "NONE"}},
    "graphs-only": {"compilation_config": {"mode": 0, "cudagraph_mode": "FULL_DECODE_ONLY"}},
}


def child(args: argparse.Namespace) -> None:
    from vllm import LLM, SamplingParams

    llm = LLM(model=args.model, gpu_memory_utilization=args.gpu_memory_utilization,
              max_model_len=args.max_model_len, seed=0, **MODES[args.mode])
    params = SamplingParams(max_tokens=args.max_tokens, temperature=0.0, ignore_eos=True)
    llm.generate(["warm up"] * max(args.batches), params, use_tqdm=False)
    for b in args.batches:
        prompts = [args.prompt] * b
        t0 = time.perf_counter()
        outs = llm.generate(prompts, params, use_tqdm=False)
        dt = time.perf_counter() - t0
        n = sum(len(o.outputs[0].token_ids) for o in outs)
        print(f"mode={args.mode} batch={b}: {n / dt:.1f} tok/s", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="facebook/opt-125m")
    ap.add_argument("--modes", nargs="+", default=["eager", "default"], choices=list(MODES))
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8, 64])
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--max-model-len", type=int, default=512)
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.5)
    ap.add_argument("--prompt", default="The meaning of life is")
    ap.add_argument("--mode", help=argparse.SUPPRESS)  # set in the child process
    args = ap.parse_args()
    if args.mode:
        child(args)
        return
    for mode in args.modes:
        cmd = [sys.executable, __file__, "--mode", mode, "--model", args.model,
               "--max-tokens", str(args.max_tokens), "--max-model-len", str(args.max_model_len),
               "--gpu-memory-utilization", str(args.gpu_memory_utilization), "--prompt", args.prompt,
               "--batches", *map(str, args.batches)]
        subprocess.run(cmd, check=True)


if __name__ == "__main__":
    main()
