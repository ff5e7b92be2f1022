"""The grader reads the learner's progress from LAB_IMPL=starter runs and never gates by default."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from course import grade
from course.fakelab import SOLUTION, make_lab
from course.labrun import CaseResult, LabRun


def test_status_done_in_progress_not_started():
    passed, failed = CaseResult("a", "passed"), CaseResult("b", "failed")
    skipped = CaseResult("c", "skipped", "gpu: no CUDA")
    assert grade.status(LabRun("starter", 0, [passed, skipped])) == "done"
    assert grade.status(LabRun("starter", 1, [passed, failed])) == "in progress"
    assert grade.status(LabRun("starter", 1, [failed, failed])) == "not started"
    assert grade.status(LabRun("starter", 0, [skipped])) == "not started", "skips never count as progress"


def test_grade_prints_a_phase_table_and_exits_0_unless_strict(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    make_lab(tmp_path, name="lab-01-finished", starter=SOLUTION, tag="CPU-OK")
    make_lab(tmp_path, name="lab-02-untouched", tag="GPU-OPT")
    args = argparse.Namespace(phases=[], jobs=2, strict=False, root=tmp_path)
    assert grade.run(args) == 0
    out = capsys.readouterr().out
    assert "Phase 00" in out
    finished = [line for line in out.splitlines() if "lab-01-finished" in line][-1]  # the table row
    untouched = [line for line in out.splitlines() if "lab-02-untouched" in line][-1]
    assert "done" in finished and "CPU-OK" in finished
    assert "not started" in untouched and "GPU-OPT" in untouched
    assert "1/2 labs done" in out


def test_strict_fails_while_a_lab_is_unfinished(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    make_lab(tmp_path, name="lab-01-finished")
    make_lab(tmp_path, name="lab-02-untouched")
    canned = {"lab-01-finished": [CaseResult("a", "passed")], "lab-02-untouched": [CaseResult("a", "failed")]}
    monkeypatch.setattr(grade, "run_lab", lambda path, root, label, impl: LabRun(label, 0, canned[path.name]))
    args = argparse.Namespace(phases=[], jobs=1, strict=True, root=tmp_path)
    assert grade.run(args) == 1, "--strict must fail while a lab is unfinished"
    canned["lab-02-untouched"] = [CaseResult("a", "passed")]
    assert grade.run(args) == 0


def test_grade_reports_labs_in_folder_order_whatever_finishes_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
):
    import threading

    for name in ("lab-01-first", "lab-02-second", "lab-03-third"):
        make_lab(tmp_path, name=name)
    later_labs_done = threading.Event()
    finished: list[str] = []

    def run_lab(path, root, label, impl):
        if path.name == "lab-01-first":  # the first lab finishes last
            assert later_labs_done.wait(10), "the other labs should run meanwhile"
        finished.append(path.name)
        if path.name == "lab-03-third":
            later_labs_done.set()
        return LabRun(label, 0, [CaseResult("a", "passed")])

    monkeypatch.setattr(grade, "run_lab", run_lab)
    assert grade.run(argparse.Namespace(phases=[], jobs=3, strict=False, root=tmp_path)) == 0
    assert finished[-1] == "lab-01-first"
    out = capsys.readouterr()
    text = out.out + out.err
    lines = [line for line in text.splitlines() if line.strip().startswith("[")]
    assert [line.split("/")[-1].split(":")[0] for line in lines] == [
        "lab-01-first",
        "lab-02-second",
        "lab-03-third",
    ], "progress must follow the one lab order (folder numbers), not completion order"


def test_attempted_and_the_slow_tests_a_done_lab_left_out():
    failed, passed = CaseResult("b", "failed"), CaseResult("a", "passed")
    assert grade.status(LabRun("starter", 1, [failed]), edited=True) == "attempted", (
        "a starter the learner changed that passes nothing is attempted, not 'not started'"
    )
    assert grade.status(LabRun("starter", 1, [failed]), edited=False) == "not started"
    done = LabRun("starter", 0, [passed], output="1 passed, 2 deselected in 0.1s")
    assert grade.status(done) == "done (2 slow/engine test(s) not run: make test-slow)"
    assert grade.status(LabRun("starter", 0, [passed], output="1 passed in 0.1s")) == "done"


def test_grade_prints_a_summary_line_first(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    make_lab(tmp_path, name="lab-01-finished", starter=SOLUTION)
    assert grade.run(argparse.Namespace(phases=[], jobs=1, strict=False, root=tmp_path)) == 0
    out = capsys.readouterr().out
    assert out.index("Summary: 1/1 labs done") < out.index("Phase 00"), "the one-line summary comes first"
