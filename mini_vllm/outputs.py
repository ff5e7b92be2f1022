"""What the engine hands back for a finished request.

Mirrors ``vllm/outputs.py`` (``RequestOutput`` with its ``CompletionOutput``) flattened into one
record, since mini generates exactly one completion per request (no ``n``, no beam search) and
only returns finished requests (no streaming deltas). ``DraftTokenIds`` mirrors
``vllm/v1/outputs.py``: the drafts a proposer made after a step, handed to
``Scheduler.update_draft_token_ids``.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RequestOutput:
    request_id: str
    prompt: str | None  # the prompt text, or None when the prompt was given as token ids
    prompt_token_ids: list[int]
    token_ids: list[int]  # generated tokens (an EOS that stopped generation is included)
    text: str  # token_ids decoded, EOS skipped
    finish_reason: str | None  # "stop", "length" or "abort"
    finished: bool


@dataclass(frozen=True)
class DraftTokenIds:
    req_ids: list[str]
    draft_token_ids: list[list[int]]  # one list per request id, possibly empty
