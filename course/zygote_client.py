"""The parent side of ``course.zygote``: one pre-warmed launcher per worker thread.

``run_pytest`` returns the exit status of a forked pytest run, or None whenever the zygote
cannot help (not POSIX, ``COURSE_ZYGOTE=0``, it failed to start, it refused to fork); the
caller then runs a plain subprocess. A run that outlives its timeout takes the zygote (and
its child) down with it.
"""

from __future__ import annotations

import atexit
import json
import os
import select
import signal
import subprocess
import sys
import threading
from pathlib import Path

_local = threading.local()
_all: list[subprocess.Popen[str]] = []
_lock = threading.Lock()


def enabled() -> bool:
    return os.name == "posix" and hasattr(os, "fork") and os.environ.get("COURSE_ZYGOTE", "1") != "0"


def _start(root: Path, env: dict[str, str]) -> subprocess.Popen[str] | None:
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "course.zygote"],
            cwd=root,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            bufsize=1,
            start_new_session=True,
        )
    except OSError:
        return None
    with _lock:
        _all.append(proc)
    return proc


def _kill(proc: subprocess.Popen[str]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()


def run_pytest(
    root: Path, env: dict[str, str], args: list[str], log: Path, preload: list[str], timeout: float
) -> int | None:
    """Run ``pytest.main(args)`` in a forked child of this thread's zygote; None if it cannot."""
    if not enabled():
        return None
    key = (str(root), env.get("PYTHONHASHSEED"), env.get("TRITON_INTERPRET"))
    proc = getattr(_local, "proc", None)
    if proc is None or proc.poll() is not None or getattr(_local, "key", None) != key:
        if proc is not None and proc.poll() is None:
            proc.stdin.close()
        proc = _local.proc = _start(root, env)
        _local.key = key
        if proc is None:
            return None
    request = {"args": args, "env": env, "cwd": str(root), "log": str(log), "preload": preload}
    try:
        proc.stdin.write(json.dumps(request) + "\n")
        proc.stdin.flush()
        ready, _, _ = select.select([proc.stdout], [], [], timeout)
        if not ready:
            _kill(proc)
            _local.proc = None
            raise TimeoutError
        line = proc.stdout.readline()
    except (BrokenPipeError, OSError, ValueError):
        _local.proc = None
        return None
    if not line:
        _local.proc = None
        return None
    try:
        return json.loads(line).get("returncode")
    except (ValueError, AttributeError):
        _kill(proc)
        _local.proc = None
        return None


@atexit.register
def shutdown() -> None:
    """Close every zygote (they exit when their stdin closes)."""
    with _lock:
        procs, _all[:] = list(_all), []
    for proc in procs:
        if proc.poll() is None:
            try:
                proc.stdin.close()
                proc.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                _kill(proc)
