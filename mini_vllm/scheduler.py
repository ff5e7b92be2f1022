"""Continuous batching: each step decide who runs and with how many tokens.

Mirrors ``vllm/v1/core/sched/scheduler.py`` (``Scheduler.schedule``, ``update_from_output``,
``_preempt_request``, ``add_request``, ``finish_requests``) and ``vllm/v1/core/sched/output.py``
(``SchedulerOutput``) for the FCFS policy. One rule drives everything: give each request
tokens so ``num_computed_tokens`` catches up with ``num_tokens``. A step::

    budget = max_num_batched_tokens
    RUNNING, in order:   n = min(behind, threshold, budget, max_model_len-1-computed)
                         allocate_slots(n); on None preempt running[-1] and retry
    WAITING, FCFS:       only if nobody was preempted this step and len(running) < max_num_seqs;
                         prefix hits first; the whole current sequence must fit; a failure stops
                         admission (head-of-line blocking is deliberate)

Left out (see README): async scheduling and output placeholders, speculative decoding,
structured output, encoder inputs, KV connectors, LoRA limits, PRIORITY policy, pipeline
parallelism, pause states, stats beyond prefix-cache counters.

Deliberate difference: upstream advances ``num_computed_tokens`` at the end of ``schedule()``
(``_update_after_schedule``) so an async scheduler can plan the next step before this one
returns. Mini has no async scheduling and advances it in ``update_from_output`` instead, so
between the two calls a request's counters still describe the state *before* the step (which
is what ``needs_sample`` reads). The decisions are the same.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from .kv_cache import KVCacheManager, cdiv
from .request import Request, RequestStatus, is_token_id


@dataclass
class SchedulerOutput:
    """What one ``schedule()`` call decided. Dict/list orders are scheduling order."""

    num_scheduled_tokens: dict[str, int]  # request id -> tokens computed this step
    scheduled_new_reqs: list[Request]  # admitted for the first time
    scheduled_resumed_reqs: list[Request]  # re-admitted after a preemption
    scheduled_running_reqs: list[Request]  # were already running
    preempted_req_ids: set[str]  # preempted during this step
    finished_req_ids: set[str]  # finished since the previous schedule()
    req_to_new_block_ids: dict[str, list[int]] = field(default_factory=dict)  # blocks added this step
    scheduled_requests: list[Request] = field(default_factory=list)  # every scheduled request

    @property
    def total_num_scheduled_tokens(self) -> int:
        return sum(self.num_scheduled_tokens.values())


class Scheduler:
    """FCFS scheduler over one ``KVCacheManager``: ``schedule()`` then ``update_from_output()``."""

    def __init__(
        self,
        kv_cache_manager: KVCacheManager,
        max_num_seqs: int = 128,
        max_num_batched_tokens: int = 2048,
        long_prefill_token_threshold: int = 0,
        max_model_len: int | None = None,
    ) -> None:
        if not isinstance(kv_cache_manager, KVCacheManager):
            raise TypeError(
                f"kv_cache_manager must be a KVCacheManager, got {type(kv_cache_manager).__name__}"
            )
        for name, value, low in (
            ("max_num_seqs", max_num_seqs, 1),
            ("max_num_batched_tokens", max_num_batched_tokens, 1),
            ("long_prefill_token_threshold", long_prefill_token_threshold, 0),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"{name} must be an int >= {low}, got {value!r}")
        if max_model_len is None:
            max_model_len = kv_cache_manager.max_model_len
        if isinstance(max_model_len, bool) or not isinstance(max_model_len, int) or max_model_len < 2:
            raise ValueError(f"max_model_len must be an int >= 2, got {max_model_len!r}")
        self.kv_cache_manager = kv_cache_manager
        self.max_num_running_reqs = max_num_seqs
        self.max_num_scheduled_tokens = max_num_batched_tokens
        self.long_prefill_token_threshold = long_prefill_token_threshold
        self.max_model_len = max_model_len
        self.block_size = kv_cache_manager.block_size

        self.requests: dict[str, Request] = {}  # every unfinished request, by id
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.finished_req_ids: set[str] = set()  # finished since the last schedule()
        self._pending_output: SchedulerOutput | None = None  # awaiting update_from_output

    # Short names used in the course text.
    @property
    def kv(self) -> KVCacheManager:
        return self.kv_cache_manager

    @property
    def max_num_seqs(self) -> int:
        return self.max_num_running_reqs

    @property
    def max_num_batched_tokens(self) -> int:
        return self.max_num_scheduled_tokens

    # -- intake ----------------------------------------------------------------------------
    def add_request(self, request: Request) -> None:
        """Queue a new request at the back of ``waiting``."""
        if not isinstance(request, Request):
            raise TypeError(f"expected a Request, got {type(request).__name__}")
        if request.request_id in self.requests:
            raise ValueError(f"duplicate request id {request.request_id!r}")
        if (
            request.status != RequestStatus.WAITING
            or request.num_computed_tokens
            or request.num_output_tokens
        ):
            raise ValueError(f"request {request.request_id!r} is not fresh (status {request.status.name})")
        if request.num_tokens >= self.max_model_len:
            raise ValueError(
                f"prompt of {request.num_tokens} tokens leaves no room to generate within "
                f"max_model_len={self.max_model_len}"
            )
        usable = self.kv_cache_manager.block_pool.num_gpu_blocks - 1
        if cdiv(request.num_tokens, self.block_size) > usable:
            raise ValueError(
                f"prompt of {request.num_tokens} tokens needs {cdiv(request.num_tokens, self.block_size)} "
                f"blocks but the pool only has {usable}: it could never be admitted"
            )
        if self.kv_cache_manager.enable_caching:
            self.kv_cache_manager._ensure_hashes(request)
        self.waiting.append(request)
        self.requests[request.request_id] = request

    def finish_requests(
        self,
        request_ids: str | Iterable[str],
        finished_status: RequestStatus = RequestStatus.FINISHED_ABORTED,
    ) -> list[Request]:
        """Finish requests from outside (an abort): leave the queues, free KV. Returns them."""
        if not RequestStatus.is_finished(finished_status):
            raise ValueError(f"finished_status must be a FINISHED_* status, got {finished_status!r}")
        ids = [request_ids] if isinstance(request_ids, str) else list(request_ids)
        unknown = [rid for rid in ids if rid not in self.requests]
        if unknown:
            raise ValueError(f"unknown or already finished request id(s): {unknown}")
        finished = [self.requests[rid] for rid in dict.fromkeys(ids)]
        gone = {id(r) for r in finished}
        self.running = [r for r in self.running if id(r) not in gone]
        self.waiting = deque(r for r in self.waiting if id(r) not in gone)
        for request in finished:
            request.status = finished_status
            self._free_request(request)
        return finished

    def _free_request(self, request: Request) -> None:
        self.kv_cache_manager.free(request)
        self.finished_req_ids.add(request.request_id)
        del self.requests[request.request_id]

    def has_unfinished_requests(self) -> bool:
        return bool(self.running or self.waiting)

    def get_num_unfinished_requests(self) -> int:
        return len(self.running) + len(self.waiting)

    def get_request_counts(self) -> tuple[int, int]:
        """``(num_running, num_waiting)``."""
        return len(self.running), len(self.waiting)

    # -- the step --------------------------------------------------------------------------
    def schedule(self) -> SchedulerOutput:
        if self._pending_output is not None:
            raise RuntimeError(
                "schedule() called twice: pass the previous output to update_from_output() first"
            )
        kv = self.kv_cache_manager
        token_budget = self.max_num_scheduled_tokens
        num_scheduled_tokens: dict[str, int] = {}
        new_block_ids: dict[str, list[int]] = {}
        scheduled: list[Request] = []
        new_reqs: list[Request] = []
        resumed_reqs: list[Request] = []
        running_reqs: list[Request] = []
        preempted: list[Request] = []

        # First, the RUNNING requests, oldest first.
        req_index = 0
        while req_index < len(self.running) and token_budget > 0:
            request = self.running[req_index]
            behind = request.num_tokens - request.num_computed_tokens
            num_new_tokens = self._clamp_new_tokens(behind, token_budget)
            # and never a position past max_model_len - 1
            num_new_tokens = min(num_new_tokens, self.max_model_len - 1 - request.num_computed_tokens)
            if num_new_tokens <= 0:
                req_index += 1
                continue
            while True:
                new_blocks = kv.allocate_slots(request, num_new_tokens)
                if new_blocks is not None:
                    break
                victim = self.running.pop()  # FCFS: the most recently admitted
                self._preempt_request(victim)
                preempted.append(victim)
                if victim is request:
                    break  # it preempted itself: nothing left to free this step
            if new_blocks is None:
                break
            running_reqs.append(request)
            scheduled.append(request)
            num_scheduled_tokens[request.request_id] = num_new_tokens
            new_block_ids[request.request_id] = [b.block_id for b in new_blocks]
            token_budget -= num_new_tokens
            req_index += 1

        # Then the WAITING requests, but never in a step that had to preempt.
        if not preempted:
            while self.waiting and token_budget > 0:
                if len(self.running) == self.max_num_running_reqs:
                    break
                request = self.waiting[0]  # new or preempted: num_computed_tokens is 0 either way
                computed_blocks, num_computed = kv.get_computed_blocks(request)  # prefix-cache head start
                # >= 1 because prefix hits stop at num_tokens - 1
                num_new_tokens = self._clamp_new_tokens(request.num_tokens - num_computed, token_budget)
                new_blocks = kv.allocate_slots(
                    request, num_new_tokens, num_computed, computed_blocks, full_sequence_must_fit=True
                )
                if new_blocks is None:
                    break  # head-of-line: nobody behind it jumps the queue
                self.waiting.popleft()
                self.running.append(request)
                (new_reqs if request.status == RequestStatus.WAITING else resumed_reqs).append(request)
                scheduled.append(request)
                num_scheduled_tokens[request.request_id] = num_new_tokens
                new_block_ids[request.request_id] = kv.get_block_ids(request.request_id)
                token_budget -= num_new_tokens
                request.status = RequestStatus.RUNNING
                request.num_computed_tokens = num_computed

        assert token_budget >= 0 and len(self.running) <= self.max_num_running_reqs
        output = SchedulerOutput(
            num_scheduled_tokens=num_scheduled_tokens,
            scheduled_new_reqs=new_reqs,
            scheduled_resumed_reqs=resumed_reqs,
            scheduled_running_reqs=running_reqs,
            preempted_req_ids={r.request_id for r in preempted},
            finished_req_ids=self.finished_req_ids,
            req_to_new_block_ids=new_block_ids,
            scheduled_requests=scheduled,
        )
        self.finished_req_ids = set()
        self._pending_output = output
        return output

    def _clamp_new_tokens(self, num_new_tokens: int, token_budget: int) -> int:
        """Chunked prefill in one line: cap by ``long_prefill_token_threshold`` (0 = off), then the budget."""
        if 0 < self.long_prefill_token_threshold < num_new_tokens:
            num_new_tokens = self.long_prefill_token_threshold
        return min(num_new_tokens, token_budget)

    def _preempt_request(self, request: Request) -> None:
        """Recompute-style preemption: drop all KV, restart from token 0, go to the FRONT of waiting."""
        assert request.status == RequestStatus.RUNNING
        self.kv_cache_manager.free(request)
        request.status = RequestStatus.PREEMPTED
        request.num_computed_tokens = 0
        request.num_preemptions += 1
        self.waiting.appendleft(request)

    @staticmethod
    def needs_sample(request: Request, num_scheduled_tokens: int) -> bool:
        """True when this step's tokens finish catching up, so its last logits give a new token.

        Evaluate it before ``update_from_output`` (the counter has not moved yet). A mid-prefill
        chunk is False: its logits belong to a prompt position and are thrown away.
        """
        return request.num_computed_tokens + num_scheduled_tokens == request.num_tokens

    def update_from_output(
        self,
        scheduler_output: SchedulerOutput,
        sampled_token_ids: Mapping[str, int] | None = None,
    ) -> list[Request]:
        """Apply a step's results; return the requests that finished, in scheduling order.

        ``sampled_token_ids`` maps each request that ``needs_sample`` to its new token (and has
        no entry for a mid-prefill chunk). Counters advance, tokens are appended, stop checks run
        (EOS, stop tokens, then ``max_tokens``/``max_model_len``), finished requests leave
        ``running`` and free their blocks. Call it every step, even when nothing was sampled.
        """
        if scheduler_output is not self._pending_output:
            raise ValueError("update_from_output() needs the output of the latest schedule(), exactly once")
        sampled = dict(sampled_token_ids or {})
        scheduled = scheduler_output.num_scheduled_tokens
        for rid, tok in sampled.items():
            if rid not in scheduled:
                raise ValueError(f"a token was sampled for {rid!r}, which was not scheduled this step")
            if not is_token_id(tok):
                raise ValueError(f"sampled token for {rid!r} must be a non-negative int, got {tok!r}")
        for request in scheduler_output.scheduled_requests:
            if request.is_finished:  # aborted after it was scheduled: its token is dropped
                continue
            wants = self.needs_sample(request, scheduled[request.request_id])
            if wants != (request.request_id in sampled):
                what = "needs a sampled token" if wants else "is mid-prefill and must not get a token"
                raise ValueError(f"request {request.request_id!r} {what}")
        self._pending_output = None

        finished: list[Request] = []
        for request in scheduler_output.scheduled_requests:
            if request.is_finished:  # aborted after it was scheduled
                continue
            request.num_computed_tokens += scheduled[request.request_id]
            token = sampled.get(request.request_id)
            if token is not None:
                request.append_output_token_ids(token)
                if request.maybe_finish(self.max_model_len):
                    finished.append(request)
        if finished:
            done = {id(r) for r in finished}
            self.running = [r for r in self.running if id(r) not in done]
            for request in finished:
                self._free_request(request)
        return finished
