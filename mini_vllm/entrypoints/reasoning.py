"""Split a reasoning model's output into ``reasoning`` (inside ``<think>…</think>``) and ``content``.

Mirrors ``vllm/reasoning/deepseek_r1_reasoning_parser.py`` (``DeepSeekR1ReasoningParser`` over
``basic_parsers.py``'s ``BaseThinkingReasoningParser``): everything up to the first ``</think>``
is reasoning, even when the model never wrote ``<think>`` (R1's chat template opens the block in
the prompt); a ``<think>`` there is dropped; what follows ``</think>`` is content; no ``</think>``
means the whole output is reasoning and content is ``None``.

Upstream's tags are single special tokens, so its streaming path tests token ids. Here the tags
are text (mini's byte tokenizer spells ``<think>`` in 7 tokens), so ``StreamingReasoningParser``
holds back a trailing prefix of a tag, as the tool parser does, and streaming == batch for any
chunking. Difference, on purpose: text *before* a ``<think>`` stays reasoning (upstream's batch
path drops it, while its streaming path already sent it as reasoning).
"""

from __future__ import annotations

from .tool_parsers import partial_tag_overlap

THINK_START = "<think>"
THINK_END = "</think>"


def extract_reasoning(text: str) -> tuple[str | None, str | None]:
    """``(reasoning, content)`` of a whole output; empty parts are ``None``, as upstream returns them."""
    head, found, content = text.partition(THINK_END)
    reasoning = head.replace(THINK_START, "", 1)
    if not found:
        return reasoning, None
    return reasoning, content or None


class StreamingReasoningParser:
    """Feed text deltas; get ``(reasoning_delta, content_delta)`` back, held-back tag prefixes excluded."""

    def __init__(self) -> None:
        self.buffer = ""
        self.seen_start = False
        self.in_content = False

    def feed(self, delta: str) -> tuple[str, str]:
        if self.in_content:
            return "", delta
        self.buffer += delta
        reasoning = []
        if not self.seen_start:
            i, j = self.buffer.find(THINK_START), self.buffer.find(THINK_END)
            if i != -1 and (j == -1 or i < j):
                self.seen_start = True
                reasoning.append(self.buffer[:i])
                self.buffer = self.buffer[i + len(THINK_START) :]
        end = self.buffer.find(THINK_END)
        if end != -1:
            reasoning.append(self.buffer[:end])
            content, self.buffer = self.buffer[end + len(THINK_END) :], ""
            self.in_content = True
            return "".join(reasoning), content
        keep = partial_tag_overlap(self.buffer, THINK_END)
        if not self.seen_start:
            keep = max(keep, partial_tag_overlap(self.buffer, THINK_START))
        cut = len(self.buffer) - keep
        reasoning.append(self.buffer[:cut])
        self.buffer = self.buffer[cut:]
        return "".join(reasoning), ""

    def finish(self) -> tuple[str, str]:
        """The stream ended: a held tag prefix was reasoning after all."""
        rest, self.buffer = self.buffer, ""
        return rest, ""
