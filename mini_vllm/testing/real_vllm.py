"""Drive the real vLLM 0.22.1 ``BlockPool`` and ``Scheduler`` on a CPU, without a model.

Used by mini's differential tests and benchmark, and by the course labs that read the real
engine (Phase 01 lab-02, Phase 02 lab-05, Phase 03 lab-06). Importing *this* module imports
torch and vllm (seconds); ``import mini_vllm`` never does.

The real objects (a tiny Llama's ``VllmConfig`` with a CPU ``DeviceConfig``, one
full-attention ``KVCacheConfig`` of ``num_gpu_blocks`` blocks, the ``Scheduler``, the prefix
block hasher) come from ``course.runtime.real_vllm``, the one recipe every real-vLLM test
shares; this module adds mini's ``SchedConfig`` / ``StepRecord`` vocabulary. The model runner
is faked: each step every request that caught up "samples" ``traces.fake_token``, and a
request still mid chunked prefill gets ``[]``, exactly what the real runner returns.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

# isort: off
# First: it wires the CPU environment that must precede any vllm import, and builds the tiny-model
# VllmConfig / Scheduler / block hasher.
from course.runtime import real_vllm as rv

from vllm.config import LoRAConfig
from vllm.lora.request import LoRARequest as VllmLoRARequest
from vllm.sampling_params import SamplingParams as VllmSamplingParams
from vllm.v1.core.block_pool import BlockPool as VllmBlockPool
from vllm.v1.core.sched.output import SchedulerOutput as VllmSchedulerOutput
from vllm.v1.core.sched.scheduler import Scheduler as VllmScheduler
from vllm.v1.outputs import ModelRunnerOutput
from vllm.v1.request import Request as VllmRequest
from vllm.v1.request import RequestStatus
# isort: on

from .traces import FAKE_EOS, Event, SchedConfig, StepRecord, fake_token, split_trace

model_dir = rv.model_dir

__all__ = [
    "RealScheduler",
    "VllmBlockPool",
    "VllmRequest",
    "VllmScheduler",
    "make_block_pool",
    "model_dir",
    "run_trace",
]


def make_block_pool(num_gpu_blocks: int, enable_caching: bool = True, block_size: int = 16) -> VllmBlockPool:
    """The real ``BlockPool`` (block 0 becomes its null block, as in mini)."""
    return VllmBlockPool(
        num_gpu_blocks=num_gpu_blocks, enable_caching=enable_caching, hash_block_size=block_size
    )


def make_vllm_config(config: SchedConfig):
    return rv.make_vllm_config(
        max_model_len=config.max_model_len,
        block_size=config.block_size,
        num_gpu_blocks=config.num_gpu_blocks,
        max_num_seqs=config.max_num_seqs,
        max_num_batched_tokens=config.max_num_batched_tokens,
        long_prefill_token_threshold=config.long_prefill_token_threshold,
        enable_chunked_prefill=config.enable_chunked_prefill,
        enable_prefix_caching=config.enable_prefix_caching,
        **({"lora_config": LoRAConfig(max_loras=config.max_loras, max_lora_rank=8)} if config.max_loras else {}),
    )


class RealScheduler:
    """The real ``Scheduler`` + ``KVCacheManager`` with a fake model runner."""

    def __init__(self, config: SchedConfig, *, log_stats: bool = True) -> None:
        self.config = config
        vllm_config = make_vllm_config(config)
        self.scheduler = rv.make_scheduler(vllm_config, log_stats=log_stats)
        self.block_hasher = rv.make_block_hasher(vllm_config)
        self.eos_at: dict[str, int | None] = {}

    @property
    def kv_cache_manager(self) -> Any:
        return self.scheduler.kv_cache_manager

    def add_request(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        max_tokens: int,
        eos_at: int | None = None,
        lora_id: int | None = None,
        cache_salt: str | None = None,
    ) -> VllmRequest:
        """Queue a request; with ``eos_at=k`` its ``k``-th output is ``FAKE_EOS`` and stops it.
        ``lora_id``: adapter ``"a{lora_id}"`` (the config needs ``max_loras``)."""
        params = VllmSamplingParams(max_tokens=max_tokens, ignore_eos=eos_at is None)
        if eos_at is not None:
            params.update_from_generation_config({}, eos_token_id=FAKE_EOS)
        self.eos_at[request_id] = eos_at
        request = VllmRequest(
            request_id=request_id,
            prompt_token_ids=list(prompt_token_ids),
            sampling_params=params,
            pooling_params=None,
            block_hasher=self.block_hasher,
            lora_request=None if lora_id is None else VllmLoRARequest(f"a{lora_id}", lora_id, "/adapters/a"),
            cache_salt=cache_salt,
        )
        self.scheduler.add_request(request)
        return request

    def fake_model_runner_output(self, out: VllmSchedulerOutput) -> ModelRunnerOutput:
        """One token per request that caught up, ``[]`` for one still mid chunked prefill."""
        req_ids = list(out.num_scheduled_tokens)
        sampled = []
        for rid in req_ids:
            request = self.scheduler.requests[rid]
            if request.is_prefill_chunk:
                sampled.append([])
            else:
                sampled.append([fake_token(rid, request.num_output_tokens, self.eos_at.get(rid))])
        return ModelRunnerOutput(
            req_ids=req_ids,
            req_id_to_index={rid: i for i, rid in enumerate(req_ids)},
            sampled_token_ids=sampled,
        )

    def step(
        self, timings: list[float] | None = None, clock: Callable[[], float] = time.perf_counter
    ) -> StepRecord:
        """``schedule()`` → fake runner → ``update_from_output()``; what happened, as a StepRecord.

        ``timings`` receives the seconds of ``schedule()`` + ``update_from_output()`` alone."""
        sched = self.scheduler
        t0 = clock()
        out = sched.schedule()
        t1 = clock()
        runner_output = self.fake_model_runner_output(out)
        t2 = clock()
        engine_outputs = sched.update_from_output(out, runner_output)
        if timings is not None:
            timings.append(t1 - t0 + clock() - t2)
        finished: list[tuple[str, str]] = []
        stats = None
        for eco in engine_outputs.values():
            for o in eco.outputs:
                if o.finish_reason is not None:
                    finished.append((o.request_id, str(o.finish_reason)))
            if eco.scheduler_stats is not None:
                stats = eco.scheduler_stats.prefix_cache_stats
        kv = sched.kv_cache_manager
        prefix = (0, 0, 0, 0, 0, 0)
        if stats is not None:
            prefix = (
                stats.requests,
                stats.queries,
                stats.hits,
                stats.preempted_requests,
                stats.preempted_queries,
                stats.preempted_hits,
            )
        return StepRecord(
            num_scheduled_tokens=dict(out.num_scheduled_tokens),
            preempted=set(out.preempted_req_ids or ()),
            finished=finished,
            block_ids={r.request_id: list(kv.get_block_ids(r.request_id)[0]) for r in sched.running},
            num_free_blocks=kv.block_pool.get_num_free_blocks(),
            prefix_cache=prefix,
        )


def run_trace(
    config: SchedConfig,
    trace: list[Event],
    max_steps: int = 10_000,
    *,
    timings: list[float] | None = None,
    clock: Callable[[], float] = time.perf_counter,
    log_stats: bool = True,
) -> list[StepRecord]:
    """Drive the real Scheduler through ``trace``; one StepRecord per ``schedule()``.

    Same event rules as ``traces.run_mini_trace``: arrivals, then aborts (one id per
    ``finish_requests`` call, live ids only), then the step. ``log_stats=False`` builds the
    scheduler as offline ``LLM()`` does (no per-step stats); the differential tests keep True."""
    real = RealScheduler(config, log_stats=log_stats)
    sched = real.scheduler
    arrivals, aborts = split_trace(trace)
    records: list[StepRecord] = []
    step = 0
    while arrivals or aborts or sched.has_unfinished_requests():
        while arrivals and arrivals[0].step <= step:
            a = arrivals.pop(0)
            real.add_request(a.request_id, list(a.prompt_token_ids), a.max_tokens, a.eos_at, a.lora_id, a.cache_salt)
        aborted: list[str] = []
        t_abort = clock()
        while aborts and aborts[0].step <= step:
            for rid in aborts.pop(0).request_ids:
                if rid in sched.requests and not sched.requests[rid].is_finished():
                    sched.finish_requests(rid, RequestStatus.FINISHED_ABORTED)
                    aborted.append(rid)
        t_abort = clock() - t_abort
        record = real.step(timings, clock)
        if timings is not None:
            timings[-1] += t_abort
        record.aborted = aborted
        records.append(record)
        step += 1
        if step > max_steps:
            raise RuntimeError("trace did not finish on the real scheduler")
    return records
