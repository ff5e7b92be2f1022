"""Phase 18: the stats a step produces, their Prometheus page, the profiler switch.

A fake clock (``Clock.now`` set by the test before each step) makes every interval exact.
"""

import pstats
import urllib.request

import pytest

from mini_vllm import LLMEngine, SamplingParams
from mini_vllm.metrics import PrometheusStatLogger, StatsRecorder, find_knee, sweep_budget

pytest.importorskip("prometheus_client")


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def greedy(n: int) -> SamplingParams:
    return SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)


def run(engine: LLMEngine, clock: Clock, dt: float = 1.0) -> None:
    while engine.has_unfinished_requests():
        clock.now += dt
        engine.step()


def test_recorder_is_invisible():
    prompts = ["the quick brown fox " * 3, "jumps over", "the quick brown fox " * 3 + "again"]
    plain = LLMEngine(num_gpu_blocks=40, block_size=4, max_num_batched_tokens=16, max_num_seqs=2)
    probed = LLMEngine(num_gpu_blocks=40, block_size=4, max_num_batched_tokens=16, max_num_seqs=2)
    StatsRecorder(probed, clock=Clock())
    a = [o.outputs[0].token_ids for o in plain.generate(prompts, greedy(12))]
    b = [o.outputs[0].token_ids for o in probed.generate(prompts, greedy(12))]
    assert a == b, "attaching a StatsRecorder changed the generated tokens: the probe must only observe"
    assert plain.num_steps == probed.num_steps


def test_ttft_itl_e2e_and_queue_time_are_exact_under_a_fake_clock():
    clock = Clock()
    eng = LLMEngine(num_gpu_blocks=32, block_size=4, max_num_seqs=1)  # one at a time: b queues
    rec = StatsRecorder(eng, clock=clock)
    eng.add_request("abcd", greedy(3), request_id="a")
    clock.now = 0.5
    eng.add_request("efgh", greedy(2), request_id="b")
    run(eng, clock)  # steps at t = 1.5, 2.5, 3.5 (a's three tokens), 4.5, 5.5 (b's two)
    ttfts = [t for _, it in rec.history for t in it.time_to_first_tokens_iter]
    itls = [t for _, it in rec.history for t in it.inter_token_latencies_iter]
    assert ttfts == [1.5, 4.0], f"TTFT runs from arrival to the step that emits the first token, got {ttfts}"
    assert itls == [1.0, 1.0, 1.0], f"one gap per later token, got {itls}"
    fin = {f.request_id: f for f in rec.finished}
    assert fin["a"].e2e_latency == 3.5 and fin["b"].e2e_latency == 5.0
    assert fin["a"].queued_time == 1.5 and fin["b"].queued_time == 4.0, "b waited in the queue behind a"
    assert fin["a"].mean_time_per_output_token == 1.0 and fin["b"].decode_time == 1.0
    assert fin["a"].finish_reason == "length" and fin["b"].num_generation_tokens == 2


def test_scheduler_stats_each_step():
    clock = Clock()
    eng = LLMEngine(num_gpu_blocks=33, block_size=4, max_num_seqs=2, max_num_batched_tokens=64)
    rec = StatsRecorder(eng, clock=clock)
    prompt = "x" * 16
    for rid in "abc":
        eng.add_request(prompt, greedy(2), request_id=rid)
    clock.now = 1.0
    eng.step()
    s, it = rec.history[-1]
    assert (s.num_running_reqs, s.num_waiting_reqs) == (2, 1), "max_num_seqs=2: two run, one waits"
    assert s.kv_cache_usage == pytest.approx(eng.scheduler.kv_cache_manager.usage)
    assert s.kv_cache_usage == pytest.approx(5 / 32), "a's 4 blocks + b's own last one (3 shared): 5 of 32"
    assert (s.prefix_cache_stats.queries, s.prefix_cache_stats.hits) == (32, 12), (
        "b hits a's three full blocks at admission (capped at num_tokens - 1)"
    )
    assert it.num_prompt_tokens == 32 and it.num_generation_tokens == 2
    run(eng, clock)
    total_q = sum(s.prefix_cache_stats.queries for s, _ in rec.history)
    assert total_q == 48, "the counters are drained each step: their sum is every lookup once"


NUM_PREEMPTIONS = 1  # b is preempted once when a needs its third block (6 usable blocks)


def test_preemptions_counted():
    clock = Clock()
    eng = LLMEngine(num_gpu_blocks=7, block_size=4, max_num_seqs=4, enable_prefix_caching=False)
    rec = StatsRecorder(eng, clock=clock)
    for rid in "ab":
        eng.add_request("y" * 7, greedy(10), request_id=rid)
    run(eng, clock)
    n = sum(it.num_preempted_reqs for _, it in rec.history)
    assert n == NUM_PREEMPTIONS, f"expected {NUM_PREEMPTIONS} preemption(s) in this trace, counted {n}"
    prom = PrometheusStatLogger("m")
    for s, it in rec.history:
        prom.record(s, it)
    assert prom.counter_num_preempted_reqs._value.get() == n


def test_prometheus_page_has_vllm_names_and_the_recorded_values():
    clock = Clock()
    eng = LLMEngine(num_gpu_blocks=32, block_size=4)
    prom = PrometheusStatLogger("mini-toy")
    StatsRecorder(eng, clock=clock, loggers=[prom])
    eng.add_request("abcdefgh", greedy(4))
    run(eng, clock, dt=0.02)
    page = prom.render().decode()
    for name in (
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "vllm:prefix_cache_queries_total",
        "vllm:prefix_cache_hits_total",
        "vllm:num_preemptions_total",
        "vllm:time_to_first_token_seconds_bucket",
        "vllm:inter_token_latency_seconds_count",
        "vllm:e2e_request_latency_seconds_sum",
    ):
        assert name in page, f"{name} missing from the /metrics text"
    assert 'vllm:time_to_first_token_seconds_bucket{engine="0",le="0.02",model_name="mini-toy"} 1.0' in page
    assert 'vllm:inter_token_latency_seconds_count{engine="0",model_name="mini-toy"} 3.0' in page
    assert 'vllm:request_success_total{engine="0",finished_reason="length",model_name="mini-toy"} 1.0' in page
    assert "spec_decode" not in page, "spec-decode counters exist only with a speculative config"


def test_server_serves_metrics():
    pytest.importorskip("fastapi")
    from mini_vllm.testing.live_server import LiveServer

    s = LiveServer(num_gpu_blocks=64, block_size=16)
    try:
        body = b'{"model": "mini-toy", "prompt": "hello", "max_tokens": 3, "temperature": 0}'
        req = urllib.request.Request(
            s.base_url + "/v1/completions", body, {"Content-Type": "application/json"}
        )
        urllib.request.urlopen(req, timeout=30).read()
        page = urllib.request.urlopen(s.base_url + "/metrics", timeout=10).read().decode()
    finally:
        s.stop()
    assert 'vllm:time_to_first_token_seconds_count{engine="0",model_name="mini-toy"} 1.0' in page
    assert 'vllm:generation_tokens_total{engine="0",model_name="mini-toy"} 3.0' in page
    assert 'vllm:num_requests_running{engine="0",model_name="mini-toy"} 0.0' in page


def test_profiler_writes_a_file_pstats_reads(tmp_path):
    eng = LLMEngine(num_gpu_blocks=16, block_size=4)
    with pytest.raises(RuntimeError, match="not running"):
        eng.stop_profile()
    eng.start_profile(str(tmp_path))
    with pytest.raises(RuntimeError, match="already running"):
        eng.start_profile(str(tmp_path))
    eng.generate(["profile me"], greedy(3))
    path = eng.stop_profile()
    names = {func[2] for func in pstats.Stats(path).stats}
    assert "step" in names and "schedule" in names, "the profile must cover the engine's steps"


def test_double_attach_refused():
    eng = LLMEngine(num_gpu_blocks=8, block_size=4)
    rec = StatsRecorder(eng, clock=Clock())
    with pytest.raises(ValueError, match="already has"):
        StatsRecorder(eng)
    rec.detach()
    StatsRecorder(eng)


def test_step_shapes_and_budget_sweep():
    clock = Clock()
    eng = LLMEngine(num_gpu_blocks=64, block_size=4, max_num_batched_tokens=16)
    rec = StatsRecorder(eng, clock=clock)
    eng.add_request("z" * 40, greedy(3))
    eng.add_request("w" * 4, greedy(3))
    run(eng, clock)
    assert rec.step_shapes == [(16, 1), (16, 1), (12, 2), (2, 2), (2, 2)], rec.step_shapes
    prompts = ["p" * n for n in (200, 150, 100, 60, 30)]
    points = sweep_budget(
        prompts, [16, 32, 64, 128, 256, 512, 1024], max_tokens=8, num_gpu_blocks=64, block_size=16
    )
    steps = [s for _, s in points]
    assert steps == sorted(steps, reverse=True), f"more budget never means more steps: {points}"
    assert steps[0] > 2 * steps[-1], points
    assert points[-3:] == [(256, 8), (512, 8), (1024, 8)], "8 output tokens: 8 steps is the floor"
    assert find_knee(points) == 256, (
        f"from budget 256 the last prompt chunks ride in steps the first requests' decodes run anyway: {points}"
    )
    with pytest.raises(ValueError):
        find_knee([])


def test_gauges_mid_run_and_one_gap_per_step_with_speculation():
    clock = Clock()
    eng = LLMEngine(num_gpu_blocks=32, block_size=4, max_num_seqs=1)
    prom = PrometheusStatLogger("m")
    StatsRecorder(eng, clock=clock, loggers=[prom])
    for rid in "abc":
        eng.add_request("q" * 6, greedy(3), request_id=rid)
    clock.now = 1.0
    eng.step()
    page = prom.render().decode()
    assert 'vllm:num_requests_running{engine="0",model_name="m"} 1.0' in page
    assert 'vllm:num_requests_waiting{engine="0",model_name="m"} 2.0' in page, "one runs, two wait"

    spec = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 2, "prompt_lookup_max": 3}
    eng = LLMEngine(num_gpu_blocks=64, block_size=4, speculative_config=spec)
    prom = PrometheusStatLogger("m", spec_decoding=True)
    rec = StatsRecorder(eng, clock=clock, loggers=[prom])
    eng.add_request("abcabcabcabcabcabc", greedy(24))
    run(eng, clock)
    emitting_steps = sum(1 for _, it in rec.history if it.num_generation_tokens)
    gaps = [g for _, it in rec.history for g in it.inter_token_latencies_iter]
    assert len(gaps) == emitting_steps - 1 < 23, (
        f"{len(gaps)} gaps over {emitting_steps} emitting steps: one gap per step that brought tokens, "
        f"however many it brought (24 tokens in {emitting_steps} steps)"
    )
    drafts = sum(s.spec_decoding_stats.num_draft_tokens for s, _ in rec.history if s.spec_decoding_stats)
    assert (
        drafts > 0
        and f'vllm:spec_decode_num_draft_tokens_total{{engine="0",model_name="m"}} {drafts:.1f}'
        in (prom.render().decode())
    )
