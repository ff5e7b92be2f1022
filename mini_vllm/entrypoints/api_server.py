"""An OpenAI-compatible HTTP server on FastAPI + uvicorn, the stack ``vllm serve`` runs on.

Mirrors ``vllm/entrypoints/openai/api_server.py`` (``build_app``: routes, the
``RequestValidationError`` handler that turns a bad body into a 400, the API-key middleware of
``server_utils.py`` that guards every ``/v1`` path) and ``vllm/entrypoints/utils.py``
(``with_cancellation``: a non-streamed request whose client hangs up is cancelled, which aborts
it in the engine; a streamed one is cancelled by Starlette's ``StreamingResponse``). Routes:
``/health``, ``/v1/models``, ``/v1/completions``, ``/v1/chat/completions``, ``/metrics`` (Prometheus
text with vLLM's metric names, ``metrics.py``; unguarded by the API key, as upstream's).

``python -m mini_vllm serve [CHECKPOINT] [--host 127.0.0.1] [--port 8000] [--api-key KEY]``
(``VLLM_API_KEY`` works too). Without a checkpoint (or with ``toy``) it serves mini's toy engine
with the byte tokenizer; a checkpoint path goes to ``LLMEngine(model=...)`` once the engine can
load one. Left out: ``/tokenize``, CORS, TLS, several API-server
processes.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import hashlib
import os
import secrets
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from .async_llm import AsyncLLM
from .detokenizer import byte_token_bytes, hf_token_bytes
from .protocol import ChatCompletionRequest, CompletionRequest, error_body
from .serving import OpenAIServing, RequestError, ServedModel


def _error(message: str, err_type: str, code: int, param: str | None = None) -> JSONResponse:
    return JSONResponse(error_body(message, err_type, code, param), status_code=code)


async def listen_for_disconnect(request: Request) -> None:
    """Return when the client hangs up (the body was already read by FastAPI)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


def with_cancellation(handler):
    """Run the handler and a disconnect listener; whichever finishes first cancels the other."""

    @functools.wraps(handler)
    async def wrapper(*args: Any, **kwargs: Any) -> Any:
        request: Request = kwargs["raw_request"]
        work = asyncio.create_task(handler(*args, **kwargs))
        hangup = asyncio.create_task(listen_for_disconnect(request))
        done, pending = await asyncio.wait({work, hangup}, return_when=asyncio.FIRST_COMPLETED)
        for t in pending:
            t.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        if work in done:
            return work.result()
        return None  # nobody is listening any more

    return wrapper


def build_app(model: ServedModel, api_key: str | None = None) -> FastAPI:
    serving = OpenAIServing(model)

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        await model.llm.shutdown()

    app = FastAPI(title="mini_vllm OpenAI-compatible server", lifespan=lifespan)
    app.state.model = model

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        errors = exc.errors()
        param = ".".join(str(p) for p in errors[0]["loc"][1:]) if errors and errors[0].get("loc") else None
        msgs = "; ".join(f"{'.'.join(map(str, e.get('loc', ())))}: {e.get('msg')}" for e in errors)
        return _error(msgs or "invalid request", "Bad Request", 400, param or None)

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        kind = {404: "NotFoundError", 405: "MethodNotAllowed"}.get(exc.status_code, "BadRequestError")
        return _error(str(exc.detail), kind, exc.status_code)

    @app.exception_handler(RequestError)
    async def _request_error(_: Request, exc: RequestError) -> JSONResponse:
        return _error(str(exc), exc.err_type, exc.status, exc.param)

    @app.exception_handler(Exception)
    async def _internal(_: Request, exc: Exception) -> JSONResponse:  # a bug, never bad input
        return _error(f"internal error: {type(exc).__name__}: {exc}", "InternalServerError", 500)

    if api_key:
        want = hashlib.sha256(api_key.encode()).digest()

        @app.middleware("http")
        async def _auth(request: Request, call_next):  # upstream's AuthenticationMiddleware
            if request.method != "OPTIONS" and request.url.path.startswith("/v1"):
                scheme, _, token = request.headers.get("Authorization", "").partition(" ")
                got = hashlib.sha256(token.encode()).digest()
                if scheme.lower() != "bearer" or not secrets.compare_digest(got, want):
                    return _error(
                        "Unauthorized: a valid 'Authorization: Bearer <key>' header is required",
                        "AuthenticationError",
                        401,
                    )
            return await call_next(request)

    @app.get("/health")
    async def health() -> JSONResponse:
        return (
            JSONResponse({})
            if model.llm.errored is None
            else _error("engine dead", "InternalServerError", 503)
        )

    from ..metrics import PrometheusStatLogger, StatsRecorder

    engine = model.llm.engine
    recorder = getattr(engine, "stats_recorder", None) or StatsRecorder(engine, keep_history=False)
    prometheus = PrometheusStatLogger(
        model.name, spec_decoding=engine.vllm_config.speculative_config is not None
    )
    recorder.loggers.append(prometheus)
    app.state.prometheus = prometheus

    @app.get("/metrics")
    async def metrics() -> Response:  # upstream mounts prometheus_client's ASGI app here
        return Response(prometheus.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.get("/v1/models")
    async def models() -> dict:
        card = {
            "id": model.name,
            "object": "model",
            "created": 0,
            "owned_by": "mini_vllm",
            "max_model_len": model.max_model_len,
        }
        return {"object": "list", "data": [card]}

    def respond(result: dict | AsyncIterator[str]) -> Any:
        if isinstance(result, dict):
            return JSONResponse(result)
        return StreamingResponse(result, media_type="text/event-stream")

    @app.post("/v1/completions")
    @with_cancellation
    async def completions(request: CompletionRequest, raw_request: Request) -> Any:
        return respond(await serving.create_completion(request))

    @app.post("/v1/chat/completions")
    @with_cancellation
    async def chat_completions(request: ChatCompletionRequest, raw_request: Request) -> Any:
        return respond(await serving.create_chat_completion(request))

    return app


def load_model(
    checkpoint: str | None, reasoning_parser: str | None = None, **engine_args: Any
) -> ServedModel:
    """The engine behind the server: mini's toy engine, or (later) a checkpoint directory."""
    from ..engine import LLMEngine

    if checkpoint in (None, "toy"):
        engine = LLMEngine(**engine_args)
        name, token_bytes = "mini-toy", byte_token_bytes(engine.tokenizer.eos_token_id)
    else:
        if not os.path.isdir(checkpoint):
            raise SystemExit(f"checkpoint {checkpoint!r} is not a directory")
        try:
            engine = LLMEngine(model=checkpoint, **engine_args)
        except TypeError as e:
            raise SystemExit(f"this LLMEngine cannot load checkpoints yet ({e}); serve the toy engine") from e
        name, token_bytes = checkpoint, hf_token_bytes(engine.tokenizer)
    return ServedModel(name, AsyncLLM(engine), token_bytes, engine.max_model_len, reasoning_parser)


def make_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m mini_vllm serve", description="OpenAI-compatible server on mini_vllm"
    )
    p.add_argument("checkpoint", nargs="?", default=None, help="model directory, or 'toy' (default)")
    p.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument(
        "--api-key", default=os.environ.get("VLLM_API_KEY"), help="require 'Authorization: Bearer KEY' on /v1"
    )
    p.add_argument("--served-model-name", default=None)
    p.add_argument("--reasoning-parser", choices=["deepseek_r1"], default=None)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--num-gpu-blocks", type=int, default=512)
    p.add_argument("--max-num-seqs", type=int, default=64)
    return p


def main(argv: list[str] | None = None) -> int:
    import uvicorn

    args = make_parser().parse_args(argv)
    model = load_model(
        args.checkpoint,
        args.reasoning_parser,
        block_size=args.block_size,
        num_gpu_blocks=args.num_gpu_blocks,
        max_num_seqs=args.max_num_seqs,
    )
    if args.served_model_name:
        model.name = args.served_model_name
    uvicorn.run(build_app(model, args.api_key), host=args.host, port=args.port, log_level="info")
    return 0
