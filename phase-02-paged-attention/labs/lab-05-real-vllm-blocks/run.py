"""Lab 02.05 on a GPU box: start the real vLLM 0.22.1, read its KV-capacity lines, check them
against your arithmetic, and watch prefix caching share blocks among identical prompts.

Needs a CUDA GPU and `pip install vllm==0.22.1` (plus the model download, e.g.
`hf download facebook/opt-125m`). Never run by the test suite.

    python phase-02-paged-attention/labs/lab-05-real-vllm-blocks/run.py
    python phase-02-paged-attention/labs/lab-05-real-vllm-blocks/run.py --gpu-memory-utilization 0.9
    python phase-02-paged-attention/labs/lab-05-real-vllm-blocks/run.py --max-model-len 1024
    LAB_IMPL=starter python .../run.py        # check YOUR starter.py's arithmetic and parser

The engine runs in a child process (this same file with --child) so that every log line, including
those printed by vLLM's engine-core process, lands in one captured stream that we parse.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
SYSTEM = (
    "You are a careful assistant for a travel company. Answer in one short sentence, name the "
    "country and the city, avoid speculation, never invent facts, and prefer the official name "
    "of a place. If a question is ambiguous, pick the most common reading and say so briefly. "
    "Keep a friendly, plain tone and do not use lists, tables or markdown of any kind. "
)
QUESTION = "Question: what is the capital of France? Answer:"


def child(args: argparse.Namespace) -> None:
    from vllm import LLM, SamplingParams

    llm = LLM(model=args.model, gpu_memory_utilization=args.gpu_memory_utilization,
              max_model_len=args.max_model_len, enable_prefix_caching=True, disable_log_stats=False,
              seed=0)
    prompts = [SYSTEM + QUESTION] * args.num_prompts
    outs = llm.generate(prompts, SamplingParams(max_tokens=args.max_tokens, temperature=0.0))
    counters = {m.name: getattr(m, "value", None) for m in llm.get_metrics()}
    engine = llm.llm_engine
    mc, pc = engine.model_config, engine.vllm_config.parallel_config
    print("RESULT " + json.dumps({
        "text": outs[0].outputs[0].text,
        "prompt_len": len(outs[0].prompt_token_ids),
        "block_size": engine.vllm_config.cache_config.block_size,
        "num_layers": mc.get_num_layers(pc),
        "num_kv_heads": mc.get_num_kv_heads(pc),
        "head_dim": mc.get_head_size(),
        "dtype_bytes": mc.dtype.itemsize,
        "queries": counters.get("vllm:prefix_cache_queries"),
        "hits": counters.get("vllm:prefix_cache_hits"),
    }), flush=True)


def parent(args: argparse.Namespace) -> None:
    from course.runtime.bench import this_lab

    lab = this_lab(__file__)
    cmd = [sys.executable, __file__, "--child", "--model", args.model,
           "--gpu-memory-utilization", str(args.gpu_memory_utilization),
           "--max-model-len", str(args.max_model_len), "--num-prompts", str(args.num_prompts),
           "--max-tokens", str(args.max_tokens)]
    env = dict(os.environ, VLLM_LOGGING_LEVEL="INFO", PYTHONUNBUFFERED="1")
    proc = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, check=False)
    log = proc.stdout
    if args.show_log:
        print(log)
    if proc.returncode != 0:
        print(log[-4000:])
        sys.exit(f"the engine exited with {proc.returncode}")
    result = json.loads(next(line for line in log.splitlines() if line.startswith("RESULT "))[7:])

    facts = lab.parse_startup_log(log)
    for line in log.splitlines():
        if any(key in line for key in ("Available KV cache memory", "GPU KV cache size", "Maximum concurrency")):
            print("log  |", line.strip())
    bs = result["block_size"]
    shape = lab.ModelShape(args.model, result["num_layers"], result["num_kv_heads"], result["head_dim"],
                           dtype_bytes=result["dtype_bytes"])
    num_blocks = facts["kv_cache_tokens"] // bs
    per_block = lab.bytes_per_block(shape, bs)
    print(f"model: {shape}")
    print(f"KV per token {lab.kv_bytes_per_token(shape):,} B; per {bs}-token block {per_block:,} B")
    print(f"blocks = {facts['kv_cache_tokens']:,} tokens / {bs} = {num_blocks:,}; "
          f"they occupy {num_blocks * per_block / 2**30:.2f} GiB")
    if facts["available_gib"] is not None:
        predicted = lab.predict_num_blocks(shape, int(facts["available_gib"] * 2**30), bs)
        print(f"your predict_num_blocks from the logged {facts['available_gib']} GiB: {predicted:,} "
              f"(the log rounds GiB to 2 decimals, so expect a small difference)")
    print(f"your max_concurrency: {lab.max_concurrency(num_blocks, bs, facts['max_model_len']):.2f}x "
          f"(logged {facts['max_concurrency']:.2f}x)")
    print(f"first output: {result['text']!r}")
    if result["queries"]:
        rate = result["hits"] / result["queries"]
        print(f"prefix cache: {result['hits']} hits / {result['queries']} queries = {100 * rate:.1f}% "
              f"(your predicted_hit_rate for {args.num_prompts} x {result['prompt_len']} tokens: "
              f"{100 * lab.predicted_hit_rate(args.num_prompts, result['prompt_len'], bs):.1f}%)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="facebook/opt-125m")
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.5)
    ap.add_argument("--max-model-len", type=int, default=2048)
    ap.add_argument("--num-prompts", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--show-log", action="store_true", help="print the engine's whole log")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    child(args) if args.child else parent(args)


if __name__ == "__main__":
    main()
