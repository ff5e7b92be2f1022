"""Lab 08-04 on a GPU box: EAGLE speculative decoding with the real vLLM 0.22.1, read back through lab 03.

Runs the same greedy prompts twice, once plain and once with an EAGLE draft head, and prints for
each: the wall time of ``generate`` and the inter-token latency (ITL, elapsed / tokens per
stream), whether the two runs produced the same tokens, and for the EAGLE run vLLM's own
spec-decode counters (``LLM.get_metrics()``) read and reconciled by this lab's ``report``:
mean acceptance length, draft acceptance rate, per-position acceptance, the α lab 03 fits to
them, and the speedup lab 03 predicts at a draft cost ``--draft-cost`` (c).

Needs a CUDA GPU with ~24 GB free, ``pip install vllm==0.22.1`` and the two checkpoints (gated
Llama: accept its licence on Hugging Face first). The names are defaults, yours to change; an
EAGLE head is trained for one target and only fits that one::

    hf download meta-llama/Llama-3.1-8B-Instruct
    hf download yuhuili/EAGLE-LLaMA3.1-Instruct-8B
    python run.py                                  # one stream, k = 5
    python run.py --prompt code --k 3              # a code prompt, fewer drafts
    python run.py --batch 32                       # many streams: watch the speedup shrink
    python run.py --method eagle3 --draft yuhuili/EAGLE3-LLaMA3.1-Instruct-8B

Greedy outputs of the two runs should match; on a GPU a handful of tokens can differ, because the
verify pass batches k + 1 positions and bf16 kernels round differently at another shape.
"""

from __future__ import annotations

import argparse
import gc
import time

from course.runtime.bench import this_lab

PROMPTS = {
    "prose": "Explain how a hash map handles collisions.",
    "code": "Write a Python function that parses an ISO-8601 date string and returns a datetime, with tests.",
}


def run_once(args, speculative_config, prompts):
    from vllm import LLM, SamplingParams

    llm = LLM(
        model=args.model,
        speculative_config=speculative_config,
        gpu_memory_utilization=args.gpu_memory_utilization,
        max_model_len=args.max_model_len,
        disable_log_stats=False,      # keeps the spec-decode counters that get_metrics() returns
        seed=0,
    )
    params = SamplingParams(max_tokens=args.max_tokens, temperature=0.0, ignore_eos=True)
    llm.generate(prompts[:1], params, use_tqdm=False)            # warm-up (graphs, caches)
    metrics_before = llm.get_metrics()
    start = time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=False)
    elapsed = time.perf_counter() - start
    tokens = [list(o.outputs[0].token_ids) for o in outs]
    result = (tokens, elapsed, metrics_before, llm.get_metrics())
    llm.llm_engine.engine_core.shutdown()     # free the GPU before the second engine claims its share of memory
    del llm
    gc.collect()
    return result


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="meta-llama/Llama-3.1-8B-Instruct")
    ap.add_argument("--draft", default="yuhuili/EAGLE-LLaMA3.1-Instruct-8B", help="an EAGLE head trained for --model")
    ap.add_argument("--method", default="eagle", choices=["eagle", "eagle3"])
    ap.add_argument("--k", type=int, default=5, help="num_speculative_tokens")
    ap.add_argument("--prompt", default="prose", choices=sorted(PROMPTS))
    ap.add_argument("--batch", type=int, default=1, help="copies of the prompt generated together")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--draft-cost", type=float, default=0.1,
                    help="c: one draft step / one target step (EAGLE on Llama 3.1 8B at batch 1: 0.78 B of 8.03 B weights read)")
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.8)
    ap.add_argument("--max-model-len", type=int, default=2048)
    ap.add_argument("--impl", default=None, choices=["solution", "starter"], help="whose report() to use")
    args = ap.parse_args(argv)
    lab = this_lab(__file__, args.impl)

    prompts = [PROMPTS[args.prompt]] * args.batch
    spec = {"method": args.method, "model": args.draft, "num_speculative_tokens": args.k}
    base_tokens, base_s, _, _ = run_once(args, None, prompts)
    spec_tokens, spec_s, before, after = run_once(args, spec, prompts)

    n = sum(len(t) for t in base_tokens) / len(base_tokens)
    print(f"target {args.model}  draft {args.draft} ({args.method}, k={args.k})  prompt {args.prompt!r}  batch {args.batch}")
    print(f"plain: {base_s:.2f} s, ITL {base_s / n * 1e3:.1f} ms/token per stream")
    print(f"EAGLE: {spec_s:.2f} s, ITL {spec_s / n * 1e3:.1f} ms/token per stream   measured speedup {base_s / spec_s:.2f}x")
    same = sum(a == b for a, b in zip(base_tokens, spec_tokens))
    print(f"streams with identical greedy tokens: {same} of {len(prompts)}")

    # The counters are cumulative: subtract the warm-up's share to keep only the timed generate().
    c_before, c_after = lab.read_spec_counters(before), lab.read_spec_counters(after)
    counters = lab.SpecCounters(
        c_after.num_drafts - c_before.num_drafts,
        c_after.num_draft_tokens - c_before.num_draft_tokens,
        c_after.num_accepted_tokens - c_before.num_accepted_tokens,
        tuple(a - b for a, b in zip(c_after.accepted_per_pos, c_before.accepted_per_pos)),
    )
    print(lab.report(counters, args.k))
    r = lab.reconcile(counters, args.k)
    predicted = lab.LAB03.speedup(r.alpha, args.k, args.draft_cost)
    print(f"lab 03 predicts {predicted:.2f}x at c = {args.draft_cost}; measured {base_s / spec_s:.2f}x "
          f"(the gap is what the model leaves out: per-cycle overhead, verify cost growing with k and batch)")


if __name__ == "__main__":
    main()
