"""Every pytest command a course page prints selects tests, and deselects none it names."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from course import ROOT, pagecmds
from course.labrun import lab_env


def test_every_pytest_command_in_the_pages_runs_what_it_says():
    proc = subprocess.run(
        [sys.executable, "-m", "course.pagecmds"],
        cwd=ROOT,
        env=lab_env(),
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    problems = [line for line in proc.stdout.splitlines() if ": `" in line]
    assert proc.returncode == 0, "pages print pytest commands that do not run what they say:\n" + "\n".join(
        problems or [proc.stdout[-2000:], proc.stderr[-2000:]]
    )
    assert len(pagecmds.find_commands(ROOT)) > 100, (
        "the page scan found almost no commands: is the regex broken?"
    )


def test_the_page_scan_parses_env_python_and_selection():
    cmd = pagecmds.parse(
        'COURSE_STRICT=1 .venv/bin/python -m pytest mini_vllm/test_x.py -q -m "slow or not slow" -k "a and b"',
        "p.md",
        1,
    )
    assert cmd is not None
    assert (cmd.env, cmd.paths, cmd.markexpr, cmd.keyword) == (
        {"COURSE_STRICT": "1"},
        ["mini_vllm/test_x.py"],
        "slow or not slow",
        "a and b",
    )
    assert pagecmds.parse("pytest phase-NN-x/labs/<lab> -q", "p.md", 1) is None, "placeholders are skipped"


def test_a_command_that_selects_nothing_or_drops_what_it_names_is_reported(tmp_path: Path):
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "test_a.py").write_text(
        "import pytest\n\n\ndef test_fast():\n    pass\n\n\n@pytest.mark.slow\ndef test_slow():\n    pass\n"
    )
    (tmp_path / "pyproject.toml").write_text('[tool.pytest.ini_options]\nmarkers = ["slow: slow"]\n')
    (tmp_path / "README.md").write_text(
        "```bash\n"
        "pytest t/test_a.py -q -k nomatch\n"
        "pytest t/test_a.py::test_slow -q\n"
        'pytest t/test_a.py -q -m "slow or not slow"\n'
        "COURSE_SLOW=1 pytest t/test_a.py::test_slow -q\n"
        "```\n"
    )
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            f"from course import pagecmds; from pathlib import Path; print(pagecmds.check(Path({str(tmp_path)!r})))",
        ],
        cwd=tmp_path,
        env=lab_env(),
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    out = proc.stdout
    assert "README.md:2: `pytest t/test_a.py -q -k nomatch` selects no test" in out, out + proc.stderr
    assert (
        "README.md:3: `pytest t/test_a.py::test_slow -q` names t/test_a.py::test_slow but deselects it" in out
    )
    assert "README.md:4" not in out and "README.md:5" not in out, "-m naming slow, or COURSE_SLOW=1, runs it"
