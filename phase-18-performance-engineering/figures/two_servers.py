"""Draw two_servers.svg and print the table: mini's server and vLLM's, one benchmark, three loads.

The figures are one recorded run of ``bench_two_servers.py`` (vLLM's own benchmark client against
both servers on build/tiny-llama, one thread each), kept in two_servers.json: wall-clock numbers
from a shared 2-core machine, so a re-run on yours gives other values (re-record with
``bench_two_servers.py --rate 10 40 80 --save figures/two_servers.json``). This script only lays
them out: the table with the ratio mini / vLLM, and three stacked panels over the offered load
(throughput, p50 and p99 TTFT, p50 ITL), mini in blue and vLLM in orange.
Run: python phase-18-performance-engineering/figures/two_servers.py
"""

from __future__ import annotations

import json
from pathlib import Path

from course.svgfig import BLUE, GREY, INK, ORANGE, Svg

HERE = Path(__file__).parent
DATA = json.loads((HERE / "two_servers.json").read_text(encoding="utf-8"))
ROWS = [
    ("request_throughput", "requests/s"),
    ("median_ttft_ms", "TTFT p50 ms"),
    ("p99_ttft_ms", "TTFT p99 ms"),
    ("median_itl_ms", "ITL p50 ms"),
    ("p99_e2el_ms", "E2EL p99 ms"),
]
PANELS = [
    ("request_throughput", "requests/s served"),
    ("p99_ttft_ms", "p99 TTFT, ms"),
    ("median_itl_ms", "p50 ITL, ms"),
]


def table() -> None:
    s = DATA["setup"]
    print(f"{s['num_prompts']} prompts of {s['input_len']} tokens -> {s['output_len']}, vLLM's client, "
          f"Poisson arrivals; recorded in two_servers.json (wall clock, a shared machine)")  # fmt: skip
    print(f"{'offered':>8} {'figure':<12}{'mini':>10}{'vLLM':>10}{'mini/vLLM':>11}")
    for run in DATA["runs"]:
        for key, label in ROWS:
            a, b = run["mini"][key], run["vllm"][key]
            print(f"{run['rate']:>8g} {label:<12}{a:>10.1f}{b:>10.1f}{a / b:>11.2f}")


def draw(path: Path) -> None:
    width, left, ph, gap, top = 560, 70, 120, 62, 30
    runs = DATA["runs"]
    rates = [r["rate"] for r in runs]
    svg = Svg(
        width,
        top + len(PANELS) * (ph + gap) + 10,
        "mini's server and vLLM's, one benchmark",
        "Three stacked panels over the offered request rate: requests served per second, p99 time to first "
        "token and median inter-token latency, mini_vllm in blue and vLLM's CPU server in orange, from one "
        "recorded run of vLLM's benchmark client against both.",
    )
    xs = [left + (width - left - 30) * r / max(rates) for r in rates]
    for p, (key, title) in enumerate(PANELS):
        y0 = top + p * (ph + gap) + 20
        ymax = max(max(r["mini"][key], r["vllm"][key]) for r in runs) * 1.15
        svg.text(left, y0 - 10, title + " (blue: mini, orange: vLLM)", 14)
        svg.rect(left, y0, width - left - 30, ph, "none", GREY)
        svg.text(left - 8, y0 + 12, f"{ymax:,.0f}", 12, "end")
        svg.text(left - 8, y0 + ph, "0", 12, "end")
        for side, colour in (("mini", BLUE), ("vllm", ORANGE)):
            pts = [(x, y0 + ph - ph * r[side][key] / ymax) for x, r in zip(xs, runs)]
            svg.polyline(pts, colour, 2.5)
            for px, py in pts:
                svg.circle(px, py, 4, colour)
        for x, r in zip(xs, rates):
            svg.text(x, y0 + ph + 16, f"{r:g}", 12, "middle")
    svg.text(left + (width - left - 30) / 2, top + len(PANELS) * (ph + gap) + 2,
             "offered load, requests/s (Poisson)", 14, "middle", INK)  # fmt: skip
    svg.write(path)


def main() -> None:
    table()
    draw(HERE / "two_servers.svg")
    print("wrote two_servers.svg")


if __name__ == "__main__":
    main()
