"""Root pytest harness for the whole course.

* Markers: ``gpu`` (needs CUDA: skipped with a reason when absent), ``triton`` (runs on CPU
  under ``TRITON_INTERPRET=1`` when there is no GPU), ``upstream`` (drives the real vLLM 0.22.1
  Python classes, or reads the pinned ``upstream/`` tree: skipped with a reason when absent).
* Strict mode (``COURSE_STRICT=1``, set by CI): any skip other than a ``gpu`` skip fails the run,
  so a missing dependency can never look like a pass.
* ``LAB_IMPL`` is validated once, up front, so a typo fails loudly instead of grading the wrong file.
* Hangs and crashes (``course.guard``): every test phase has a time limit (``COURSE_TEST_TIMEOUT``,
  ``@pytest.mark.timeout(s)``), and under the Triton interpreter each ``triton`` test runs in a
  forked child, so a kernel that segfaults is one failed test (``COURSE_ISOLATE_TRITON=0``: off).
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

from course.harness import LabImplError, current_impl

ROOT = Path(__file__).resolve().parent


def _cuda_available() -> bool:
    """Cheap CUDA probe that does not import torch unless a driver is visible."""
    if not (Path("/dev/nvidiactl").exists() or Path("/proc/driver/nvidia").exists()):
        return False
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


HAS_CUDA = _cuda_available()
if not HAS_CUDA:
    # Must happen before anything imports triton: kernels then run in the interpreter on CPU.
    os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("PYTHONHASHSEED", "0")
os.environ.setdefault("MPLBACKEND", "Agg")

STRICT = os.environ.get("COURSE_STRICT", "") not in ("", "0", "false", "False")


def _importable(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def pytest_configure(config):
    try:
        current_impl()
    except LabImplError as exc:
        raise pytest.UsageError(str(exc)) from None
    _register_guard(config)


# --- hangs and crashes (issue 17): per-test timeout + Triton interpreter isolation -------------
# All the logic lives in course/guard.py; this section only plugs it in.


def _register_guard(config):
    from course.guard import GuardPlugin

    if not config.pluginmanager.has_plugin("course-guard"):
        config.pluginmanager.register(GuardPlugin(config, has_cuda=HAS_CUDA), "course-guard")


def _guard_header(config) -> list[str]:
    plugin = config.pluginmanager.get_plugin("course-guard")
    return [plugin.report_header()] if plugin else []


# --- end of the hangs-and-crashes section -----------------------------------------------------


def pytest_report_header(config):
    mode = "strict (only gpu tests may skip)" if STRICT else "relaxed"
    header = (
        f"course: LAB_IMPL={current_impl()}  CUDA={'yes' if HAS_CUDA else 'no'}  "
        f"TRITON_INTERPRET={os.environ.get('TRITON_INTERPRET', '0')}  mode={mode}"
    )
    return [header, *_guard_header(config)]


def pytest_collection_modifyitems(config, items):
    has_triton = _importable("triton") and _importable("torch")
    has_vllm = _importable("vllm")
    has_tree = (ROOT / "upstream" / "vllm" / "v1" / "core" / "block_pool.py").is_file()
    for item in items:
        if item.get_closest_marker("gpu") and not HAS_CUDA:
            item.add_marker(pytest.mark.skip(reason="gpu: no CUDA device here (run on a GPU box: pytest -m gpu)"))
        if item.get_closest_marker("triton") and not has_triton:
            item.add_marker(pytest.mark.skip(reason="triton: torch/triton not installed (pip install -e '.[triton]')"))
        marker = item.get_closest_marker("upstream")
        if marker:
            needs = marker.kwargs.get("needs", "vllm")
            if needs in ("vllm", "both") and not has_vllm:
                item.add_marker(pytest.mark.skip(reason="upstream: vllm 0.22.1 not importable (make upstream-deps)"))
            if needs in ("tree", "both") and not has_tree:
                item.add_marker(pytest.mark.skip(reason="upstream: pinned tree missing (make upstream)"))


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    """Strict mode: a whole test module skipped at collection (missing extra) is a failure."""
    outcome = yield
    report = outcome.get_result()
    if STRICT and report.skipped:
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        report.outcome = "failed"
        report.longrepr = f"COURSE_STRICT=1: {collector.nodeid} was skipped at collection ({reason})"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if not STRICT or not report.skipped or hasattr(report, "wasxfail"):
        return
    if item.get_closest_marker("gpu") and not HAS_CUDA:
        return
    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    report.outcome = "failed"
    report.longrepr = (
        f"COURSE_STRICT=1: this test was skipped ({reason}); only gpu tests may skip in strict mode. "
        f"Install what it needs (see SETUP.md) instead of letting it skip."
    )
