"""The translation layer: an OpenAI request in, ``SamplingParams`` + prompt to ``AsyncLLM``, text out.

Mirrors ``vllm/entrypoints/openai/chat_completion/serving.py`` (``create_chat_completion``: check
the model, render the chat template, build the sampling parameters, call ``generate``, then
either collect or stream) and ``completion/serving.py``. Each choice runs one pipeline of stacked
hold-back buffers: token ids → ``IncrementalDetokenizer`` (whole characters, stop strings) →
``StreamingReasoningParser`` (``<think>``) → ``StreamingToolParser`` (``<tool_call>``). The
non-streamed response runs the same pipeline and joins its pieces, so streaming and not streaming
give the same text. ``tool_choice`` ``required`` or a named function, and ``response_format``
``json_schema``, are forced with phase 12's grammar (a flat schema becomes a regex).

Left out: logprobs, ``echo``, the Responses / Anthropic / gRPC front ends, per-model chat
templates beyond a checkpoint's own ``apply_chat_template``.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..sampling_params import SamplingParams, StructuredOutputsParams
from .async_llm import AsyncLLM, TokenDelta
from .detokenizer import IncrementalDetokenizer
from .protocol import ChatCompletionRequest, CompletionRequest
from .reasoning import StreamingReasoningParser
from .tool_parsers import StreamingToolParser, tool_call_to_openai


class RequestError(Exception):
    """Bad input found past validation: becomes an OpenAI error with this status (never a 500)."""

    def __init__(
        self, message: str, status: int = 400, err_type: str = "BadRequestError", param: str | None = None
    ):
        super().__init__(message)
        self.status, self.err_type, self.param = status, err_type, param


@dataclass
class ServedModel:
    """What the server needs from a checkpoint: a name, an engine, its tokenizer's bytes, a chat template."""

    name: str
    llm: AsyncLLM
    token_bytes: Any  # token id -> bytes
    max_model_len: int
    reasoning_parser: str | None = None  # "deepseek_r1" splits <think> blocks

    def encode(self, text: str) -> list[int]:
        return self.llm.engine.tokenizer.encode(text)

    def render_chat(self, messages: list[dict], tools: list[dict] | None) -> str:
        tok = self.llm.engine.tokenizer
        if hasattr(tok, "apply_chat_template"):  # a checkpoint's own template
            return tok.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=False)
        # mini's byte tokenizer has no template: the tiny test model's plain one, tools as a system line
        head = ""
        if tools:
            head = (
                "<|system|>Tools: "
                + json.dumps(tools)
                + ' Call one as <tool_call>{"name": ..., "arguments": {...}}</tool_call>\n'
            )
        body = "".join(f"<|{m['role']}|>{m.get('content') or ''}\n" for m in messages)
        return head + body + "<|assistant|>"


# -- JSON schema -> regex (flat objects only) ---------------------------------------------------------
_SCALAR = {
    "string": '"[a-zA-Z0-9 _.,-]*"',
    "integer": "-?(0|[1-9][0-9]*)",  # JSON: no leading zero
    "number": "-?(0|[1-9][0-9]*)",
    "boolean": "(true|false)",
}


def _escape(s: str) -> str:
    return re.sub(r"([\\()|*+?\[\]{}.^$])", r"\\\1", s)


def schema_regex(schema: dict, param: str) -> str:
    """A regex for the compact JSON of a flat object schema (string/integer/number/boolean/enum properties)."""
    if schema.get("type") != "object" or not isinstance(schema.get("properties", {}), dict):
        raise RequestError("mini forces only flat JSON object schemas (type: object)", param=param)
    parts = []
    for name, prop in schema.get("properties", {}).items():
        if not isinstance(prop, dict):
            raise RequestError(f"property {name!r} needs a schema object", param=param)
        if "enum" in prop:
            alts = "|".join(_escape(json.dumps(v, ensure_ascii=False)) for v in prop["enum"])
            value = f"({alts})"
        elif prop.get("type") in _SCALAR:
            value = _SCALAR[prop["type"]]
        else:
            raise RequestError(
                f"property {name!r}: mini forces string, integer, number, boolean or enum", param=param
            )
        parts.append(_escape(json.dumps(name, ensure_ascii=False)) + ": " + value)
    return "\\{" + ", ".join(parts) + "\\}"


def tool_call_regex(tools: Sequence[dict]) -> str:
    alts = []
    for t in tools:
        f = t["function"]
        args = schema_regex(f.get("parameters") or {"type": "object", "properties": {}}, "tools")
        alts.append(
            _escape('<tool_call>{"name": ' + json.dumps(f["name"], ensure_ascii=False) + ', "arguments": ')
            + args
            + _escape("}</tool_call>")
        )
    return "(" + "|".join(alts) + ")"


# -- one choice's text pipeline -------------------------------------------------------------------------
@dataclass
class ChoiceState:
    detok: IncrementalDetokenizer
    reasoning: StreamingReasoningParser | None
    tools: StreamingToolParser | None
    tool_calls: list[dict] = field(default_factory=list)
    finish_reason: str | None = None
    num_output_tokens: int = 0
    named_tool: bool = False  # a named tool_choice finishes with "stop", as upstream's does

    def push(self, delta: TokenDelta) -> tuple[str, str, list[dict]]:
        """Tokens in; (reasoning, content, new tool calls) out. Sets ``finish_reason`` when done."""
        self.num_output_tokens = delta.num_output_tokens
        stopped = self.detok.update(delta.new_token_ids)
        done = stopped is not None or delta.finished
        if done and stopped is None:
            stopped = self.detok.finish()
        text = self.detok.get_next_output_text(done, delta=True)
        reasoning, content, calls = "", text, []
        if self.reasoning is not None:
            reasoning, content = self.reasoning.feed(text)
            if done:
                r, c = self.reasoning.finish()
                reasoning, content = reasoning + r, content + c
        if self.tools is not None:
            events = self.tools.feed(content)
            if done:
                try:
                    events += self.tools.finish()
                except ValueError:  # cut inside a call (max_tokens): the raw text is content
                    events.append(("content", "<tool_call>" + self.tools.buffer))
            content = "".join(v for k, v in events if k == "content")
            calls = [v for k, v in events if k == "tool_call"]
            self.tool_calls += calls
        if done:
            self.finish_reason = "stop" if stopped is not None else delta.finish_reason
            if self.tool_calls and self.finish_reason == "stop" and not self.named_tool:
                self.finish_reason = "tool_calls"
        return reasoning, content, calls


class OpenAIServing:
    """``create_completion`` and ``create_chat_completion`` over one ``ServedModel``."""

    def __init__(self, model: ServedModel) -> None:
        self.model = model

    def check_model(self, name: str | None) -> None:
        if name is not None and name != self.model.name:
            raise RequestError(
                f"The model `{name}` does not exist.", status=404, err_type="NotFoundError", param="model"
            )

    def _params(
        self,
        req: CompletionRequest | ChatCompletionRequest,
        prompt_len: int,
        max_tokens: int | None,
        structured: StructuredOutputsParams | None,
    ) -> list[SamplingParams]:
        if req.structured_outputs is not None:
            if structured is not None:
                raise RequestError(
                    "structured_outputs and another constraint cannot both apply", param="structured_outputs"
                )
            try:
                structured = StructuredOutputsParams(**req.structured_outputs.model_dump(exclude_none=True))
            except (TypeError, ValueError) as e:
                raise RequestError(str(e), param="structured_outputs") from e
        room = self.model.max_model_len - prompt_len
        if room < 1:
            raise RequestError(
                f"This model's maximum context length is {self.model.max_model_len} tokens. "
                f"Your prompt contains {prompt_len} input tokens, which leaves no room for output.",
                param="input_tokens",
            )
        if max_tokens is not None and max_tokens > room:
            raise RequestError(
                f"This model's maximum context length is {self.model.max_model_len} tokens. However, "
                f"you requested {max_tokens} output tokens and your prompt contains {prompt_len} input "
                f"tokens, for a total of {prompt_len + max_tokens} tokens. Please reduce the length of "
                f"the input prompt or the number of requested output tokens.",
                param="max_tokens",
            )
        out = []
        for i in range(req.n):
            try:
                out.append(
                    SamplingParams(
                        max_tokens=max_tokens or room,
                        temperature=req.temperature,
                        top_p=req.top_p,
                        top_k=req.top_k,
                        seed=None if req.seed is None else req.seed + i,
                        ignore_eos=req.ignore_eos,
                        structured_outputs=structured,
                    )
                )
            except (TypeError, ValueError) as e:
                raise RequestError(str(e)) from e
        return out

    async def _choices(
        self, prompt: str | list[int], params: list[SamplingParams]
    ) -> AsyncIterator[tuple[int, TokenDelta]]:
        """All n choices' deltas, merged as they come; leaving early aborts every unfinished one."""
        rid = f"req-{uuid.uuid4().hex[:16]}"
        gens = [self.model.llm.generate(prompt, p, f"{rid}-{i}") for i, p in enumerate(params)]
        if len(gens) == 1:
            try:
                async for d in gens[0]:
                    yield 0, d
            finally:
                await gens[0].aclose()
            return
        queue: asyncio.Queue = asyncio.Queue()

        async def pump(i: int) -> None:
            try:
                async for d in gens[i]:
                    await queue.put((i, d))
            except Exception as e:
                await queue.put((i, e))

        tasks = [asyncio.create_task(pump(i)) for i in range(len(gens))]
        try:
            left = len(gens)
            while left:
                i, d = await queue.get()
                if isinstance(d, Exception):
                    raise d
                left -= d.finished
                yield i, d
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            for g in gens:
                await g.aclose()

    def _state(self, stop: Any, tools: bool, reasoning: bool) -> ChoiceState:
        try:
            detok = IncrementalDetokenizer(self.model.token_bytes, stop=stop)
        except ValueError as e:
            raise RequestError(str(e), param="stop") from e
        splitter = StreamingReasoningParser() if reasoning and self.model.reasoning_parser else None
        return ChoiceState(detok, splitter, StreamingToolParser() if tools else None)

    # -- /v1/completions -------------------------------------------------------------------------
    async def create_completion(self, req: CompletionRequest) -> dict | AsyncIterator[str]:
        self.check_model(req.model)
        prompt = req.prompt
        n_prompt = len(self.model.encode(prompt)) if isinstance(prompt, str) else len(prompt)
        params = self._params(req, n_prompt, req.max_tokens, None)
        states = [self._state(req.stop, tools=False, reasoning=False) for _ in params]
        gen = self._choices(prompt, params)
        first = await _first(
            gen
        )  # engine errors (bad prompt ids, empty prompt) raise here, before any byte is sent
        rid, created = f"cmpl-{uuid.uuid4().hex}", int(time.time())
        head = {"id": rid, "object": "text_completion", "created": created, "model": self.model.name}
        usage = lambda: _usage(n_prompt, states)  # noqa: E731
        if not req.stream:
            texts, ids = [""] * len(states), [[] for _ in states]
            async for i, d in _chain(first, gen):
                if states[i].finish_reason is not None:  # stopped on a stop string; its abort follows
                    continue
                texts[i] += states[i].push(d)[1]
                ids[i] += d.new_token_ids
                if states[i].finish_reason is not None and not d.finished:
                    self.model.llm.abort(d.request_id)
            choices = [
                {"index": i, "text": texts[i], "logprobs": None, "finish_reason": s.finish_reason}
                for i, s in enumerate(states)
            ]
            if req.return_token_ids:  # what a prefill/decode proxy needs to hand the prompt on
                prompt_ids = self.model.encode(prompt) if isinstance(prompt, str) else list(prompt)
                for c in choices:
                    c.update(prompt_token_ids=prompt_ids, token_ids=ids[c["index"]])
            return {**head, "choices": choices, "usage": usage()}

        async def stream() -> AsyncIterator[str]:
            async for i, d in _chain(first, gen):
                if states[i].finish_reason is not None:
                    continue
                _, text, _ = states[i].push(d)
                if text or states[i].finish_reason:
                    choice = {
                        "index": i,
                        "text": text,
                        "logprobs": None,
                        "finish_reason": states[i].finish_reason,
                    }
                    yield _sse({**head, "choices": [choice]})
                if states[i].finish_reason is not None and not d.finished:
                    self.model.llm.abort(d.request_id)
            if req.stream_options and req.stream_options.include_usage:
                yield _sse({**head, "choices": [], "usage": usage()})
            yield "data: [DONE]\n\n"

        return stream()

    # -- /v1/chat/completions ----------------------------------------------------------------------
    async def create_chat_completion(self, req: ChatCompletionRequest) -> dict | AsyncIterator[str]:
        self.check_model(req.model)
        tools = [t.model_dump() for t in req.tools or []]
        choice = req.tool_choice or ("auto" if tools else "none")
        if choice != "none" and not tools:
            raise RequestError("tool_choice needs tools", param="tool_choice")
        structured = None
        if choice == "required":
            structured = StructuredOutputsParams(regex=tool_call_regex(tools))
        elif not isinstance(choice, str):
            named = [t for t in tools if t["function"]["name"] == choice.function.get("name")]
            if not named:
                raise RequestError(
                    f"tool_choice names {choice.function.get('name')!r}, which is not in tools",
                    param="tool_choice",
                )
            structured = StructuredOutputsParams(regex=tool_call_regex(named))
        fmt = req.response_format
        if fmt is not None and fmt.type != "text":
            if structured is not None:
                raise RequestError(
                    "response_format and a forced tool call cannot both constrain the output",
                    param="response_format",
                )
            if fmt.type == "json_object":
                structured = StructuredOutputsParams(json_object=True)
            else:
                if fmt.json_schema is None:
                    raise RequestError(
                        "response_format json_schema needs json_schema", param="response_format"
                    )
                structured = StructuredOutputsParams(
                    regex=schema_regex(fmt.json_schema.schema_, "response_format")
                )
        messages = [m.model_dump(exclude_none=True) for m in req.messages]
        prompt = self.model.render_chat(messages, tools if choice != "none" else None)
        n_prompt = len(self.model.encode(prompt))
        params = self._params(req, n_prompt, req.max_completion_tokens or req.max_tokens, structured)
        # a grammar that forces a call or a format from the first token leaves no room for <think>
        forced = structured is not None and req.structured_outputs is None
        states = [self._state(req.stop, tools=choice != "none", reasoning=not forced) for _ in params]
        for st in states:
            st.named_tool = not isinstance(choice, str)
        gen = self._choices(prompt, params)
        first = await _first(gen)
        rid, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())
        usage = lambda: _usage(n_prompt, states)  # noqa: E731
        if not req.stream:
            parts = [["", ""] for _ in states]
            async for i, d in _chain(first, gen):
                if states[i].finish_reason is not None:
                    continue
                r, c, _ = states[i].push(d)
                parts[i][0] += r
                parts[i][1] += c
                if states[i].finish_reason is not None and not d.finished:
                    self.model.llm.abort(d.request_id)
            choices = []
            for i, s in enumerate(states):
                msg: dict[str, Any] = {
                    "role": "assistant",
                    "content": parts[i][1] or (None if s.tool_calls else ""),
                }
                if s.tool_calls:
                    msg["tool_calls"] = [
                        tool_call_to_openai(c, f"chatcmpl-tool-{uuid.uuid4().hex[:16]}") for c in s.tool_calls
                    ]
                if self.model.reasoning_parser:
                    msg["reasoning"] = parts[i][0] or None
                choices.append(
                    {"index": i, "message": msg, "logprobs": None, "finish_reason": s.finish_reason}
                )
            return {
                "id": rid,
                "object": "chat.completion",
                "created": created,
                "model": self.model.name,
                "choices": choices,
                "usage": usage(),
            }

        head = {"id": rid, "object": "chat.completion.chunk", "created": created, "model": self.model.name}

        def chunk(i: int, delta: dict, finish: str | None = None) -> str:
            return _sse(
                {**head, "choices": [{"index": i, "delta": delta, "logprobs": None, "finish_reason": finish}]}
            )

        async def stream() -> AsyncIterator[str]:
            num_calls = [0] * len(states)
            for i in range(len(states)):
                yield chunk(i, {"role": "assistant", "content": ""})
            async for i, d in _chain(first, gen):
                s = states[i]
                if s.finish_reason is not None:
                    continue
                r, c, calls = s.push(d)
                if r:
                    yield chunk(i, {"reasoning": r})
                if c:
                    yield chunk(i, {"content": c})
                for call in calls:
                    tc = tool_call_to_openai(call, f"chatcmpl-tool-{uuid.uuid4().hex[:16]}")
                    yield chunk(i, {"tool_calls": [{"index": num_calls[i], **tc}]})
                    num_calls[i] += 1
                if s.finish_reason is not None:
                    yield chunk(i, {}, s.finish_reason)
                    if not d.finished:
                        self.model.llm.abort(d.request_id)
            if req.stream_options and req.stream_options.include_usage:
                yield _sse({**head, "choices": [], "usage": usage()})
            yield "data: [DONE]\n\n"

        return stream()


async def _first(gen: AsyncIterator) -> Any:
    """The first item (so errors raised on submission surface before a response starts)."""
    try:
        return await gen.__anext__()
    except (ValueError, TypeError) as e:
        await gen.aclose()
        raise RequestError(str(e), param="prompt") from e


async def _chain(first: Any, gen: AsyncIterator) -> AsyncIterator:
    yield first
    try:
        async for item in gen:
            yield item
    finally:
        await gen.aclose()


def _usage(n_prompt: int, states: Sequence[ChoiceState]) -> dict:
    completion = sum(s.num_output_tokens for s in states)
    return {"prompt_tokens": n_prompt, "completion_tokens": completion, "total_tokens": n_prompt + completion}


def _sse(obj: dict) -> str:
    return "data: " + json.dumps(obj, ensure_ascii=False) + "\n\n"
