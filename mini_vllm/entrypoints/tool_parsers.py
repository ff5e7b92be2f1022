"""Tool calls out of generated text, the Hermes convention: ``<tool_call>{json}</tool_call>``.

Mirrors ``vllm/tool_parsers/hermes_tool_parser.py`` (``Hermes2ProToolParser``): the batch path
(``parse_tool_calls``, upstream's ``extract_tool_calls``) finds every tagged span and loads its
JSON ``{"name": ..., "arguments": {...}}``; the streaming path (``StreamingToolParser``, upstream's
``extract_tool_calls_streaming``) emits content eagerly but holds back a trailing prefix of
``<tool_call>`` (``partial_tag_overlap``, the same helper upstream has in ``tool_parsers/utils.py``)
and buffers a call until its closing tag. For any chunking, streaming == batch.

Differences from upstream, on purpose: text after or between calls is kept as content (upstream
keeps only the text before the first call); a malformed or unterminated call raises
``ValueError`` (upstream logs and returns the raw text as content); a call is emitted whole when
its closing tag arrives (upstream streams the ``arguments`` text as it grows). Left out: the
``ToolParserManager`` registry of ~40 model conventions, ``<scratch_pad>``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

TOOL_CALL_START = "<tool_call>"
TOOL_CALL_END = "</tool_call>"


def partial_tag_overlap(text: str, tag: str) -> int:
    """Length of the longest proper prefix of ``tag`` that ``text`` ends with (0 if none)."""
    for k in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:k]):
            return k
    return 0


def _load_call(body: str) -> dict:
    """One call's JSON: an object with a string ``name`` and an object ``arguments``."""
    try:
        call = json.loads(body)
    except json.JSONDecodeError as e:
        raise ValueError(f"tool call body is not JSON ({e.msg} at {e.pos}): {body!r}") from e
    if (
        not isinstance(call, dict)
        or not isinstance(call.get("name"), str)
        or not isinstance(call.get("arguments"), dict)
    ):
        raise ValueError(f'a tool call must be {{"name": str, "arguments": object}}, got {body!r}')
    return {"name": call["name"], "arguments": call["arguments"]}


def parse_tool_calls(text: str) -> tuple[str, list[dict]]:
    """Split ``text`` into its content (outside the tags) and its calls, in order.

    Raises ``ValueError`` for a body that is not a call's JSON or a ``<tool_call>`` never closed.
    """
    content: list[str] = []
    calls: list[dict] = []
    pos = 0
    while True:
        start = text.find(TOOL_CALL_START, pos)
        if start == -1:
            content.append(text[pos:])
            return "".join(content), calls
        content.append(text[pos:start])
        body_start = start + len(TOOL_CALL_START)
        end = text.find(TOOL_CALL_END, body_start)
        if end == -1:
            raise ValueError(f"unterminated {TOOL_CALL_START}: {text[start:]!r}")
        calls.append(_load_call(text[body_start:end]))
        pos = end + len(TOOL_CALL_END)


@dataclass
class StreamingToolParser:
    """Feed text deltas; get ``("content", str)`` and ``("tool_call", dict)`` events."""

    buffer: str = ""
    in_block: bool = False

    def feed(self, chunk: str) -> list[tuple[str, object]]:
        self.buffer += chunk
        events: list[tuple[str, object]] = []
        while True:
            if self.in_block:
                end = self.buffer.find(TOOL_CALL_END)
                if end == -1:
                    return events  # buffer the call silently until it closes
                events.append(("tool_call", _load_call(self.buffer[:end])))
                self.buffer = self.buffer[end + len(TOOL_CALL_END) :]
                self.in_block = False
                continue
            start = self.buffer.find(TOOL_CALL_START)
            if start == -1:
                keep = partial_tag_overlap(self.buffer, TOOL_CALL_START)
                ready, self.buffer = (
                    self.buffer[: len(self.buffer) - keep],
                    self.buffer[len(self.buffer) - keep :],
                )
                if ready:
                    events.append(("content", ready))
                return events
            if start:
                events.append(("content", self.buffer[:start]))
            self.buffer = self.buffer[start + len(TOOL_CALL_START) :]
            self.in_block = True

    def finish(self) -> list[tuple[str, object]]:
        """The stream ended: release held text; an open call is an error."""
        if self.in_block:
            raise ValueError(f"the stream ended inside {TOOL_CALL_START}: {self.buffer!r}")
        rest, self.buffer = self.buffer, ""
        return [("content", rest)] if rest else []


def tool_call_to_openai(call: dict, call_id: str) -> dict:
    """A parsed call in the OpenAI response shape (``arguments`` is a JSON *string*, as upstream dumps it)."""
    arguments = json.dumps(call["arguments"], ensure_ascii=False)
    return {"id": call_id, "type": "function", "function": {"name": call["name"], "arguments": arguments}}
