"""Lab 10-04 on a 2-GPU box: the real vLLM 0.22.1 at tensor_parallel_size=1 and 2, side by side.

Needs two CUDA GPUs, ``pip install vllm==0.22.1`` (in its own environment) and a small Llama,
``hf download TinyLlama/TinyLlama-1.1B-Chat-v1.0`` (2.2 GB in bf16). Never run by the test suite.
Each TP size runs in a child process (this file with ``--child``), so the GPUs are free again
between them. The script prints:

* the greedy tokens at TP=1 and TP=2 and whether they agree (they should, token for token, apart
  from rare last-bit flips: the all-reduce adds the two halves in a different order than one GPU);
* per-token decode latency at each TP size: ``(t(max_tokens) - t(1)) / (max_tokens - 1)``;
* with ``--count-collectives`` (eager mode: CUDA graphs replay without calling Python, so nothing
  could be counted), the collectives each worker issued, next to ``predict_generate_collectives``
  from this lab (``LAB_IMPL=starter`` checks yours);
* the predicted wire time of one decode step on each link of lab 02 (``predicted_comm_s``).

    python phase-10-distributed-inference/labs/lab-04-two-way-tp/run.py
    python phase-10-distributed-inference/labs/lab-04-two-way-tp/run.py --count-collectives
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
PROMPT = "Distributed inference means"


def child(args: argparse.Namespace) -> None:
    from vllm import LLM, SamplingParams

    llm = LLM(model=args.model, tensor_parallel_size=args.tp, gpu_memory_utilization=args.gpu_memory_utilization,
              max_model_len=args.max_model_len, enforce_eager=args.count_collectives, seed=0)
    counter = None
    if args.count_collectives and args.tp > 1:
        from course.runtime import engine_jobs as counter  # wraps each worker's TP communicator

        llm.collective_rpc(counter._count_tp_collectives)

    def timed(max_tokens: int):
        params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
        start = time.perf_counter()
        out = llm.generate([PROMPT], params, use_tqdm=False)[0]
        return time.perf_counter() - start, out

    timed(4)  # warm-up
    if counter is not None:
        llm.collective_rpc(counter._take_tp_collectives)
    _, out = timed(args.max_tokens)
    collectives = llm.collective_rpc(counter._take_tp_collectives) if counter is not None else None
    first = min(timed(1)[0] for _ in range(3))
    full = min(timed(args.max_tokens)[0] for _ in range(3))
    hf = llm.llm_engine.model_config.hf_config
    print("RESULT " + json.dumps({
        "tokens": list(out.outputs[0].token_ids), "text": out.outputs[0].text,
        "prompt_len": len(out.prompt_token_ids),
        "per_token_s": (full - first) / (args.max_tokens - 1), "first_token_s": first,
        "collectives": collectives,
        "num_layers": hf.num_hidden_layers, "hidden": hf.hidden_size, "vocab_size": hf.vocab_size,
        "dtype_bytes": llm.llm_engine.model_config.dtype.itemsize,
    }), flush=True)


def run_child(args: argparse.Namespace, tp: int) -> dict:
    argv = [sys.executable, __file__, "--child", "--tp", str(tp), "--model", args.model,
            "--max-tokens", str(args.max_tokens), "--max-model-len", str(args.max_model_len),
            "--gpu-memory-utilization", str(args.gpu_memory_utilization)]
    if args.count_collectives:
        argv.append("--count-collectives")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    if args.count_collectives:
        # LLM.collective_rpc with a function: with the engine core in its own process (the default) the
        # function would go through vLLM's msgpack encoder, which refuses functions unless
        # VLLM_ALLOW_INSECURE_SERIALIZATION=1. In-process, the core hands it straight to the executor,
        # which cloudpickles it to the TP workers (the tier-2 engine job does the same).
        env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    proc = subprocess.run(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, check=False)
    results = [line[7:] for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    if proc.returncode != 0 or not results:
        sys.exit(f"TP={tp} failed (exit {proc.returncode}):\n{proc.stdout[-4000:]}")
    print(f"TP={tp}: " + "; ".join(line for line in proc.stdout.splitlines() if "Worker_TP" in line and
                                    "Model loading took" in line)[:400])
    return json.loads(results[-1])


def parent(args: argparse.Namespace) -> None:
    import torch

    if torch.cuda.device_count() < 2:
        sys.exit(f"run.py needs 2 CUDA GPUs, this box has {torch.cuda.device_count()}; on a CPU run the tests "
                 f"(pytest -m engine runs the same comparison on two CPU workers)")
    sys.path.insert(0, str(ROOT))
    from course.runtime.bench import this_lab

    lab = this_lab(__file__, args.impl)
    res = {tp: run_child(args, tp) for tp in (1, 2)}
    one, two = res[1], res[2]
    print(f"\nmodel {args.model}, prompt {PROMPT!r} ({one['prompt_len']} tokens), {args.max_tokens} greedy tokens")
    print(f"TP=1 text: {one['text']!r}")
    print(f"TP=2 text: {two['text']!r}")
    same = sum(a == b for a, b in zip(one["tokens"], two["tokens"]))
    print(f"tokens equal: {one['tokens'] == two['tokens']} ({same}/{len(one['tokens'])} positions agree)")
    for tp in (1, 2):
        print(f"TP={tp}: first token {res[tp]['first_token_s'] * 1e3:7.2f} ms, "
              f"per decode token {res[tp]['per_token_s'] * 1e3:6.2f} ms (measured)")
    print(f"speed-up per token: {one['per_token_s'] / two['per_token_s']:.2f}x (2x would mean free communication)")

    shape = {k: two[k] for k in ("num_layers", "hidden", "vocab_size")}
    steps = lab.predict_generate_collectives([two["prompt_len"]], args.max_tokens, tp_size=2,
                                             dtype_bytes=two["dtype_bytes"], **shape)
    if two["collectives"] is not None:
        want = sum(s.all_reduces + s.all_gathers for s in steps)
        for rank, log in enumerate(two["collectives"]):
            print(f"rank {rank}: {len(log)} collectives counted, {want} predicted by your predict_generate_collectives")
    decode = steps[-1]
    print(f"\npredicted, not measured — one decode step at TP=2: {decode.all_reduces} all-reduces of "
          f"{decode.all_reduce_bytes} B, ring cost 2(n-1)/n x bytes / bandwidth + 2(n-1) x latency each")
    for link in lab.LAB02.LINKS.values():
        print(f"  {link.name:<26} {lab.predicted_comm_s(decode, 2, link) * 1e6:8.1f} us per step")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="TinyLlama/TinyLlama-1.1B-Chat-v1.0")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--max-model-len", type=int, default=1024)
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.6)
    ap.add_argument("--count-collectives", action="store_true", help="eager mode; count each worker's collectives")
    ap.add_argument("--impl", default=os.environ.get("LAB_IMPL", "solution") or "solution",
                    choices=["solution", "starter"])
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--tp", type=int, default=1, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.max_tokens < 2:
        ap.error("--max-tokens must be at least 2 (per-token latency needs a decode step)")
    (child if args.child else parent)(args)


if __name__ == "__main__":
    main()
