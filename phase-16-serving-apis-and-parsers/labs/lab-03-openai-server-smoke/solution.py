"""Lab 16-03 solution: walk the whole front door of an OpenAI-compatible server with the official client.

``smoke(base_url, model)`` runs the same five steps against any server that speaks the OpenAI API
(mini's ``python -m mini_vllm serve``, or the real ``vllm serve`` on a GPU via ``run.py``) and
returns what each layer produced: streamed deltas, a forced tool call, the 400 for an oversized
``max_tokens``, the 404 for a wrong model name, and a stream the client abandons mid-way.
Run ``python phase-16-serving-apis-and-parsers/labs/lab-03-openai-server-smoke/solution.py``
(it starts mini's server on a free loopback port, runs the steps, stops it).
"""

from __future__ import annotations

import json
import socket
from urllib.parse import urlparse

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
    stream = client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=max_tokens, temperature=0, stream=True)
    deltas = [c.choices[0].delta.content for c in stream if c.choices]
    whole = client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=max_tokens, temperature=0)
    return deltas, whole.choices[0].message.content


def forced_tool_call(client, model: str) -> dict:
    """Step 2: force ``get_weather``; return its name, its arguments parsed from the JSON string, the finish reason."""
    choice = {"type": "function", "function": {"name": "get_weather"}}
    r = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "Weather in Paris?"}], tools=[WEATHER_TOOL],
        tool_choice=choice, max_tokens=128, temperature=0,
    )
    call = r.choices[0].message.tool_calls[0]
    return {"name": call.function.name, "arguments": json.loads(call.function.arguments),
            "arguments_type": type(call.function.arguments).__name__, "finish_reason": r.choices[0].finish_reason}


def error_of(fn) -> dict:
    """Steps 3-4: call ``fn``; return the HTTP status and the ``error`` object of the body it raised."""
    import openai

    try:
        fn()
    except openai.APIStatusError as e:
        body = e.response.json()
        return {"status": e.status_code, "error": body["error"], "exception": type(e).__name__}
    raise AssertionError("the request was expected to fail")


def abandon_stream(base_url: str, model: str, events_to_read: int = 3) -> int:
    """Step 5: start a long stream over a raw socket, read a few SSE events, hang up. Returns how many
    of the ``events_to_read`` arrived before the hang-up (one ``recv`` may carry more; they are not counted)."""
    url = urlparse(base_url)
    body = json.dumps({"model": model, "prompt": "Count forever:", "max_tokens": 2000, "stream": True,
                       "ignore_eos": True}).encode()
    with socket.create_connection((url.hostname, url.port), timeout=30) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: " + url.hostname.encode()
                     + b"\r\nContent-Type: application/json\r\nContent-Length: " + str(len(body)).encode()
                     + b"\r\n\r\n" + body)
        got = b""
        while got.count(b"data: ") < events_to_read:
            more = sock.recv(4096)
            if not more:
                break
            got += more
    return min(got.count(b"data: "), events_to_read)


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
