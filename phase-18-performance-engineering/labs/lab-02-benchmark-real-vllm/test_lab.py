"""Lab 18-02 CPU path: percentiles, TPOT, ITL and goodput from raw records, held to vLLM's calculate_metrics."""

import contextlib
import io
import warnings

import numpy as np
import pytest

from course.runtime import lab_module

lab = lab_module(__file__)  # solution.py by default; LAB_IMPL=starter grades starter.py
R = lab.Record


def test_percentile_interpolates_between_ranks():
    rng = np.random.default_rng(0)
    cases = [rng.lognormal(0, 1, n).tolist() for n in (1, 2, 7, 100)] + [[3.0, 1.0, 2.0, 2.0, 2.0]]
    for xs in cases:
        for p in (0, 1, 25, 50, 90, 99, 99.9, 100):
            got, want = lab.percentile(xs, p), float(np.percentile(xs, p))
            assert got == pytest.approx(want), (
                f"p{p} of {len(xs)} values: got {got}, want {want}. Sort, take rank (n - 1) * p / 100 and "
                f"interpolate between the values on either side (do not round to the nearest rank)"
            )
    assert lab.percentile([], 99) == 0.0, "no successful request: report 0.0, as vLLM does"
    with pytest.raises(ValueError):
        lab.percentile([1.0], 101)


def test_failed_requests_count_nowhere_else():
    records = [
        R(True, 10, 3, 0.1, [0.01, 0.02], 0.13),
        R(False, 10, 0, 9.0, [5.0], 9.0),  # a failed request's junk timings must not leak in
        R(True, 30, 5, 0.3, [0.01] * 4, 0.34),
    ]
    s = lab.summarize(records, duration_s=2.0, percentiles=[50, 99])
    assert (s.completed, s.failed, s.total_input, s.total_output) == (2, 1, 40, 8), (
        f"completed/failed/input/output = {(s.completed, s.failed, s.total_input, s.total_output)}: a failed "
        f"request adds to 'failed' only"
    )
    assert s.percentiles_ms["ttft"][99] == pytest.approx(298.0) and s.mean_ms["ttft"] == pytest.approx(200.0)
    assert s.percentiles_ms["itl"][99] == pytest.approx(19.5), "ITL must not see the failed request's 5 s gap"


def test_tpot_needs_two_tokens_but_goodput_counts_one_token_replies():
    records = [
        R(True, 8, 1, 0.02, [], 0.02),  # one token: no TPOT, but TPOT 0 for goodput (it passes)
        R(True, 8, 3, 0.02, [0.05, 0.05], 0.12),  # TPOT 50 ms
        R(True, 8, 5, 0.40, [0.01] * 4, 0.44),  # TPOT 10 ms, TTFT too slow
    ]
    s = lab.summarize(records, 1.0, [50], {"ttft": 100, "tpot": 20})
    assert s.mean_ms["tpot"] == pytest.approx(30.0), (
        f"mean TPOT over requests with 2+ tokens is (50 + 10) / 2 = 30 ms, got {s.mean_ms['tpot']}: a 1-token "
        f"reply has no time per output token"
    )
    assert s.request_goodput == pytest.approx(1.0), (
        f"only the 1-token reply meets TTFT <= 100 ms and TPOT <= 20 ms (its TPOT counts as 0), got goodput "
        f"{s.request_goodput}; pair each request's own TTFT with its own TPOT"
    )


def test_itl_pools_every_gap():
    records = [R(True, 4, 2, 0.1, [0.1], 0.2), R(True, 4, 10, 0.1, [0.01] * 9, 0.19)]
    s = lab.summarize(records, 1.0, [50])
    assert s.mean_ms["itl"] == pytest.approx(19.0), (
        f"ITL pools all 10 gaps: (100 + 9 x 10) / 10 = 19 ms, got {s.mean_ms['itl']}; averaging per request "
        f"first (55 ms) weights a 2-token reply like a 10-token one"
    )
    assert s.median_ms["tpot"] == pytest.approx(55.0), "TPOT is per request: median of 100 and 10 ms"


def test_goodput_boundary_is_inclusive():
    records = [R(True, 4, 2, 0.025, [0.01], 0.035), R(True, 4, 2, 0.0251, [0.01], 0.0351)]
    s = lab.summarize(records, 1.0, [50], {"ttft": 25})
    assert s.request_goodput == pytest.approx(1.0), (
        f"a TTFT of exactly 25 ms meets a 25 ms SLO (<=); 25.1 ms does not: goodput 1 req/s, got "
        f"{s.request_goodput}"
    )
    with pytest.raises(ValueError):
        lab.summarize(records, 1.0, [50], {"itl": 10})


def test_rates_divide_by_the_run_duration():
    records = [R(True, 100, 10, 0.1, [0.01] * 9, 0.19, start_time=t) for t in (0.0, 0.5, 3.0)]
    s = lab.summarize(records, duration_s=4.0, percentiles=[50])
    assert s.request_throughput == pytest.approx(0.75) and s.output_throughput == pytest.approx(7.5), (
        f"3 requests and 30 tokens over the 4 s run: 0.75 req/s and 7.5 tok/s, got {s.request_throughput} and "
        f"{s.output_throughput}: divide by the benchmark's duration, not by the requests' own latencies"
    )
    assert s.total_token_throughput == pytest.approx(82.5)
    assert s.request_goodput == 0.0, "no SLO given: goodput 0, as vLLM reports"


# --------------------------------------------------------------------------- against vLLM's own code
def vllm_metrics(records, duration, percentiles, slo):
    from vllm.benchmarks.lib.endpoint_request_func import RequestFuncOutput
    from vllm.benchmarks.serve import calculate_metrics

    outs = [
        RequestFuncOutput(
            success=r.success,
            latency=r.latency,
            output_tokens=r.output_tokens,
            ttft=r.ttft,
            itl=list(r.itl),
            prompt_len=r.prompt_len,
            start_time=r.start_time,
            error="" if r.success else "failed",
        )
        for r in records
    ]
    with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():  # it prints and warns
        warnings.simplefilter("ignore")
        m, _ = calculate_metrics([], outs, duration, None, list(percentiles), dict(slo))
    return m


def assert_same(s, m, percentiles, where):
    pairs = {
        "completed": (s.completed, m.completed),
        "failed": (s.failed, m.failed),
        "total_input": (s.total_input, m.total_input),
        "total_output": (s.total_output, m.total_output),
        "request_throughput": (s.request_throughput, m.request_throughput),
        "request_goodput": (s.request_goodput, m.request_goodput),
        "output_throughput": (s.output_throughput, m.output_throughput),
        "total_token_throughput": (s.total_token_throughput, m.total_token_throughput),
    }
    for metric in ("ttft", "tpot", "itl", "e2el"):
        pairs[f"mean_{metric}_ms"] = (s.mean_ms[metric], getattr(m, f"mean_{metric}_ms"))
        pairs[f"median_{metric}_ms"] = (s.median_ms[metric], getattr(m, f"median_{metric}_ms"))
        for p, v in getattr(m, f"percentiles_{metric}_ms"):
            pairs[f"p{p}_{metric}_ms"] = (s.percentiles_ms[metric][p], v)
    wrong = {k: v for k, v in pairs.items() if v[0] != pytest.approx(v[1], rel=1e-9, abs=1e-12)}
    assert not wrong, f"{where}: yours vs vLLM's calculate_metrics: {wrong}"


@pytest.mark.upstream
def test_matches_vllms_calculate_metrics():
    percentiles = [25, 50, 90, 99, 99.9]
    for seed in range(3):
        records, duration = lab.synthetic_records(120, seed)
        for slo in ({}, {"ttft": 200}, {"ttft": 300, "tpot": 11.5}, {"e2el": 1300}, {"tpot": 12}):
            s = lab.summarize(records, duration, percentiles, slo)
            assert_same(
                s, vllm_metrics(records, duration, percentiles, slo), percentiles, f"seed {seed}, SLO {slo}"
            )
    dead = [R(False, 10, 0), R(False, 12, 0)]
    assert_same(
        lab.summarize(dead, 1.0, [50, 99]), vllm_metrics(dead, 1.0, [50, 99], {}), [50, 99], "all failed"
    )


@pytest.mark.upstream
def test_records_from_mini_server_with_vllms_client():
    pytest.importorskip("aiohttp")
    pytest.importorskip("fastapi")
    from mini_vllm.testing.live_server import LiveServer

    server = LiveServer(num_gpu_blocks=128, block_size=16)
    try:
        prompts = [f"benchmark prompt number {i}" for i in range(8)]
        records = lab.collect_from_server(server.base_url, "mini-toy", prompts, output_len=6)
    finally:
        server.stop()
    assert all(r.success for r in records), [r for r in records if not r.success][:1]
    assert [r.output_tokens for r in records] == [6] * 8, (
        "usage.completion_tokens: 6 tokens each (ignore_eos)"
    )
    duration = max(r.start_time + r.latency for r in records) - min(r.start_time for r in records)
    s = lab.summarize(records, duration, [50, 99], {"ttft": 5000})
    assert_same(s, vllm_metrics(records, duration, [50, 99], {"ttft": 5000}), [50, 99], "mini's server")
