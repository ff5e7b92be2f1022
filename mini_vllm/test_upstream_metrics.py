"""Differential test: the same step stats through vLLM 0.22.1's ``PrometheusStatLogger`` and mini's.

mini's engine runs a trace with prefix hits, a preemption, queueing and every finish path under a
fake clock whose steps span several histogram buckets; each step's ``(SchedulerStats,
IterationStats)`` is converted field by field into vLLM's own classes and recorded by both
loggers. Every sample mini exports (name, labels, value: gauges, counters, each histogram bucket,
sum and count) must appear in vLLM's registry with the same value.
"""

import importlib

import pytest

from mini_vllm import LLMEngine, SamplingParams
from mini_vllm.metrics import PrometheusStatLogger, StatsRecorder

pytestmark = pytest.mark.upstream


@pytest.fixture(scope="module")
def real():
    rv = importlib.import_module("course.runtime.real_vllm")
    loggers = importlib.import_module("vllm.v1.metrics.loggers")
    stats = importlib.import_module("vllm.v1.metrics.stats")
    engine = importlib.import_module("vllm.v1.engine")
    prometheus = importlib.import_module("vllm.v1.metrics.prometheus")
    return rv, loggers, stats, engine, prometheus


def to_real(stats_mod, engine_mod, sched, it):
    pcs = sched.prefix_cache_stats
    s = stats_mod.SchedulerStats(
        num_running_reqs=sched.num_running_reqs,
        num_waiting_reqs=sched.num_waiting_reqs,
        num_skipped_waiting_reqs=sched.num_skipped_waiting_reqs,
        kv_cache_usage=sched.kv_cache_usage,
        prefix_cache_stats=stats_mod.PrefixCacheStats(
            requests=pcs.requests,
            queries=pcs.queries,
            hits=pcs.hits,
            preempted_requests=pcs.preempted_requests,
            preempted_queries=pcs.preempted_queries,
            preempted_hits=pcs.preempted_hits,
        ),
    )
    r = stats_mod.IterationStats()
    r.num_generation_tokens = it.num_generation_tokens
    r.prompt_token_stats.total = it.num_prompt_tokens
    r.prompt_token_stats.computed = it.num_prompt_tokens
    r.num_preempted_reqs = it.num_preempted_reqs
    r.time_to_first_tokens_iter = list(it.time_to_first_tokens_iter)
    r.inter_token_latencies_iter = list(it.inter_token_latencies_iter)
    for f in it.finished_requests:
        fields = {k: v for k, v in vars(f).items() if k != "finish_reason"}
        r.finished_requests.append(
            stats_mod.FinishedRequestStats(
                finish_reason=engine_mod.FinishReason[f.finish_reason.upper()], **fields
            )
        )
    return s, r


def run_trace():
    class Clock:
        now = 0.0

        def __call__(self):
            return self.now

    clock = Clock()
    eng = LLMEngine(num_gpu_blocks=8, block_size=4, max_num_seqs=3, max_num_batched_tokens=12)
    rec = StatsRecorder(eng, clock=clock)
    shared = "a shared prefix!"  # 16 tokens: four full blocks
    gaps = [0.004, 0.03, 0.2, 0.9, 3.0, 0.05]
    for i, (prompt, n) in enumerate([(shared + "one", 6), (shared + "two", 9), ("solo", 3), (shared, 5)]):
        eng.add_request(
            prompt, SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True), request_id=f"r{i}"
        )
        clock.now += 0.01
    eng.add_request(
        "to abort", SamplingParams(max_tokens=50, temperature=0.0, ignore_eos=True), request_id="ab"
    )
    k = 0
    while eng.has_unfinished_requests():
        clock.now += gaps[k % len(gaps)]
        k += 1
        eng.step()
        if k == 4:
            eng.abort_request("ab")
    return rec.history


def samples(registry, names):
    out = {}
    for family in registry.collect():
        if family.name not in names:
            continue
        for s in family.samples:
            if not s.name.endswith("_created"):
                out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_same_stats_same_prometheus_samples(real):
    rv, loggers, stats_mod, engine_mod, prometheus = real
    history = run_trace()
    assert sum(it.num_preempted_reqs for _, it in history) >= 1, "the trace must preempt"
    assert sum(s.prefix_cache_stats.hits for s, _ in history) > 0, "the trace must hit the prefix cache"
    assert {f.finish_reason for _, it in history for f in it.finished_requests} == {"length", "abort"}

    vc = rv.make_vllm_config(max_model_len=64, block_size=4, num_gpu_blocks=8)
    real_logger = loggers.PrometheusStatLogger(vc, engine_indexes=[0])
    try:
        mini = PrometheusStatLogger(vc.model_config.served_model_name)
        for sched, it in history:
            mini.record(sched, it)
            s, r = to_real(stats_mod, engine_mod, sched, it)
            real_logger.record(scheduler_stats=s, iteration_stats=r, engine_idx=0)
        names = sorted({f.name for f in mini.registry.collect()})
        assert len(names) == 13, names
        from prometheus_client import REGISTRY

        want = samples(mini.registry, names)
        got = samples(REGISTRY, names)
        missing = sorted(set(want) - set(got))
        assert not missing, f"mini exports samples vLLM does not: {missing[:5]}"
        wrong = {k: (want[k], got[k]) for k in want if want[k] != pytest.approx(got[k])}
        assert not wrong, f"mini vs vLLM values differ: {wrong}"
        extra = sorted(k for k in set(got) - set(want))
        assert not extra, f"vLLM exports samples of these names that mini lacks: {extra[:5]}"
    finally:
        prometheus.unregister_vllm_metrics()
