"""Lab 06-06 on a GPU box: a real model's prefix-cache hit rate with the real vLLM 0.22.1.

Sixteen prompts share a long system prompt (about 400 tokens) and differ in a short question.
The script generates them in ONE ``LLM.generate`` call, with prefix caching on (default) or off
(``--no-prefix-caching``), and prints:

* the first two outputs (``repr``), so you can check the two runs generate the same text;
* per request: tokens vLLM reports as cached (``RequestOutput.num_cached_tokens``) next to this
  lab's prediction (``predict_prefix_hits`` from ``solution.py``, applied to the real token ids
  and the engine's real block size);
* vLLM's own counters (``vllm:prefix_cache_queries`` / ``vllm:prefix_cache_hits``), the hit rate,
  the prompt tokens actually computed, and wall time.

Needs a CUDA GPU, ``pip install vllm==0.22.1`` and the model, e.g.
``hf download Qwen/Qwen2.5-0.5B-Instruct``. Run it twice and compare:

    python run.py
    python run.py --no-prefix-caching

Add ``VLLM_LOGGING_LEVEL=DEBUG`` to see the engine's periodic "Prefix cache hit rate" log lines.
"""

from __future__ import annotations

import argparse
import importlib.util
import time
from pathlib import Path


def load_predictor():
    """``predict_prefix_hits`` and ``hit_rate`` from this lab's solution.py (no vLLM import there)."""
    path = Path(__file__).resolve().parent / "solution.py"
    spec = importlib.util.spec_from_file_location("lab03_solution", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.predict_prefix_hits, module.hit_rate


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="Qwen/Qwen2.5-0.5B-Instruct")
    ap.add_argument("--num-requests", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--system-repeats", type=int, default=30, help="copies of the system sentence (~13 tokens each)")
    ap.add_argument("--no-prefix-caching", action="store_true", help="the control arm")
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.6)
    ap.add_argument("--max-model-len", type=int, default=4096)
    args = ap.parse_args()

    from vllm import LLM, SamplingParams  # imported here so --help works without a GPU

    predict_prefix_hits, hit_rate = load_predictor()
    caching = not args.no_prefix_caching
    system = "You are a meticulous assistant. Follow instructions carefully. " * args.system_repeats
    prompts = [f"{system}\n\nQuestion {i}: what is {i}+{i}?" for i in range(args.num_requests)]

    llm = LLM(
        model=args.model,
        enable_prefix_caching=caching,
        gpu_memory_utilization=args.gpu_memory_utilization,
        max_model_len=args.max_model_len,
        disable_log_stats=False,  # keep the Prometheus counters we read below
        seed=0,
    )
    tokenizer = llm.get_tokenizer()
    token_ids = [tokenizer.encode(p) for p in prompts]
    block_size = llm.llm_engine.vllm_config.cache_config.block_size
    predicted = predict_prefix_hits(token_ids, block_size) if caching else [0] * len(token_ids)

    params = SamplingParams(max_tokens=args.max_tokens, temperature=0.0)
    start = time.perf_counter()
    outputs = llm.generate([{"prompt_token_ids": ids} for ids in token_ids], params)
    elapsed = time.perf_counter() - start

    print(f"prefix caching: {'ON' if caching else 'OFF'}   model: {args.model}   block_size: {block_size}")
    print(f"prompt lengths: {sorted({len(t) for t in token_ids})} tokens; shared prefix: "
          f"{len(tokenizer.encode(system))} tokens")
    for out in outputs[:2]:
        print(f"  {out.request_id}: {out.outputs[0].text!r}")
    print("\nper request: cached tokens (vLLM) vs predicted")
    mismatches = 0
    for out, pred in zip(outputs, predicted):
        got = out.num_cached_tokens or 0
        mismatches += got != pred
        print(f"  {out.request_id:>4}: {got:>5} vs {pred:>5}{'' if got == pred else '   <-- differs'}")

    metrics = {m.name: m for m in llm.get_metrics()}
    queries = int(metrics["vllm:prefix_cache_queries"].value) if "vllm:prefix_cache_queries" in metrics else 0
    hits = int(metrics["vllm:prefix_cache_hits"].value) if "vllm:prefix_cache_hits" in metrics else 0
    prompt_tokens = sum(len(t) for t in token_ids)
    computed = prompt_tokens - sum((o.num_cached_tokens or 0) for o in outputs)
    print(f"\nvLLM counters: queries {queries}, hits {hits}, hit rate {hit_rate(queries, hits):.2%}")
    print(f"predicted:     queries {prompt_tokens if caching else 0}, hits {sum(predicted)}, "
          f"hit rate {hit_rate(prompt_tokens if caching else 0, sum(predicted)):.2%}")
    print(f"prompt tokens: {prompt_tokens} submitted, {computed} computed "
          f"({prompt_tokens / max(computed, 1):.1f}x fewer than submitted)")
    print(f"wall time for generate(): {elapsed:.2f} s ({computed / elapsed:,.0f} computed prompt tokens/s)")
    print(f"requests whose cached count differs from the prediction: {mismatches}")


if __name__ == "__main__":
    main()
