"""Lab 09-04 on a GPU box: parallel sampling n = 1..8 with a real model and the real vLLM 0.22.1.

One long prompt, ``SamplingParams(n=n, temperature=1.0, seed=10)``, for n = 1, 2, 4, 8 (or
``--ns``). Before each n the prefix cache is reset, so every run starts cold. For each n it prints
vLLM's own prefix-cache counters (``vllm:prefix_cache_queries`` / ``_hits``, the increase over the
run), the hit rate this lab predicts (``predict_counters`` from your ``solution.py`` or
``starter.py``, on the real token ids and the engine's real block size), generated tokens per
second, and whether the n samples differ. Ends with the control: the largest n with prefix caching
off (``--no-prefix-caching``), where nothing is looked up.

Needs a CUDA GPU, ``pip install vllm==0.22.1`` and the weights:

    hf download Qwen/Qwen2.5-0.5B-Instruct
    python phase-09-sampling-and-decoding-algorithms/labs/lab-04-parallel-sampling/run.py
    python phase-09-sampling-and-decoding-algorithms/labs/lab-04-parallel-sampling/run.py --no-prefix-caching
"""

from __future__ import annotations

import argparse
import time

from course.runtime.bench import this_lab


def counters(llm) -> tuple[int, int]:
    got = {"vllm:prefix_cache_queries": 0, "vllm:prefix_cache_hits": 0}
    for m in llm.get_metrics():
        if m.name in got:
            got[m.name] += int(m.value)
    return got["vllm:prefix_cache_queries"], got["vllm:prefix_cache_hits"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="Qwen/Qwen2.5-0.5B-Instruct")
    ap.add_argument("--ns", default="1,2,4,8", help="comma-separated values of n")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--prompt-repeats", type=int, default=60, help="copies of the context sentence (~12 tokens each)")
    ap.add_argument("--no-prefix-caching", action="store_true", help="the control arm")
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.6)
    ap.add_argument("--impl", default=None, help="solution (default) or starter: whose predict_counters to print")
    args = ap.parse_args()

    from vllm import LLM, SamplingParams  # imported here so --help works without a GPU

    lab = this_lab(__file__, args.impl)
    caching = not args.no_prefix_caching
    llm = LLM(model=args.model, enable_prefix_caching=caching, gpu_memory_utilization=args.gpu_memory_utilization,
              disable_log_stats=False, seed=0)
    block_size = llm.llm_engine.vllm_config.cache_config.block_size
    context = "The report lists every shipment, its weight, its route and the day it arrived. " * args.prompt_repeats
    prompt_ids = llm.get_tokenizer().encode(context + "\nSummarise the report in one sentence:")
    p = len(prompt_ids)
    print(f"model {args.model}; prompt {p} tokens; block_size {block_size}; prefix caching {'ON' if caching else 'OFF'}; "
          f"max_tokens {args.max_tokens}")
    print(f"{'n':>2} {'queries':>8} {'hits':>7} {'hit rate':>8} {'predicted':>9} {'gen tok/s':>10} {'distinct':>8}")
    for n in [int(x) for x in args.ns.split(",")]:
        llm.reset_prefix_cache()
        q0, h0 = counters(llm)
        params = SamplingParams(n=n, temperature=1.0, seed=10, max_tokens=args.max_tokens, ignore_eos=True)
        start = time.perf_counter()
        (out,) = llm.generate([{"prompt_token_ids": prompt_ids}], params, use_tqdm=False)
        elapsed = time.perf_counter() - start
        q1, h1 = counters(llm)
        q, h = q1 - q0, h1 - h0
        pq, ph = lab.predict_counters(p, n, block_size) if caching else (0, 0)
        generated = sum(len(c.token_ids) for c in out.outputs)
        distinct = len({tuple(c.token_ids) for c in out.outputs})
        print(f"{n:>2} {q:>8} {h:>7} {h / max(q, 1):>8.2%} {ph / max(pq, 1):>9.2%} {generated / elapsed:>10,.0f} "
              f"{distinct:>5}/{n}")
    print("hit rate: vLLM's counters over the run; predicted: predict_counters(prompt, n, block_size) from the lab. "
          "Timings include the first run's warm-up: compare n against n, not against another GPU.")


if __name__ == "__main__":
    main()
