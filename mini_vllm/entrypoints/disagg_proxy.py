"""A prefill/decode proxy over two in-process engines: prefill on one, decode on the other.

Mirrors the flow of upstream's disaggregated-serving proxy (``examples/online_serving/
disaggregated_serving/``, which is not part of the pinned wheel tree; the pin ships only the
engine-side token endpoint a proxy calls, ``vllm/entrypoints/serve/disagg/protocol.py:62 —
GenerateRequest``, whose ``kv_transfer_params`` carry the handoff): send the request to the prefill
engine with ``max_tokens=1``, then to the decode engine, and return the decode engine's answer.
The prefill engine (``kv_producer``) saves the prompt's KV through its connector as it computes it;
the decode engine (``kv_consumer``) finds it and computes only the tail.

Mini follows ``ExampleConnector``'s convention, not NIXL's: the decode engine gets the prompt plus
the prefill engine's one token (the connector keys the KV by the prompt without its last token),
asks for ``max_tokens - 1`` more, and the proxy puts the first token in front. For greedy sampling
the tokens equal one engine's.

``build_proxy_app(prefill_url, decode_url)`` is the same flow over HTTP, between two OpenAI
servers that take vLLM's ``return_token_ids`` (``python -m mini_vllm serve`` with a producer and a
consumer ``kv_transfer_config``): ``/v1/completions`` goes to the prefill server with
``max_tokens=1``, then prompt + first token to the decode server; the answer is the first token's
text followed by the decode server's (streamed: relayed as it comes, the usage re-counted). Text is
joined as upstream's ExampleConnector examples join it, so a character cut between the first token
and the rest shows as U+FFFD. Left out: chat (its prompt is messages, not ids), ``n > 1``,
round-robin over several servers of each kind, ``kv_transfer_params``, retries.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from ..engine import LLMEngine
from ..outputs import CompletionOutput, RequestOutput
from ..sampling_params import SamplingParams
from ..tokenizer import Prompt


class DisaggProxy:
    """``generate`` like an ``LLMEngine``, split over a prefill engine and a decode engine."""

    def __init__(self, prefill: LLMEngine, decode: LLMEngine) -> None:
        for name, engine, role in (
            ("prefill", prefill, "is_kv_producer"),
            ("decode", decode, "is_kv_consumer"),
        ):
            if not isinstance(engine, LLMEngine):
                raise TypeError(f"{name} must be an LLMEngine, got {type(engine).__name__}")
            cfg = engine.vllm_config.kv_transfer_config
            if cfg is None or not getattr(cfg, role):
                got = "no kv_transfer_config" if cfg is None else f"kv_role={cfg.kv_role!r}"
                want = "kv_producer" if name == "prefill" else "kv_consumer"
                raise ValueError(f"the {name} engine needs kv_role {want!r} (or 'kv_both'), it has {got}")
        if prefill is decode:
            raise ValueError("prefill and decode must be two engines")
        self.prefill, self.decode = prefill, decode

    def generate(
        self, prompts: Prompt | Sequence[Prompt], sampling_params: SamplingParams | None = None
    ) -> list[RequestOutput]:
        """Outputs in input order, as ``LLMEngine.generate``; one sampling params for all prompts."""
        params = sampling_params if sampling_params is not None else SamplingParams()
        if not isinstance(params, SamplingParams):
            raise TypeError(f"sampling_params must be a SamplingParams, got {type(params).__name__}")
        if params.n != 1:
            raise ValueError(f"the proxy serves n=1 only, got n={params.n}")
        prompts = [prompts] if isinstance(prompts, str) else list(prompts)
        # 1. prefill: the whole prompt, one token; the producer's connector saves the prompt's KV
        first = self.prefill.generate(prompts, replace(params, max_tokens=1))
        outputs = []
        todo = [i for i, out in enumerate(first) if params.max_tokens > 1 and out.finish_reason == "length"]
        # 2. decode: prompt + that token; the consumer's connector loads the KV, it computes the tail
        rest = {}
        if todo:
            decoded = self.decode.generate(
                [first[i].prompt_token_ids + first[i].token_ids for i in todo],
                replace(params, max_tokens=params.max_tokens - 1),
            )
            rest = dict(zip(todo, decoded))
        for i, out in enumerate(first):
            if i not in rest:  # stopped at its first token (EOS, a stop token) or max_tokens=1
                outputs.append(out)
                continue
            tail = rest[i].outputs[0]
            token_ids = out.token_ids + tail.token_ids
            completion = CompletionOutput(
                index=0,
                text=self.decode.tokenizer.decode(token_ids),
                token_ids=token_ids,
                finish_reason=tail.finish_reason,
                stop_reason=tail.stop_reason,
            )
            outputs.append(replace(out, outputs=[completion], finished=rest[i].finished))
        return outputs


def build_proxy_app(prefill_url: str, decode_url: str) -> Any:
    """A FastAPI app: ``/v1/completions`` split over a prefill server and a decode server."""
    import aiohttp
    from fastapi import FastAPI, Request
    from fastapi.responses import JSONResponse, StreamingResponse

    from .protocol import error_body

    app = FastAPI(title="mini_vllm prefill/decode proxy")
    timeout = aiohttp.ClientTimeout(total=600)

    def refuse(message: str, param: str | None = None) -> JSONResponse:
        return JSONResponse(error_body(message, "BadRequestError", 400, param), status_code=400)

    @app.get("/health")
    async def health() -> JSONResponse:
        return JSONResponse({})

    @app.get("/v1/models")
    async def models() -> JSONResponse:
        async with aiohttp.ClientSession(timeout=timeout) as session:
            async with session.get(decode_url + "/v1/models") as r:
                return JSONResponse(await r.json(), status_code=r.status)

    async def completions(raw: Request) -> Any:
        try:
            body = json.loads(await raw.body())
            if not isinstance(body, dict):
                raise ValueError("the body must be a JSON object")
        except ValueError as e:
            return refuse(f"invalid JSON body: {e}")
        if body.get("n", 1) != 1:
            return refuse("the proxy serves n=1 only", "n")
        max_tokens = body.get("max_tokens") or 16  # the OpenAI completions default
        prefill = {**body, "max_tokens": 1, "stream": False, "return_token_ids": True}
        prefill.pop("stream_options", None)
        session = aiohttp.ClientSession(timeout=timeout)
        try:
            async with session.post(prefill_url + "/v1/completions", json=prefill) as r:
                first = await r.json()
            if r.status != 200:  # the prefill server's 4xx is the client's answer
                await session.close()
                return JSONResponse(first, status_code=r.status)
            head = first["choices"][0]
            if head["finish_reason"] != "length" or max_tokens == 1:  # done at its first token
                await session.close()
                return JSONResponse(first)
            # the decode server admits prompt + the first token (the store's key) and writes the rest
            decode = {**body, "prompt": head["prompt_token_ids"] + head["token_ids"], "max_tokens": max_tokens - 1}
            r = await session.post(decode_url + "/v1/completions", json=decode)
        except BaseException:
            await session.close()
            raise
        if r.status != 200 or not body.get("stream"):
            try:
                rest = await r.json()
            finally:
                r.release()
                await session.close()
            if r.status != 200:
                return JSONResponse(rest, status_code=r.status)
            choice = rest["choices"][0]
            choice["text"] = head["text"] + choice["text"]
            usage = rest["usage"]
            usage["prompt_tokens"] = first["usage"]["prompt_tokens"]
            usage["completion_tokens"] += 1
            usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
            return JSONResponse(rest)

        async def relay():
            try:
                opening = {**first, "object": "text_completion", "usage": None}
                opening["choices"] = [{**head, "finish_reason": None}]
                for key in ("prompt_token_ids", "token_ids"):
                    opening["choices"][0].pop(key, None)
                yield f"data: {json.dumps(opening)}\n\n"  # the first token's text, from the prefill
                async for line in r.content:  # one SSE line at a time; the usage chunk is re-counted
                    text = line.decode()
                    if text.startswith("data: {") and '"usage"' in text:
                        event = json.loads(text[len("data: "):])
                        if event.get("usage"):
                            u = event["usage"]
                            u["prompt_tokens"] = first["usage"]["prompt_tokens"]
                            u["completion_tokens"] += 1
                            u["total_tokens"] = u["prompt_tokens"] + u["completion_tokens"]
                            text = f"data: {json.dumps(event)}\n"
                    yield text
            finally:  # a client that leaves closes the decode stream: that server aborts the request
                r.release()
                await session.close()

        return StreamingResponse(relay(), media_type="text/event-stream")

    # postponed annotations are strings that FastAPI resolves in this module's globals, where the
    # lazily imported Request is not: give the endpoint the class itself
    completions.__signature__ = inspect.Signature(
        [inspect.Parameter("raw", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=Request)]
    )
    app.add_api_route("/v1/completions", completions, methods=["POST"])
    return app
