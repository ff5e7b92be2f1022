"""Lab 16.03 on a GPU box: `vllm serve` a small instruct model and run the five smoke steps against it.

Needs a CUDA GPU, `pip install vllm==0.22.1 openai` and the model (`hf download
Qwen/Qwen2.5-0.5B-Instruct`). Never run by the test suite.

    python phase-16-serving-apis-and-parsers/labs/lab-03-openai-server-smoke/run.py
    python .../run.py --model Qwen/Qwen2.5-0.5B-Instruct --port 8000
    python .../run.py --base-url http://127.0.0.1:8000 --model mini-toy   # a server you started yourself
                                                                          # (e.g. python -m mini_vllm serve)
    LAB_IMPL=starter python .../run.py                                    # YOUR starter.py's steps

It starts `vllm serve MODEL --enable-auto-tool-choice --tool-call-parser hermes` on 127.0.0.1, waits
for /health (bounded), runs `smoke()`, prints every finding, then shows the server log lines about
the abandoned request (vLLM logs the abort), and stops the server.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent


def wait_healthy(base_url: str, proc: subprocess.Popen | None, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            urllib.request.urlopen(base_url + "/health", timeout=2).read()
            return
        except OSError:
            if proc is not None and proc.poll() is not None:
                raise SystemExit(f"vllm serve exited with {proc.returncode}; see its log above") from None
            if time.monotonic() > deadline:
                raise SystemExit(f"no /health from {base_url} after {timeout_s:.0f} s") from None
            time.sleep(1)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="Qwen/Qwen2.5-0.5B-Instruct")
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--base-url", default=None, help="use a running server instead of starting vllm serve")
    ap.add_argument("--startup-timeout", type=float, default=600)
    args = ap.parse_args()
    from course.runtime.bench import this_lab

    lab = this_lab(__file__)  # solution.py, or starter.py with LAB_IMPL=starter
    proc, log = None, None
    base_url = args.base_url
    if base_url is None:
        base_url = f"http://127.0.0.1:{args.port}"
        log = open(HERE / "vllm_serve.log", "w")  # noqa: SIM115
        cmd = ["vllm", "serve", args.model, "--host", "127.0.0.1", "--port", str(args.port),
               "--enable-auto-tool-choice", "--tool-call-parser", "hermes", "--max-model-len", "4096"]
        print("$", " ".join(cmd))
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_healthy(base_url, proc, args.startup_timeout)
        out = lab.smoke(base_url, args.model)
        print("1. deltas:", out["deltas"])
        print("   joined == non-streamed:", "".join(d or "" for d in out["deltas"]) == out["whole"])
        print("2. forced tool call:", out["tool_call"])
        print("3. oversized max_tokens:", out["too_long"]["status"], out["too_long"]["error"])
        print("4. wrong model:", out["wrong_model"]["status"], out["wrong_model"]["error"]["message"])
        print("5. hung up after", out["abandoned_after_events"], "events")
        if log is not None:
            time.sleep(2)
            log.flush()
            lines = (HERE / "vllm_serve.log").read_text().splitlines()
            print("   server log about it:", *[ln for ln in lines if "abort" in ln.lower()][-3:], sep="\n     ")
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(timeout=60)
    return 0


if __name__ == "__main__":
    sys.exit(main())
