"""``python -m course lock``: the pinned, hashed requirement sets the course venv installs from.

One lock per supported Python (``requirements/lock/py3.11.txt``, ``py3.12.txt``), compiled by
``uv pip compile`` from the ranges in ``pyproject.toml`` (extras ``dev`` and ``upstream``) for
Linux x86_64, with every file's sha256. Two packages stay outside the lock on purpose:

* ``torch`` — ``make venv`` installs ``torch==2.13.0`` first, from wherever pip finds the CPU
  build (a local wheel, ``TORCH_INDEX``, or PyPI's CUDA build); what torch itself pins (NVIDIA
  libraries, triton on PyPI's build) is resolved here exactly as that route resolves it: for 3.11
  against the CPU wheel when a local one is found (``--find-links``), else against PyPI's.
* ``vllm`` — its metadata asks for ``torch==2.11.0``, so it cannot be resolved beside the course's
  torch; ``requirements/upstream.txt`` pins it with its hashes and it is installed ``--no-deps``.

``course/test_lock.py`` fails when a range in ``pyproject.toml`` and a lock disagree.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from pathlib import Path

from course import ROOT

PYTHONS = ("3.11", "3.12")
PLATFORM = "x86_64-manylinux_2_28"
UV_VERSION = "0.13.9"
LOCK_DIR = Path("requirements/lock")
UPSTREAM = Path("requirements/upstream.txt")
# A local folder of wheels (the CPU torch build) that some machines carry; used when present.
LOCAL_WHEELS = Path("/opt/wheels")

UPSTREAM_HEADER = """\
# vllm 0.22.1 itself, installed --no-deps by `make venv` (its metadata asks for torch==2.11.0, which
# the CPU course replaces with torch 2.13.0). What its scheduler, KV manager, parsers and kernels
# import on CPU is pinned in requirements/lock/ (pyproject.toml's `upstream` extra).
# Regenerate with `make lock`.
"""


def lock_path(python: str, root: Path = ROOT) -> Path:
    return root / LOCK_DIR / f"py{python}.txt"


def _uv() -> list[str]:
    exe = shutil.which("uv", path=str(Path(sys.executable).parent)) or shutil.which("uv")
    if exe is None:
        raise SystemExit(f"uv is not installed: `{sys.executable} -m pip install uv=={UV_VERSION}` (make lock does it)")
    return [exe]


def compile_lock(python: str, root: Path = ROOT) -> list[str]:
    cmd = [*_uv(), "pip", "compile", "pyproject.toml", "--extra", "dev", "--extra", "upstream",
           "--python-version", python, "--python-platform", PLATFORM, "--generate-hashes",
           "--no-emit-package", "torch", "--no-header", "--quiet", "-o", str(LOCK_DIR / f"py{python}.txt")]
    if LOCAL_WHEELS.is_dir() and any(LOCAL_WHEELS.glob(f"torch-*-cp{python.replace('.', '')}-*.whl")):
        cmd += ["--find-links", str(LOCAL_WHEELS)]
    return cmd


def run(args: argparse.Namespace) -> int:
    root: Path = args.root
    (root / LOCK_DIR).mkdir(parents=True, exist_ok=True)
    for python in args.python or PYTHONS:
        cmd = compile_lock(python, root)
        print("$", " ".join(cmd), flush=True)
        subprocess.run(cmd, cwd=root, check=True)
        path = lock_path(python, root)
        path.write_text(
            f"# The course's locked set for Python {python} on Linux x86_64 (`make lock`; do not edit).\n"
            f"# uv {' '.join(cmd[1:])}\n" + path.read_text()
        )
    out = subprocess.run([*_uv(), "pip", "compile", "-", "--no-deps", "--generate-hashes", "--no-header",
                          "--quiet", "--python-platform", PLATFORM, "--python-version", PYTHONS[0]],
                         input="vllm==0.22.1\n", text=True, capture_output=True, cwd=root, check=True)
    (root / UPSTREAM).write_text(UPSTREAM_HEADER + out.stdout)
    print(f"wrote {', '.join(str(LOCK_DIR / f'py{p}.txt') for p in args.python or PYTHONS)} and {UPSTREAM}")
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("lock", help="regenerate requirements/lock/ (uv pip compile) and requirements/upstream.txt",
                       description=__doc__.split("\n\n")[0])
    p.add_argument("--python", action="append", choices=PYTHONS, help="only this Python (repeatable)")
    p.add_argument("--root", type=Path, default=ROOT, help=argparse.SUPPRESS)
    p.set_defaults(func=run)
