"""`python -m course mini-build`: stubs keep the surface, check reports per part, reset restores."""

from __future__ import annotations

import argparse
import ast
import subprocess
from pathlib import Path

import pytest

from course import ROOT, minibuild

MODULE = '''"""A module."""

import functools


def free(x: int, *, scale: int = 2) -> int:
    """Scale x."""
    # a comment that goes with the body
    y = x * scale
    return y


class Box:
    @functools.cache
    def method(
        self,
        a: int,
    ) -> int:
        """Multi-line
        docstring."""
        return a + 1

    def untouched(self) -> int:
        return 7
'''


def test_stub_keeps_signature_docstring_and_everything_else():
    out = minibuild.stub_source(
        MODULE, [("free", "mini-build 99 · a: task"), ("Box.method", "mini-build 99 · b")]
    )
    tree = ast.parse(out)
    free = tree.body[2]
    assert ast.get_docstring(free) == "Scale x." and len(free.body) == 2
    assert "def free(x: int, *, scale: int = 2) -> int:" in out
    assert "y = x * scale" not in out and "a comment that goes with the body" not in out
    assert '        """Multi-line\n        docstring."""\n        raise NotImplementedError(' in out
    assert "@functools.cache" in out and "return 7" in out, "the rest of the file stays"
    assert minibuild.is_stub(out, "free") and minibuild.is_stub(out, "Box.method")
    assert not minibuild.is_stub(out, "Box.untouched") and not minibuild.is_stub(MODULE, "free")
    namespace: dict = {}
    exec(compile(out, "m.py", "exec"), namespace)
    with pytest.raises(NotImplementedError, match="mini-build 99 · a: task"):
        namespace["free"](3)


def test_stub_refuses_a_missing_name():
    with pytest.raises(ValueError, match="Box.nothing"):
        minibuild.stub_source(MODULE, [("Box.nothing", "m")])


def test_the_table_names_real_bodies_and_tests():
    builds = minibuild.load()
    assert set(builds) == {f"{n:02d}" for n in range(14)}, "one mini-build per phase 00-13"
    for number, build in builds.items():
        if build.kind == "lab":
            assert (ROOT / build.lab / "starter.py").is_file(), build.lab
            continue
        for part in build.parts:
            assert (ROOT / part.tests[0]).is_file(), f"{number} · {part.name}: {part.tests[0]}"
        for path in build.files:
            text = (ROOT / path).read_text(encoding="utf-8")
            out = minibuild.stubbed_text(build, path, text)
            for part in build.parts:
                for target in part.stubs:
                    if target.path == path:
                        assert minibuild.is_stub(out, target.name), f"{number}: {target}"


def _git(root: Path, *args: str) -> None:
    subprocess.run(["git", *args], cwd=root, check=True, capture_output=True)


def test_start_check_reset_round_trip(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
):
    pkg = tmp_path / "mini_vllm"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "calc.py").write_text(MODULE)
    (pkg / "test_calc.py").write_text(
        "from mini_vllm.calc import Box, free\n\n\ndef test_free():\n    assert free(3) == 6\n\n\n"
        "def test_method():\n    assert Box().method(1) == 2\n"
    )
    table = tmp_path / "minibuilds.toml"
    table.write_text(
        '[[phase]]\nnumber = "42"\n'
        '[[phase.part]]\nname = "free"\nstubs = ["mini_vllm/calc.py::free"]\n'
        'tests = ["mini_vllm/test_calc.py", "-k", "free"]\ntask = "scale it"\n'
        '[[phase.part]]\nname = "method"\nstubs = ["mini_vllm/calc.py::Box.method"]\n'
        'tests = ["mini_vllm/test_calc.py::test_method"]\ntask = "add one"\n'
    )
    _git(tmp_path, "init", "-q")
    _git(tmp_path, "add", "mini_vllm")
    _git(tmp_path, "-c", "user.email=a@b", "-c", "user.name=a", "commit", "-qm", "reference")
    monkeypatch.setattr(minibuild, "TABLE", table)
    monkeypatch.setattr(minibuild.load, "__defaults__", (table,))

    def cli(action: str) -> int:
        return minibuild.run(argparse.Namespace(phase="42", action=action, force=False, root=tmp_path))

    assert cli("start") == 0
    assert minibuild.stubbed_files(tmp_path) == ["mini_vllm/calc.py"]
    assert "scale it" in capsys.readouterr().out
    assert cli("start") == 1, "a second start would overwrite the learner's work"
    assert cli("check") == 1
    out = capsys.readouterr().out
    assert "0/2 parts done" in out and "to do (1 stub(s) left)" in out
    # The learner writes one body: that part turns done, the other stays to do.
    text = (pkg / "calc.py").read_text()
    body_start = text.index("raise NotImplementedError('mini-build 42 · free")
    body_end = text.index("\n", body_start)
    (pkg / "calc.py").write_text(text[:body_start] + "return x * scale" + text[body_end:])
    assert cli("check") == 1
    out = capsys.readouterr().out
    assert "1/2 parts done" in out
    assert [row[:2] for row in minibuild.grade_rows(["42"], tmp_path)] == [["42", "1/2"]]
    assert cli("reset") == 0
    assert (pkg / "calc.py").read_text() == MODULE and not minibuild.stubbed_files(tmp_path)
    assert cli("check") == 0


def test_every_package_mini_build_page_shows_the_command():
    for number, build in minibuild.load().items():
        if build.kind != "package":
            continue
        [page] = ROOT.glob(f"phase-{number}-*/02-mini-build.md")
        text = " ".join(page.read_text(encoding="utf-8").split())
        assert f"mini-build {number} start" in text, f"{page}: show the command"


@pytest.mark.slow  # four pytest processes; check-labs runs the real contract in CI anyway
def test_check_labs_contract_catches_a_part_whose_tests_miss_its_stubs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    pkg = tmp_path / "mini_vllm"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "calc.py").write_text(MODULE)
    (pkg / "test_calc.py").write_text(
        "from mini_vllm.calc import Box, free\n\n\ndef test_free():\n    assert free(3) == 6\n\n\n"
        "def test_untouched():\n    assert Box().untouched() == 7\n"
    )
    table = tmp_path / "minibuilds.toml"
    table.write_text(
        '[[phase]]\nnumber = "42"\n'
        '[[phase.part]]\nname = "free"\nstubs = ["mini_vllm/calc.py::free"]\n'
        'tests = ["mini_vllm/test_calc.py::test_free"]\ntask = "scale it"\n'
        '[[phase.part]]\nname = "toothless"\nstubs = ["mini_vllm/calc.py::Box.method"]\n'
        'tests = ["mini_vllm/test_calc.py::test_untouched"]\ntask = "add one"\n'
    )
    monkeypatch.setattr(minibuild.load, "__defaults__", (table,))
    rows, problems = minibuild.contract_problems(["42"], tmp_path, jobs=2, quiet=True)
    assert [(r[1], r[-1]) for r in rows] == [("mini-build: free", "OK"), ("mini-build: toothless", "FAIL")]
    assert (
        len(problems) == 1 and "toothless" in problems[0] and "every test passes on the stubs" in problems[0]
    )
