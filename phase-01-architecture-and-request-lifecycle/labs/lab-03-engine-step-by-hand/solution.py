"""Lab 01-03 — one engine step, written by hand (reference solution).

``mini_vllm.LLMEngine.step`` is four calls. Here you write them yourself, against the same
scheduler, toy model and sampler the engine owns, and the tests check that your loop and the
engine's produce identical tokens, step for step:

1. **schedule** — ``out = scheduler.schedule()`` decides who runs and how many tokens each
   (``out.num_scheduled_tokens``; ``out.scheduled_requests`` lists them in row order);
2. **execute** — one batched ``model.forward(last_tokens, positions)`` over every scheduled
   request. The toy model only needs each request's *last* scheduled position: for a request
   with ``num_computed_tokens = c`` that was given ``n`` tokens, that is position ``c + n - 1``
   and the token sitting there, ``request.all_token_ids[c + n - 1]``;
3. **sample** — only for a request whose tokens this step catch it up
   (``Scheduler.needs_sample(request, n)``, i.e. ``c + n == num_tokens``); a mid-prefill chunk
   produces logits for a prompt position, which are thrown away;
4. **update** — ``scheduler.update_from_output(out, sampled)`` advances the counters, appends
   the new tokens, runs the stop checks and returns the requests that finished. Call it every
   step, even when nothing was sampled.

Upstream the same four calls are ``EngineCore.step`` (``vllm/v1/engine/core.py``).
"""

from __future__ import annotations

import numpy as np

from mini_vllm import Request, Sampler, Scheduler, ToyModel


def engine_step(scheduler: Scheduler, model: ToyModel, sampler: Sampler) -> list[Request]:
    """Run one schedule → execute → sample → update iteration; return the requests that finished.

    Rows of the batch follow ``out.scheduled_requests``: row ``i`` of the logits belongs to
    request ``i``. Do not call the model when nothing is scheduled. Sample with
    ``sampler.sample(logits[i], request.sampling_params)`` only where ``needs_sample`` holds.
    """
    out = scheduler.schedule()  # 1. plan
    reqs = out.scheduled_requests
    sampled: dict[str, int] = {}
    if reqs:
        counts = [out.num_scheduled_tokens[r.request_id] for r in reqs]
        positions = [r.num_computed_tokens + n - 1 for r, n in zip(reqs, counts)]
        last_tokens = [r.all_token_ids[p] for r, p in zip(reqs, positions)]
        logits = model.forward(np.array(last_tokens), np.array(positions))  # 2. run, one batch
        for i, (request, n) in enumerate(zip(reqs, counts)):
            if Scheduler.needs_sample(request, n):  # 3. pick, only when caught up
                sampled[request.request_id] = sampler.sample(logits[i], request.sampling_params)
    return scheduler.update_from_output(out, sampled)  # 4. bookkeep, always


# --------------------------------------------------------------------------- demo
def main() -> None:
    import mini_vllm

    engine = mini_vllm.LLMEngine(max_num_batched_tokens=8)
    greedy = mini_vllm.SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True)
    ids = [engine.add_request(p, greedy) for p in ("hello world", "hi")]
    requests = {rid: engine.scheduler.requests[rid] for rid in ids}
    print("engine_step by hand: 'hello world' (11 tokens) + 'hi' (2 tokens), token budget 8, max_tokens=3")
    print(f"  {'step':>4}  {'scheduled':<28}{'sampled this step':<36}finished")
    step = 0
    while engine.has_unfinished_requests():
        before = {rid: r.num_output_tokens for rid, r in requests.items()}
        scheduled_probe = {rid: r.num_computed_tokens for rid, r in requests.items()}
        finished = engine_step(engine.scheduler, engine.model, engine.sampler)
        step += 1
        scheduled = {rid: requests[rid].num_computed_tokens - scheduled_probe[rid] for rid in ids}
        scheduled = {rid: n for rid, n in scheduled.items() if n}
        new = {rid: list(r.output_token_ids)[before[rid]:] for rid, r in requests.items()}
        new = {rid: t for rid, t in new.items() if t}
        print(f"  {step:>4}  {scheduled!s:<28}{new!s:<36}{[r.request_id for r in finished]}")
    for rid, r in requests.items():
        print(f"  {rid}: output {list(r.output_token_ids)}, {r.status.name}")


if __name__ == "__main__":
    main()
