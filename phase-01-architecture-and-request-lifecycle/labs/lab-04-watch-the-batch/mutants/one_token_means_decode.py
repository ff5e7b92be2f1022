"""MUTANT: decides prefill vs decode by the chunk size (n > 1), so a 1-token prefill chunk is drawn as "D".

Lab 01-04 — watch continuous batching happen, one step at a time (reference solution).

You put several prompts into one ``mini_vllm.LLMEngine`` and record, for every step, the
scheduler's decision: ``SchedulerOutput.num_scheduled_tokens``, a dict ``{request_id: tokens}``.
Then you draw it as a picture, one row per step and one column per request:

    P8   a prefill chunk of 8 prompt tokens (the prompt is not finished yet)
    P3*  a prefill chunk of 3 that completes the prompt, so a token is sampled (``*``)
    D    a decode step: 1 token in, 1 token out
    .    not scheduled this step (still waiting, or already finished)

The probe must not change what the engine does: wrap ``engine.scheduler.schedule`` in a
function that calls the original, stores a *copy* of the dict and returns the output as is.
"""

from __future__ import annotations

from collections.abc import Sequence

import mini_vllm


# --------------------------------------------------------------------------- the lab
def trace_batches(
    prompts: Sequence[str], max_tokens: int | Sequence[int] = 4, **engine_kwargs
) -> tuple[list[str], list[dict[str, int]]]:
    """Run ``prompts`` together; return ``(request_ids, per-step num_scheduled_tokens dicts)``.

    All requests are added before the first step, with greedy sampling and ``ignore_eos=True``.
    ``max_tokens`` is one int for all, or one per prompt. Record one dict per ``engine.step()``,
    copied (the engine may reuse or mutate its own), and keep the engine's behaviour unchanged.
    """
    engine = mini_vllm.LLMEngine(**engine_kwargs)
    caps = [max_tokens] * len(prompts) if isinstance(max_tokens, int) else list(max_tokens)
    if len(caps) != len(prompts):
        raise ValueError(f"got {len(caps)} max_tokens values for {len(prompts)} prompts")
    ids = [
        engine.add_request(p, mini_vllm.SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True))
        for p, n in zip(prompts, caps)
    ]
    steps: list[dict[str, int]] = []
    original = engine.scheduler.schedule

    def probe():
        out = original()
        steps.append(dict(out.num_scheduled_tokens))
        return out

    engine.scheduler.schedule = probe
    while engine.has_unfinished_requests():
        engine.step()
    return ids, steps


def render_batches(ids: Sequence[str], steps: Sequence[dict[str, int]], prompt_lens: Sequence[int]) -> list[str]:
    """Draw the per-step batch picture: a header line, then one line per step.

    Cells are 8 characters wide, left-aligned. Header: ``"step"`` right-aligned in 4, then each request id,
    then ``"total"``. Each step line: the step number (from 1), one cell per request (``P<n>``,
    ``P<n>*``, ``D`` or ``.``, see the module docstring) and the step's total scheduled tokens.
    A request is prefilling while the tokens scheduled for it so far are below its prompt length.
    """
    done = dict.fromkeys(ids, 0)
    plen = dict(zip(ids, prompt_lens))
    lines = [f"{'step':>4}  " + "".join(f"{rid:<8}" for rid in ids) + "total"]
    for number, step in enumerate(steps, 1):
        cells = []
        for rid in ids:
            n = step.get(rid, 0)
            if n == 0:
                cells.append(".")
            elif n > 1:  # WRONG: a 1-token chunk can still be prefill
                cells.append(f"P{n}" + ("*" if done[rid] + n >= plen[rid] else ""))
            else:
                cells.append("D")
            done[rid] += n
        lines.append(f"{number:>4}  " + "".join(f"{c:<8}" for c in cells) + f"{sum(step.values()):>5}")
    return lines


# --------------------------------------------------------------------------- demo
def _show(title: str, prompts: Sequence[str], max_tokens, **kw) -> None:
    ids, steps = trace_batches(prompts, max_tokens, **kw)
    print(title)
    caps = [max_tokens] * len(prompts) if isinstance(max_tokens, int) else list(max_tokens)
    for letter, rid, p, n in zip("ABCDEFGH", ids, prompts, caps):
        print(f"  {letter} = {rid} = {p!r} ({len(p)} prompt tokens, max_tokens={n})")
    for line in render_batches(ids, steps, [len(p) for p in prompts]):
        print("  " + line)
    totals = {rid: sum(s.get(rid, 0) for s in steps) for rid in ids}
    print(f"  tokens scheduled per request: {totals}")
    print()


def main() -> None:
    _show("A tight token budget: max_num_batched_tokens=8, max_tokens=4",
          ["hello world", "goodbye"], 4, max_num_batched_tokens=8)
    _show("The default budget (2048): everyone prefills in step 1",
          ["hello world", "goodbye"], 4)
    _show("Two seats (max_num_seqs=2), three requests: C takes A's seat the step after A finishes",
          ["hello", "goodbye", "hey you"], [2, 5, 3], max_num_seqs=2)


if __name__ == "__main__":
    main()
