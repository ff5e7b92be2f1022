"""`python -m course hint LAB [N]`: a lab's code-level hints, one at a time."""

from __future__ import annotations

import argparse

import pytest

from course import ROOT, hint


def test_every_hints_file_numbers_its_sections_from_one():
    for path in sorted(ROOT.glob("phase-*/labs/lab-*/HINTS.md")):
        numbers = [n for n, _, _ in hint.sections(path.read_text(encoding="utf-8"))]
        assert numbers == list(range(1, len(numbers) + 1)) and numbers, f"{path}: '## 1. title', '## 2. ...'"


def test_hint_lists_then_shows_one(capsys: pytest.CaptureFixture[str]):
    args = argparse.Namespace(lab="09-01", number=None, root=ROOT)
    assert hint.run(args) == 0
    assert "1. apply_top_k" in capsys.readouterr().out
    args.number = 2
    assert hint.run(args) == 0
    out = capsys.readouterr().out
    assert out.startswith("2. apply_top_p") and "np.argsort" in out
    args.number = 99
    assert hint.run(args) == 2
    assert hint.run(argparse.Namespace(lab="nonsense", number=None, root=ROOT)) == 2


def test_starters_point_at_their_hints_instead_of_holding_the_code():
    starter = ROOT / "phase-09-sampling-and-decoding-algorithms/labs/lab-01-sampling-ops/starter.py"
    text = starter.read_text(encoding="utf-8")
    assert "np.sort(row)[V - k]" not in text and "(cum < p).sum() + 1" not in text
    assert "course hint 09-01" in text
