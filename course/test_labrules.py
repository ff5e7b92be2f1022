"""The static lab rules: same public surface, declared and ordered cross-lab dependencies, no cycles."""

from __future__ import annotations

from pathlib import Path

from course import labrules
from course.discover import find_phases
from course.fakelab import make_lab


def _labs(root: Path):
    return [lab for phase in find_phases(root) for lab in phase.labs]


def test_a_drifted_starter_is_reported(tmp_path: Path):
    make_lab(tmp_path, starter='def add(a, b, c=0):\n    raise NotImplementedError\n\n\ndef extra():\n    pass\n')
    problems = labrules.surface_problems(_labs(tmp_path)[0])
    assert any("starter.py add(a, b, c=0)" in p for p in problems), problems
    assert any("defines extra" in p for p in problems), problems
    copied = '"""Lab 00-02 (reference solution)."""\n\n\ndef add(a: int, b: int) -> int:\n    raise NotImplementedError\n'
    make_lab(tmp_path, name="lab-02-copied", starter=copied)
    assert labrules.surface_problems(_labs(tmp_path)[1]) == [
        "starter.py's docstring calls it the reference: say it is the starter"
    ]


def test_dependencies_must_be_declared_and_earlier(tmp_path: Path):
    first = make_lab(tmp_path, name="lab-01-first")
    second = make_lab(tmp_path, name="lab-02-second")
    (first / "lab.toml").write_text('requires = ["phase-00/lab-02-second"]\n')
    (second / "solution.py").write_text(
        (second / "solution.py").read_text() + '\nfrom course.runtime import use_lab\n\nX = use_lab("phase-00/lab-01-first")\n'
    )
    (second / "bench.py").write_text('P = HERE / "lab-01-first" / "test_lab.py"\n')
    labs = _labs(tmp_path)
    problems = labrules.static_problems(labs, labs)
    assert any("a later lab" in p for p in problems[first]), problems[first]
    assert any("lab.toml does not declare it" in p for p in problems[second]), problems[second]
    assert any("bench.py:1 builds a path to lab-01-first" in p for p in problems[second]), problems[second]
    (second / "lab.toml").write_text('requires = ["phase-00/lab-01-first"]\n')
    problems = labrules.static_problems(labs, labs)
    assert any("dependency cycle" in p for p in problems[second]), problems[second]


def test_find_cycle():
    assert labrules.find_cycle({"a": ["b"], "b": []}) is None
    assert labrules.find_cycle({"a": ["b"], "b": ["a"]}) == ["a", "b", "a"]


def test_a_whole_copy_mutant_is_flagged_not_ignored(tmp_path: Path):
    lab = make_lab(tmp_path)
    (lab / "mutants" / "old_style.py").write_text("def add(a, b):\n    return a - b\n")
    [problems] = labrules.static_problems(_labs(tmp_path), _labs(tmp_path)).values()
    assert len(problems) == 1 and problems[0].startswith("mutants/old_style.py: mutants are deltas now"), problems
