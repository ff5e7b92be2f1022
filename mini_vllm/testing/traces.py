"""Request traces, and a driver that runs one through mini's ``Scheduler`` without a model.

A trace is a list of ``Arrival``s: at engine step ``step`` (0-based), request ``request_id``
arrives with ``prompt_token_ids`` and wants ``max_tokens`` outputs (``ignore_eos``). The same
trace goes through the real scheduler in ``real_vllm.run_trace``; both sides "sample"
``fake_token(request_id, n)`` so generated blocks hash the same way.
Nothing here imports vllm or torch.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field

from ..kv_cache import KVCacheManager
from ..request import Request
from ..sampling_params import SamplingParams
from ..scheduler import Scheduler


@dataclass(frozen=True)
class Arrival:
    step: int
    request_id: str
    prompt_token_ids: tuple[int, ...]
    max_tokens: int


@dataclass(frozen=True)
class SchedConfig:
    """The knobs both schedulers are built from."""

    num_gpu_blocks: int
    block_size: int = 16
    max_num_seqs: int = 16
    max_num_batched_tokens: int = 64
    long_prefill_token_threshold: int = 0
    enable_prefix_caching: bool = True
    max_model_len: int = 512


@dataclass
class StepRecord:
    """What one step decided, in a form both engines can produce."""

    num_scheduled_tokens: dict[str, int]
    preempted: set[str]
    finished: list[tuple[str, str]]  # (request id, finish reason), in finish order
    block_ids: dict[str, list[int]] = field(default_factory=dict)  # running requests' block tables
    num_free_blocks: int = 0
    prefix_cache: tuple[int, int, int, int, int, int] = (0, 0, 0, 0, 0, 0)
    # (requests, queries, hits, preempted_requests, preempted_queries, preempted_hits)


def fake_token(request_id: str, num_output_tokens: int) -> int:
    """Deterministic stand-in for a sampled token (never 0..31 control bytes, never EOS)."""
    return 32 + (zlib.crc32(request_id.encode()) + 7 * num_output_tokens) % 200


def run_mini_trace(config: SchedConfig, trace: list[Arrival], max_steps: int = 10_000) -> list[StepRecord]:
    """Drive mini's Scheduler through ``trace``; one StepRecord per ``schedule()``."""
    kv = KVCacheManager(
        config.num_gpu_blocks, config.block_size, config.enable_prefix_caching, config.max_model_len
    )
    sched = Scheduler(
        kv,
        config.max_num_seqs,
        config.max_num_batched_tokens,
        config.long_prefill_token_threshold,
        config.max_model_len,
    )
    pending = sorted(trace, key=lambda a: a.step)
    records: list[StepRecord] = []
    step = 0
    while pending or sched.has_unfinished_requests():
        while pending and pending[0].step <= step:
            a = pending.pop(0)
            params = SamplingParams(max_tokens=a.max_tokens, ignore_eos=True)
            sched.add_request(
                Request(a.request_id, list(a.prompt_token_ids), params, block_hasher=kv.block_hasher)
            )
        out = sched.schedule()
        sampled = {
            r.request_id: fake_token(r.request_id, r.num_output_tokens)
            for r in out.scheduled_requests
            if Scheduler.needs_sample(r, out.num_scheduled_tokens[r.request_id])
        }
        finished = sched.update_from_output(out, sampled)
        s = kv.make_prefix_cache_stats()
        records.append(
            StepRecord(
                num_scheduled_tokens=dict(out.num_scheduled_tokens),
                preempted=set(out.preempted_req_ids),
                finished=[(r.request_id, r.finish_reason or "") for r in finished],
                block_ids={r.request_id: kv.get_block_ids(r.request_id) for r in sched.running},
                num_free_blocks=kv.block_pool.get_num_free_blocks(),
                prefix_cache=(
                    s.requests,
                    s.queries,
                    s.hits,
                    s.preempted_requests,
                    s.preempted_queries,
                    s.preempted_hits,
                ),
            )
        )
        step += 1
        if step > max_steps:
            raise RuntimeError("trace did not finish: is the pool big enough for every request?")
    return records
