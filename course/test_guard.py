"""The harness's guard (course/guard.py): an endless loop fails within the timeout with a message
naming the likely cause; a Triton test whose process crashes is one failed test and the session
goes on; check-labs turns a hanging mutant into a caught one with a "timed out" verdict."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from course import ROOT, check_labs, labrun
from course.discover import find_phases
from course.fakelab import SOLUTION, make_lab
from course.guard import TIMEOUT_TAG, TestTimeout, time_limit, trim_stack
from course.labrun import CaseResult, LabRun, run_lab

LOOP_ADVICE = "a loop that never terminates — check your loop's exit condition"

SESSION = """
import os
import signal
import threading
import time

import pytest


def test_loops_forever():
    budget = 0
    while budget < 10:  # the update `budget += 1` was forgotten
        pass


@pytest.mark.timeout(30)
def test_may_ask_for_more_time():
    time.sleep(0.8)  # longer than COURSE_TEST_TIMEOUT, inside its own budget


@pytest.mark.triton
def test_kernel_crashes_its_process():
    print("launching the kernel")
    os.kill(os.getpid(), signal.SIGSEGV)  # what an out-of-bounds tl.load does to the interpreter


@pytest.mark.triton
def test_isolated_assertion_reaches_the_learner():
    got = 3
    assert got == 4, "the tail block must be masked"


@pytest.mark.triton
def test_kernel_after_the_crash_passes():
    assert sum(range(4)) == 6


def test_plain_test_after_everything_passes():
    assert True
"""


def _course_root(tmp: Path) -> Path:
    """A scratch root that runs under the course's own conftest.py and pytest config."""
    shutil.copy(ROOT / "conftest.py", tmp / "conftest.py")
    shutil.copy(ROOT / "pyproject.toml", tmp / "pyproject.toml")
    return tmp


@pytest.fixture(scope="module")
def session(tmp_path_factory: pytest.TempPathFactory):
    """One real pytest session over SESSION, under the interpreter with a 0.5 s timeout."""
    root = _course_root(tmp_path_factory.mktemp("guarded"))
    (root / "test_session.py").write_text(SESSION, encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COURSE_TEST_TIMEOUT": "0.5", "TRITON_INTERPRET": "1"}
    env["CUDA_VISIBLE_DEVICES"] = ""  # isolation is for the interpreter: hide a GPU if this box has one
    for key in ("COURSE_ISOLATE_TRITON", "LAB_IMPL", "COURSE_LAB_FILE", "COURSE_STRICT"):
        env.pop(key, None)
    start = time.monotonic()
    no_plugins = [arg for name in labrun.UNNEEDED_PLUGINS for arg in ("-p", f"no:{name}")]
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            *no_plugins,
            "--junitxml=out.xml",
            "-o",
            "junit_family=xunit2",
            "test_session.py",
        ],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    elapsed = time.monotonic() - start
    cases = {}
    for case in ET.parse(root / "out.xml").getroot().iter("testcase"):
        failure = case.find("failure")
        cases[case.get("name")] = (
            "passed" if failure is None else "failed",
            "" if failure is None else (failure.get("message", "") + "\n" + (failure.text or "")),
            float(case.get("time", "0")),
        )
    return proc, cases, elapsed


def test_an_endless_loop_fails_within_the_timeout_and_names_the_cause(session):
    proc, cases, _ = session
    outcome, message, seconds = cases["test_loops_forever"]
    assert outcome == "failed", proc.stdout[-3000:]
    assert TIMEOUT_TAG in message and LOOP_ADVICE in message, message
    assert "while budget < 10" in message, f"the traceback must point at the loop:\n{message}"
    assert 0.5 <= seconds < 10, f"timed out after {seconds:.1f}s, expected about 0.5s"
    assert "guard: timeout 0.5s per test phase" in proc.stdout, "the header should say the limit"


def test_a_marker_gives_a_slow_test_its_own_budget(session):
    _, cases, _ = session
    assert cases["test_may_ask_for_more_time"][0] == "passed", cases["test_may_ask_for_more_time"]


def test_a_crashing_kernel_is_one_failed_test_and_the_session_goes_on(session):
    proc, cases, elapsed = session
    outcome, message, _ = cases["test_kernel_crashes_its_process"]
    assert outcome == "failed" and "SIGSEGV" in message and "tl.load" in message, message
    assert "test_session.py" in message, f"the child's stack at the crash should be shown:\n{message}"
    assert "launching the kernel" in proc.stdout, "the child's captured output must reach the report"
    assert cases["test_kernel_after_the_crash_passes"][0] == "passed"
    assert cases["test_plain_test_after_everything_passes"][0] == "passed"
    assert "3 failed, 3 passed" in proc.stdout and proc.returncode == 1, proc.stdout[-3000:]
    assert elapsed < 60


def test_an_isolated_failure_keeps_its_assertion_message(session):
    proc, cases, _ = session
    outcome, message, _ = cases["test_isolated_assertion_reaches_the_learner"]
    assert outcome == "failed" and "the tail block must be masked" in message, message
    assert "assert 3 == 4" in proc.stdout, proc.stdout[-3000:]


def test_limits_nest_and_restore_the_outer_timer():
    before, _ = signal.getitimer(signal.ITIMER_REAL)
    with pytest.raises(TestTimeout, match="loop that never terminates"), time_limit(0.2):
        while True:
            pass
    after, _ = signal.getitimer(signal.ITIMER_REAL)
    assert (after > 0) == (before > 0), "the outer test's own timeout must be re-armed"


def test_off_the_main_thread_the_timeout_still_lands():
    caught: list[BaseException] = []

    def body():
        try:
            with time_limit(0.2, hard_stop=False):
                while True:
                    pass
        except TestTimeout as exc:
            caught.append(exc)

    worker = threading.Thread(target=body, daemon=True)
    worker.start()
    worker.join(10)
    assert caught and LOOP_ADVICE in str(caught[0]), caught


def test_stack_dumps_drop_the_harness_frames():
    dump = (
        "Fatal Python error: Segmentation fault\n\nCurrent thread 0x1 (most recent call first):\n"
        '  File "/x/solution.py", line 9 in kernel\n'
        '  File "/v/site-packages/_pytest/python.py", line 1 in runtest\n'
        '  File "/r/course/guard.py", line 2 in run_isolated\n\n'
        "Extension modules: numpy (total: 1)"
    )
    assert trim_stack(dump) == (
        "Fatal Python error: Segmentation fault\n\nCurrent thread 0x1 (most recent call first):\n"
        '  File "/x/solution.py", line 9 in kernel'
    )


# ------------------------------------------------------------------------------------ check-labs

# Counts up to a + b but never advances its counter (make_lab stores it as a delta).
LOOPING_MUTANT = SOLUTION.replace(
    "    return a + b\n", "    total, i = 0, 0\n    while i < a + b:\n        total += 1\n    return total\n"
)


def test_check_labs_catches_a_looping_mutant_with_a_timed_out_verdict(tmp_path, monkeypatch):
    root = _course_root(tmp_path)
    lab = make_lab(root, mutants={"never_advances": LOOPING_MUTANT})
    [lab_entry] = find_phases(root)[0].labs
    mutated = check_labs.materialize(lab_entry, lab / "mutants" / "never_advances.diff", tmp_path / "mutants")
    monkeypatch.setenv("COURSE_TEST_TIMEOUT", "0.5")
    start = time.monotonic()
    run = run_lab(lab, root, "mutant never_advances", lab_file=mutated, first_failure=True)
    assert time.monotonic() - start < 60
    assert run.timed_out and not run.collection_error, run.output[-2000:]
    assert TIMEOUT_TAG in run.summary(), run.summary()
    ok = LabRun("solution", 0, [CaseResult("test_adds_small_numbers", "passed")])
    starter = LabRun("starter", 1, [CaseResult("test_adds_small_numbers", "failed")])
    assert check_labs.judge(lab_entry, ok, starter, [run]).ok, "a mutant that hangs is a caught mutant"


def test_a_run_that_outlives_the_backstop_is_a_failed_run_not_a_broken_lab(tmp_path, monkeypatch):
    lab = make_lab(tmp_path)

    def hang(*args, **kwargs):
        raise TimeoutError

    monkeypatch.setattr(labrun.zygote_client, "run_pytest", hang)
    run = run_lab(lab, tmp_path, "starter", impl="starter", timeout=7)
    assert run.returncode == 124 and run.timed_out and run.failed and not run.collection_error
    assert "did not finish in 7s" in run.tests[0].message and TIMEOUT_TAG in run.summary()


def test_a_crash_hint_comes_first_in_the_crash_message():
    from course.guard import crash_message

    text = crash_message(0, "", "cast the row index to int64")
    assert text.startswith("crashed: cast the row index to int64"), text
    assert "Triton interpreter" in text, "the general advice still follows the hint"
