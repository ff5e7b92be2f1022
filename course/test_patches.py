"""Mutant deltas: written from an edited copy, applied exactly, stale ones named; the mutant CLI round-trips."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from course import mutant, patches
from course.fakelab import MUTANT_WRONG, SOLUTION, make_lab

BEFORE = "".join(f"line {i}\n" for i in range(1, 21))


def test_write_then_apply_round_trips():
    after = BEFORE.replace("line 7\n", "line seven\n").replace("line 15\n", "")
    text = patches.write_diff("Two edits.", {"f.py": (BEFORE, after)})
    delta = patches.parse(text)
    assert delta.header == "Two edits." and len(delta.files[0].hunks) == 2
    assert patches.apply(delta, lambda p: BEFORE) == {"f.py": after}


def test_a_hunk_may_move_but_never_fuzz():
    after = BEFORE.replace("line 7\n", "line seven\n")
    delta = patches.parse(patches.write_diff("One edit.", {"f.py": (BEFORE, after)}))
    moved = "new\nlines\n" + BEFORE
    assert patches.apply(delta, lambda p: moved)["f.py"] == "new\nlines\n" + after
    changed_context = BEFORE.replace("line 6\n", "line six\n")
    with pytest.raises(patches.StaleMutant, match="expected 'line 6', found 'line six'"):
        patches.apply(delta, lambda p: changed_context)


def test_a_mutant_needs_a_header_and_a_diff():
    with pytest.raises(patches.StaleMutant, match="header is empty"):
        patches.parse("--- a/solution.py\n+++ b/solution.py\n")
    with pytest.raises(patches.StaleMutant, match="no '--- a/<file>' line"):
        patches.parse("Just prose.\n")
    with pytest.raises(ValueError, match="identical"):
        patches.write_diff("Nothing changed.", {})


def test_mutant_new_save_check(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    lab = make_lab(tmp_path, mutants={})
    rel_lab = str(lab.relative_to(tmp_path))
    ns = {"root": tmp_path, "lab": rel_lab, "name": "subtracts"}
    assert mutant.cmd_new(argparse.Namespace(**ns, file=None)) == 0
    edit = tmp_path / "build" / "mutants" / rel_lab / "subtracts" / "solution.py"
    assert edit.read_text() == SOLUTION
    edit.write_text(MUTANT_WRONG)
    assert mutant.cmd_save(argparse.Namespace(**ns, why="Subtracts instead of adding.")) == 0
    saved = (lab / "mutants" / "subtracts.diff").read_text()
    assert saved.startswith("Subtracts instead of adding.\n\n--- a/solution.py\n+++ b/solution.py\n@@")
    assert mutant.cmd_check(argparse.Namespace(root=tmp_path, lab=rel_lab, names=[])) == 0
    assert "caught   subtracts" in capsys.readouterr().out


def test_mutant_new_on_a_stale_delta_starts_from_the_current_file(tmp_path: Path, capsys):
    lab = make_lab(tmp_path)
    moved_on = SOLUTION.replace("return a + b", "return sum((a, b))")
    (lab / "solution.py").write_text(moved_on)
    rel_lab = str(lab.relative_to(tmp_path))
    assert mutant.cmd_new(argparse.Namespace(root=tmp_path, lab=rel_lab, name="subtracts", file=None)) == 0
    assert "no longer applies" in capsys.readouterr().out
    edit = tmp_path / "build" / "mutants" / rel_lab / "subtracts" / "solution.py"
    assert edit.read_text() == moved_on
    edit.write_text(moved_on.replace("sum((a, b))", "a - b"))
    assert mutant.cmd_save(argparse.Namespace(root=tmp_path, lab=rel_lab, name="subtracts", why=None)) == 0
    assert (lab / "mutants" / "subtracts.diff").read_text().startswith("Fake mutant subtracts.\n\n--- a/solution.py")
