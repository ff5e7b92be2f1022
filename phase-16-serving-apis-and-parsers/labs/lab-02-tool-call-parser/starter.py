"""Lab 16-02 starter: pull Hermes-style tool calls out of generated text, batch and streaming.

A call is ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``. ``parse_tool_calls`` takes
the whole text; ``StreamingToolParser`` takes it in chunks of any size and must give the same
result: content outside the tags emitted as early as possible, a possible half tag held back, a
call emitted when its closing tag arrives, every error loud.
Your job: ``trailing_tag_prefix``, ``parse_tool_calls``, ``StreamingToolParser.feed`` and ``finish``
(``load_call`` and ``collect`` are given).
Grade with: LAB_IMPL=starter pytest phase-16-serving-apis-and-parsers/labs/lab-02-tool-call-parser -q
"""

from __future__ import annotations

import json

OPEN = "<tool_call>"
CLOSE = "</tool_call>"


def trailing_tag_prefix(text: str, tag: str) -> int:
    """Length of the longest *proper* prefix of ``tag`` that ``text`` ends with (0 if none)."""
    raise NotImplementedError(
        'try k = len(tag) - 1 down to 1: the first k with text.endswith(tag[:k]) is the '
        'answer; else 0'
    )

def load_call(body: str) -> dict:
    """One call: JSON with a string ``name`` and an object ``arguments``; anything else raises ValueError."""
    try:
        call = json.loads(body)
    except json.JSONDecodeError as e:
        raise ValueError(f"tool call is not JSON: {body!r} ({e.msg})") from e
    if not isinstance(call, dict) or not isinstance(call.get("name"), str) or not isinstance(call.get("arguments"), dict):
        raise ValueError(f'a tool call must look like {{"name": str, "arguments": {{...}}}}, got {body!r}')
    return {"name": call["name"], "arguments": call["arguments"]}


def parse_tool_calls(text: str) -> tuple[str, list[dict]]:
    """(the text outside the tags, the calls in order). Malformed or unterminated calls raise ValueError."""
    raise NotImplementedError(
        'loop: find OPEN from pos; keep the text before it; find CLOSE after it (missing: '
        'ValueError); load_call the body; continue after CLOSE'
    )

class StreamingToolParser:
    """Feed chunks; get events ``("content", str)`` and ``("tool_call", dict)``."""

    def __init__(self) -> None:
        self.buffer = ""  # text not yet emitted: a possible half tag, or the inside of a call
        self.in_block = False

    def feed(self, chunk: str) -> list[tuple[str, object]]:
        raise NotImplementedError(
            "outside a block: emit up to OPEN (or all but trailing_tag_prefix(buffer, OPEN)); "
            "inside: wait for CLOSE, then emit ('tool_call', load_call(body)); loop until nothing changes"
        )

    def finish(self) -> list[tuple[str, object]]:
        """The stream ended: held text is content after all; an open call raises ValueError."""
        raise NotImplementedError(
            'inside a block: ValueError; otherwise the held text is content: return it and clear '
            'the buffer'
        )

def collect(events: list[tuple[str, object]]) -> tuple[str, list[dict]]:
    """Events folded into the batch shape: (content, calls)."""
    return "".join(v for k, v in events if k == "content"), [v for k, v in events if k == "tool_call"]


def main() -> None:
    text = 'Sure. <tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call> Done.'
    content, calls = parse_tool_calls(text)
    print(f"batch: content {content!r}")
    print(f"       calls   {calls}")
    p = StreamingToolParser()
    for chunk in ["Sure. <tool", '_call>{"name": "get_weather", ', '"arguments": {"city": "Paris"}}</tool_', "call> Done."]:
        print(f"  feed {chunk!r:42} -> {p.feed(chunk)}   held {p.buffer!r:.24}")
    print(f"  finish -> {p.finish()}")
    p = StreamingToolParser()
    print(f"\nfalse alarm: feed '<to' -> {p.feed('<to')}, feed 'day>' -> {p.feed('day>')}")
    for bad in ['<tool_call>{"name": "f", "arguments": </tool_call>', '<tool_call>{"name": "f"']:
        try:
            parse_tool_calls(bad)
        except ValueError as e:
            print(f"loud: {str(e)[:72]}")


if __name__ == "__main__":
    main()
