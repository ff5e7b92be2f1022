"""MUTANT: forgets ignore_eos=True, so a greedy EOS ends the trace early with FINISHED_STOPPED.

Lab 01-01 — trace one request through the engine loop (reference solution).

You drive ``mini_vllm.LLMEngine`` one ``step()`` at a time and, after every step, write down
what the request looks like: its status and its two counters. The result is the request's
whole life as a list of ``Event`` rows, the same picture vLLM's DEBUG logs and metrics give
you on a real server.

Two facts make the trace possible:

* ``add_request`` returns an id, and ``engine.scheduler.requests[id]`` is the live
  ``Request`` object. The engine mutates that object in place every step, and it stays a
  valid Python object after the scheduler lets go of it, so you can read its final
  ``FINISHED_*`` status even though it has left ``scheduler.running``.
* Nothing happens in ``add_request``: admission (WAITING → RUNNING) happens inside the next
  ``step()``'s ``schedule()``. So the first snapshot you take, after step 1, already shows
  RUNNING with the whole prompt computed.
"""

from __future__ import annotations

from typing import NamedTuple

import mini_vllm


class Event(NamedTuple):
    """One snapshot of one request, taken right after an engine step."""

    step: int  # 1 for the first engine.step() call, 2 for the second, ...
    request_id: str
    status: str  # RequestStatus name, e.g. "RUNNING", "FINISHED_LENGTH_CAPPED"
    num_computed_tokens: int  # tokens whose KV is in the cache
    num_tokens: int  # prompt + generated tokens so far


# --------------------------------------------------------------------------- the lab
def trace_request(prompt: str, max_tokens: int = 4, **engine_kwargs) -> list[Event]:
    """Run ``prompt`` alone through a fresh engine and snapshot it after every step.

    Build ``mini_vllm.LLMEngine(**engine_kwargs)``, add one request with greedy sampling
    (``temperature=0.0``), ``ignore_eos=True`` and ``max_tokens=max_tokens``, then call
    ``engine.step()`` until the engine has no unfinished request. After each step append one
    ``Event`` for the request. No event before the first step.
    """
    engine = mini_vllm.LLMEngine(**engine_kwargs)
    params = mini_vllm.SamplingParams(max_tokens=max_tokens, temperature=0.0)
    request_id = engine.add_request(prompt, params)
    request = engine.scheduler.requests[request_id]  # the live object; it outlives the scheduler's hold on it
    events: list[Event] = []
    step = 0
    while engine.has_unfinished_requests():
        engine.step()
        step += 1
        events.append(
            Event(step, request.request_id, request.status.name, request.num_computed_tokens, request.num_tokens)
        )
    return events


def split_steps(events: list[Event], num_prompt_tokens: int) -> tuple[int, int]:
    """Return ``(prefill_steps, decode_steps)`` for a single request's trace.

    A step did prompt work if, after it, the request had computed no more than the prompt
    (``num_computed_tokens <= num_prompt_tokens``); every later step is a decode step.
    """
    prefill = sum(1 for e in events if e.num_computed_tokens <= num_prompt_tokens)
    return prefill, len(events) - prefill


# --------------------------------------------------------------------------- demo
def _print_trace(title: str, events: list[Event]) -> None:
    print(title)
    print(f"  {'step':>4}  {'status':<24}{'num_computed_tokens':>20}{'num_tokens':>12}")
    for e in events:
        print(f"  {e.step:>4}  {e.status:<24}{e.num_computed_tokens:>20}{e.num_tokens:>12}")


def main() -> None:
    _print_trace('trace_request("hello", max_tokens=4)   # 5 prompt tokens', trace_request("hello", 4))
    print()
    joke = "Tell me a joke"
    _print_trace(
        f'trace_request("{joke}", max_tokens=6)   # {len(joke)} prompt tokens (one per byte)',
        trace_request(joke, 6),
    )
    print()
    print("max_tokens = N gives 1 prefill step + (N - 1) decode steps   (prompt: 'hello')")
    print(f"  {'N':>3}  {'steps':>5}  {'prefill':>7}  {'decode':>6}  {'final num_tokens':>16}")
    for n in (1, 2, 4, 16):
        events = trace_request("hello", n)
        prefill, decode = split_steps(events, 5)
        print(f"  {n:>3}  {len(events):>5}  {prefill:>7}  {decode:>6}  {events[-1].num_tokens:>16}")
    print()
    _print_trace(
        'trace_request("abcdefghij", max_tokens=3, long_prefill_token_threshold=4)   # chunked prefill',
        trace_request("abcdefghij", 3, long_prefill_token_threshold=4),
    )


if __name__ == "__main__":
    main()
