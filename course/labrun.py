"""Run one lab's tests in a fresh pytest process and read back each test's outcome.

Used by ``check-labs`` (solution / starter / mutants) and ``grade`` (starter). Outcomes come
from pytest's ``--junitxml`` report, so no plugin is needed; every run is a separate process so
``LAB_IMPL`` and ``COURSE_LAB_FILE`` take effect at import time. The process is forked from a
pre-warmed zygote (``course.zygote``) when possible, so torch/vllm are imported once, not per run.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import threading
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from course import ROOT, zygote_client
from course.guard import TIMEOUT_TAG
from course.report import progress
from course.runtime import cpu_env
from course.zygote import preload_for

T = TypeVar("T")

# Autoloaded plugins a lab run does not need; skipping them saves about a second per run.
UNNEEDED_PLUGINS = ("xdist", "xdist.looponfail", "anyio", "hypothesispytest", "cacheprovider")
# Hangs inside a test are cut short by the harness's per-test timeout (course/guard.py, 60 s by
# default), so a looping mutant is simply a failed test. This whole-run limit is the backstop for
# what that cannot reach (a loop at import time, code stuck in C): the run then counts as failed
# with a "timed out" verdict and the check moves on. COURSE_RUN_TIMEOUT overrides it.
RUN_TIMEOUT_S = float(os.environ.get("COURSE_RUN_TIMEOUT", "") or 300)


@dataclass(frozen=True)
class CaseResult:
    """One test case: ``outcome`` is passed / failed / error / skipped."""

    name: str
    outcome: str
    message: str = ""

    @property
    def gpu_skipped(self) -> bool:
        return self.outcome == "skipped" and self.message.startswith("gpu")

    @property
    def timed_out(self) -> bool:
        return self.outcome in ("failed", "error") and TIMEOUT_TAG in self.message


@dataclass
class LabRun:
    """The outcome of running one lab's tests with one implementation."""

    label: str  # "solution", "starter", "mutant off_by_one.py"
    returncode: int
    tests: list[CaseResult] = field(default_factory=list)
    output: str = ""

    def count(self, outcome: str) -> int:
        return sum(t.outcome == outcome for t in self.tests)

    @property
    def timed_out(self) -> bool:
        """The whole run, or one of its tests, ran out of time (most likely an endless loop)."""
        return any(t.timed_out for t in self.tests)

    @property
    def collection_error(self) -> bool:
        """pytest could not even collect/import the tests (or crashed)."""
        if self.timed_out:
            return False  # a hang (even while importing) is a failed run, not an unloadable lab
        if any(t.outcome == "error" and t.name.startswith("<collect>") for t in self.tests):
            return True
        return self.returncode not in (0, 1) and not (self.returncode == 5 and not self.tests)

    @property
    def ran(self) -> list[CaseResult]:
        return [t for t in self.tests if t.outcome != "skipped"]

    @property
    def failed(self) -> list[CaseResult]:
        return [t for t in self.tests if t.outcome in ("failed", "error")]

    @property
    def passed(self) -> list[CaseResult]:
        return [t for t in self.tests if t.outcome == "passed"]

    def summary(self) -> str:
        parts = [f"{self.count('passed')} passed"]
        failed = len(self.failed)
        if failed:
            parts.append(f"{failed} failed")
        if self.count("skipped"):
            parts.append(f"{self.count('skipped')} skipped")
        if self.timed_out:
            parts.append(TIMEOUT_TAG)
        return ", ".join(parts)


def parse_junit(path: Path) -> list[CaseResult]:
    """Per-test outcomes from a pytest junit XML file."""
    results = []
    root = ET.parse(path).getroot()
    for case in root.iter("testcase"):
        name = case.get("name", "?")
        classname = case.get("classname", "")
        outcome, message = "passed", ""
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                outcome = {"failure": "failed"}.get(child.tag, child.tag)
                message = child.get("message", "") or (child.text or "")
                break
        if outcome == "error" and (not classname or "collection" in message.lower()):
            name = f"<collect> {classname or name}"
        # Skip messages look like "gpu: no CUDA device here" (from conftest) or "path:line: reason".
        if outcome == "skipped":
            message = _skip_reason(message)
        results.append(CaseResult(name=name, outcome=outcome, message=message.strip()))
    return results


def _skip_reason(message: str) -> str:
    for prefix in ("Skipped: ",):
        message = message.removeprefix(prefix)
    return message


def lab_env(
    impl: str | None = None, lab_file: Path | None = None, extra: dict[str, str] | None = None
) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("COURSE_LAB_FILE", None)
    env.pop("LAB_IMPL", None)
    if impl:
        env["LAB_IMPL"] = impl
    if lab_file:
        env["COURSE_LAB_FILE"] = str(lab_file)
    # The lab's tests import ``course.runtime``: make sure this checkout's package is the one found.
    env["PYTHONPATH"] = os.pathsep.join(x for x in (str(ROOT), env.get("PYTHONPATH", "")) if x)
    env.setdefault("PYTHONHASHSEED", "0")
    env.setdefault("MPLBACKEND", "Agg")
    # Tier-1 CPU wiring, as conftest.py applies it: the zygote imports vllm before any conftest runs.
    cpu_env.apply_env(env, cuda=None if _cuda_visible() else False)
    if extra:
        env.update(extra)
    return env


def _cuda_visible() -> bool:
    return Path("/dev/nvidiactl").exists() or Path("/proc/driver/nvidia").exists()


def run_lab(
    lab_dir: Path,
    root: Path,
    label: str,
    impl: str | None = None,
    lab_file: Path | None = None,
    timeout: float = RUN_TIMEOUT_S,
    first_failure: bool = False,
    extra_env: dict[str, str] | None = None,
    fork: bool = True,
) -> LabRun:
    """Run ``pytest <lab_dir>`` from ``root`` with the chosen implementation.

    ``first_failure`` stops at the first failing test (``-x``): enough to show a mutant is caught.
    ``fork=False`` always starts a fresh interpreter (the zygote's preloaded modules would shadow
    a patched copy of ``mini_vllm``).
    """
    env = lab_env(impl, lab_file, extra_env)
    with tempfile.TemporaryDirectory(prefix="course-junit-") as tmp:
        report = Path(tmp) / "report.xml"
        args = [str(lab_dir), "-q", "--no-header", "-rN", f"--junitxml={report}", "-o", "junit_family=xunit2"]
        for plugin in UNNEEDED_PLUGINS:
            args += ["-p", f"no:{plugin}"]
        if first_failure:
            args.append("-x")
        log = Path(tmp) / "output.log"
        try:
            code = zygote_client.run_pytest(root, env, args, log, preload_for(lab_dir), timeout) if fork else None
        except TimeoutError:
            partial = log.read_text(encoding="utf-8", errors="replace") if log.is_file() else ""
            return _timed_out(label, timeout, partial)
        if code is not None:
            output = log.read_text(encoding="utf-8", errors="replace") if log.is_file() else ""
        else:
            try:
                proc = subprocess.run(
                    [sys.executable, "-m", "pytest", *args],
                    cwd=root,
                    env=env,
                    check=False,
                    capture_output=True,
                    text=True,
                    timeout=timeout,
                )
            except subprocess.TimeoutExpired as exc:
                return _timed_out(label, timeout, exc.stdout or "")
            code, output = proc.returncode, proc.stdout + proc.stderr
        tests = parse_junit(report) if report.is_file() else []
        if code == 124 and TIMEOUT_TAG in output and not any(t.timed_out for t in tests):
            # The harness's watchdog ended a test that ignored its timeout (stuck in C code):
            # pytest died before writing its report, so record the verdict it printed.
            tests.append(CaseResult("<run timed out>", "failed", _tail_line(output)))
        return LabRun(label, code, tests, output)


def _tail_line(output: str) -> str:
    lines = [line for line in output.splitlines() if TIMEOUT_TAG in line]
    return lines[-1].strip() if lines else TIMEOUT_TAG


def _timed_out(label: str, timeout: float, partial_output: str | bytes) -> LabRun:
    """A run killed by the backstop timeout: one failed pseudo-test that says why."""
    if isinstance(partial_output, bytes):
        partial_output = partial_output.decode("utf-8", "replace")
    message = (
        f"{TIMEOUT_TAG}: the pytest run did not finish in {timeout:.0f}s and was stopped "
        f"(a loop at import time, or code stuck where the per-test timeout cannot reach)"
    )
    case = CaseResult(name="<run timed out>", outcome="failed", message=message)
    return LabRun(label, returncode=124, tests=[case], output=f"{partial_output}\n{message}".strip())


def run_many(
    tasks: Sequence[T],
    one: Callable[[T], LabRun],
    line: Callable[[T, LabRun], str],
    jobs: int,
    in_order: bool = False,
) -> list[LabRun]:
    """Run ``one(task)`` for every task on ``jobs`` threads, printing ``line(task, result)`` per run.

    Lines come as runs finish, with their time, or with ``in_order`` in the tasks' own order.
    """
    done = 0
    lock = threading.Lock()

    def timed(task: T) -> LabRun:
        nonlocal done
        start = time.monotonic()
        result = one(task)
        if not in_order:
            with lock:
                done += 1
                progress(f"  [{done}/{len(tasks)}] {line(task, result)} ({time.monotonic() - start:.1f}s)")
        return result

    results: list[LabRun] = []
    try:
        with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
            # map() yields in submission order, so in-order progress reads in task order.
            for number, (task, result) in enumerate(zip(tasks, pool.map(timed, tasks), strict=True), 1):
                results.append(result)
                if in_order:
                    progress(f"  [{number}/{len(tasks)}] {line(task, result)}")
    finally:
        zygote_client.shutdown()
    return results
