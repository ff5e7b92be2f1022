"""A pre-warmed pytest launcher: import the heavy libraries once, then fork once per lab run.

Importing torch, triton and vllm costs about ten seconds of CPU, far more than most lab tests
take. ``check-labs`` runs every lab several times (solution, starter, each mutant), so it asks a
zygote process to import what the lab needs once and fork a fresh child per run: the child gets
the imported libraries for free and everything else (the lab's modules, pytest's session, the
environment) new, exactly as a fresh process would.

Protocol (one JSON object per line): the parent writes ``{"args", "env", "cwd", "log",
"preload"}``; the zygote answers ``{"returncode": N}`` (the child's stdout and stderr go to
``log``) or ``{"returncode": null, "error": "..."}`` when it cannot fork safely, and the parent
then falls back to a plain subprocess. The zygote only imports (it never runs tests or tensor
ops), and refuses to fork once an import has started a Python thread. POSIX only.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import sys
import threading
from pathlib import Path

# Imports worth sharing across runs: the heavy libraries, and the course engine (whose
# ``mini_vllm.testing`` helpers are how many labs reach torch and vllm). Lab files never are.
HEAVY_ROOTS = ("torch", "triton", "vllm", "transformers", "matplotlib", "scipy", "mini_vllm")


def _preload(modules: list[str]) -> None:
    for name in modules:
        if name in sys.modules:
            continue
        # A failed preload is harmless: the child imports it again and reports it properly.
        with contextlib.suppress(Exception):
            importlib.import_module(name)


def _child(request: dict) -> None:
    """In the forked child: become the requested pytest run, then exit with its status."""
    code = 3
    try:
        os.chdir(request["cwd"])
        for key in ("LAB_IMPL", "COURSE_LAB_FILE"):
            os.environ.pop(key, None)
        os.environ.update(request["env"])
        fd = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.dup2(os.open(os.devnull, os.O_RDONLY), 0)  # the pipe to the parent is not the test's stdin
        sys.path[:0] = [request["cwd"]]
        import pytest

        code = int(pytest.main(request["args"]))
    except BaseException as exc:  # noqa: BLE001 - report anything, never return into the loop
        print(f"zygote child failed: {exc!r}", file=sys.stderr)
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def serve() -> None:
    """Answer run requests on stdin until it closes."""
    # Keep the reply channel private: anything an import prints goes to stderr, not to the parent.
    replies = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    import pytest  # noqa: F401 - shared by every child

    _preload(["numpy"])
    for line in sys.stdin:
        request = json.loads(line)
        _preload(request.get("preload", []))
        if threading.active_count() > 1:
            reply: dict = {"returncode": None, "error": "an import started a Python thread; fork is unsafe"}
        else:
            pid = os.fork()
            if pid == 0:
                replies.close()
                _child(request)
            _, status = os.waitpid(pid, 0)
            reply = {"returncode": os.waitstatus_to_exitcode(status)}
        replies.write(json.dumps(reply) + "\n")


def preload_for(lab_dir: Path) -> list[str]:
    """The heavy modules a lab's Python files import (``import torch``, ``from vllm.x import y``)."""
    found: list[str] = []
    for path in sorted(lab_dir.glob("*.py")):
        for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
            words = line.split()
            if len(words) >= 2 and words[0] in ("import", "from") and words[1].split(".")[0] in HEAVY_ROOTS:
                name = words[1].rstrip(",")
                if name not in found:
                    found.append(name)
    return found


if __name__ == "__main__":
    serve()
