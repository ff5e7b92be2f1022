"""The static lab rules: same public surface, declared and ordered cross-lab dependencies, no cycles."""

from __future__ import annotations

from pathlib import Path

from course import ROOT, labrules
from course.discover import find_phases
from course.fakelab import make_lab


def _labs(root: Path):
    return [lab for phase in find_phases(root) for lab in phase.labs]


def test_a_drifted_starter_is_reported(tmp_path: Path):
    make_lab(
        tmp_path, starter="def add(a, b, c=0):\n    raise NotImplementedError\n\n\ndef extra():\n    pass\n"
    )
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
        (second / "solution.py").read_text()
        + '\nfrom course.runtime import use_lab\n\nX = use_lab("phase-00/lab-01-first")\n'
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
    assert len(problems) == 1 and problems[0].startswith("mutants/old_style.py: mutants are deltas now"), (
        problems
    )


def test_a_typed_count_of_tests_or_mutants_is_flagged_and_a_description_is_not(tmp_path: Path):
    lab = make_lab(tmp_path)
    (lab / "README.md").write_text(
        "# Lab 01 — Add two numbers [CPU-OK]\n\n"
        "| File | What it is |\n|---|---|\n"
        "| `test_lab.py` | The grader (8 tests), one `gpu` test |\n"
        "| `mutants/` | eleven plausible wrong solutions the tests must catch |\n\n"
        "Thirteen tests, nineteen cases. Nine CPU tests.\n\n"
        # Not counts: a number that names something, a fact of the subject, code, generated output.
        "Lab 01 tests pass; the tier-1 tests import vllm; it calls those two and refuses wrong shapes.\n"
        "A 16-token block; the test's 300-row sweep.\n\n"
        "```text\n3 tests\n```\n\n"
        "<!-- output: python solution.py -->\n```text\n7 tests\n```\n<!-- /output -->\n",
        encoding="utf-8",
    )
    [found] = _labs(tmp_path)
    problems = labrules.readme_count_problems(found)
    phrases = [p.split("'")[1] for p in problems]
    assert phrases == [
        "8 tests",
        "one `gpu` test",
        "eleven plausible wrong",
        "Thirteen tests",
        "nineteen cases",
        "Nine CPU tests",
    ], problems
    assert problems[0].startswith("README.md:5: '8 tests'") and "describe them instead" in problems[0], (
        problems[0]
    )
    assert any("README.md:" in p for p in labrules.static_problems([found], [found])[found.path]), (
        "check-labs should report typed counts with the other static rules"
    )


def test_no_lab_readme_counts_its_tests_or_mutants():
    """Tests and mutants are added all the time: a README that counts them goes stale. Describe them."""
    problems = [
        f"{lab.path.relative_to(ROOT)}/{problem}"
        for phase in find_phases(ROOT)
        for lab in phase.labs
        for problem in labrules.readme_count_problems(lab)
    ]
    assert not problems, "typed counts in lab READMEs (describe rather than count):\n" + "\n".join(problems)
