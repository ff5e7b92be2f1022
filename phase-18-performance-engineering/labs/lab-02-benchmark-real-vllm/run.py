"""Lab 18-02 on a rented GPU: the rate sweep and the one-knob table with ``vllm serve`` + ``vllm bench serve``.

Needs a CUDA machine with the GPU install (``SETUP.md``: ``uv pip install -e ".[gpu]"``, which
brings ``vllm==0.22.1``) and network access for the first ``hf download``. Each config gets a
fresh server, a warm-up run that is thrown away, then ``--repeats`` measured runs. Every run's
per-request records (``--save-detailed``) go through *your* ``summarize`` (``LAB_IMPL=starter``
picks yours) and are checked against the numbers ``vllm bench serve`` printed itself; the table
then comes from your code. The server's own ``vllm:time_to_first_token_seconds`` is scraped
after each run to compare with the client's view.

    .venv/bin/python phase-18-performance-engineering/labs/lab-02-benchmark-real-vllm/run.py
    .venv/bin/python phase-18-performance-engineering/labs/lab-02-benchmark-real-vllm/run.py --quick
    # the same method on the CPU engine (make engine): slower, tiny random-weight model
    .venv/bin/python .../run.py --vllm .venv-engine/bin/vllm --model build/tiny-llama --quick
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[2]))
from course.runtime.bench import this_lab  # noqa: E402

lab = this_lab(__file__)  # solution.py, or starter.py with LAB_IMPL=starter

MODEL = "Qwen/Qwen2.5-0.5B-Instruct"
# One change per row against the baseline (the server's defaults at the pin).
CONFIGS = {
    "baseline": [],
    "threshold=64": ["--long-prefill-token-threshold", "64"],
    "max_num_seqs=64": ["--max-num-seqs", "64"],
    "gpu_mem_util=0.80": ["--gpu-memory-utilization", "0.80"],
}
PERCENTILES = [50, 99]


VLLM = "vllm"  # the CLI; --vllm points at another one (the CPU engine's)


def sh(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    print("+", " ".join(cmd), flush=True)
    return subprocess.run(cmd, check=True, **kw)


def wait_healthy(url: str, proc: subprocess.Popen, timeout_s: float = 900) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"vllm serve exited with {proc.returncode}; see its log")
        try:
            urllib.request.urlopen(url + "/health", timeout=2).read()
            return
        except OSError:
            time.sleep(2)
    raise SystemExit(f"vllm serve did not become healthy within {timeout_s:.0f} s")


def server_ttft(url: str) -> tuple[float, float]:
    """(sum, count) of the server's vllm:time_to_first_token_seconds histogram."""
    text = urllib.request.urlopen(url + "/metrics", timeout=10).read().decode()
    got = {}
    for line in text.splitlines():
        for part in ("_sum", "_count"):
            if line.startswith("vllm:time_to_first_token_seconds" + part):
                got[part] = got.get(part, 0.0) + float(line.rsplit(" ", 1)[1])
    return got.get("_sum", 0.0), got.get("_count", 0.0)


def bench(url: str, model: str, rate: float, num_prompts: int, out: Path, name: str) -> dict:
    cmd = [
        VLLM,
        "bench",
        "serve",
        "--backend",
        "vllm",
        "--base-url",
        url,
        "--model",
        model,
        "--dataset-name",
        "random",
        "--random-input-len",
        "512",
        "--random-output-len",
        "128",
        "--ignore-eos",
        "--num-prompts",
        str(num_prompts),
        "--request-rate",
        str(rate),
        "--seed",
        "0",
        "--percentile-metrics",
        "ttft,tpot,itl,e2el",
        "--metric-percentiles",
        ",".join(map(str, PERCENTILES)),
        "--goodput",
        "ttft:800",
        "tpot:20",
        "--save-result",
        "--save-detailed",
        "--result-dir",
        str(out),
        "--result-filename",
        name + ".json",
    ]
    sh(cmd, stdout=subprocess.DEVNULL)
    return json.loads((out / (name + ".json")).read_text())


def check_and_row(result: dict) -> dict:
    """Your summarize on the run's records, checked against what vllm bench serve reported."""
    records = lab.records_from_bench_json(result)
    s = lab.summarize(records, result["duration"], PERCENTILES, {"ttft": 800, "tpot": 20})
    for key, mine in [
        ("request_throughput", s.request_throughput),
        ("output_throughput", s.output_throughput),
        ("p99_ttft_ms", s.percentiles_ms["ttft"][99]),
        ("p99_itl_ms", s.percentiles_ms["itl"][99]),
        ("median_tpot_ms", s.median_ms["tpot"]),
        ("request_goodput", s.request_goodput),
    ]:
        theirs = result.get(key)
        if theirs is not None and abs(mine - theirs) > 1e-6 * max(1.0, abs(theirs)):
            print(f"  MISMATCH {key}: yours {mine:.6g} vs vllm bench {theirs:.6g}")
    return {
        "tput": s.output_throughput,
        "ttft": (s.percentiles_ms["ttft"][50], s.percentiles_ms["ttft"][99]),
        "itl": (s.percentiles_ms["itl"][50], s.percentiles_ms["itl"][99]),
        "goodput": s.request_goodput,
    }


def run_config(name: str, extra: list[str], args, out: Path, rates: list[float]) -> list[tuple[float, dict]]:
    url = f"http://127.0.0.1:{args.port}"
    log = open(out / f"serve-{name}.log", "w")
    proc = subprocess.Popen(
        [VLLM, "serve", args.model, "--port", str(args.port), *extra], stdout=log, stderr=log
    )
    rows = []
    try:
        wait_healthy(url, proc)
        bench(url, args.model, rates[0], 20, out, f"{name}-warmup")  # capture / compile / caches: thrown away
        for rate in rates:
            for rep in range(args.repeats):
                before = server_ttft(url)
                result = bench(url, args.model, rate, args.num_prompts, out, f"{name}-rate{rate:g}-run{rep}")
                after = server_ttft(url)
                row = check_and_row(result)
                n = after[1] - before[1]
                row["server_ttft_mean_ms"] = 1000 * (after[0] - before[0]) / n if n else float("nan")
                row["client_ttft_mean_ms"] = result.get("mean_ttft_ms", float("nan"))
                rows.append((rate, row))
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()
    return rows


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", default=MODEL)
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--num-prompts", type=int, default=200)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--quick", action="store_true", help="baseline only, 60 prompts, one run per rate")
    p.add_argument("--out", default=str(HERE / "results"))
    p.add_argument("--vllm", default="vllm", help="the vllm CLI to run (default: the one on PATH)")
    args = p.parse_args()
    global VLLM
    VLLM = args.vllm
    if shutil.which(VLLM) is None:
        raise SystemExit(
            f"no `{VLLM}`: run this on a GPU box with the GPU install (SETUP.md), or pass --vllm"
        )
    if args.quick:
        args.num_prompts, args.repeats = 60, 1
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if not Path(args.model).is_dir():  # a hub name: fetch it once (a local directory is used as is)
        sh(["hf", "download", args.model], stdout=subprocess.DEVNULL)
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")

    print("\n== rate sweep, baseline: find the knee first ==")
    sweep = run_config("baseline-sweep", [], args, out, [4, 8, 12] if not args.quick else [4, 12])
    for rate, r in sweep:
        print(
            f"  {rate:>4g} req/s  TTFT p99 {r['ttft'][1]:8.0f} ms  ITL p99 {r['itl'][1]:6.1f} ms  "
            f"goodput {r['goodput']:.2f} req/s"
        )
    if args.quick:
        return
    print("\n== one knob at a time, 8 req/s ==")
    print(
        f"  {'config':<20} {'tok/s':>7} {'TTFT p50/p99 ms':>17} {'ITL p50/p99 ms':>16} {'server-client TTFT ms':>22}"
    )
    for name, extra in CONFIGS.items():
        for _, r in run_config(name, extra, args, out, [8]):
            gap = r["client_ttft_mean_ms"] - r["server_ttft_mean_ms"]
            print(
                f"  {name:<20} {r['tput']:>7.0f} {r['ttft'][0]:>8.0f}/{r['ttft'][1]:<8.0f}"
                f" {r['itl'][0]:>7.1f}/{r['itl'][1]:<8.1f} {gap:>22.1f}"
            )
    print(f"\nraw results and server logs: {out}")


if __name__ == "__main__":
    main()
