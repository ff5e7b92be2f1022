"""Drive vLLM 0.22.1's own serving-side text machinery on a CPU: the hermes tool parser, the
deepseek_r1 reasoning parser and ``FastIncrementalDetokenizer``, on the tiny model's byte-level
BPE (``course.runtime.tiny_model``: ``<tool_call>``, ``<think>`` and their closers are added
tokens). Used by mini's differential tests and Phase 16's labs. Importing this module imports
vllm (seconds); ``import mini_vllm`` never does.

Every stream is fed as *text deltas cut at token boundaries*, the way the server sees them: a
chunking is a sorted list of cut points into the token ids, and only cuts where the decoded prefix
ends on a whole character are used (upstream's detokenizer never hands out half a character).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence

import numpy as np

# isort: off
from course.runtime import real_vllm as rv  # wires the CPU environment before any vllm import

from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
from vllm.reasoning import ReasoningParserManager
from vllm.sampling_params import SamplingParams as VllmSamplingParams
from vllm.tool_parsers.abstract_tool_parser import ToolParserManager
from vllm.v1.engine import EngineCoreRequest
from vllm.v1.engine.detokenizer import IncrementalDetokenizer as VllmIncrementalDetokenizer
# isort: on


@functools.cache
def tokenizer():
    """vLLM's tokenizer for the tiny model (cached: loading takes a second)."""
    return rv.make_tokenizer()


@functools.cache
def request() -> ChatCompletionRequest:
    return ChatCompletionRequest(model="tiny", messages=[{"role": "user", "content": "hi"}])


def encode(text: str) -> list[int]:
    return tokenizer().encode(text, add_special_tokens=False)


def decode(ids: Sequence[int]) -> str:
    return tokenizer().decode(list(ids), skip_special_tokens=False)


def char_cuts(ids: Sequence[int]) -> list[int]:
    """Token positions where the decoded prefix ends on a whole character (0 and len(ids) included)."""
    full = decode(ids)
    return [
        k
        for k in range(len(ids) + 1)
        if full.startswith(decode(ids[:k])) and not decode(ids[:k]).endswith("\ufffd")
    ]


def random_chunking(ids: Sequence[int], rng: np.random.Generator, max_tokens: int = 4) -> list[list[int]]:
    """Split ``ids`` into token chunks of 1..max_tokens (at whole-character cuts)."""
    cuts, out, pos = char_cuts(ids), [], 0
    while pos < len(ids):
        ahead = [c for c in cuts if pos < c <= pos + max_tokens] or [next(c for c in cuts if c > pos)]
        nxt = int(rng.choice(ahead))
        out.append(list(ids[pos:nxt]))
        pos = nxt
    return out


def text_deltas(chunks: Sequence[Sequence[int]]) -> list[str]:
    """The text each chunk adds (cumulative decode, differenced)."""
    out, prev, ids = [], "", []
    for c in chunks:
        ids += list(c)
        cur = decode(ids)
        out.append(cur[len(prev) :])
        prev = cur
    return out


# -- hermes ------------------------------------------------------------------------------------
def hermes_batch(text: str) -> tuple[str | None, list[tuple[str, str]]]:
    """vLLM's ``extract_tool_calls``: (content or None, [(name, arguments JSON string)])."""
    parser = ToolParserManager.get_tool_parser("hermes")(tokenizer())
    info = parser.extract_tool_calls(text, request())
    return info.content, [(c.function.name, c.function.arguments) for c in info.tool_calls]


def hermes_stream(chunks: Sequence[Sequence[int]]) -> tuple[str, list[tuple[str, str]]]:
    """vLLM's ``extract_tool_calls_streaming`` over token chunks: (content, [(name, args text)])."""
    parser = ToolParserManager.get_tool_parser("hermes")(tokenizer())
    content, calls = "", {}
    prev_text, prev_ids = "", []
    for chunk in chunks:
        cur_ids = prev_ids + list(chunk)
        cur_text = decode(cur_ids)
        d = parser.extract_tool_calls_streaming(
            prev_text, cur_text, cur_text[len(prev_text) :], prev_ids, cur_ids, list(chunk), request()
        )
        if d is not None:
            content += d.content or ""
            for tc in d.tool_calls:
                slot = calls.setdefault(tc.index, ["", ""])
                slot[0] += (tc.function.name or "") if tc.function else ""
                slot[1] += (tc.function.arguments or "") if tc.function else ""
        prev_text, prev_ids = cur_text, cur_ids
    return content, [tuple(calls[i]) for i in sorted(calls)]


# -- deepseek_r1 ---------------------------------------------------------------------------------
def r1_batch(text: str) -> tuple[str | None, str | None]:
    parser = ReasoningParserManager.get_reasoning_parser("deepseek_r1")(tokenizer())
    return parser.extract_reasoning(text, request())


def r1_stream(chunks: Sequence[Sequence[int]]) -> tuple[str, str]:
    """vLLM's ``extract_reasoning_streaming`` over token chunks: (reasoning, content) concatenated."""
    parser = ReasoningParserManager.get_reasoning_parser("deepseek_r1")(tokenizer())
    reasoning, content = "", ""
    prev_text, prev_ids = "", []
    for chunk in chunks:
        cur_ids = prev_ids + list(chunk)
        cur_text = decode(cur_ids)
        d = parser.extract_reasoning_streaming(
            prev_text, cur_text, cur_text[len(prev_text) :], prev_ids, cur_ids, list(chunk)
        )
        if d is not None:
            reasoning += d.reasoning or ""
            content += d.content or ""
        prev_text, prev_ids = cur_text, cur_ids
    return reasoning, content


# -- detokenizer ---------------------------------------------------------------------------------
def fast_detokenizer(prompt_ids: Sequence[int], stop: Sequence[str] = (), include_stop: bool = False):
    """vLLM's ``FastIncrementalDetokenizer`` for one request (what ``from_new_request`` picks)."""
    params = VllmSamplingParams(stop=list(stop), include_stop_str_in_output=include_stop, max_tokens=10_000)
    req = EngineCoreRequest(
        request_id="r",
        prompt_token_ids=list(prompt_ids),
        mm_features=None,
        sampling_params=params,
        pooling_params=None,
        arrival_time=0.0,
        lora_request=None,
        cache_salt=None,
        data_parallel_rank=None,
    )
    return VllmIncrementalDetokenizer.from_new_request(tokenizer(), req)


def detok_stream(detok, chunks: Sequence[Sequence[int]]) -> tuple[list[str], str | None, str]:
    """Feed token chunks to a detokenizer with upstream's interface: (deltas, stop string, final text)."""
    deltas, stopped = [], None
    for chunk in chunks:
        stopped = detok.update(list(chunk), False)
        deltas.append(detok.get_next_output_text(stopped is not None, delta=True))
        if stopped is not None:
            break
    return deltas, stopped, detok.get_next_output_text(True, delta=False)


def args_obj(arguments: str) -> object:
    return json.loads(arguments)


@functools.cache
def _byte_ids() -> tuple[int, ...]:
    from mini_vllm.entrypoints.detokenizer import _byte_level_decoder

    vocab = tokenizer().get_vocab()
    by_byte = {b: c for c, b in _byte_level_decoder().items()}
    return tuple(vocab[by_byte[b]] for b in range(256))


def byte_token_ids(data: bytes) -> list[int]:
    """The tiny BPE's single-byte token for each byte: the byte-per-token stream vLLM can detokenize."""
    table = _byte_ids()
    return [table[b] for b in data]
