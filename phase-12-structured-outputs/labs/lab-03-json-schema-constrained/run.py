"""Lab 12-03 on a GPU box: validity and cost of structured outputs on a real model, real vLLM 0.22.1.

For three constraints (a JSON schema, a regex, a choice) the script generates the same prompts
twice, unconstrained (the prompt only *asks* for the format) and with
``SamplingParams(structured_outputs=StructuredOutputsParams(...))``, and grades every output with
this lab's ``check_output`` (your ``solution.py``, or ``--impl starter``). It prints:

* per arm: the verdict counts (ok / truncated / unparseable / invalid) and one failing output;
* the cost of the constraint: the first request with a new schema alone (it pays the xgrammar
  compile), a second one with the same schema (cache hit), and output tokens per second for the
  whole batch with and without the grammar (the steady-state overhead of filling and applying
  the bitmask);
* the truncation hole: one constrained request with ``--short-max-tokens`` (12 by default).

Needs a CUDA GPU, ``pip install vllm==0.22.1`` and the model:

    hf download Qwen/Qwen2.5-0.5B-Instruct
    python phase-12-structured-outputs/labs/lab-03-json-schema-constrained/run.py
    python .../run.py --backend guidance          # the same with llguidance instead of xgrammar

Sampling is at temperature 0.8 on purpose: validity has to hold under sampling, not only greedy.
"""

from __future__ import annotations

import argparse
import time

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer", "minimum": 0},
        "skills": {"type": "array", "items": {"type": "string"}},
    },
    "required": ["name", "age", "skills"],
}
JOBS = ["pirate", "astronaut", "barista", "wizard", "plumber"]
REGEX = r"\(\d{3}\) \d{3}-\d{4}"
CHOICES = ["positive", "negative", "neutral"]
REVIEWS = ["The soup was cold and the waiter rude.", "Best concert of my life!", "The train left on time.",
           "I want my money back.", "Lovely garden, friendly staff."]


def _lab(impl: str):
    from course.runtime.bench import this_lab

    return this_lab(__file__, impl)


def arms(n: int) -> dict[str, tuple[list[str], dict]]:
    """name -> (prompts, constraint) for the three constraints."""
    profile = [f"Generate a profile for a fictional {JOBS[i % len(JOBS)]} as JSON with keys name, age, skills."
               for i in range(n)]
    phone = [f"Invent a US phone number for customer {i}, formatted like (555) 123-4567. Reply with the number only."
             for i in range(n)]
    mood = [f"Classify the sentiment of this review as positive, negative or neutral. Reply with one word.\n"
            f"Review: {REVIEWS[i % len(REVIEWS)]}" for i in range(n)]
    return {"json": (profile, {"json": SCHEMA}), "regex": (phone, {"regex": REGEX}), "choice": (mood, {"choice": CHOICES})}


def grade(lab, outputs, constraint) -> tuple[dict[str, int], str | None, int]:
    counts = {"ok": 0, "truncated": 0, "unparseable": 0, "invalid": 0}
    example, tokens = None, 0
    for out in outputs:
        o = out.outputs[0]
        tokens += len(o.token_ids)
        verdict = lab.check_output(o.text, o.finish_reason, constraint)
        counts[verdict] += 1
        if verdict != "ok" and example is None:
            example = f"{verdict}: {o.text[:100]!r} (finish_reason={o.finish_reason})"
    return counts, example, tokens


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="Qwen/Qwen2.5-0.5B-Instruct")
    ap.add_argument("--num-prompts", type=int, default=50)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--short-max-tokens", type=int, default=12)
    ap.add_argument("--temperature", type=float, default=0.8)
    ap.add_argument("--backend", default="xgrammar", help="structured-output backend: xgrammar, guidance, outlines")
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.6)
    ap.add_argument("--impl", default="solution", choices=["solution", "starter"])
    args = ap.parse_args()

    from vllm import LLM, SamplingParams  # imported here so --help works without a GPU
    from vllm.sampling_params import StructuredOutputsParams

    lab = _lab(args.impl)
    llm = LLM(model=args.model, gpu_memory_utilization=args.gpu_memory_utilization, seed=0,
              structured_outputs_config={"backend": args.backend})

    def params(constraint: dict | None, max_tokens: int = args.max_tokens) -> SamplingParams:
        so = StructuredOutputsParams(**constraint) if constraint else None
        return SamplingParams(max_tokens=max_tokens, temperature=args.temperature, seed=0, structured_outputs=so)

    # The compile cost: one request with a schema the engine has not seen, then the same schema again.
    probe = [{"type": "object", "properties": {"city": {"type": "string"}, "zip": {"type": "string"}},
              "required": ["city", "zip"]}]
    llm.generate(["warm-up"], params(None, 4), use_tqdm=False)
    t0 = time.perf_counter()
    llm.generate(["Where do you live? JSON please."], params({"json": probe[0]}, 16), use_tqdm=False)
    t1 = time.perf_counter()
    llm.generate(["Where do you live? JSON please."], params({"json": probe[0]}, 16), use_tqdm=False)
    t2 = time.perf_counter()
    print(f"model {args.model}, backend {args.backend}, temperature {args.temperature}, max_tokens {args.max_tokens}")
    print(f"first request with a new schema: {1e3 * (t1 - t0):.0f} ms; the same schema again: {1e3 * (t2 - t1):.0f} ms "
          f"(difference ~ grammar compile)")

    for name, (prompts, constraint) in arms(args.num_prompts).items():
        for constrained in (False, True):
            t0 = time.perf_counter()
            outs = llm.generate(prompts, params(constraint if constrained else None), use_tqdm=False)
            dt = time.perf_counter() - t0
            counts, example, tokens = grade(lab, outs, constraint)
            label = f"{name} {'guided' if constrained else 'baseline'}"
            print(f"{label:<16} ok {counts['ok']:>3}/{len(prompts)}  truncated {counts['truncated']:>3}  unparseable "
                  f"{counts['unparseable']:>3}  invalid {counts['invalid']:>3}  {tokens / dt:8.0f} output tok/s")
            if example:
                print(f"{'':<16} e.g. {example}")

    # Steady-state overhead on equal work: every output runs to max_tokens (min_tokens blocks EOS, and the
    # regex never forces an end), so both arms sample the same number of tokens; only the mask differs.
    prompts, _ = arms(args.num_prompts)["json"]
    rates = {}
    for constrained in (False, True):
        so = StructuredOutputsParams(regex="[a-z ,.]*") if constrained else None
        p = SamplingParams(max_tokens=args.max_tokens, min_tokens=args.max_tokens, temperature=args.temperature,
                           seed=0, structured_outputs=so)
        llm.generate(prompts, p, use_tqdm=False)  # warm (and compile once)
        t0 = time.perf_counter()
        outs = llm.generate(prompts, p, use_tqdm=False)
        rates[constrained] = sum(len(o.outputs[0].token_ids) for o in outs) / (time.perf_counter() - t0)
    print(f"equal work ({args.num_prompts} x {args.max_tokens} tokens): {rates[False]:.0f} tok/s free, "
          f"{rates[True]:.0f} tok/s masked: overhead {100 * (1 - rates[True] / rates[False]):.1f} %")

    out = llm.generate([arms(1)["json"][0][0]], params({"json": SCHEMA}, args.short_max_tokens), use_tqdm=False)[0]
    o = out.outputs[0]
    print(f"max_tokens={args.short_max_tokens}: {o.text!r} finish_reason={o.finish_reason} -> "
          f"{lab.check_output(o.text, o.finish_reason, {'json': SCHEMA})}")


if __name__ == "__main__":
    main()
