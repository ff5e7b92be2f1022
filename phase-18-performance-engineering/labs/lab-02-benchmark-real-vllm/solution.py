"""Lab 18-02 — from raw per-request records to the numbers a benchmark reports (reference solution).

A serving benchmark (``vllm bench serve``) keeps one record per request: did it succeed, its
prompt and output token counts, its time to first token, every inter-token gap the client saw,
its end-to-end latency. Everything in the final table is computed from those records: request
and token throughput over the run's duration, mean / median / percentiles of TTFT, TPOT, ITL and
E2E latency, and goodput, the rate of requests that met every SLO. You write that computation;
the tests hold it to vLLM's own ``calculate_metrics`` on the same records.

The records come from anywhere: synthetic ones here, ones collected by vLLM's own client from
mini's server (``collect_from_server``), or the JSON a rented GPU's ``vllm bench serve
--save-result --save-detailed`` writes (``run.py``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

METRICS = ("ttft", "tpot", "itl", "e2el")


@dataclass
class Record:
    """One request as the client saw it (vLLM's ``RequestFuncOutput``, the fields that matter)."""

    success: bool
    prompt_len: int
    output_tokens: int
    ttft: float = 0.0  # seconds
    itl: list[float] = field(default_factory=list)  # seconds between consecutive chunks
    latency: float = 0.0  # seconds, request sent -> last chunk
    start_time: float = 0.0


@dataclass
class Summary:
    completed: int
    failed: int
    total_input: int
    total_output: int
    request_throughput: float  # completed requests / s
    request_goodput: float  # requests that met every SLO / s
    output_throughput: float  # output tokens / s
    total_token_throughput: float  # (input + output) tokens / s
    mean_ms: dict[str, float]  # metric -> mean in ms, for "ttft", "tpot", "itl", "e2el"
    median_ms: dict[str, float]
    percentiles_ms: dict[str, dict[float, float]]  # metric -> {p: value in ms}


# --------------------------------------------------------------------------- the lab
def percentile(values: Sequence[float], p: float) -> float:
    """The ``p``-th percentile (0 <= p <= 100) with linear interpolation between closest ranks.

    Sort the values; the rank is ``(n - 1) * p / 100``; interpolate between the two values around
    it (numpy's default method). An empty list gives 0.0 (a run where nothing succeeded).
    """
    if not 0 <= p <= 100:
        raise ValueError(f"a percentile lies in [0, 100], got {p}")
    if len(values) == 0:
        return 0.0
    xs = sorted(values)
    rank = (len(xs) - 1) * p / 100
    lo = math.floor(rank)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (rank - lo)


def summarize(
    records: Sequence[Record],
    duration_s: float,
    percentiles: Sequence[float] = (50, 99),
    goodput_slo_ms: dict[str, float] | None = None,
) -> Summary:
    """Compute the benchmark's table from its records.

    Failed requests count in ``failed`` and nowhere else. TPOT of a request is ``(latency - ttft) /
    (output_tokens - 1)``, defined only with 2+ output tokens (a 1-token request has no TPOT for
    the statistics, and counts as TPOT 0 for goodput). ITL statistics pool every gap of every
    request. Goodput counts requests whose every metric named in ``goodput_slo_ms`` ("ttft",
    "tpot", "e2el"; milliseconds) is at or under its SLO. Rates divide by ``duration_s``.
    """
    if duration_s <= 0:
        raise ValueError(f"duration_s must be > 0, got {duration_s}")
    slo = dict(goodput_slo_ms or {})
    unknown = set(slo) - {"ttft", "tpot", "e2el"}
    if unknown:
        raise ValueError(f"goodput SLOs exist for ttft, tpot and e2el (ms), got {sorted(unknown)}")
    ok = [r for r in records if r.success]
    values: dict[str, list[float]] = {m: [] for m in METRICS}
    good = 0
    for r in ok:
        tpot = (r.latency - r.ttft) / (r.output_tokens - 1) if r.output_tokens > 1 else 0.0
        if r.output_tokens > 1:
            values["tpot"].append(tpot)
        values["ttft"].append(r.ttft)
        values["e2el"].append(r.latency)
        values["itl"].extend(r.itl)
        seen = {"ttft": r.ttft, "tpot": tpot, "e2el": r.latency}
        if slo and all(seen[k] <= v / 1000 for k, v in slo.items()):
            good += 1
    total_input = sum(r.prompt_len for r in ok)
    total_output = sum(r.output_tokens for r in ok)
    return Summary(
        completed=len(ok),
        failed=len(records) - len(ok),
        total_input=total_input,
        total_output=total_output,
        request_throughput=len(ok) / duration_s,
        request_goodput=good / duration_s,
        output_throughput=total_output / duration_s,
        total_token_throughput=(total_input + total_output) / duration_s,
        mean_ms={m: float(np.mean(v)) * 1000 if v else 0.0 for m, v in values.items()},
        median_ms={m: percentile(v, 50) * 1000 for m, v in values.items()},
        percentiles_ms={m: {p: percentile(v, p) * 1000 for p in percentiles} for m, v in values.items()},
    )


# --------------------------------------------------------------------------- provided
def synthetic_records(n: int = 200, seed: int = 0) -> tuple[list[Record], float]:
    """A seeded run: Poisson arrivals at 8 req/s, lognormal TTFTs, a few failures and 1-token replies."""
    rng = np.random.default_rng(seed)
    start = np.cumsum(rng.exponential(1 / 8, n))
    records = []
    for i in range(n):
        if rng.random() < 0.02:
            records.append(Record(False, 512, 0, start_time=float(start[i])))
            continue
        out = 1 if rng.random() < 0.05 else int(rng.integers(64, 129))
        ttft = float(rng.lognormal(np.log(0.15), 0.6))
        itl = [float(x) for x in rng.gamma(4.0, 0.011 / 4, out - 1)]
        records.append(Record(True, 512, out, ttft, itl, ttft + sum(itl), float(start[i])))
    duration = max(r.start_time + r.latency for r in records) - float(start[0])
    return records, duration


def collect_from_server(base_url: str, model: str, prompts: Sequence[str], output_len: int) -> list[Record]:
    """Send ``prompts`` at once with vLLM's own benchmark client (streamed completions); one Record each.

    Needs vllm importable (tier 1) and aiohttp. Bounded: every request carries a 30 s timeout.
    """
    import asyncio

    import aiohttp
    from vllm.benchmarks.lib.endpoint_request_func import RequestFuncInput, async_request_openai_completions

    async def run() -> list:
        timeout = aiohttp.ClientTimeout(total=30)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            inputs = [
                RequestFuncInput(
                    prompt=p,
                    api_url=base_url + "/v1/completions",
                    prompt_len=len(p.encode()),
                    output_len=output_len,
                    model=model,
                    ignore_eos=True,
                )
                for p in prompts
            ]
            return await asyncio.gather(*(async_request_openai_completions(x, session) for x in inputs))

    outs = asyncio.run(run())
    return [
        Record(o.success, o.prompt_len, o.output_tokens, o.ttft, list(o.itl), o.latency, o.start_time)
        for o in outs
    ]


def records_from_bench_json(result: dict) -> list[Record]:
    """Records from ``vllm bench serve --save-result --save-detailed`` JSON (its per-request lists).

    The JSON has no per-request latency; the client's own clock gives it back: the last chunk
    arrived ``ttft + sum(itl)`` after the request was sent.
    """
    rows = zip(result["input_lens"], result["output_lens"], result["ttfts"], result["itls"], result["errors"])
    return [Record(not err, p, o, t, list(itl), t + sum(itl)) for p, o, t, itl, err in rows]


def render(s: Summary, percentiles: Sequence[float] = (50, 99)) -> list[str]:
    lines = [
        f"completed {s.completed}, failed {s.failed}",
        f"request throughput {s.request_throughput:.2f} req/s, goodput {s.request_goodput:.2f} req/s",
        f"output throughput {s.output_throughput:.1f} tok/s, total {s.total_token_throughput:.1f} tok/s",
        f"{'metric':<6} {'mean':>8} {'median':>8} "
        + " ".join(f"{'p' + format(p, 'g'):>8}" for p in percentiles),
    ]
    for m in METRICS:
        cells = " ".join(f"{s.percentiles_ms[m][p]:>8.1f}" for p in percentiles)
        lines.append(f"{m:<6} {s.mean_ms[m]:>8.1f} {s.median_ms[m]:>8.1f} {cells}")
    return lines


def main() -> None:
    records, duration = synthetic_records()
    print(f"200 synthetic requests over {duration:.1f} s (seed 0), 512 prompt tokens each; times in ms")
    for line in render(summarize(records, duration, (50, 90, 99), {"ttft": 500, "tpot": 15}), (50, 90, 99)):
        print("  " + line)
    loose = summarize(records, duration, (50, 99), {"ttft": 1000})
    print(f"goodput at TTFT <= 1000 ms alone: {loose.request_goodput:.2f} req/s")


if __name__ == "__main__":
    main()
