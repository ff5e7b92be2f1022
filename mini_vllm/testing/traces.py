"""Request traces, and the one driver that runs a trace through mini's ``Scheduler`` without a model.

A trace is a list of events. ``Arrival``: at engine step ``step`` (0-based) request
``request_id`` arrives with ``prompt_token_ids`` and wants ``max_tokens`` outputs; with
``eos_at=k`` its ``k``-th output token (0-based) is ``FAKE_EOS`` and stops it. ``Abort``: at
step ``step``, before ``schedule()``, the still-unfinished ids among ``request_ids`` are aborted,
one ``finish_requests`` call per id (several ids in one call free in an order that upstream
takes from a ``set``, which depends on the process's hash seed: no trace can pin it). The same
trace goes through the real scheduler in ``real_vllm.run_trace``; both sides "sample"
``fake_token(request_id, n)`` so generated blocks hash the same way. Nothing here imports vllm
or torch; the benchmark times the same driver (``timings``).
"""

from __future__ import annotations

import time
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from ..config import CacheConfig, LoRAConfig, SchedulerConfig, VllmConfig
from ..lora import LoRARequest
from ..request import Request
from ..sampling_params import SamplingParams
from ..scheduler import Scheduler

FAKE_EOS = 2  # never produced by fake_token, so a request stops on it only when told to


@dataclass(frozen=True)
class Arrival:
    step: int
    request_id: str
    prompt_token_ids: tuple[int, ...]
    max_tokens: int
    eos_at: int | None = None  # output index whose token is FAKE_EOS (None: never)
    lora_id: int | None = None  # adapter "a{lora_id}" (needs SchedConfig.max_loras); None: base model
    cache_salt: str | None = None


@dataclass(frozen=True)
class Abort:
    step: int
    request_ids: tuple[str, ...]


Event = Arrival | Abort


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
    enable_chunked_prefill: bool = True
    max_loras: int = 0  # 0: LoRA off

    def to_vllm_config(self) -> VllmConfig:
        """The same knobs as mini's validated ``VllmConfig``."""
        return VllmConfig(
            CacheConfig(self.block_size, self.num_gpu_blocks, self.enable_prefix_caching),
            SchedulerConfig(
                max_num_seqs=self.max_num_seqs,
                max_num_batched_tokens=self.max_num_batched_tokens,
                max_model_len=self.max_model_len,
                long_prefill_token_threshold=self.long_prefill_token_threshold,
                enable_chunked_prefill=self.enable_chunked_prefill,
            ),
            lora_config=LoRAConfig(max_loras=self.max_loras) if self.max_loras else None,
        )


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
    aborted: list[str] = field(default_factory=list)  # ids aborted before this step's schedule()


def assert_same_records(want: list[StepRecord], got: list[StepRecord]) -> None:
    """Step by step, the real scheduler's records (``want``) equal mini's (``got``): scheduled
    tokens in order, preemptions, finishes, block tables, free blocks, prefix-cache counters, aborts."""
    fields = ("num_scheduled_tokens", "preempted", "finished", "block_ids", "num_free_blocks", "prefix_cache", "aborted")
    for i, (r, m) in enumerate(zip(want, got)):
        for name in fields:
            a, b = getattr(r, name), getattr(m, name)
            if name == "num_scheduled_tokens":
                a, b = list(a.items()), list(b.items())  # order matters too
            assert a == b, f"step {i}: {name} differs — vLLM {a}, mini {b}"
    assert len(want) == len(got), f"vLLM took {len(want)} steps, mini {len(got)}"


def fake_token(request_id: str, num_output_tokens: int, eos_at: int | None = None) -> int:
    """Deterministic stand-in for a sampled token (never 0..31 control bytes, never EOS)."""
    if num_output_tokens == eos_at:
        return FAKE_EOS
    return 32 + (zlib.crc32(request_id.encode()) + 7 * num_output_tokens) % 200


def split_trace(trace: Iterable[Event]) -> tuple[list[Arrival], list[Abort]]:
    """Arrivals and aborts, each sorted by step (stable: same-step events keep trace order)."""
    events = list(trace)
    arrivals = sorted((e for e in events if isinstance(e, Arrival)), key=lambda a: a.step)
    aborts = sorted((e for e in events if isinstance(e, Abort)), key=lambda a: a.step)
    return arrivals, aborts


def run_mini_trace(
    config: SchedConfig,
    trace: Iterable[Event],
    max_steps: int = 10_000,
    *,
    record: bool = True,
    timings: list[float] | None = None,
    clock: Callable[[], float] = time.perf_counter,
) -> list[StepRecord]:
    """Drive mini's Scheduler through ``trace``; one StepRecord per ``schedule()``.

    ``record=False`` skips building the records (returns ``[]``); ``timings`` receives, per
    step, the seconds spent in that step's aborts, ``schedule()`` and ``update_from_output()``,
    read from ``clock``.
    """
    sched = Scheduler(config.to_vllm_config())
    kv = sched.kv_cache_manager
    arrivals, aborts = split_trace(trace)
    eos_at: dict[str, int | None] = {}
    records: list[StepRecord] = []
    step = 0
    while arrivals or aborts or sched.has_unfinished_requests():
        while arrivals and arrivals[0].step <= step:
            a = arrivals.pop(0)
            params = SamplingParams(max_tokens=a.max_tokens, ignore_eos=a.eos_at is None)
            sched.add_request(
                Request(
                    a.request_id,
                    list(a.prompt_token_ids),
                    params,
                    eos_token_id=FAKE_EOS,
                    block_hasher=kv.block_hasher,
                    lora_request=None if a.lora_id is None else LoRARequest(f"a{a.lora_id}", a.lora_id),
                    cache_salt=a.cache_salt,
                )
            )
            eos_at[a.request_id] = a.eos_at
        aborted: list[str] = []
        t_abort = clock()
        while aborts and aborts[0].step <= step:
            for rid in aborts.pop(0).request_ids:
                if rid in sched.requests:
                    sched.finish_requests(rid)
                    aborted.append(rid)
        t_abort = clock() - t_abort
        t0 = clock()
        out = sched.schedule()
        t1 = clock()
        sampled = {
            r.request_id: fake_token(r.request_id, r.num_output_tokens, eos_at[r.request_id])
            for r in out.scheduled_requests
            if Scheduler.needs_sample(r, out.num_scheduled_tokens[r.request_id])
        }
        t2 = clock()
        finished = sched.update_from_output(out, sampled)
        if timings is not None:
            timings.append(t_abort + t1 - t0 + clock() - t2)
        if record:
            s = kv.make_prefix_cache_stats()
            records.append(
                StepRecord(
                    num_scheduled_tokens=dict(out.num_scheduled_tokens),
                    preempted=set(out.preempted_req_ids),
                    finished=[(r.request_id, r.get_finished_reason() or "") for r in finished],
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
                    aborted=aborted,
                )
            )
        step += 1
        if step > max_steps:
            raise RuntimeError("trace did not finish: is the pool big enough for every request?")
    return records
