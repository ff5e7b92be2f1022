"""What the engine measures each step, and the Prometheus page that shows it (Phase 18).

Mirrors ``vllm/v1/metrics/stats.py`` (``SchedulerStats``, ``RequestStateStats``,
``FinishedRequestStats``, ``IterationStats``: same field names and the same interval rules: TTFT
and e2e from arrival, one inter-token gap per step that emits tokens, queue = scheduled - queued),
``Scheduler.make_stats`` (here ``make_scheduler_stats``) and ``vllm/v1/metrics/loggers.py``
(``PrometheusStatLogger``: the same metric names, help texts, label names and buckets for the
subset mini fills). ``StatsRecorder`` attaches to an ``LLMEngine`` by wrapping ``add_request``,
``scheduler.schedule`` and ``step`` (the probe pattern of Phase 01 lab-04: generated tokens never
change), so the engine itself stays free of timing code. ``Profiler`` is the ``start_profile`` /
``stop_profile`` switch (upstream's ``vllm/profiler``), writing a cProfile file.

The clock is injectable (``clock=``): tests pass a fake one and assert exact intervals. Left out:
the engine-core / front-end split (one clock here), LoRA and KV-connector gauges, the logging
logger, multi-engine aggregation, eviction events, the sleep-state gauge, ``num_cached_tokens``.
"""

from __future__ import annotations

import cProfile
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .kv_cache import PrefixCacheStats
from .spec_decode import SpecDecodingStats

Clock = Callable[[], float]


# ----------------------------------------------------------------------------- the stats
@dataclass
class SchedulerStats:
    """The scheduler's state after one step (upstream's ``SchedulerStats``, mini's subset)."""

    num_running_reqs: int = 0
    num_waiting_reqs: int = 0
    num_skipped_waiting_reqs: int = 0
    step_counter: int = 0
    kv_cache_usage: float = 0.0  # fraction of usable blocks held, 0..1
    prefix_cache_stats: PrefixCacheStats = field(default_factory=PrefixCacheStats)
    spec_decoding_stats: SpecDecodingStats | None = None


def make_scheduler_stats(scheduler: Any, step_counter: int = 0) -> SchedulerStats:
    """Upstream's ``Scheduler.make_stats``: it drains the prefix-cache counters (call once a step)."""
    return SchedulerStats(
        num_running_reqs=len(scheduler.running),
        num_waiting_reqs=len(scheduler.waiting),
        num_skipped_waiting_reqs=len(scheduler.skipped_waiting),
        step_counter=step_counter,
        kv_cache_usage=scheduler.kv_cache_manager.usage,
        prefix_cache_stats=scheduler.kv_cache_manager.make_prefix_cache_stats(),
        spec_decoding_stats=scheduler.make_spec_decoding_stats(),
    )


@dataclass
class RequestStateStats:
    """Timestamps a live request carries between steps."""

    num_generation_tokens: int = 0
    arrival_time: float = 0.0
    queued_ts: float = 0.0
    scheduled_ts: float = 0.0  # first scheduling only: a preemption does not move it
    first_token_ts: float = 0.0
    last_token_ts: float = 0.0
    first_token_latency: float = 0.0


@dataclass
class FinishedRequestStats:
    """One finished request's intervals, in seconds."""

    finish_reason: str
    request_id: str | None = None
    e2e_latency: float = 0.0  # arrival -> finish
    num_prompt_tokens: int = 0
    num_generation_tokens: int = 0
    max_tokens_param: int | None = None
    queued_time: float = 0.0  # queued -> first scheduled
    prefill_time: float = 0.0  # first scheduled -> first token
    inference_time: float = 0.0  # first scheduled -> last token
    decode_time: float = 0.0  # first token -> last token
    mean_time_per_output_token: float = 0.0  # decode_time / (tokens - 1): the first token is prefill's


@dataclass
class IterationStats:
    """What one step produced (upstream's ``IterationStats``)."""

    iteration_timestamp: float = 0.0
    num_generation_tokens: int = 0
    num_prompt_tokens: int = 0  # prompt tokens of requests that got their first token this step
    num_preempted_reqs: int = 0
    finished_requests: list[FinishedRequestStats] = field(default_factory=list)
    time_to_first_tokens_iter: list[float] = field(default_factory=list)
    inter_token_latencies_iter: list[float] = field(default_factory=list)


# ----------------------------------------------------------------------------- the recorder
class StatsRecorder:
    """Attach to an ``LLMEngine``; after every ``step()`` hand both stats to each logger.

    ``history`` keeps every step's ``(SchedulerStats, IterationStats)`` (pass ``keep_history=False``
    on a long-running server). ``loggers`` are objects with ``record(scheduler_stats,
    iteration_stats)``, such as ``PrometheusStatLogger``.
    """

    def __init__(
        self,
        engine: Any,
        clock: Clock = time.monotonic,
        loggers: list[Any] | None = None,
        keep_history: bool = True,
    ) -> None:
        if getattr(engine, "stats_recorder", None) is not None:
            raise ValueError("this engine already has a StatsRecorder")
        self.engine, self.clock = engine, clock
        self.loggers = list(loggers or [])
        self.keep_history = keep_history
        self.history: list[tuple[SchedulerStats, IterationStats]] = []
        self.finished: list[FinishedRequestStats] = []  # every finished request so far
        self.step_shapes: list[tuple[int, int]] = []  # (scheduled tokens, batch size) per step: mini's extra
        self._states: dict[str, RequestStateStats] = {}
        self._requests: dict[str, Any] = {}  # request id -> its Request (read after it finishes)
        self._last_output = None
        self._add, self._schedule, self._step = engine.add_request, engine.scheduler.schedule, engine.step
        engine.add_request, engine.scheduler.schedule, engine.step = (
            self._on_add,
            self._on_schedule,
            self._on_step,
        )
        engine.stats_recorder = self

    def detach(self) -> None:
        self.engine.add_request, self.engine.scheduler.schedule, self.engine.step = (
            self._add,
            self._schedule,
            self._step,
        )
        self.engine.stats_recorder = None

    def _on_add(self, *args: Any, **kwargs: Any) -> str:
        now = self.clock()
        known = set(self.engine.scheduler.requests)
        rid = self._add(*args, **kwargs)
        for child in set(self.engine.scheduler.requests) - known:  # n > 1 queues several
            self._states[child] = RequestStateStats(arrival_time=now, queued_ts=now)
            self._requests[child] = self.engine.scheduler.requests[child]
        return rid

    def _on_schedule(self) -> Any:
        out = self._schedule()
        self._last_output = out
        now = self.clock()
        for req in out.scheduled_requests:
            state = self._states.get(req.request_id)
            if state is not None and state.scheduled_ts == 0.0:
                state.scheduled_ts = now
        return out

    def _on_step(self) -> Any:
        self._last_output = None
        outputs = self._step()
        now = self.clock()
        it = IterationStats(iteration_timestamp=now)
        out = self._last_output
        if out is not None:
            it.num_preempted_reqs = len(out.preempted_req_ids)
            if self.keep_history:
                self.step_shapes.append((out.total_num_scheduled_tokens, len(out.num_scheduled_tokens)))
        for rid, state in list(self._states.items()):
            req = self._requests[rid]
            new = len(req.output_token_ids) - state.num_generation_tokens
            if new > 0:
                it.num_generation_tokens += new
                if state.num_generation_tokens == 0:  # the prefill's token: TTFT, no gap
                    state.first_token_latency = now - state.arrival_time
                    it.time_to_first_tokens_iter.append(state.first_token_latency)
                    it.num_prompt_tokens += len(req.prompt_token_ids)
                    state.first_token_ts = now
                else:  # one gap per step, however many tokens it brought (speculation)
                    it.inter_token_latencies_iter.append(now - state.last_token_ts)
                state.last_token_ts = now
                state.num_generation_tokens += new
            if req.is_finished:
                it.finished_requests.append(self._finish(rid, req, state, now))
        sched_stats = make_scheduler_stats(self.engine.scheduler, self.engine.num_steps)
        if self.keep_history:
            self.history.append((sched_stats, it))
        for logger in self.loggers:
            logger.record(sched_stats, it)
        return outputs

    def _finish(self, rid: str, req: Any, s: RequestStateStats, now: float) -> FinishedRequestStats:
        del self._states[rid], self._requests[rid]
        decode = s.last_token_ts - s.first_token_ts
        stats = FinishedRequestStats(
            finish_reason=req.get_finished_reason(),
            request_id=rid,
            e2e_latency=now - s.arrival_time,
            num_prompt_tokens=len(req.prompt_token_ids),
            num_generation_tokens=s.num_generation_tokens,
            max_tokens_param=req.sampling_params.max_tokens,
            queued_time=s.scheduled_ts - s.queued_ts,
            prefill_time=s.first_token_ts - s.scheduled_ts,
            inference_time=s.last_token_ts - s.scheduled_ts,
            decode_time=decode,
            mean_time_per_output_token=decode / (s.num_generation_tokens - 1)
            if s.num_generation_tokens > 1
            else 0.0,
        )
        self.finished.append(stats)
        return stats


def sweep_budget(
    prompts: list[str], budgets: list[int], max_tokens: int = 8, **engine_args: Any
) -> list[tuple[int, int]]:
    """``(budget, steps)`` for each ``max_num_batched_tokens``: every prompt queued at once, greedy."""
    from .engine import LLMEngine
    from .sampling_params import SamplingParams

    out = []
    for budget in budgets:
        engine = LLMEngine(max_num_batched_tokens=budget, **engine_args)
        params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
        engine.generate(prompts, params)
        out.append((budget, engine.num_steps))
    return out


def find_knee(points: list[tuple[int, int]], min_gain: float = 0.05) -> int:
    """The first budget past which a larger one saves less than ``min_gain`` of the steps.

    ``points`` are ``(budget, steps)`` by rising budget. Past the knee, more budget buys almost
    nothing: every prompt already fits, and the decode steps (one token each) set the length.
    """
    if not points:
        raise ValueError("find_knee needs at least one (budget, steps) point")
    for (budget, steps), (_, next_steps) in zip(points, points[1:]):
        if steps - next_steps < min_gain * steps:
            return budget
    return points[-1][0]


# ----------------------------------------------------------------------------- Prometheus
TTFT_BUCKETS = [
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
    2560.0,
]
ITL_BUCKETS = [
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
]
REQUEST_LATENCY_BUCKETS = [
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
    960.0,
    1920.0,
    7680.0,
]
FINISH_REASONS = ("stop", "length", "abort", "error", "repetition")  # upstream's FinishReason, in order


class PrometheusStatLogger:
    """vLLM's Prometheus metrics for one engine, in a registry of its own (``self.registry``).

    Labels ``model_name`` and ``engine`` as upstream; the ``vllm:spec_decode_*`` counters exist
    only with ``spec_decoding=True`` (upstream: only with a speculative config). ``render()`` is
    the text a ``/metrics`` scrape returns. Needs ``prometheus_client`` (imported here, not when mini_vllm is).
    """

    def __init__(
        self, model_name: str, engine_index: int = 0, registry: Any = None, spec_decoding: bool = False
    ) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.registry = registry if registry is not None else CollectorRegistry()
        names = ["model_name", "engine"]
        values = [model_name, str(engine_index)]

        def make(cls: Any, name: str, doc: str, **kw: Any) -> Any:
            return cls(name=name, documentation=doc, labelnames=names, registry=self.registry, **kw).labels(
                *values
            )

        self.gauge_scheduler_running = make(
            Gauge, "vllm:num_requests_running", "Number of requests in model execution batches."
        )
        self.gauge_scheduler_waiting = make(
            Gauge, "vllm:num_requests_waiting", "Number of requests waiting to be processed."
        )
        self.gauge_kv_cache_usage = make(
            Gauge, "vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage."
        )
        self.counter_prefix_cache_queries = make(
            Counter,
            "vllm:prefix_cache_queries",
            "Prefix cache queries, in terms of number of queried tokens.",
        )
        self.counter_prefix_cache_hits = make(
            Counter, "vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens."
        )
        self.counter_num_preempted_reqs = make(
            Counter, "vllm:num_preemptions", "Cumulative number of preemption from the engine."
        )
        self.counter_prompt_tokens = make(
            Counter, "vllm:prompt_tokens", "Number of prefill tokens processed."
        )
        self.counter_generation_tokens = make(
            Counter, "vllm:generation_tokens", "Number of generation tokens processed."
        )
        success = Counter(
            name="vllm:request_success",
            documentation="Count of successfully processed requests.",
            labelnames=[*names, "finished_reason"],
            registry=self.registry,
        )
        self.counter_request_success = {r: success.labels(*values, r) for r in FINISH_REASONS}
        self.histogram_time_to_first_token = make(
            Histogram,
            "vllm:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            buckets=TTFT_BUCKETS,
        )
        self.histogram_inter_token_latency = make(
            Histogram,
            "vllm:inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds.",
            buckets=ITL_BUCKETS,
        )
        self.histogram_e2e_time_request = make(
            Histogram,
            "vllm:e2e_request_latency_seconds",
            "Histogram of e2e request latency in seconds.",
            buckets=REQUEST_LATENCY_BUCKETS,
        )
        self.histogram_queue_time_request = make(
            Histogram,
            "vllm:request_queue_time_seconds",
            "Histogram of time spent in WAITING phase for request.",
            buckets=REQUEST_LATENCY_BUCKETS,
        )
        self.spec_decoding = spec_decoding
        if not spec_decoding:
            return
        self.counter_spec_decode_num_drafts = make(
            Counter, "vllm:spec_decode_num_drafts", "Number of spec decoding drafts."
        )
        self.counter_spec_decode_num_draft_tokens = make(
            Counter, "vllm:spec_decode_num_draft_tokens", "Number of draft tokens."
        )
        self.counter_spec_decode_num_accepted_tokens = make(
            Counter, "vllm:spec_decode_num_accepted_tokens", "Number of accepted tokens."
        )

    def record(self, scheduler_stats: SchedulerStats | None, iteration_stats: IterationStats | None) -> None:
        """Gauges are set, counters advance by the step's amounts, histograms observe each interval."""
        if scheduler_stats is not None:
            self.gauge_scheduler_running.set(scheduler_stats.num_running_reqs)
            self.gauge_scheduler_waiting.set(
                scheduler_stats.num_waiting_reqs + scheduler_stats.num_skipped_waiting_reqs
            )
            self.gauge_kv_cache_usage.set(scheduler_stats.kv_cache_usage)
            self.counter_prefix_cache_queries.inc(scheduler_stats.prefix_cache_stats.queries)
            self.counter_prefix_cache_hits.inc(scheduler_stats.prefix_cache_stats.hits)
            spec = scheduler_stats.spec_decoding_stats
            if spec is not None and self.spec_decoding:
                self.counter_spec_decode_num_drafts.inc(spec.num_drafts)
                self.counter_spec_decode_num_draft_tokens.inc(spec.num_draft_tokens)
                self.counter_spec_decode_num_accepted_tokens.inc(spec.num_accepted_tokens)
        if iteration_stats is None:
            return
        self.counter_num_preempted_reqs.inc(iteration_stats.num_preempted_reqs)
        self.counter_prompt_tokens.inc(iteration_stats.num_prompt_tokens)
        self.counter_generation_tokens.inc(iteration_stats.num_generation_tokens)
        for ttft in iteration_stats.time_to_first_tokens_iter:
            self.histogram_time_to_first_token.observe(ttft)
        for itl in iteration_stats.inter_token_latencies_iter:
            self.histogram_inter_token_latency.observe(itl)
        for fin in iteration_stats.finished_requests:
            self.counter_request_success[fin.finish_reason].inc()
            self.histogram_e2e_time_request.observe(fin.e2e_latency)
            self.histogram_queue_time_request.observe(fin.queued_time)

    def render(self) -> bytes:
        from prometheus_client import generate_latest

        return generate_latest(self.registry)


# ----------------------------------------------------------------------------- the profiler
class Profiler:
    """``start()`` / ``stop()`` around any stretch of engine work; ``stop()`` writes a cProfile file.

    Upstream's switch (``LLMEngine.start_profile``) drives ``torch.profiler`` in every worker and
    writes a trace per rank into ``VLLM_TORCH_PROFILER_DIR``; mini has one process and no
    kernels, so Python's own profiler is the right instrument. Open the file with
    ``python -m pstats FILE`` (then ``sort cumtime`` / ``stats 20``) or snakeviz.
    """

    def __init__(self, out_dir: str | os.PathLike[str]) -> None:
        self.out_dir = os.fspath(out_dir)
        self._profile: cProfile.Profile | None = None
        self.num_traces = 0

    @property
    def running(self) -> bool:
        return self._profile is not None

    def start(self) -> None:
        if self._profile is not None:
            raise RuntimeError("the profiler is already running: call stop_profile() first")
        self._profile = cProfile.Profile()
        self._profile.enable()

    def stop(self) -> str:
        if self._profile is None:
            raise RuntimeError("the profiler is not running: call start_profile() first")
        profile, self._profile = self._profile, None
        profile.disable()
        os.makedirs(self.out_dir, exist_ok=True)
        path = os.path.join(self.out_dir, f"mini_vllm-{os.getpid()}-{self.num_traces}.prof")
        profile.dump_stats(path)
        self.num_traces += 1
        return path
