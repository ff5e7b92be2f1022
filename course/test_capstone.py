"""The Phase 19 front ends: ``course capstone check`` and ``course interview`` (non-interactive)."""

import io
import json

import pytest

from course import ROOT
from course.cli import main

PLAN = ROOT / "phase-19-capstone" / "labs" / "lab-01-find-and-scope-a-pr" / "PLAN.md"


@pytest.mark.upstream
def test_check_passes_the_worked_plan(capsys):
    assert main(["capstone", "check", str(PLAN)]) == 0, capsys.readouterr().out
    assert "ready to post" in capsys.readouterr().out


def test_check_names_each_problem(tmp_path, capsys):
    bad = tmp_path / "PLAN.md"
    text = PLAN.read_text(encoding="utf-8").replace("0decac0d96c42b49572498019f0a0e3600f50398", "0decac0")
    bad.write_text(text.replace("Blast radius: LoRA", "Blast radius: kernels"), encoding="utf-8")
    assert main(["capstone", "check", str(bad), "--upstream", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    for code in ("bad-commit", "bad-blast-radius", "bad-citation"):
        assert f"  {code}:" in out, f"{code} missing from the report:\n{out}"
    assert main(["capstone", "check", str(tmp_path / "nope.md")]) == 2


def test_interview_from_a_file_is_deterministic(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("sys.stdin", io.StringIO(""))  # scripted runs must not read stdin
    answers = tmp_path / "answers.json"
    answers.write_text(json.dumps([{"answer": "a", "score": i % 4, "peek": i == 2} for i in range(8)]))
    reports = []
    for out in ("one", "two"):
        argv = [
            "interview",
            "--seed",
            "4",
            "--level",
            "fundamentals",
            "--answers",
            str(answers),
            "--out",
            str(tmp_path / out),
        ]
        assert main(argv) == 0, capsys.readouterr().err
        reports.append((tmp_path / out / "report.md").read_text(encoding="utf-8"))
        assert (tmp_path / out / "matrix.png").read_bytes()[:4] == b"\x89PNG"
    assert reports[0] == reports[1], "the same seed and answers must give the same report"
    assert "| Memory management | 02 |" in reports[0] and "Design round" in reports[0]
    capsys.readouterr()


def test_interview_refuses_bad_input(tmp_path, capsys):
    answers = tmp_path / "answers.json"
    answers.write_text(json.dumps([{"score": 3}]))
    assert (
        main(["interview", "--level", "fundamentals", "--answers", str(answers), "--out", str(tmp_path)]) == 2
    )
    assert main(["interview", "--level", "guru", "--answers", str(answers), "--out", str(tmp_path)]) == 2
    answers.write_text(json.dumps([{"score": 5}] * 20))
    assert main(["interview", "--phase", "2", "--answers", str(answers), "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "1 answers for 8 questions" in err and "unknown level" in err and "score" in err, err


def test_interview_interactive_reprompts_a_bad_score(tmp_path, capsys, monkeypatch):
    lines = ["my answer", "7", "3", "n", "n"]  # answer, a bad score, a good one, no peek, no skip
    monkeypatch.setattr("sys.stdin", io.StringIO("\n".join(lines) + "\n"))
    assert main(["interview", "--phase", "19", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "'7' is not a score" in out and "model answer:" in out, out
    assert "| Open-source practice | 19 | 3 |" in (tmp_path / "report.md").read_text(encoding="utf-8")
