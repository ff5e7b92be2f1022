"""Lab 15-03 on a GPU box: a real prefill/decode pair behind a small proxy, against one engine.

Starts three ``vllm serve`` processes of the same model (a single engine, a producer, a consumer),
sends every prompt through the proxy (to P with ``max_tokens=1``, then P's prompt + first token to
D, which loads P's KV from shared storage) and to the single engine, and prints whether the tokens
agree and the TTFT / ITL each path saw. Needs the ``gpu`` install route (SETUP.md) and a GPU; with
one GPU each server takes a third of its memory. ``--dry-run`` prints the commands and exits.

    .venv/bin/python phase-15-disaggregated-serving/labs/lab-03-pd-pair/run.py --dry-run
    .venv/bin/python phase-15-disaggregated-serving/labs/lab-03-pd-pair/run.py --model Qwen/Qwen2.5-0.5B-Instruct
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

PORTS = {"single": 8000, "producer": 8100, "consumer": 8200}


def serve_command(model: str, role: str, store: str, block_size: int, mem: float) -> list[str]:
    cmd = [
        "vllm",
        "serve",
        model,
        "--port",
        str(PORTS[role]),
        "--block-size",
        str(block_size),
        "--gpu-memory-utilization",
        str(mem),
        "--enforce-eager",
        "--max-model-len",
        "4096",
    ]
    if role != "single":
        config = {
            "kv_connector": "ExampleConnector",
            "kv_role": f"kv_{role}",
            "kv_connector_extra_config": {"shared_storage_path": store},
        }
        cmd += ["--kv-transfer-config", json.dumps(config)]
    return cmd


def post(port: int, body: dict, stream: bool = False) -> tuple[list[int], list[float]]:
    """Completion token ids and the arrival time of each streamed chunk (one when not streaming)."""
    body = {**body, "stream": stream, "return_token_ids": True, "temperature": 0.0}
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/completions",
        json.dumps(body).encode(),
        {"Content-Type": "application/json"},
    )
    ids, times = [], []
    with urllib.request.urlopen(req, timeout=600) as resp:
        if not stream:
            ids = json.loads(resp.read())["choices"][0]["token_ids"]
            return ids, [time.perf_counter()]
        for line in resp:
            line = line.decode().strip()
            if line.startswith("data: ") and line != "data: [DONE]":
                chunk = json.loads(line[6:])["choices"][0]
                ids += chunk.get("token_ids") or []
                times.append(time.perf_counter())
    return ids, times


def through_proxy(model: str, prompt_ids: list[int], max_tokens: int) -> tuple[list[int], list[float], float]:
    """The disaggregated path: P computes the prompt and one token; D gets prompt + that token."""
    t0 = time.perf_counter()
    first, _ = post(PORTS["producer"], {"model": model, "prompt": prompt_ids, "max_tokens": 1})
    rest, times = post(
        PORTS["consumer"],
        {"model": model, "prompt": prompt_ids + first, "max_tokens": max_tokens - 1},
        stream=True,
    )
    return first + rest, times, t0


def wait_ready(port: int, timeout: float = 900) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5)
            return
        except OSError:
            time.sleep(2)
    raise TimeoutError(f"server on port {port} did not become healthy in {timeout:.0f} s")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="Qwen/Qwen2.5-0.5B-Instruct")
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--prompt-len", type=int, default=2031)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--dry-run", action="store_true")
    args = ap.parse_args()
    store = tempfile.mkdtemp(prefix="pd_store_")
    gpus = [g for g in os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",") if g]
    mem = 0.3 if len(gpus) < 3 else 0.8
    cmds = {role: serve_command(args.model, role, store, args.block_size, mem) for role in PORTS}
    if args.dry_run:
        for role, cmd in cmds.items():
            print(f"{role:>8}: {' '.join(cmd)}")
        return 0
    procs = []
    try:
        for i, cmd in enumerate(cmds.values()):
            env = {**os.environ, "CUDA_VISIBLE_DEVICES": gpus[i % len(gpus)]}
            procs.append(subprocess.Popen(cmd, env=env, stdout=sys.stderr, stderr=sys.stderr))
        for port in PORTS.values():
            wait_ready(port)
        vocab = 1000
        agree, ttft_single, ttft_pair, itl_single, itl_pair = 0, [], [], [], []
        for k in range(args.prompts):
            prompt = [(31 * k + 7 * i) % vocab + 100 for i in range(args.prompt_len)]
            t0 = time.perf_counter()
            want, times = post(
                PORTS["single"],
                {"model": args.model, "prompt": prompt, "max_tokens": args.max_tokens},
                stream=True,
            )
            ttft_single.append(times[0] - t0)
            itl_single += [b - a for a, b in zip(times, times[1:])]
            got, times, t0 = through_proxy(args.model, prompt, args.max_tokens)
            ttft_pair.append(times[0] - t0)
            itl_pair += [b - a for a, b in zip(times, times[1:])]
            agree += got == want
        print(f"tokens identical: {agree}/{args.prompts} prompts")
        for name, ttft, itl in (("single", ttft_single, itl_single), ("pair", ttft_pair, itl_pair)):
            q = statistics.quantiles(itl, n=100) if len(itl) > 1 else [0.0] * 99
            print(
                f"{name:>6}: TTFT p50 {statistics.median(ttft) * 1e3:.1f} ms, ITL p50 {q[49] * 1e3:.2f} ms, "
                f"p99 {q[98] * 1e3:.2f} ms"
            )
        print(f"stored KV folders: {len(os.listdir(store))} (one per prompt)")
        return 0 if agree == args.prompts else 1
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(timeout=60)


if __name__ == "__main__":
    sys.exit(main())
