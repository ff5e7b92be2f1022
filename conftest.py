"""Root pytest harness for the whole course.

* Markers: ``gpu`` (needs CUDA: skipped with a reason when absent), ``triton`` (runs on CPU
  under ``TRITON_INTERPRET=1`` when there is no GPU), ``upstream`` (drives the real vLLM 0.22.1
  Python classes, or reads the pinned ``upstream/`` tree: skipped with a reason when absent),
  ``engine`` (tier 2: the whole engine in the ``.venv-engine`` that ``make engine`` builds;
  deselected, not skipped, unless ``COURSE_ENGINE=1`` or ``-m engine`` asks for it), and ``slow``
  (multi-process groups and the real vLLM's kernels at size: deselected unless ``COURSE_SLOW=1``
  or ``-m slow``; ``make test-slow`` runs them, and CI runs them as a stage of their own).
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
import re
from pathlib import Path

import pytest

# ---------------------------------------------------------------------------------------------
# Tier 1: the real vLLM on a CPU. This must run before anything imports vllm (or triton): without
# CUDA it sets CUDA_VISIBLE_DEVICES="" and TRITON_INTERPRET=1 (vLLM's own Triton kernels load for
# real and run in the interpreter instead of becoming placeholders), puts the course's platform
# plugin on sys.path (vLLM picks CpuPlatform), and sets TORCHDYNAMO_DISABLE=1. Child processes
# inherit it through os.environ / PYTHONPATH. See course/runtime/cpu_env.py.
from course.runtime import cpu_env

HAS_CUDA = cpu_env.has_cuda()
cpu_env.apply(HAS_CUDA)
# ---------------------------------------------------------------------------------------------

from course.runtime.harness import LabImplError, current_impl  # noqa: E402 - after cpu_env.apply

ROOT = Path(__file__).resolve().parent

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


# Markers whose tests run only when asked for: deselected (not skipped) otherwise, so the default
# suite stays within its time budget and strict mode never sees them as skips.
ON_DEMAND = {
    "engine": "COURSE_ENGINE",  # tier 2: the whole engine in .venv-engine (make test-engine)
    "slow": "COURSE_SLOW",  # multi-process groups, the real vLLM's kernels at size (make test-slow)
}


SLOW_TIMEOUT_S = 300


def _wanted(config, marker: str) -> bool:
    """``marker`` tests run when its env var is set (``make test-engine`` / ``make test-slow``) or ``-m`` names it.

    When ``-m`` names the marker, pytest's own evaluation of the expression decides which tests run:
    ``-m slow`` runs only them, ``-m "not slow"`` none of them, ``-m "slow or not slow"`` everything.
    """
    return on_demand_wanted(marker, config.getoption("markexpr", "") or "", os.environ)


def on_demand_wanted(marker: str, markexpr: str, env) -> bool:
    """The rule itself (``course/pagecmds.py`` applies it to every pytest command a page prints)."""
    if env.get(ON_DEMAND[marker], "") not in ("", "0", "false", "False"):
        return True
    return marker in _marker_names(markexpr)


def _marker_names(expr: str) -> set[str]:
    """The identifiers of a ``-m`` expression, without its keywords (``and``, ``or``, ``not``)."""
    return set(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", expr)) - {"and", "or", "not"}


def _engine_wanted(config) -> bool:
    return _wanted(config, "engine")


def pytest_report_header(config):
    mode = "strict (only gpu tests may skip)" if STRICT else "relaxed"
    header = (
        f"course: LAB_IMPL={current_impl()}  CUDA={'yes' if HAS_CUDA else 'no'}  "
        f"TRITON_INTERPRET={os.environ.get('TRITON_INTERPRET', '0')}  "
        f"engine tests={'on' if _engine_wanted(config) else 'off (make test-engine)'}  "
        f"slow tests={'on' if _wanted(config, 'slow') else 'off (make test-slow)'}  mode={mode}"
    )
    return [header, *_guard_header(config), *_minibuild_lines()]


def _minibuild_lines() -> list[str]:
    """A mini-build in progress (``python -m course mini-build NN start``) says so in every run."""
    from course.minibuild import stubbed_header

    line = stubbed_header(ROOT)
    return [line] if line else []


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    for line in _minibuild_lines():
        terminalreporter.write_line(line, yellow=True)


def pytest_collection_modifyitems(config, items):
    for marker in ON_DEMAND:
        if not _wanted(config, marker):
            # Deselected, not skipped: a plain `make test` never needs the 4.6 GB engine venv, nor
            # the minutes the slow checks take on 2 cores (CI runs both as stages of their own).
            dropped = [item for item in items if item.get_closest_marker(marker)]
            if dropped:
                config.hook.pytest_deselected(items=dropped)
                items[:] = [item for item in items if not item.get_closest_marker(marker)]
    if _wanted(config, "slow"):
        for item in items:
            if item.get_closest_marker("slow") and not item.get_closest_marker("timeout"):
                # A cold vLLM import plus a process group can take a minute on 2 busy cores.
                item.add_marker(pytest.mark.timeout(SLOW_TIMEOUT_S))
    if _engine_wanted(config):
        from course.runtime import engine

        missing = engine.missing_reason()
        for item in items:
            if item.get_closest_marker("engine"):
                # An engine start-up takes 20 s to minutes on 2 busy cores: the job has its own limit.
                item.add_marker(pytest.mark.timeout(engine.TEST_TIMEOUT_S))
                if missing:
                    item.add_marker(pytest.mark.skip(reason=f"engine: {missing}"))
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
