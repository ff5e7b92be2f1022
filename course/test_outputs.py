"""The output refresher: finds blocks, catches stale ones, rewrites them, runs each command once."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from course import outputs

SCRIPT = """import os
from pathlib import Path

counter = Path(__file__).with_name("runs.txt")
counter.write_text(counter.read_text() + "x" if counter.exists() else "x")
assert os.environ["COURSE_OUTPUTS"] == "1" and os.environ["PYTHONHASHSEED"] == "0"
print("blocks per request: 3   ")
print("speedup: 4.0x")
"""


def page(body: str, command: str = "python numbers.py") -> str:
    return (
        f"# Lab\n\nIntro.\n\n<!-- output: {command} -->\n```text\n{body}\n```\n<!-- /output -->\n\nAfter.\n"
    )


@pytest.fixture
def course(tmp_path: Path) -> Path:
    (tmp_path / "numbers.py").write_text(SCRIPT, encoding="utf-8")
    return tmp_path


def run(root: Path, check: bool) -> int:
    return outputs.run(argparse.Namespace(paths=[], check=check, jobs=2, root=root))


def test_check_catches_a_stale_block_and_changes_nothing(course: Path, capsys: pytest.CaptureFixture[str]):
    md = course / "README.md"
    md.write_text(page("blocks per request: 2\nspeedup: 4.0x"), encoding="utf-8")
    before = md.read_text()
    assert run(course, check=True) == 1
    out = capsys.readouterr().out
    assert "README.md:5: stale output of `python numbers.py`" in out
    assert "-blocks per request: 2" in out and "+blocks per request: 3" in out
    assert md.read_text() == before, "--check must not rewrite anything"


def test_refresh_rewrites_the_block_then_check_passes(course: Path):
    md = course / "README.md"
    md.write_text(page("(placeholder)"), encoding="utf-8")
    assert run(course, check=False) == 0
    assert md.read_text() == page("blocks per request: 3\nspeedup: 4.0x"), (
        "trailing spaces are stripped per line"
    )
    assert run(course, check=True) == 0


def test_each_distinct_command_runs_once(course: Path):
    (course / "a.md").write_text(page("old") + page("old"), encoding="utf-8")
    (course / "b.md").write_text(page("old"), encoding="utf-8")
    assert run(course, check=False) == 0
    assert (course / "runs.txt").read_text() == "x", "three blocks with one command should run it once"


def test_a_failing_command_is_an_error_with_its_stderr(course: Path, capsys: pytest.CaptureFixture[str]):
    (course / "boom.py").write_text("import sys\nsys.exit('kaboom: no such table')\n", encoding="utf-8")
    (course / "README.md").write_text(page("x", "python boom.py"), encoding="utf-8")
    assert run(course, check=True) == 1
    assert "kaboom: no such table" in capsys.readouterr().err


def test_a_malformed_block_is_an_error(tmp_path: Path):
    md = tmp_path / "README.md"
    md.write_text("<!-- output: python x.py -->\n```\nno text tag\n```\n<!-- /output -->\n", encoding="utf-8")
    with pytest.raises(outputs.BlockError, match="```text"):
        outputs.find_blocks(md)
    md.write_text("<!-- output: python x.py -->\n```text\nunclosed\n```\n", encoding="utf-8")
    with pytest.raises(outputs.BlockError, match="closed"):
        outputs.find_blocks(md)


def test_shell_syntax_is_refused_and_python_means_this_interpreter():
    import sys

    assert outputs.argv_for("python a.py --n 3")[0] == sys.executable
    with pytest.raises(outputs.BlockError, match="shell"):
        outputs.argv_for("python a.py | head")


def test_an_example_block_inside_a_code_fence_is_not_a_block(tmp_path: Path):
    md = tmp_path / "CONTRIBUTING.md"
    md.write_text("````markdown\n" + page("(filled in by the tool)") + "````\n", encoding="utf-8")
    assert outputs.find_blocks(md) == []
