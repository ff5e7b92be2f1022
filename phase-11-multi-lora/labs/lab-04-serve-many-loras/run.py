"""Lab 11-04 on a GPU box: throughput of the real vLLM 0.22.1 against max_loras, many adapters at once.

One base model, N adapter ids, a queue of requests spread round-robin over the adapters plus some
base requests, all submitted in ONE ``LLM.generate`` call. For each ``max_loras`` in the sweep the
script builds a fresh ``LLM(enable_lora=True, max_loras=...)``, generates, and prints the wall
time, output tokens per second, the throughput relative to the fastest ``max_loras``, and this
lab's prediction (``min_steps`` rounds, ``throughput_ratio``), which assumes every step costs the
same however many requests it holds: compare where the measurement departs from it.

Needs a CUDA GPU, ``pip install vllm==0.22.1`` and the weights (the Llama-2 base is gated on the
Hub: accept its licence and ``hf auth login`` first)::

    hf download meta-llama/Llama-2-7b-hf
    hf download yard1/llama-2-7b-sql-lora-test       # a real LoRA for that base (q/k/v/o, r=8)
    python phase-11-multi-lora/labs/lab-04-serve-many-loras/run.py --adapter yard1/llama-2-7b-sql-lora-test

``--adapter`` may be given several times (any LoRAs trained on the same base); the N adapter ids
cycle over them. Ids that share a checkpoint are still distinct adapters to the engine: each takes
its own slot and its own load, which is what the sweep measures. Each ``max_loras`` runs in a
child process of its own, so one engine's GPU memory is gone before the next starts. ``--impl
starter`` makes the predictions with your starter.py.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time


def measure_one(args, max_loras: int) -> dict:
    """One fresh engine at ``max_loras``: warm up, then time one generate over the whole queue."""
    from huggingface_hub import snapshot_download
    from vllm import LLM, SamplingParams  # imported here so --help works without a GPU
    from vllm.lora.request import LoRARequest

    paths = [snapshot_download(a) for a in args.adapter]
    queue = make_queue(args)
    prompts = [f"Request {i}: write one sentence about the number {i}." for i in range(len(queue))]
    handles = {a: LoRARequest(f"adapter-{a}", a, paths[(a - 1) % len(paths)]) for a in set(queue) if a is not None}
    llm = LLM(model=args.model, enable_lora=True, max_loras=max_loras, max_lora_rank=args.max_lora_rank,
              gpu_memory_utilization=args.gpu_memory_utilization, seed=0)
    llm.generate(prompts[:2], SamplingParams(max_tokens=4), lora_request=[handles[1], None], use_tqdm=False)
    params = SamplingParams(max_tokens=args.max_tokens, temperature=0.0, ignore_eos=True)
    start = time.perf_counter()
    outs = llm.generate(prompts, params, lora_request=[None if a is None else handles[a] for a in queue], use_tqdm=False)
    seconds = time.perf_counter() - start
    tokens = sum(len(o.outputs[0].token_ids) for o in outs)
    return {"max_loras": max_loras, "seconds": seconds, "tokens": tokens}


def make_queue(args) -> list[int | None]:
    ids = [1 + (i % args.num_adapters) for i in range(args.num_adapters * args.per_adapter)]
    return ids + [None] * args.base_requests


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="meta-llama/Llama-2-7b-hf")
    ap.add_argument("--adapter", action="append", default=None, help="HF repo id or local path of a LoRA (repeatable)")
    ap.add_argument("--num-adapters", type=int, default=8, help="distinct adapter ids in the queue")
    ap.add_argument("--per-adapter", type=int, default=16, help="requests per adapter id")
    ap.add_argument("--base-requests", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--sweep", default="1,2,4,8", help="max_loras values, comma-separated")
    ap.add_argument("--max-lora-rank", type=int, default=16)
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.85)
    ap.add_argument("--impl", default=None, choices=["solution", "starter"])
    ap.add_argument("--one", type=int, default=None, help=argparse.SUPPRESS)   # child: measure one max_loras
    args = ap.parse_args()
    args.adapter = args.adapter or ["yard1/llama-2-7b-sql-lora-test"]

    if args.one is not None:
        print("RESULT " + json.dumps(measure_one(args, args.one)), flush=True)
        return

    from course.runtime import this_lab

    lab = this_lab(__file__, args.impl)
    queue = make_queue(args)
    sweep = [int(m) for m in args.sweep.split(",")]
    print(f"model {args.model}; {args.num_adapters} adapter ids over {len(args.adapter)} checkpoint(s); "
          f"{len(queue)} requests ({args.base_requests} base), max_tokens={args.max_tokens}")
    results = []
    for m in sweep:   # one child process per engine: a finished engine's GPU memory goes with its process
        argv = [a for a in sys.argv[1:] if a != "--one"] + ["--one", str(m)]
        proc = subprocess.run([sys.executable, __file__, *argv], capture_output=True, text=True, check=False)
        found = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
        if proc.returncode != 0 or not found:
            print(f"max_loras={m}: the engine failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
            sys.exit(1)
        r = json.loads(found[-1][len("RESULT "):])
        results.append((m, r["seconds"], r["tokens"] / r["seconds"]))
    best = max(r[2] for r in results)
    print(f"{'max_loras':>9} {'seconds':>8} {'tok/s':>8} {'measured':>9} {'rounds':>7} {'predicted':>10}")
    for m, seconds, tps in results:
        print(f"{m:>9} {seconds:8.2f} {tps:8.0f} {tps / best:8.2f}x {lab.min_steps(queue, m):>7} "
              f"{lab.throughput_ratio(queue, m):9.2f}x")
    print("predicted = 1 / rounds (every step costs the same). A step with more requests costs a little more, so the")
    print("measured drop is smaller than predicted; more slots also cost memory (max_loras x max_lora_rank buffers).")


if __name__ == "__main__":
    main()
