"""Lab 01-02 — read the real loop: vLLM 0.22.1's own Scheduler, stepped by hand on a CPU (starter: your work goes here).

On a GPU box, ``run.py`` runs the whole real engine. Here, without a GPU, you drive the *real*
``vllm.v1.core.sched.scheduler.Scheduler`` (with its real ``KVCacheManager`` and ``BlockPool``)
through the same three calls ``EngineCore.step`` makes, with a fake model runner standing in
for the GPU, and you put its lifecycle next to the one you traced in mini_vllm in lab-01:

    out    = scheduler.schedule()                      # plan (real code)
    mro    = fake model runner output for ``out``      # run + sample (faked: no GPU, no weights)
    scheduler.update_from_output(out, mro)             # bookkeep (real code)

``mini_vllm.testing.real_vllm.RealScheduler`` builds the real scheduler from a tiny Llama
``config.json`` (no weights, no tokenizer) and fakes the runner; importing it imports torch and
vllm, which takes seconds, so this file imports it only inside the functions that need it.
Prompts are byte-tokenized exactly as mini_vllm does, so both engines see the same token ids.
"""

from __future__ import annotations

import re
from typing import Any, NamedTuple

from course.runtime import use_lab

lab01 = use_lab("phase-01/lab-01-trace-a-request")  # lab-01's reference: Event, trace_request, split_steps
Event = lab01.Event

# mini_vllm.LLMEngine's defaults, except max_model_len: the tiny Llama config allows 2048
# positions and the real ModelConfig checks it, so both engines get 512 unless told otherwise.
DEFAULTS: dict[str, Any] = {
    "num_gpu_blocks": 257,
    "block_size": 16,
    "max_num_seqs": 128,
    "max_num_batched_tokens": 2048,
    "long_prefill_token_threshold": 0,
    "enable_prefix_caching": True,
    "max_model_len": 512,
}


# --------------------------------------------------------------------------- provided helpers
def make_real_scheduler(**engine_kwargs: Any):
    """The real vLLM Scheduler behind ``RealScheduler``, built from mini_vllm-style keyword args."""
    from mini_vllm.testing.real_vllm import RealScheduler
    from mini_vllm.testing.traces import SchedConfig

    unknown = set(engine_kwargs) - set(DEFAULTS)
    if unknown:
        raise TypeError(f"unknown engine kwargs {sorted(unknown)}; use any of {sorted(DEFAULTS)}")
    return RealScheduler(SchedConfig(**{**DEFAULTS, **engine_kwargs}))


def mini_trace(prompt: str, max_tokens: int = 4, **engine_kwargs: Any) -> list:
    """lab-01's ``trace_request`` with the same defaults the real side uses."""
    return lab01.trace_request(prompt, max_tokens, **{**DEFAULTS, **engine_kwargs})


def side_by_side(mini: list, real: list) -> list[str]:
    """Format two traces as one table: step, then (status, computed, tokens) for each engine."""
    lines = [f"{'':>4}  {'mini_vllm':<38}vLLM 0.22.1 Scheduler (CPU)",
             f"{'step':>4}  " + f"{'status':<24}{'comp':>6}{'toks':>6}  " * 2 + "agree"]
    for i in range(max(len(mini), len(real))):
        cells = []
        for trace in (mini, real):
            if i < len(trace):
                e = trace[i]
                cells.append(f"{e.status:<24}{e.num_computed_tokens:>6}{e.num_tokens:>6}  ")
            else:
                cells.append(f"{'-':<24}{'':>6}{'':>6}  ")
        same = i < len(mini) and i < len(real) and tuple(mini[i])[2:] == tuple(real[i])[2:]
        lines.append(f"{i + 1:>4}  " + "".join(cells) + ("yes" if same else "NO"))
    return lines


# --------------------------------------------------------------------------- the lab
def real_step(real) -> Any:
    """One ``EngineCore.step`` on the real scheduler: schedule → fake runner → update_from_output.

    ``real`` is a ``RealScheduler``; its ``.scheduler`` is vLLM's ``Scheduler`` and
    ``real.fake_model_runner_output(out)`` builds the ``ModelRunnerOutput`` a GPU would return
    (one token per request that caught up, ``[]`` for a mid-prefill chunk). Return the
    ``SchedulerOutput`` of this step.
    """
    raise NotImplementedError(
        "out = real.scheduler.schedule(); then real.scheduler.update_from_output(out, "
        "real.fake_model_runner_output(out)); return out"
    )


def real_trace(prompt: str, max_tokens: int = 4, **engine_kwargs: Any) -> list:
    """lab-01's ``trace_request``, on the real vLLM scheduler: one ``Event`` per step.

    Build ``make_real_scheduler(**engine_kwargs)``, add the byte-tokenized prompt with
    ``real.add_request(request_id, list(prompt.encode()), max_tokens)`` (it returns vLLM's live
    ``Request``), then ``real_step`` until ``real.scheduler.has_unfinished_requests()`` is False,
    snapshotting the request after every step.
    """
    raise NotImplementedError(
        "real = make_real_scheduler(**engine_kwargs); request = real.add_request('real-0', "
        "list(prompt.encode()), max_tokens); while real.scheduler.has_unfinished_requests(): real_step(real), "
        "then append Event(step, request.request_id, request.status.name, request.num_computed_tokens, request.num_tokens)"
    )


def compare_traces(mini: list, real: list) -> list[int]:
    """Step numbers (from 1) where the two traces disagree on status, computed or total tokens.

    Request ids are not compared (each engine names its own). A step present in only one trace
    is a disagreement.
    """
    raise NotImplementedError(
        "walk both traces side by side; collect i + 1 wherever (status, num_computed_tokens, num_tokens) "
        "differ or only one trace has a step i"
    )


# --------------------------------------------------------------------------- the real engine's own log
class Iteration(NamedTuple):
    """One step as ``EngineCore`` logs it with ``enable_logging_iteration_details=True``."""

    index: int  # N in "Iteration(N)": the engine's step counter, from 0
    context_requests: int  # requests that have not sampled a token yet (new, or a later prefill chunk)
    context_tokens: int  # tokens scheduled for them this step
    generation_requests: int  # requests past their first token
    generation_tokens: int  # tokens scheduled for those (1 each without speculative decoding)


# The line EngineCore.log_iteration_details writes (upstream/vllm/v1/engine/core.py, near line 399).
ITERATION_LINE = re.compile(
    r"Iteration\((\d+)\): (\d+) context requests, (\d+) context tokens, "
    r"(\d+) generation requests, (\d+) generation tokens"
)


def iteration_details(out: Any, index: int = 0) -> Iteration:
    """What the engine logs for the step that ran ``out`` (a ``SchedulerOutput``).

    Upstream's rule (``compute_iteration_details`` in ``vllm/v1/utils.py``): a scheduled request
    is a *context* request when it is new this step (``out.scheduled_new_reqs``) or it is a
    continuing request (``out.scheduled_cached_reqs``) that still has 0 output tokens, i.e. a later
    chunk of a chunked prefill; every other scheduled request is a *generation* request. Tokens
    come from ``out.num_scheduled_tokens``.
    """
    raise NotImplementedError(
        "a request is 'context' if its id is in {r.req_id for r in out.scheduled_new_reqs}, or it is in "
        "out.scheduled_cached_reqs with num_output_tokens == 0; otherwise 'generation'. Count requests "
        "and out.num_scheduled_tokens[req_id] for each kind; return Iteration(index, ...)"
    )


def predict_iterations(prompts: list[list[int]], max_tokens: int, **engine_kwargs: Any) -> list[Iteration]:
    """The ``Iteration`` lines a real ``LLM.generate(prompts)`` will log, predicted on the real scheduler.

    ``LLM.generate`` with the engine core in-process hands every request to the scheduler before
    the first step; do the same (request ids ``req-0``, ``req-1``, ...), then ``real_step`` until
    ``has_unfinished_requests()`` is False, one ``iteration_details`` per step, indexed from 0.
    """
    raise NotImplementedError(
        "make_real_scheduler(**engine_kwargs); add every prompt (ids req-0, req-1, ...) before the first step; "
        "while has_unfinished_requests(): append iteration_details(real_step(real), step index from 0)"
    )


def parse_iterations(log_text: str) -> list[Iteration]:
    """Every ``Iteration(N): ...`` line in an engine's output, in order, as ``Iteration`` tuples.

    The line may carry a prefix (``(EngineCore pid=…) INFO 11-25 … [core.py:407]``) or follow a
    progress bar on the same line; other lines are ignored. The elapsed time is wall clock and is
    dropped.
    """
    raise NotImplementedError(
        "find every 'Iteration(N): a context requests, b context tokens, c generation requests, d generation "
        "tokens' in the text (anywhere in a line) and return Iteration(N, a, b, c, d) for each, in order"
    )


# --------------------------------------------------------------------------- demo
def _show(title: str, prompt: str, max_tokens: int, **kw: Any) -> None:
    mini, real = mini_trace(prompt, max_tokens, **kw), real_trace(prompt, max_tokens, **kw)
    print(title)
    for line in side_by_side(mini, real):
        print("  " + line)
    prefill, decode = lab01.split_steps(real, len(prompt.encode()))
    print(f"  real vLLM: {len(real)} steps = {prefill} prefill + {decode} decode; "
          f"disagreements: {compare_traces(mini, real) or 'none'}")
    print()


def _import_driver_quietly() -> None:
    """Import torch + vllm with stdout pointed at stderr, so vLLM's import-time warnings (which
    carry timestamps) bind their log handler to stderr and never reach this script's stdout."""
    import contextlib
    import sys

    with contextlib.redirect_stdout(sys.stderr):
        import mini_vllm.testing.real_vllm  # noqa: F401


def main() -> None:
    _import_driver_quietly()
    _show('"hello" (5 tokens), max_tokens=4', "hello", 4)
    mini, real = mini_trace("hello", 16), real_trace("hello", 16)
    prefill, decode = lab01.split_steps(real, 5)
    print('"hello", max_tokens=16: the first token comes out of the prefill step')
    print(f"  mini_vllm: {len(mini)} steps, final {mini[-1].status} {mini[-1].num_computed_tokens}/{mini[-1].num_tokens}")
    print(f"  vLLM     : {len(real)} steps = {prefill} prefill + {decode} decode, "
          f"final {real[-1].status} {real[-1].num_computed_tokens}/{real[-1].num_tokens}")
    print(f"  disagreements: {compare_traces(mini, real) or 'none'}")
    print()
    _show('"abcdefghij" (10 tokens), max_tokens=3, long_prefill_token_threshold=4', "abcdefghij", 3,
          long_prefill_token_threshold=4)

    real = make_real_scheduler()
    request = real.add_request("real-0", list(b"hello"), 2)
    print("Inside one real step: upstream advances num_computed_tokens in schedule() already")
    print(f"  {'moment':<40}{'status':<24}{'comp':>6}{'toks':>6}")
    print(f"  {'after add_request':<40}{request.status.name:<24}{request.num_computed_tokens:>6}{request.num_tokens:>6}")
    for step in (1, 2):
        out = real.scheduler.schedule()
        print(f"  {f'step {step}: after schedule()':<40}{request.status.name:<24}"
              f"{request.num_computed_tokens:>6}{request.num_tokens:>6}")
        real.scheduler.update_from_output(out, real.fake_model_runner_output(out))
        print(f"  {f'step {step}: after update_from_output()':<40}{request.status.name:<24}"
              f"{request.num_computed_tokens:>6}{request.num_tokens:>6}")
    out = real.scheduler.schedule()
    print(f"  then has_unfinished_requests() = {real.scheduler.has_unfinished_requests()}, yet one more schedule() "
          f"carries finished_req_ids = {sorted(out.finished_req_ids)}")
    print(f"  with {out.total_num_scheduled_tokens} tokens scheduled: the message that tells the workers to drop its state")


if __name__ == "__main__":
    main()
