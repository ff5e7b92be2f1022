"""Continuous batching: each step decide who runs and with how many tokens.

Mirrors ``vllm/v1/core/sched/scheduler.py`` (``Scheduler.schedule``, ``update_from_output``,
``_preempt_request``, ``add_request``, ``finish_requests``, ``update_draft_token_ids``) and
``vllm/v1/core/sched/output.py`` (``SchedulerOutput``, ``GrammarOutput``) for the FCFS policy.
One rule drives everything: give each request tokens so ``num_computed_tokens`` catches up with
``num_tokens_with_spec``; RUNNING requests first (preempting the newest when blocks run out), then
WAITING ones in order, never in a step that preempted. Built from a ``VllmConfig``; it owns its
``KVCacheManager``. It also applies the encoder budget and doorstep rule of images (Phase 13),
the ``max_loras`` admission rule (Phase 11), schedules, rolls back and counts drafts
(Phase 08), and drives a KV connector's scheduler side (Phase 15: external hits counted as
computed, ``WAITING_FOR_REMOTE_KVS`` parking, delayed frees, recompute of blocks that failed to
load). README.md ("How the scheduler decides") walks through a step.

Deliberate difference: ``num_computed_tokens`` advances in ``update_from_output``, not at the end
of ``schedule()`` (no async scheduling), so between the two calls a request's counters describe
the state before the step, which ``needs_sample`` and the model runner read.

Left out: async scheduling and output placeholders, structured output (the engine holds the
grammars), encoder-decoder models and remote encoder caches, HMA connectors and connector stats,
the PRIORITY policy, pipeline parallelism, pause states, stats beyond the prefix-cache and
spec-decode counters. Requests skipped for ``max_loras`` or parked in ``WAITING_FOR_REMOTE_KVS``
wait in a second queue, ``skipped_waiting``, walked before ``waiting`` (upstream also parks
grammar-compile and streaming waits there; mini has neither).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .config import VllmConfig
from .kv_cache import KVCacheManager
from .kv_connector import KVConnectorBase_V1, KVConnectorFactory, KVConnectorRole, kv_layer_names
from .lora import claim_adapter
from .multimodal import (
    EncoderCacheManager,
    EncoderSchedule,
    free_consumed_encoder_inputs,
    try_schedule_encoder_inputs,
)
from .outputs import DraftTokenIds, KVConnectorOutput
from .request import Request, RequestStatus, is_token_id
from .spec_decode import SpecDecodingStats


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
    scheduled_encoder_inputs: dict[str, list[int]] = field(default_factory=dict)  # request id -> images to encode
    free_encoder_mm_hashes: list[str] = field(default_factory=list)  # evicted from the encoder cache this step
    scheduled_spec_decode_tokens: dict[str, list[int]] = field(default_factory=dict)  # drafts to verify
    kv_connector_metadata: Any = None  # the KV connector's plan for the worker (None: no connector)

    @property
    def total_num_scheduled_tokens(self) -> int:
        return sum(self.num_scheduled_tokens.values())


@dataclass
class GrammarOutput:
    """The step's grammar masks for the runner: ``k + 1`` bitmask rows per constrained request
    (``k`` = its drafts this step), in the order of ``structured_output_request_ids``."""

    structured_output_request_ids: list[str]
    grammar_bitmask: np.ndarray  # int32 [rows, ceil(vocab / 32)]


class Scheduler:
    """FCFS scheduler over its own ``KVCacheManager``: ``schedule()`` then ``update_from_output()``."""

    def __init__(self, vllm_config: VllmConfig) -> None:
        if not isinstance(vllm_config, VllmConfig):
            raise TypeError(f"vllm_config must be a VllmConfig, got {type(vllm_config).__name__}")
        self.vllm_config = vllm_config
        self.scheduler_config = vllm_config.scheduler_config
        self.cache_config = vllm_config.cache_config
        self.max_num_running_reqs = self.scheduler_config.max_num_seqs
        self.max_num_scheduled_tokens = self.scheduler_config.max_num_batched_tokens
        self.max_model_len = vllm_config.max_model_len
        self.block_size = self.cache_config.block_size
        self.kv_cache_manager = KVCacheManager(self.cache_config, self.max_model_len)
        spec = vllm_config.speculative_config
        self.num_spec_tokens = spec.num_speculative_tokens if spec is not None else 0
        self.num_lookahead_tokens = spec.num_lookahead_tokens if spec is not None else 0
        self.spec_decoding_stats: SpecDecodingStats | None = None  # the last update_from_output's

        self.requests: dict[str, Request] = {}  # every unfinished request, by id
        self._waiting: deque[Request] = deque()
        self._skipped_waiting: deque[Request] = deque()  # skipped for max_loras; walked first
        self._running: list[Request] = []
        # Finished requests still sitting in a queue; dropped in one pass on the next read, so
        # an abort costs O(1) and a step pays at most one O(len(queue)) sweep.
        self._num_finished_in_running = 0
        self._num_finished_in_waiting = 0
        self.finished_req_ids: set[str] = set()  # finished since the last schedule()
        self._pending_output: SchedulerOutput | None = None  # awaiting update_from_output
        # Images: the encoder budget per step, and the cache of encoder outputs (in embeddings).
        self.max_num_encoder_input_tokens = self.scheduler_config.max_num_encoder_input_tokens
        self.encoder_cache_manager = EncoderCacheManager(self.scheduler_config.encoder_cache_size)
        self._encoder_budget = 0  # what this step has left of max_num_encoder_input_tokens
        self._scheduled_encoder_inputs: dict[str, list[int]] = {}
        # KV connector (Phase 15): the scheduler side decides what is loaded and what is stored.
        self.kv_transfer_config = vllm_config.kv_transfer_config
        self.connector: KVConnectorBase_V1 | None = None
        if self.kv_transfer_config is not None:
            model_config = vllm_config.model_config
            num_layers = 0 if model_config is None else int(model_config.hf_config.get("num_hidden_layers", 0))
            if num_layers == 0:
                raise ValueError(
                    "kv_transfer_config needs a model with a KV cache (model=<checkpoint>); "
                    "the toy model keeps none, so there is nothing to transfer"
                )
            self.connector = KVConnectorFactory.create_connector(
                self.kv_transfer_config, KVConnectorRole.SCHEDULER, self.block_size, kv_layer_names(num_layers)
            )
        self.finished_recving_kv_req_ids: set[str] = set()  # async loads landed, not yet promoted
        self.failed_recving_kv_req_ids: set[str] = set()  # async loads that failed (recompute)
        self.requests_held_for_kv: dict[str, Request] = {}  # finished; blocks wait on the connector
        self.num_external_computed_tokens = 0  # tokens the connector promised (a counter for tests)

    @property
    def running(self) -> list[Request]:
        """RUNNING requests in admission order (finished ones already swept out)."""
        if self._num_finished_in_running:
            self._running = [r for r in self._running if r.status == RequestStatus.RUNNING]
            self._num_finished_in_running = 0
        return self._running

    @property
    def waiting(self) -> deque[Request]:
        """WAITING and PREEMPTED requests, next to admit first (finished ones swept out)."""
        self._sweep_waiting()
        return self._waiting

    @property
    def skipped_waiting(self) -> deque[Request]:
        """Requests skipped for ``max_loras``, walked before ``waiting`` (finished ones swept out)."""
        self._sweep_waiting()
        return self._skipped_waiting

    def _sweep_waiting(self) -> None:
        if self._num_finished_in_waiting:
            self._waiting = deque(r for r in self._waiting if r.status <= RequestStatus.PREEMPTED)
            self._skipped_waiting = deque(r for r in self._skipped_waiting if r.status <= RequestStatus.PREEMPTED)
            self._num_finished_in_waiting = 0

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
        self._check_encoder_inputs_fit(request)
        if self.kv_cache_manager.enable_caching:
            self.kv_cache_manager._ensure_hashes(request)
        self._waiting.append(request)
        self.requests[request.request_id] = request

    def finish_requests(
        self,
        request_ids: str | Iterable[str],
        finished_status: RequestStatus = RequestStatus.FINISHED_ABORTED,
    ) -> list[Request]:
        """Finish requests from outside (an abort): free their KV now, in the order given.

        O(1) per request: each is marked finished and its blocks freed; the queues drop it on
        their next read. Unknown or already finished ids raise before anything changes.
        """
        if not RequestStatus.is_finished(finished_status):
            raise ValueError(f"finished_status must be a FINISHED_* status, got {finished_status!r}")
        ids = [request_ids] if isinstance(request_ids, str) else list(request_ids)
        unknown = [rid for rid in ids if rid not in self.requests]
        if unknown:
            raise ValueError(f"unknown or already finished request id(s): {unknown}")
        finished = [self.requests[rid] for rid in dict.fromkeys(ids)]
        for request in finished:
            if request.status == RequestStatus.RUNNING:
                self._num_finished_in_running += 1
            else:
                self._num_finished_in_waiting += 1
            delay_free_blocks = False
            if request.status == RequestStatus.WAITING_FOR_REMOTE_KVS:  # its load may still land
                delay_free_blocks = request.request_id not in self.finished_recving_kv_req_ids
                self.finished_recving_kv_req_ids.discard(request.request_id)
                self.failed_recving_kv_req_ids.discard(request.request_id)
            request.status = finished_status
            self._free_request(request, delay_free_blocks)
        return finished

    def _free_request(self, request: Request, delay_free_blocks: bool = False) -> None:
        """Finish bookkeeping; the blocks go back now, or when the connector says it is done with them."""
        if self.connector is not None:
            delay, _ = self.connector.request_finished(
                request, self.kv_cache_manager.get_block_ids(request.request_id)
            )
            delay_free_blocks |= delay
        self.encoder_cache_manager.free(request.request_id)
        self.finished_req_ids.add(request.request_id)
        del self.requests[request.request_id]
        if delay_free_blocks:
            self.requests_held_for_kv[request.request_id] = request
        else:
            self.kv_cache_manager.free(request)

    def _free_blocks(self, request: Request) -> None:
        """A held request's transfer is over: its blocks go back to the pool."""
        del self.requests_held_for_kv[request.request_id]
        self.kv_cache_manager.free(request)

    def has_unfinished_requests(self) -> bool:
        """True while a request is unfinished or a finished one's blocks still wait on a transfer."""
        return bool(self.requests or self.requests_held_for_kv)

    def get_num_unfinished_requests(self) -> int:
        return len(self.requests)

    def get_request_counts(self) -> tuple[int, int]:
        """``(num_running, num_waiting)``; waiting counts both queues."""
        return len(self.running), len(self.waiting) + len(self.skipped_waiting)

    # -- the step --------------------------------------------------------------------------
    def schedule(self) -> SchedulerOutput:
        if self._pending_output is not None:
            raise RuntimeError(
                "schedule() called twice: pass the previous output to update_from_output() first"
            )
        kv = self.kv_cache_manager
        running = self.running  # sweeps out requests finished since the last step
        waiting = self.waiting
        skipped_waiting = self.skipped_waiting
        token_budget = self.max_num_scheduled_tokens
        num_scheduled_tokens: dict[str, int] = {}
        new_block_ids: dict[str, list[int]] = {}
        scheduled: list[Request] = []
        new_reqs: list[Request] = []
        resumed_reqs: list[Request] = []
        running_reqs: list[Request] = []
        preempted: list[Request] = []
        self._encoder_budget, self._scheduled_encoder_inputs = self.max_num_encoder_input_tokens, {}
        spec_decode_tokens: dict[str, list[int]] = {}

        # First, the RUNNING requests, oldest first. (This loop runs once per running request per
        # step: what it reads on self is read once, here.)
        max_model_len, num_lookahead_tokens = self.max_model_len, self.num_lookahead_tokens
        allocate_slots = kv._allocate_slots  # trusted caller: the arguments are right by construction
        req_index = 0
        while req_index < len(running) and token_budget > 0:
            request = running[req_index]
            num_computed = request.num_computed_tokens
            num_new_tokens = self._clamp_new_tokens(request.num_tokens_with_spec - num_computed, token_budget)
            # and never a position past max_model_len - 1
            num_new_tokens = min(num_new_tokens, max_model_len - 1 - num_computed)
            if num_new_tokens <= 0:
                req_index += 1
                continue
            encoder_plan = None
            if request.mm_features:  # the encoder rule, for requests with images (upstream guards it too)
                num_new_tokens, encoder_plan = self._try_schedule_encoder_inputs(
                    request, num_computed, num_new_tokens
                )
            if num_new_tokens == 0:  # stopped at the doorstep of an image that cannot run this step
                req_index += 1
                continue
            while True:
                new_blocks = allocate_slots(request, num_new_tokens, 0, (), False, num_lookahead_tokens)
                if new_blocks is not None:
                    break
                victim = running.pop()  # FCFS: the most recently admitted
                self._preempt_request(victim)
                preempted.append(victim)
                if victim is request:
                    break  # it preempted itself: nothing left to free this step
            if new_blocks is None:
                break
            running_reqs.append(request)
            if encoder_plan is not None:
                self._commit_encoder_inputs(request, encoder_plan)
            scheduled.append(request)
            num_scheduled_tokens[request.request_id] = num_new_tokens
            # most decode steps add no block, and a comprehension costs a call (Python 3.11): skip it
            new_block_ids[request.request_id] = [b.block_id for b in new_blocks] if new_blocks else []
            token_budget -= num_new_tokens
            req_index += 1
            if request.spec_token_ids:
                self._schedule_spec_tokens(request, num_new_tokens, spec_decode_tokens)

        # Then the WAITING requests, but never in a step that had to preempt.
        if not preempted:
            chunked = self.scheduler_config.enable_chunked_prefill
            loras, step_skipped = self._running_loras(running_reqs), []
            while (skipped_waiting or waiting) and token_budget > 0:
                if len(running) == self.max_num_running_reqs:
                    break
                queue = skipped_waiting or waiting  # upstream's FCFS walk: the skipped queue first
                request = queue[0]  # new or preempted: num_computed_tokens is 0 (unless its KV was loaded)
                if request.status == RequestStatus.WAITING_FOR_REMOTE_KVS:
                    if request.request_id not in self.finished_recving_kv_req_ids:
                        step_skipped.append(queue.popleft())  # its KV is still loading: keep walking
                        continue
                    self._update_waiting_for_remote_kv(request)
                    request.status = RequestStatus.PREEMPTED if request.num_preemptions else RequestStatus.WAITING
                if not self._lora_fits(request, loras):
                    step_skipped.append(queue.popleft())  # over max_loras: skip this step, keep walking
                    continue
                num_local, num_external, load_kv_async = 0, 0, False
                computed_blocks: list = []
                if request.num_computed_tokens == 0:
                    computed_blocks, num_local = kv.get_computed_blocks(request)  # prefix-cache head start
                    if self.connector is not None and self.kv_transfer_config.is_kv_consumer:
                        ext, load_kv_async = self.connector.get_num_new_matched_tokens(request, num_local)
                        if ext is None:  # the connector cannot tell yet: try again next step
                            step_skipped.append(queue.popleft())
                            continue
                        num_external = ext
                        load_kv_async = load_kv_async and ext > 0
                # local hits, external hits and KV an async load already brought: all computed
                num_computed = request.num_computed_tokens + num_local + num_external
                # >= 1 because prefix hits (local and external) stop at num_tokens - 1
                num_new_tokens = request.num_tokens - num_computed
                encoder_plan = None
                if not load_kv_async:
                    if 0 < self.scheduler_config.long_prefill_token_threshold < num_new_tokens:
                        num_new_tokens = self.scheduler_config.long_prefill_token_threshold
                    if not chunked and num_new_tokens > token_budget:
                        break  # without chunked prefill a prompt runs whole or waits
                    num_new_tokens = min(num_new_tokens, token_budget)
                    num_new_tokens, encoder_plan = self._try_schedule_encoder_inputs(
                        request, num_computed, num_new_tokens
                    )
                    if num_new_tokens == 0:
                        break  # its first chunk would start at an image the encoder cannot run this step
                # External tokens get fresh blocks (they are not prefix hits): allocate them as new
                # slots; an async load allocates only them, and caches none until the load lands.
                new_blocks = kv.allocate_slots(
                    request,
                    num_external + (0 if load_kv_async else num_new_tokens),
                    num_local,
                    computed_blocks,
                    full_sequence_must_fit=True,
                    delay_cache_blocks=load_kv_async,
                )
                if new_blocks is None:
                    self.encoder_cache_manager.free(request.request_id)  # drop the hits the rule recorded
                    break  # head-of-line: nobody behind it jumps the queue
                if self.connector is not None:
                    self.connector.update_state_after_alloc(request, kv.get_blocks(request.request_id), num_external)
                    self.num_external_computed_tokens += num_external
                queue.popleft()
                if load_kv_async:  # park it: blocks held, no tokens until the worker reports the load
                    request.status = RequestStatus.WAITING_FOR_REMOTE_KVS
                    request.num_computed_tokens = num_computed
                    step_skipped.append(request)
                    continue
                running.append(request)
                (new_reqs if request.status == RequestStatus.WAITING else resumed_reqs).append(request)
                self._commit_encoder_inputs(request, encoder_plan)
                scheduled.append(request)
                num_scheduled_tokens[request.request_id] = num_new_tokens
                new_block_ids[request.request_id] = kv.get_block_ids(request.request_id)
                token_budget -= num_new_tokens
                request.status = RequestStatus.RUNNING
                request.num_computed_tokens = num_computed
            skipped_waiting.extendleft(reversed(step_skipped))  # this step's skips go ahead of older ones

        assert token_budget >= 0 and len(running) <= self.max_num_running_reqs
        output = SchedulerOutput(
            num_scheduled_tokens=num_scheduled_tokens,
            scheduled_new_reqs=new_reqs,
            scheduled_resumed_reqs=resumed_reqs,
            scheduled_running_reqs=running_reqs,
            preempted_req_ids={r.request_id for r in preempted},
            finished_req_ids=self.finished_req_ids,
            req_to_new_block_ids=new_block_ids,
            scheduled_requests=scheduled,
            scheduled_encoder_inputs=self._scheduled_encoder_inputs,
            free_encoder_mm_hashes=self.encoder_cache_manager.get_freed_mm_hashes(),
            scheduled_spec_decode_tokens=spec_decode_tokens,
        )
        if self.connector is not None:
            meta = self.connector.build_connector_meta(output)
            if not self.kv_transfer_config.is_kv_producer:  # a consumer only loads
                meta.requests = [r for r in meta.requests if not r.is_store]
            output.kv_connector_metadata = meta
        self.finished_req_ids = set()
        self._pending_output = output
        return output

    def _running_loras(self, scheduled_running: list[Request]) -> set[int]:
        """Adapters the running requests scheduled this step already claim (empty when LoRA is off)."""
        if self.vllm_config.lora_config is None:
            return set()
        return {r.lora_request.lora_int_id for r in scheduled_running if r.lora_request is not None}

    def _lora_fits(self, request: Request, loras: set[int]) -> bool:
        """The ``max_loras`` rule (``mini_vllm.lora.claim_adapter``); claims the adapter when it fits.

        Claiming before the KV checks is safe: after this point the request is admitted or the
        walk stops, so a claimed adapter always has a request in this step.
        """
        lora_config = self.vllm_config.lora_config
        if lora_config is None or request.lora_request is None:
            return True
        return claim_adapter(loras, request.lora_request.lora_int_id, lora_config.max_loras)

    @staticmethod
    def _schedule_spec_tokens(request: Request, num_new_tokens: int, spec_decode_tokens: dict[str, list[int]]) -> None:
        """Record the drafts that fit in this step's ``num_new_tokens``; the request's list is spent.

        The tokens past ``num_tokens`` are drafts; the budget or ``max_model_len`` may have cut
        some (or all) of them. Fresh drafts arrive through ``update_draft_token_ids``.
        """
        num_scheduled_spec = num_new_tokens + request.num_computed_tokens - request.num_tokens
        if num_scheduled_spec > 0:
            spec_decode_tokens[request.request_id] = request.spec_token_ids[:num_scheduled_spec]
        request.spec_token_ids = []

    def _clamp_new_tokens(self, num_new_tokens: int, token_budget: int) -> int:
        """Chunked prefill in one line: cap by ``long_prefill_token_threshold`` (0 = off), then the budget."""
        threshold = self.scheduler_config.long_prefill_token_threshold
        if 0 < threshold < num_new_tokens:
            num_new_tokens = threshold
        return min(num_new_tokens, token_budget)

    # -- images (Phase 13) -------------------------------------------------------------------
    def _check_encoder_inputs_fit(self, request: Request) -> None:
        """Refuse a request with an image the encoder budget or cache can never hold (it would wait forever)."""
        limit = min(self.max_num_encoder_input_tokens, self.encoder_cache_manager.cache_size)
        for f in request.mm_features:
            if f.mm_position.get_num_embeds() > limit:
                raise ValueError(
                    f"image {f.identifier!r} of request {request.request_id!r} needs "
                    f"{f.mm_position.get_num_embeds()} encoder embeddings, more than max_num_encoder_input_tokens="
                    f"{self.max_num_encoder_input_tokens} or encoder_cache_size={self.encoder_cache_manager.cache_size}"
                )

    def _try_schedule_encoder_inputs(
        self, request: Request, num_computed_tokens: int, num_new_tokens: int
    ) -> tuple[int, EncoderSchedule | None]:
        """The encoder rule for this chunk against what is left of this step's encoder budget:
        ``(tokens, plan)``, tokens possibly cut to a doorstep. Books nothing but encoder-cache hits."""
        if not request.mm_features:
            return num_new_tokens, None
        plan = try_schedule_encoder_inputs(
            request.request_id, num_computed_tokens, num_new_tokens, request.mm_features, self._encoder_budget,
            self.encoder_cache_manager, self.scheduler_config.disable_chunked_mm_input,
        )
        return plan.num_new_tokens, plan

    def _commit_encoder_inputs(self, request: Request, plan: EncoderSchedule | None) -> None:
        """The chunk got its KV: spend the encoder budget and reserve cache space for its encodes."""
        if plan is None:
            return
        self._encoder_budget = plan.encoder_compute_budget
        if plan.encoder_inputs:
            self._scheduled_encoder_inputs[request.request_id] = plan.encoder_inputs
            for i in plan.encoder_inputs:
                pos = request.mm_features[i].mm_position
                self.encoder_cache_manager.allocate(request.request_id, request.mm_features[i].identifier, pos.get_num_embeds())

    def _preempt_request(self, request: Request) -> None:
        """Recompute-style preemption: drop all KV, restart from token 0, go to the FRONT of waiting."""
        assert request.status == RequestStatus.RUNNING
        self.kv_cache_manager.free(request)
        self.encoder_cache_manager.free(request.request_id)
        request.status = RequestStatus.PREEMPTED
        request.num_computed_tokens = 0
        request.spec_token_ids = []
        request.num_preemptions += 1
        self._waiting.appendleft(request)

    @staticmethod
    def needs_sample(request: Request, num_scheduled_tokens: int) -> bool:
        """True when this step's tokens finish catching up, so its last logits give a new token.

        Evaluate it before ``update_from_output`` (the counter has not moved yet). A mid-prefill
        chunk is False: its logits belong to a prompt position and are thrown away. Scheduled
        drafts lie past ``num_tokens``, so a step that carries drafts always samples.
        """
        return request.num_computed_tokens + num_scheduled_tokens >= request.num_tokens

    def update_from_output(
        self,
        scheduler_output: SchedulerOutput,
        sampled_token_ids: Mapping[str, int | Sequence[int]] | None = None,
        pooler_outputs: Mapping[str, Any] | None = None,
        kv_connector_output: KVConnectorOutput | None = None,
    ) -> list[Request]:
        """Apply a step's results; return the requests that finished, in scheduling order.

        ``sampled_token_ids`` maps each request that ``needs_sample`` to its new token (and has
        no entry for a mid-prefill chunk). With speculative decoding the value may be a list:
        the accepted drafts, then one bonus or correction token (1 to ``len(drafts) + 1``
        tokens). Counters advance, rejected drafts are rolled back, tokens are appended one by
        one with the stop checks (EOS, stop tokens, then ``max_tokens``/``max_model_len``) after
        each, finished requests leave ``running`` and free their blocks. Call it every step,
        even when nothing was sampled. A pooling request gets no token: ``pooler_outputs`` names
        those whose prompt is done, and they finish ``"stop"`` (vllm/v1/core/sched/scheduler.py:1411).
        ``kv_connector_output`` (the worker connector's report): a request whose loaded blocks
        turned out bad drops this step's token and recomputes from its first bad block; landed
        async loads free their parked requests; finished transfers free the blocks of requests
        held for them.
        """
        if scheduler_output is not self._pending_output:
            raise ValueError("update_from_output() needs the output of the latest schedule(), exactly once")
        sampled = dict(sampled_token_ids or {})
        pooled = pooler_outputs or {}
        scheduled = scheduler_output.num_scheduled_tokens
        spec = scheduler_output.scheduled_spec_decode_tokens
        for rid, tok in sampled.items():
            if rid not in scheduled:
                raise ValueError(f"a token was sampled for {rid!r}, which was not scheduled this step")
            if type(tok) is int and tok >= 0 or is_token_id(tok):  # the usual one token, without a call
                continue
            if isinstance(tok, (str, bytes)) or not isinstance(tok, (Sequence, np.ndarray)):
                raise ValueError(f"sampled token for {rid!r} must be a non-negative int or a list of them, got {tok!r}")
            limit = len(spec.get(rid, ())) + 1
            if not 1 <= len(tok) <= limit or not all(is_token_id(t) for t in tok):
                raise ValueError(
                    f"request {rid!r} must get 1 to {limit} token ids (accepted drafts + one more), got {list(tok)!r}"
                )
        PREEMPTED = RequestStatus.PREEMPTED  # read once: both loops below run once per request
        for request in scheduler_output.scheduled_requests:
            if request.status > PREEMPTED:  # aborted after it was scheduled: no token
                continue
            rid = request.request_id
            # needs_sample, inlined (this loop runs once per scheduled request per step)
            wants = request.num_computed_tokens + scheduled[rid] >= request.num_tokens
            if request.pooling_params is not None:
                if rid in sampled or wants != (rid in pooled):
                    raise ValueError(f"pooling request {rid!r} takes a pooler output, "
                                     "once its whole prompt is computed, and never a token")
                continue
            if wants != (rid in sampled):
                what = "needs a sampled token" if wants else "is mid-prefill and must not get a token"
                raise ValueError(f"request {rid!r} {what}")
        self._pending_output = None
        failed_kv_load: set[str] = set()
        if kv_connector_output is not None and kv_connector_output.invalid_block_ids:
            failed_kv_load = self._handle_invalid_blocks(kv_connector_output.invalid_block_ids)

        self.spec_decoding_stats = None
        finished: list[Request] = []
        max_model_len = self.max_model_len
        for request in scheduler_output.scheduled_requests:
            if request.status > PREEMPTED:  # aborted after it was scheduled
                continue
            if request.request_id in failed_kv_load:  # its KV was bad: no token, recompute
                continue
            request.num_computed_tokens += scheduled[request.request_id]
            if request.mm_features:  # images now wholly in the KV cache release their encoder output
                free_consumed_encoder_inputs(
                    request.request_id, request.mm_features, request.num_computed_tokens, self.encoder_cache_manager
                )
            if request.pooling_params is not None:  # pooling stops as soon as there is output
                request.is_prefill_chunk = request.request_id not in pooled
                if not request.is_prefill_chunk:
                    request.status = RequestStatus.FINISHED_STOPPED
                    finished.append(request)
                continue
            token = sampled.get(request.request_id)
            request.is_prefill_chunk = token is None
            if token is None:
                continue
            if spec and request.request_id in spec:
                if self._update_request_with_output(request, token, spec[request.request_id]):
                    finished.append(request)
            elif type(token) is int or is_token_id(token):
                request.append_output_token_ids(token)
                if request.maybe_finish(max_model_len):
                    finished.append(request)
            elif self._update_request_with_output(request, token, ()):
                finished.append(request)
        self._num_finished_in_running += len(finished)  # swept out on the next read
        for request in finished:
            self._free_request(request)
        if kv_connector_output is not None:
            self._update_from_kv_xfer_finished(kv_connector_output)
        return finished

    # -- KV connector (Phase 15) -------------------------------------------------------------
    def _update_waiting_for_remote_kv(self, request: Request) -> None:
        """An async load landed: cache the loaded blocks (or drop them if the load failed)."""
        rid = request.request_id
        if rid in self.failed_recving_kv_req_ids:
            self.failed_recving_kv_req_ids.remove(rid)
            if request.num_computed_tokens:
                self.kv_cache_manager.cache_blocks(request, request.num_computed_tokens)
            else:
                self.kv_cache_manager.free(request)  # nothing valid: admit it afresh
        else:
            self.kv_cache_manager.cache_blocks(request, request.num_computed_tokens)
            if request.num_computed_tokens == request.num_tokens:  # recompute the last token to sample
                request.num_computed_tokens = request.num_tokens - 1
        self.finished_recving_kv_req_ids.remove(rid)

    def _update_from_kv_xfer_finished(self, kv_connector_output: KVConnectorOutput) -> None:
        """Received loads promote parked requests; finished transfers release held blocks."""
        for rid in kv_connector_output.finished_recving or ():
            if rid in self.requests_held_for_kv:  # aborted while its load was in flight
                self._free_blocks(self.requests_held_for_kv[rid])
            elif rid in self.requests and self.requests[rid].status == RequestStatus.WAITING_FOR_REMOTE_KVS:
                self.finished_recving_kv_req_ids.add(rid)
        for rid in kv_connector_output.finished_sending or ():
            if rid in self.requests_held_for_kv:
                self._free_blocks(self.requests_held_for_kv[rid])

    def _handle_invalid_blocks(self, invalid_block_ids: set[int]) -> set[str]:
        """Requests holding a block whose load failed restart at their first bad block.

        Upstream's ``kv_load_failure_policy="recompute"``: ``num_computed_tokens`` falls back to the
        start of the first bad block and those blocks leave the prefix cache, so no other request
        hits KV that was never written. Returns the ids of running requests whose token this step
        is void (a parked request just records the failure for its promotion).
        """
        kv, failed = self.kv_cache_manager, set()
        for request in list(self.requests.values()):
            block_ids = kv.get_block_ids(request.request_id)
            bad = [i for i, b in enumerate(block_ids) if b in invalid_block_ids]
            if not bad:
                continue
            first = bad[0]
            for block in kv.get_blocks(request.request_id)[first:]:
                kv.block_pool._maybe_evict_cached_block(block)
            kv.num_cached_block[request.request_id] = min(kv.num_cached_block.get(request.request_id, 0), first)
            request.num_computed_tokens = min(request.num_computed_tokens, first * self.block_size)
            if request.status == RequestStatus.WAITING_FOR_REMOTE_KVS:
                self.failed_recving_kv_req_ids.add(request.request_id)
            else:
                failed.add(request.request_id)
        return failed

    def _update_request_with_output(
        self, request: Request, new_token_ids: int | Sequence[int], drafts: Sequence[int]
    ) -> bool:
        """Roll back the rejected drafts, then append token by token; True if the request stopped.

        ``len(new_token_ids) - 1`` drafts were accepted (the last token is the bonus or the
        correction); the KV computed for the other drafts is wrong, so ``num_computed_tokens``
        forgets them and the next step recomputes from the first rejected position.
        """
        tokens = [new_token_ids] if is_token_id(new_token_ids) else list(new_token_ids)
        if drafts:
            num_accepted = len(tokens) - 1
            request.num_computed_tokens -= len(drafts) - num_accepted
            if self.spec_decoding_stats is None:
                self.spec_decoding_stats = SpecDecodingStats.new(self.num_spec_tokens)
            self.spec_decoding_stats.observe_draft(len(drafts), num_accepted)
        for token in tokens:
            request.append_output_token_ids(token)
            if request.maybe_finish(self.max_model_len):
                return True  # a stop mid-list: the tokens after it are dropped
        return False

    def update_draft_token_ids(self, draft_token_ids: DraftTokenIds | Mapping[str, Sequence[int]]) -> None:
        """Store the drafts proposed after a step; the next ``schedule()`` verifies them.

        Requests that finished meanwhile are skipped; one that is not RUNNING or whose last
        step was a mid-prefill chunk gets none (its drafts are cleared), as upstream. Everything
        is checked before anything changes: speculation must be on, ids unique strings, each
        draft at most ``num_speculative_tokens`` token ids.
        """
        if isinstance(draft_token_ids, DraftTokenIds):
            pairs = list(zip(draft_token_ids.req_ids, draft_token_ids.draft_token_ids, strict=True))
        elif isinstance(draft_token_ids, Mapping):
            pairs = list(draft_token_ids.items())
        else:
            raise TypeError(f"expected DraftTokenIds or a mapping, got {type(draft_token_ids).__name__}")
        if not self.num_spec_tokens and any(len(d) for _, d in pairs):
            raise ValueError("speculative decoding is off (no speculative_config): drafts cannot be verified")
        for rid, drafts in pairs:
            if isinstance(drafts, (str, bytes)) or not isinstance(drafts, (Sequence, np.ndarray)):
                raise ValueError(f"drafts for {rid!r} must be a list of token ids, got {drafts!r}")
            if len(drafts) > self.num_spec_tokens or not all(is_token_id(t) for t in drafts):
                raise ValueError(
                    f"drafts for {rid!r} must be at most num_speculative_tokens={self.num_spec_tokens} "
                    f"token ids, got {list(drafts)!r}"
                )
        for rid, drafts in pairs:
            request = self.requests.get(rid)
            if request is None or request.is_finished:
                continue
            if request.status != RequestStatus.RUNNING or request.is_prefill_chunk:
                request.spec_token_ids = []  # a prefill chunk (or not running): no drafts
                continue
            request.spec_token_ids = [int(t) for t in drafts]

    def make_spec_decoding_stats(self) -> SpecDecodingStats | None:
        """The last ``update_from_output``'s counters (None when no draft was verified)."""
        return self.spec_decoding_stats
