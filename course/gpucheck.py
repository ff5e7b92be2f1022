"""``make gpu-check``: run the GPU half of the course on a rented GPU and record it, one file per device.

On a CUDA machine set up by ``make gpu`` (SETUP.md §5), ``python -m course gpu-check``:

1. runs ``pytest -m gpu`` (the full-size kernel tests);
2. runs every lab's ``bench.py`` and ``run.py`` with no arguments, as ``python <path>`` from the
   repository root, each under a time limit;
3. writes ``results/gpu/<device>.json`` (for example ``results/gpu/nvidia-h100-80gb-hbm3.json``):
   the device, driver, CUDA, torch and vllm versions, the date, the course commit, the pytest
   summary, and each command's exit status, seconds and stdout.

Commit that file. ``course outputs`` then shows each successful run in place of the prediction
in every block that names it (``<!-- output: ... --predict | gpu: python .../bench.py -->``),
headed "measured on <device>". A file that says ``"sample": true`` is a fixture for the tests
and is refused under ``results/gpu/``: nothing shown to a reader as measured was made up.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

from course import ROOT
from course.discover import PHASE_RE, rel

RESULTS_DIR = Path("results") / "gpu"
SCHEMA = 1
RUN_NAMES = ("bench.py", "run.py")
REQUIRED = ("schema", "device", "driver", "cuda", "torch", "vllm", "date", "runs")


class ResultsError(ValueError):
    """A results file that cannot be trusted or read."""


def device_slug(device: str) -> str:
    """``NVIDIA H100 80GB HBM3`` -> ``nvidia-h100-80gb-hbm3`` (the file name under results/gpu/)."""
    slug = re.sub(r"[^a-z0-9]+", "-", device.lower()).strip("-")
    if not slug:
        raise ResultsError(f"device name {device!r} gives an empty file name")
    return slug


def validate(data: object, where: str) -> dict:
    """The checks every results file passes before a reader sees a number from it."""
    if not isinstance(data, dict):
        raise ResultsError(f"{where}: expected a JSON object")
    missing = [k for k in REQUIRED if k not in data]
    if missing:
        raise ResultsError(f"{where}: missing {', '.join(missing)}")
    if data["schema"] != SCHEMA:
        raise ResultsError(f"{where}: schema {data['schema']!r}, this course reads schema {SCHEMA}")
    runs = data["runs"]
    if not isinstance(runs, dict) or not all(
        isinstance(r, dict) and isinstance(r.get("rc"), int) and isinstance(r.get("stdout"), list)
        for r in runs.values()
    ):
        raise ResultsError(f"{where}: runs must map each command to {{rc, seconds, stdout: [lines]}}")
    return data


def load_results(folder: Path, allow_sample: bool = False) -> list[tuple[Path, dict]]:
    """Every ``*.json`` in ``folder``, validated, sorted by file name (no folder: none)."""
    if not folder.is_dir():
        return []
    found = []
    for path in sorted(folder.glob("*.json")):
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as exc:
            raise ResultsError(f"{path}: not readable JSON ({exc})") from None
        validate(data, str(path))
        if data.get("sample") and not allow_sample:
            raise ResultsError(f"{path}: a sample file (\"sample\": true) is not a measurement; remove it")
        found.append((path, data))
    return found


def header(data: dict, source: str) -> str:
    label = "SAMPLE, not a measurement: " if data.get("sample") else ""
    return (
        f"{label}measured on {data['device']} (driver {data['driver']}, CUDA {data['cuda']}, "
        f"torch {data['torch']}, vllm {data['vllm']}; {data['date']}; {source})"
    )


def measured_outputs(root: Path, folder: Path | None = None, allow_sample: bool = False) -> dict[str, list[str]]:
    """``command -> block lines`` for every command a results file ran successfully.

    A command measured on several devices gets one section per device (file-name order), each
    headed by :func:`header`, separated by a blank line.
    """
    folder = root / RESULTS_DIR if folder is None else folder
    shown: dict[str, list[str]] = {}
    for path, data in load_results(folder, allow_sample):
        for command, run in sorted(data["runs"].items()):
            if run["rc"] != 0:
                continue
            lines = shown.setdefault(command, [])
            if lines:
                lines.append("")
            lines.append(header(data, rel(path, root)))
            lines.extend(str(line).rstrip() for line in run["stdout"])
    return shown


# -- the runner (only on a GPU box) ---------------------------------------------------------------


def gpu_commands(root: Path) -> list[str]:
    """``python <path>`` for every lab's bench.py and run.py, in phase and lab order."""
    found = []
    for phase in sorted(p for p in root.iterdir() if p.is_dir() and PHASE_RE.match(p.name)):
        labs = phase / "labs"
        if labs.is_dir():
            for name in RUN_NAMES:
                found.extend(f"python {rel(p, root)}" for p in sorted(labs.glob(f"lab-*/{name}")))
    return sorted(found)


def _run(argv: list[str], root: Path, timeout: int) -> tuple[int, float, list[str]]:
    env = dict(os.environ, PYTHONHASHSEED="0", MPLBACKEND="Agg")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(root), env.get("PYTHONPATH", "")) if p)
    env.pop("TRITON_INTERPRET", None)
    env.pop("LAB_IMPL", None)
    start = time.monotonic()
    try:
        proc = subprocess.run(argv, cwd=root, env=env, capture_output=True, text=True, timeout=timeout, check=False)
        rc, out = proc.returncode, proc.stdout + (proc.stderr[-4000:] if proc.returncode else "")
    except subprocess.TimeoutExpired as exc:
        rc, out = 124, (exc.stdout or "") if isinstance(exc.stdout, str) else ""
    return rc, round(time.monotonic() - start, 1), [line.rstrip() for line in out.splitlines()]


def _versions() -> dict[str, str]:
    import torch

    if not torch.cuda.is_available():
        raise ResultsError("no CUDA device visible to torch: gpu-check records GPU runs only (SETUP.md §5)")
    try:
        import vllm

        vllm_version = vllm.__version__
    except Exception as exc:  # noqa: BLE001 - recorded, not fatal: the kernel labs need no vllm
        vllm_version = f"not importable ({type(exc).__name__})"
    try:
        driver = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True, text=True, check=True, timeout=30,
        ).stdout.splitlines()[0].strip()
    except (OSError, subprocess.SubprocessError, IndexError):
        driver = "unknown"
    return {
        "device": torch.cuda.get_device_name(0),
        "driver": driver,
        "cuda": str(torch.version.cuda),
        "torch": torch.__version__,
        "vllm": vllm_version,
    }


def _commit(root: Path) -> str:
    try:
        return subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def record(root: Path, out_dir: Path, timeout: int, only: list[str] | None = None) -> Path:
    """Run the GPU half and write the device's results file; returns its path."""
    data: dict = {"schema": SCHEMA, **_versions()}
    data["date"] = _dt.date.today().isoformat()
    data["commit"] = _commit(root)
    print(f"gpu-check on {data['device']} (driver {data['driver']}, CUDA {data['cuda']}, torch {data['torch']})")
    rc, seconds, lines = _run([sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-p", "no:cacheprovider"], root, 3600)
    summary = next((line for line in reversed(lines) if " in " in line and ("passed" in line or "failed" in line)), "")
    data["pytest_gpu"] = {"rc": rc, "seconds": seconds, "summary": summary.strip("= ")}
    print(f"  pytest -m gpu: rc {rc}, {summary.strip('= ') or 'no summary line'}")
    data["runs"] = {}
    for command in gpu_commands(root):
        if only and not any(o in command for o in only):
            continue
        rc, seconds, lines = _run([sys.executable, *command.split()[1:]], root, timeout)
        data["runs"][command] = {"rc": rc, "seconds": seconds, "stdout": lines}
        print(f"  {'ok ' if rc == 0 else 'FAIL'} {command} ({seconds:.0f}s, rc {rc})")
    validate(data, "the new results")
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{device_slug(data['device'])}.json"
    path.write_text(json.dumps(data, indent=1, sort_keys=True, ensure_ascii=False) + "\n", encoding="utf-8")
    return path


def pinned_torch(vllm_requires: list[str]) -> str | None:
    """The ``torch==X`` that vllm's metadata pins (``None`` if it pins none)."""
    for req in vllm_requires:
        name, sep, rest = req.partition("==")
        if sep and name.strip().lower() == "torch":
            return rest.split(";")[0].strip()
    return None


def verify_install() -> int:
    """After ``make gpu``: vllm is 0.22.1 and torch is the version vllm pins (not the CPU course's)."""
    from importlib.metadata import PackageNotFoundError, requires, version

    try:
        vllm_version, torch_version = version("vllm"), version("torch")
    except PackageNotFoundError as exc:
        print(f"error: {exc.name} is not installed; run `make gpu` (SETUP.md §5)", file=sys.stderr)
        return 2
    want = pinned_torch(requires("vllm") or [])
    have = torch_version.split("+")[0]
    if vllm_version != "0.22.1" or (want and have != want):
        print(f"error: vllm {vllm_version} with torch {torch_version}; the course needs vllm 0.22.1 with the "
              f"torch it pins ({want}). Something replaced it: reinstall with `make gpu`.", file=sys.stderr)
        return 1
    import torch

    cuda = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no CUDA device visible"
    print(f"vllm {vllm_version}, torch {torch_version} (the version vllm pins), CUDA {torch.version.cuda}: {cuda}")
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "gpu-check",
        help="on a GPU box: pytest -m gpu, every bench.py and run.py, results in results/gpu/<device>.json",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--out", type=Path, default=None, help=f"results folder (default: {RESULTS_DIR})")
    p.add_argument("--timeout", type=int, default=900, help="seconds per bench.py / run.py (default: 900)")
    p.add_argument("--only", nargs="*", metavar="TEXT", help="run only the commands containing TEXT")
    p.add_argument("--verify-install", action="store_true",
                   help="only check that vllm is 0.22.1 and torch is the version it pins (make gpu runs this)")
    p.add_argument("--root", type=Path, default=ROOT, help=argparse.SUPPRESS)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.verify_install:
        return verify_install()
    out_dir = args.out or args.root / RESULTS_DIR
    try:
        path = record(args.root, out_dir, args.timeout, args.only)
    except ResultsError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    data = json.loads(path.read_text(encoding="utf-8"))
    failed = [c for c, r in data["runs"].items() if r["rc"] != 0]
    print(f"wrote {rel(path, args.root)}: {len(data['runs']) - len(failed)} run(s) ok, {len(failed)} failed; "
          f"pytest -m gpu rc {data['pytest_gpu']['rc']}")
    print("commit it, then `make outputs` shows these runs as 'measured on <device>' blocks")
    return 1 if failed or data["pytest_gpu"]["rc"] not in (0, 5) else 0
