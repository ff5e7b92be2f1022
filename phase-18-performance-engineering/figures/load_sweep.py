"""Draw load_sweep.svg: a toy continuous-batching server under Poisson load, rate by rate.

A step-level simulator (ours, not vLLM's): every step decodes one token for each running request,
then spends what is left of ``max_num_batched_tokens`` on prefill chunks (running requests first,
then waiting ones while fewer than ``max_num_seqs`` run), as vLLM's scheduler does. A step costs
``STEP_FIXED_S + STEP_PER_TOKEN_S * tokens``: an assumed cost model, not a measurement. Arrivals are
Poisson (exponential gaps, seeded), as ``vllm bench serve`` sends them at ``--burstiness 1``.
Per request it records TTFT, the inter-token gaps and E2EL, then checks Little's law and scores one
rate twice: with our own percentiles and with vLLM's ``calculate_metrics`` on the same records.
Run: python phase-18-performance-engineering/figures/load_sweep.py
"""

from __future__ import annotations

import contextlib
import io
import math
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from course.svgfig import BLUE, GREEN, GREY, INK, ORANGE, RED, Svg

STEP_FIXED_S = 0.004  # assumed: launch + Python + sampling per step
STEP_PER_TOKEN_S = 0.0002  # assumed: 200 us of model time per scheduled token
PROMPT, OUTPUT, NUM_REQUESTS = 256, 64, 400
SLO_TTFT_MS, SLO_TPOT_MS = 500.0, 20.0
RATES = [2, 4, 6, 8, 10, 12, 14, 16]
BUDGETS = [64, 128, 256, 512, 2048]


@dataclass
class Req:
    arrival: float
    prefilled: int = 0
    token_times: list[float] = field(default_factory=list)


def arrivals(rate: float, n: int, seed: int = 0) -> np.ndarray:
    """Poisson arrivals: exponential gaps with mean 1/rate (seeded), rescaled so the last one lands at
    n / rate, as ``get_request`` rescales its gaps to hold the offered rate exact."""
    t = np.cumsum(np.random.default_rng(seed).exponential(1.0 / rate, n))
    return t * (n / rate) / t[-1]


def simulate(times: np.ndarray, budget: int = 2048, max_num_seqs: int = 128) -> tuple[list[Req], float, int]:
    """Run the toy server until every request is done.

    Returns the requests, the area under N(t) (requests inside x seconds) and the longest step in tokens.
    """
    reqs = [Req(float(t)) for t in times]
    waiting, running, nxt, now, area, longest = [], [], 0, 0.0, 0.0, 0
    while nxt < len(reqs) or waiting or running:
        while nxt < len(reqs) and reqs[nxt].arrival <= now:
            waiting.append(reqs[nxt])
            nxt += 1
        if not waiting and not running:  # idle: jump to the next arrival
            now = reqs[nxt].arrival
            continue
        left, decoding, chunks = budget, [], []
        for r in running:  # decode first: one token each for requests past their prompt
            if r.prefilled == PROMPT and left > 0:
                decoding.append(r)
                left -= 1
        for r in running:  # then unfinished prefills of running requests
            if r.prefilled < PROMPT and left > 0:
                chunks.append((r, min(left, PROMPT - r.prefilled)))
                left -= chunks[-1][1]
        while waiting and left > 0 and len(running) < max_num_seqs:  # then admit, FCFS
            r = waiting.pop(0)
            running.append(r)
            chunks.append((r, min(left, PROMPT)))
            left -= chunks[-1][1]
        step = STEP_FIXED_S + STEP_PER_TOKEN_S * (budget - left)
        longest = max(longest, budget - left)
        area += step * (len(waiting) + len(running))
        now += step
        for r in decoding:
            r.token_times.append(now)
        for r, n in chunks:
            r.prefilled += n
            if r.prefilled == PROMPT:  # the step that finishes the prompt samples the first token
                r.token_times.append(now)
        running = [r for r in running if len(r.token_times) < OUTPUT]
    return reqs, area, longest


def metrics(reqs: list[Req]) -> dict:
    ttft = np.array([r.token_times[0] - r.arrival for r in reqs])
    itl = np.concatenate([np.diff(r.token_times) for r in reqs])
    e2el = np.array([r.token_times[-1] - r.arrival for r in reqs])
    tpot = (e2el - ttft) / (OUTPUT - 1)
    dur = max(r.token_times[-1] for r in reqs) - reqs[0].arrival
    good = int(np.sum((ttft * 1e3 <= SLO_TTFT_MS) & (tpot * 1e3 <= SLO_TPOT_MS)))
    return {
        "dur": dur,
        "req_s": len(reqs) / dur,
        "tok_s": len(reqs) * OUTPUT / dur,
        "goodput": good / dur,
        "ttft": np.percentile(ttft, [50, 99]) * 1e3,
        "itl": np.percentile(itl, [50, 99]) * 1e3,
        "e2el_mean": float(e2el.mean()),
        "good": good,
    }


def vllm_scores(reqs: list[Req], dur: float) -> tuple:
    """The same records through vLLM's own calculate_metrics (tier 1: the real function, on CPU)."""
    os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
    with contextlib.redirect_stdout(io.StringIO()):  # vLLM's import-time log lines
        from vllm.benchmarks.datasets.datasets import SampleRequest
        from vllm.benchmarks.lib.endpoint_request_func import RequestFuncOutput
        from vllm.benchmarks.serve import calculate_metrics

    inputs = [SampleRequest(prompt="x", prompt_len=PROMPT, expected_output_len=OUTPUT) for _ in reqs]
    outs = [
        RequestFuncOutput(
            success=True,
            output_tokens=OUTPUT,
            prompt_len=PROMPT,
            start_time=r.arrival,
            ttft=r.token_times[0] - r.arrival,
            latency=r.token_times[-1] - r.arrival,
            itl=list(np.diff(r.token_times)),
        )
        for r in reqs
    ]
    with contextlib.redirect_stdout(io.StringIO()):  # it prints a plotting tip
        m, _ = calculate_metrics(
            inputs, outs, dur, None, [50, 99], {"ttft": SLO_TTFT_MS, "tpot": SLO_TPOT_MS}
        )
    return m.percentiles_ttft_ms, m.percentiles_itl_ms, m.request_goodput


def draw(rows: list[tuple[float, dict]], path: Path) -> None:
    width, left, ph, gap, top = 600, 70, 150, 70, 40
    svg = Svg(
        width,
        top + 2 * (ph + gap) + 10,
        "Throughput and p99 TTFT against offered load",
        "Two stacked panels over the offered request rate of a toy continuous-batching server. Top: "
        "achieved throughput follows the offered rate and bends near capacity, while goodput (requests "
        "meeting both latency targets) peaks and then collapses. Bottom: p99 time to first token stays low "
        "and then shoots past the 500 ms target beyond the knee.",
    )
    xmax = RATES[-1]
    x = [left + (width - left - 30) * r / xmax for r, _ in rows]
    tput = [m["req_s"] for _, m in rows]
    p99 = [m["ttft"][1] for _, m in rows]
    good = [m["goodput"] for _, m in rows]
    panels = [
        ("req/s: throughput (blue), goodput (green)", tput, max(RATES), BLUE),
        ("p99 TTFT, ms (dashed: the 500 ms target)", p99, 500 * math.ceil(max(p99) * 1.1 / 500), ORANGE),
    ]
    for p, (title, ys, ymax, colour) in enumerate(panels):
        y0 = top + p * (ph + gap) + 20
        svg.text(left, y0 - 10, title, 16)
        svg.rect(left, y0, width - left - 30, ph, "none", GREY)
        svg.text(left - 8, y0 + 12, f"{ymax:,.0f}", 13, "end")
        svg.text(left - 8, y0 + ph, "0", 13, "end")
        pts = [(xi, y0 + ph - ph * yi / ymax) for xi, yi in zip(x, ys)]
        if p == 0:
            svg.line(left, y0 + ph, left + (width - left - 30), y0, GREY, 1.5, dash=True)
        else:
            yslo = y0 + ph - ph * SLO_TTFT_MS / ymax
            svg.line(left, yslo, width - 30, yslo, RED, 1.5, dash=True)
        if p == 0:
            gpts = [(xi, y0 + ph - ph * yi / ymax) for xi, yi in zip(x, good)]
            svg.polyline(gpts, GREEN, 2.5)
            for px, py in gpts:
                svg.circle(px, py, 4, GREEN)
        svg.polyline(pts, colour, 2.5)
        for px, py in pts:
            svg.circle(px, py, 4, colour)
        for xi, (r, _) in zip(x, rows):
            svg.text(xi, y0 + ph + 18, str(r), 13, "middle")
    svg.text(
        left + (width - left - 30) / 2,
        top + 2 * (ph + gap) + 2,
        "offered load, requests/s (Poisson)",
        15,
        "middle",
        INK,
    )
    svg.write(path)


def main() -> None:
    print(
        f"toy server: step = {STEP_FIXED_S * 1e3:g} ms + {STEP_PER_TOKEN_S * 1e6:g} us x tokens (assumed);"
        f" budget 2048, max_num_seqs 128"
    )
    print(
        f"workload: {NUM_REQUESTS} requests, {PROMPT} prompt + {OUTPUT} output tokens, Poisson arrivals, seed 0"
    )
    print(f"goodput target: TTFT <= {SLO_TTFT_MS:g} ms and TPOT <= {SLO_TPOT_MS:g} ms\n")
    print(" rate  req/s   tok/s  goodput  TTFT p50/p99 ms   ITL p50/p99 ms   L (time avg)  rate x E2EL")
    rows = []
    for rate in RATES:
        reqs, area, _ = simulate(arrivals(rate, NUM_REQUESTS))
        m = metrics(reqs)
        rows.append((rate, m))
        little = m["req_s"] * m["e2el_mean"]
        print(
            f"{rate:5} {m['req_s']:6.1f} {m['tok_s']:7.0f} {m['goodput']:8.1f} {m['ttft'][0]:8.0f} /"
            f"{m['ttft'][1]:6.0f} {m['itl'][0]:9.1f} /{m['itl'][1]:5.1f} {area / m['dur']:13.1f} {little:12.1f}"
        )
    print(
        "\nthe token budget at 10 req/s (chunked prefill: a 256-token prompt takes ceil(256 / budget) steps)"
    )
    print(" budget  req/s  goodput  TTFT p50/p99 ms   ITL p50/p99 ms   longest step (tokens)")
    for budget in BUDGETS:
        reqs, _, longest = simulate(arrivals(10, NUM_REQUESTS), budget=budget)
        b = metrics(reqs)
        print(
            f"{budget:7} {b['req_s']:6.1f} {b['goodput']:8.1f} {b['ttft'][0]:8.0f} /{b['ttft'][1]:6.0f}"
            f" {b['itl'][0]:9.1f} /{b['itl'][1]:5.1f} {longest:14}"
        )
    rate, m = rows[2]
    reqs, _, _ = simulate(arrivals(rate, NUM_REQUESTS))
    ttft, itl, goodput = vllm_scores(reqs, m["dur"])
    print(f"\nrate {rate} scored by vLLM's calculate_metrics on the same records:")
    print(
        f"  TTFT p50/p99 {ttft[0][1]:.0f}/{ttft[1][1]:.0f} ms, ITL p50/p99 {itl[0][1]:.1f}/{itl[1][1]:.1f} ms,"
        f" goodput {goodput:.1f} req/s"
    )
    same = (
        np.allclose([v for _, v in ttft], m["ttft"])
        and np.allclose([v for _, v in itl], m["itl"])
        and np.isclose(goodput, m["goodput"])
    )
    print(f"  equal to ours: {same}")
    draw(rows, Path(__file__).with_name("load_sweep.svg"))
    print("wrote load_sweep.svg")


if __name__ == "__main__":
    main()
