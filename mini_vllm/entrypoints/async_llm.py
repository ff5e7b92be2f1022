"""An asyncio front end over ``LLMEngine``: the engine loop in the background, one output stream per request.

Mirrors ``vllm/v1/engine/async_llm.py`` (``AsyncLLM.generate``, ``AsyncLLM.abort``, the background
``output_handler`` task) and ``output_processor.py``'s per-request queues. Upstream the engine core
runs in its own process behind ZMQ; here it runs on one worker thread of this process, and every
engine call (``add_request``, ``step``, ``abort_request``) goes through that thread, so the engine
is never touched concurrently and the event loop never blocks on a step.

``generate`` yields ``TokenDelta`` (the new token ids since the last one) until the request
finishes. A consumer that stops early (a stop string matched, the client disconnected: the task
is cancelled or the generator closed) aborts the request before the next step, which frees its KV
blocks: upstream's ``abort`` on ``asyncio.CancelledError`` / ``GeneratorExit``.

Reads one thing past the engine's public API: the live request's ``output_token_ids`` in
``engine.scheduler.requests`` (mini's ``step()`` reports a request only when it finishes; upstream
streams ``RequestOutputKind.DELTA`` outputs every step). Left out: detokenization (the server
does it, per request), multiple API-server processes, data parallelism, pausing.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
from collections.abc import AsyncIterator, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from ..sampling_params import SamplingParams


@dataclass(frozen=True)
class TokenDelta:
    request_id: str
    new_token_ids: list[int]  # generated since the previous delta
    num_prompt_tokens: int
    num_output_tokens: int  # all generated so far
    finish_reason: str | None  # "stop", "length", "abort", or None while it runs

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


class AsyncLLM:
    """``await``-able generation over one ``LLMEngine`` (which this object then owns)."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="mini-engine")
        self._queues: dict[str, asyncio.Queue[TokenDelta]] = {}  # live request -> its stream
        self._sent: dict[str, int] = {}  # live request -> output tokens already delivered
        self._prompt_len: dict[str, int] = {}
        self._aborts: set[str] = set()  # to abort before the next step (any thread may add)
        self._lock = threading.Lock()
        self._wake: asyncio.Event | None = None
        self._loop_task: asyncio.Task | None = None
        self._ids = itertools.count()
        self.num_steps = 0
        self.errored: BaseException | None = None

    # -- engine thread ------------------------------------------------------------------------
    async def _call(self, fn: Callable[..., Any], *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    def _add(self, prompt: str | list[int], params: SamplingParams, request_id: str) -> None:
        self.engine.add_request(prompt, params, request_id=request_id)
        self._prompt_len[request_id] = len(self.engine.scheduler.requests[request_id].prompt_token_ids)
        self._sent[request_id] = 0  # from now on every step reports it

    def _run_once(self) -> tuple[list[TokenDelta], bool]:
        """Apply pending aborts, run one step, and report every live request's new tokens."""
        with self._lock:
            aborts, self._aborts = [r for r in self._aborts if r in self._sent], set()
        deltas: list[TokenDelta] = []
        for out in self.engine.abort_request(aborts) if aborts else []:
            deltas.append(self._delta(out.request_id, list(out.token_ids), out.finish_reason))
        if self.engine.has_unfinished_requests():
            finished = {o.request_id: o for o in self.engine.step()}
            self.num_steps += 1
            for rid in list(self._sent):
                if rid in finished:
                    out = finished[rid]
                    deltas.append(self._delta(rid, list(out.token_ids), out.finish_reason))
                elif (req := self.engine.scheduler.requests.get(rid)) is not None:
                    if len(req.output_token_ids) > self._sent[rid]:
                        deltas.append(self._delta(rid, list(req.output_token_ids), None))
        return deltas, self.engine.has_unfinished_requests()

    def _delta(self, rid: str, token_ids: list[int], finish_reason: str | None) -> TokenDelta:
        sent = self._sent[rid]
        self._sent[rid] = len(token_ids)
        if finish_reason is not None:
            del self._sent[rid]
        return TokenDelta(rid, token_ids[sent:], self._prompt_len[rid], len(token_ids), finish_reason)

    # -- event loop ---------------------------------------------------------------------------
    async def _engine_loop(self) -> None:
        assert self._wake is not None
        try:
            while True:
                await self._wake.wait()
                self._wake.clear()
                busy = True
                while busy:
                    deltas, busy = await self._call(self._run_once)
                    for d in deltas:
                        q = self._queues.get(d.request_id)
                        if q is not None:
                            q.put_nowait(d)
                        if d.finished:
                            self._prompt_len.pop(d.request_id, None)
                    busy = busy or bool(self._aborts)
        except BaseException as e:  # an engine failure ends every stream with an error
            self.errored = e
            for q in self._queues.values():
                q.put_nowait(TokenDelta("", [], 0, 0, "error"))
            raise

    def _ensure_loop(self) -> None:
        if self._loop_task is None or self._loop_task.done():
            if self.errored is not None:
                raise RuntimeError(f"the engine loop died: {self.errored!r}")
            self._wake = asyncio.Event()
            self._loop_task = asyncio.get_running_loop().create_task(self._engine_loop())

    async def generate(
        self, prompt: str | Sequence[int], sampling_params: SamplingParams, request_id: str | None = None
    ) -> AsyncIterator[TokenDelta]:
        """Queue a request and yield its ``TokenDelta`` s until it finishes.

        Bad input raises (``ValueError`` / ``TypeError``, from the engine) before anything is
        yielded. Leaving early aborts the request.
        """
        self._ensure_loop()
        rid = request_id or f"cmpl-{next(self._ids)}"
        if rid in self._queues:
            raise ValueError(f"request id {rid!r} is already in use")
        queue: asyncio.Queue[TokenDelta] = asyncio.Queue()
        self._queues[rid] = queue
        finished = False
        try:
            await self._call(
                self._add, prompt if isinstance(prompt, str) else list(prompt), sampling_params, rid
            )
            assert self._wake is not None
            self._wake.set()
            while not finished:
                delta = await queue.get()
                if delta.finish_reason == "error":
                    raise RuntimeError(f"the engine loop died: {self.errored!r}")
                finished = delta.finished
                yield delta
        finally:
            self._queues.pop(rid, None)
            if not finished:
                self.abort(rid)

    def abort(self, request_id: str) -> None:
        """Abort a request before the next step (safe from any task; the engine frees its blocks)."""
        with self._lock:
            self._aborts.add(request_id)
        if self._wake is not None:
            self._wake.set()

    async def wait_idle(self) -> None:
        """Return once every queued abort is applied and no request is running (tests, shutdown)."""
        while self._aborts or self._sent:
            await asyncio.sleep(0.005)
        await self._call(lambda: None)

    async def shutdown(self) -> None:
        if self._loop_task is not None:
            self._loop_task.cancel()
            await asyncio.gather(self._loop_task, return_exceptions=True)
        self._executor.shutdown(wait=True)
