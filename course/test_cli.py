"""The ``python -m course`` entry point and the discovery helpers every command shares."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from course import ROOT
from course.cli import build_parser, main
from course.discover import find_phases, markdown_files, select_phases
from course.fakelab import make_lab

COMMANDS = ("upstream", "citations", "check-labs", "outputs", "grade", "book")


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_has_help(command: str, capsys: pytest.CaptureFixture[str]):
    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args([command, "--help"])
    assert exc.value.code == 0
    assert f"python -m course {command}" in capsys.readouterr().out


def test_no_command_prints_help_and_exits_2(capsys: pytest.CaptureFixture[str]):
    assert main([]) == 2
    out = capsys.readouterr().out
    assert all(c in out for c in COMMANDS)


def test_module_entry_point_runs():
    result = subprocess.run(
        [sys.executable, "-m", "course", "--help"], cwd=ROOT, check=False, capture_output=True, text=True
    )
    assert result.returncode == 0 and "check-labs" in result.stdout


def test_markdown_discovery_skips_generated_and_private_folders(tmp_path: Path):
    for rel in (
        "README.md",
        "phase-00-x/00-guide.md",
        "upstream/vllm/README.md",
        "build/book/src/README.md",
        ".venv/lib/x.md",
        ".scratch/notes.md",
        "phase-00-x/labs/lab-01-y/mutants/n.md",
    ):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("# x\n")
    found = [p.relative_to(tmp_path).as_posix() for p in markdown_files(tmp_path)]
    assert found == ["README.md", "phase-00-x/00-guide.md"]


def test_phase_selection_by_number_name_or_path(tmp_path: Path):
    make_lab(tmp_path, phase="phase-00-foundations")
    make_lab(tmp_path, phase="phase-03-continuous-batching-scheduler", name="lab-01-step")
    (tmp_path / "phase-07-half-written").mkdir()  # no labs yet: tolerated
    phases = find_phases(tmp_path)
    assert [p.number for p in phases] == ["00", "03", "07"]
    assert [p.number for p in select_phases(phases, ["3"])] == ["03"]
    assert [p.number for p in select_phases(phases, ["phase-00-foundations/"])] == ["00"]
    assert phases[1].title == "Continuous Batching & Scheduler"
    with pytest.raises(ValueError, match="no phase matches"):
        select_phases(phases, ["12"])


def test_fences_follow_commonmark_so_nested_examples_stay_code():
    from course.mdscan import fenced_lines

    lines = ["text", "````markdown", "```text", "inner", "```", "````", "after", "~~~", "x", "~~~"]
    assert fenced_lines(lines) == [False, True, True, True, True, True, False, True, True, True]
