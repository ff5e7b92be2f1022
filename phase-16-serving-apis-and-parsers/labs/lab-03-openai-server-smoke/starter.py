"""Lab 16-03 starter: walk the whole front door of an OpenAI-compatible server with the official client.

``smoke(base_url, model)`` runs the same five steps against any server that speaks the OpenAI API
(mini's ``python -m mini_vllm serve``, or the real ``vllm serve`` on a GPU via ``run.py``) and
returns what each layer produced: streamed deltas, a forced tool call, the 400 for an oversized
``max_tokens``, the 404 for a wrong model name, and a stream the client abandons mid-way.
Your job: ``stream_deltas``, ``forced_tool_call``, ``error_of`` and ``abandon_stream`` (``smoke`` is given).
Grade with: LAB_IMPL=starter pytest phase-16-serving-apis-and-parsers/labs/lab-03-openai-server-smoke -q
"""

from __future__ import annotations

import json  # noqa: F401 (you will need it)
import socket  # noqa: F401 (you will need it)
from urllib.parse import urlparse  # noqa: F401 (you will need it)

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Tokyo"]}}},
    },
}
MESSAGES = [{"role": "user", "content": "Say hello in French."}]


def stream_deltas(client, model: str, max_tokens: int = 12) -> tuple[list[str | None], str]:
    """Step 1: every chunk's ``delta.content`` (the role chunk and the finish chunk included), and the greedy whole text."""
    raise NotImplementedError(
        'stream=True, temperature=0: collect c.choices[0].delta.content of every chunk with '
        "choices (keep '' and None); then the same request without stream"
    )

def forced_tool_call(client, model: str) -> dict:
    """Step 2: force ``get_weather``; return its name, its arguments parsed from the JSON string, the finish reason."""
    raise NotImplementedError(
        "tool_choice={'type': 'function', 'function': {'name': 'get_weather'}}, "
        'tools=[WEATHER_TOOL], max_tokens=128; arguments arrive as a JSON *string*'
    )

def error_of(fn) -> dict:
    """Steps 3-4: call ``fn``; return the HTTP status and the ``error`` object of the body it raised."""
    raise NotImplementedError(
        "catch openai.APIStatusError; e.status_code, e.response.json()['error'], "
        'type(e).__name__'
    )

def abandon_stream(base_url: str, model: str, events_to_read: int = 3) -> int:
    """Step 5: start a long stream over a raw socket, read a few SSE events, hang up. Returns how many
    of the ``events_to_read`` arrived before the hang-up (one ``recv`` may carry more; they are not counted)."""
    raise NotImplementedError(
        'open a socket, send a raw POST /v1/completions with stream=true and a large '
        "max_tokens, recv until N 'data: ' events, close; return the count, at most N"
    )

def smoke(base_url: str, model: str) -> dict:
    """All five steps against the server at ``base_url`` (``http://host:port``)."""
    import openai

    client = openai.OpenAI(base_url=base_url + "/v1", api_key="-", timeout=60, max_retries=0)
    deltas, whole = stream_deltas(client, model)
    return {
        "deltas": deltas,
        "whole": whole,
        "tool_call": forced_tool_call(client, model),
        "too_long": error_of(lambda: client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=10**7)),
        "wrong_model": error_of(lambda: client.chat.completions.create(model="no-such-model", messages=MESSAGES)),
        "abandoned_after_events": abandon_stream(base_url, model),
    }


def main() -> None:
    from mini_vllm.testing.live_server import LiveServer

    server = LiveServer(num_gpu_blocks=256, block_size=16)
    try:
        free = server.num_free_blocks()
        out = smoke(server.base_url, "mini-toy")
        idle = server.wait_idle()
        print(f"1. streamed deltas: {out['deltas'][:4]} ... {out['deltas'][-2:]}  ({len(out['deltas'])} chunks)")
        print(f"   joined == non-streamed text: {''.join(d or '' for d in out['deltas']) == out['whole']}")
        print(f"2. forced tool call: {out['tool_call']}")
        e = out["too_long"]
        print(f"3. oversized max_tokens: HTTP {e['status']} {e['exception']}, type {e['error']['type']!r}, "
              f"param {e['error']['param']!r}")
        print(f"   message: {e['error']['message'][:96]}...")
        e = out["wrong_model"]
        print(f"4. wrong model: HTTP {e['status']} {e['exception']}: {e['error']['message']}")
        print(f"5. hung up after {out['abandoned_after_events']} events; engine idle again: {idle}; "
              f"free blocks {server.num_free_blocks()} of {free} before")
    finally:
        server.stop()


if __name__ == "__main__":
    main()
