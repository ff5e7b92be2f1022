"""The lab checker catches a starter that passes and a mutant that survives, and accepts a good lab."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from course import check_labs, patches
from course.discover import find_phases
from course.fakelab import MUTANT_SAME, MUTANT_WRONG, SOLUTION, make_lab
from course.labrun import CaseResult, LabRun, run_lab
from course.zygote import preload_for


@pytest.fixture(scope="module")
def verdicts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, check_labs.LabVerdict]:
    """Two real labs, seven real pytest runs: one good lab, one with two independent defects."""
    root = tmp_path_factory.mktemp("course")
    make_lab(root, name="lab-01-good")
    make_lab(
        root,
        name="lab-02-defective",
        lazy_test=True,
        mutants={"subtracts": MUTANT_WRONG, "commutes": MUTANT_SAME},
    )
    labs = [lab for phase in find_phases(root) for lab in phase.labs]
    return {v.lab.name: v for v in check_labs.check(labs, root, jobs=2)}


def test_accepts_a_good_lab(verdicts):
    v = verdicts["lab-01-good"]
    assert v.ok, v.problems
    assert len(v.solution.passed) == 2 and len(v.starter.failed) == 2 and v.mutants[0].failed


def test_catches_a_starter_that_passes_and_names_the_test(verdicts):
    v = verdicts["lab-02-defective"]
    assert not v.ok
    starter_problems = [p for p in v.problems if p.startswith("starter")]
    assert starter_problems == [
        "starter passes (these tests do not exercise learner code): test_constant_that_never_calls_the_lab"
    ], v.problems


def test_catches_a_surviving_mutant_and_names_it(verdicts):
    v = verdicts["lab-02-defective"]
    assert [p for p in v.problems if "mutant" in p] == [
        "mutant commutes survives: every test passes on it"
    ]


def test_a_lab_without_mutants_fails(tmp_path: Path):
    lab = make_lab(tmp_path, mutants={})
    [phase] = find_phases(tmp_path)
    passed = [CaseResult("test_a", "passed")]
    failed = [CaseResult("test_a", "failed")]
    v = check_labs.judge(phase.labs[0], LabRun("solution", 0, passed), LabRun("starter", 1, failed), [])
    assert not v.ok and "no mutants/" in v.problems[0], f"{lab} has no mutants and must be reported"


def test_gpu_skips_are_ignored_but_a_solution_that_runs_nothing_fails(tmp_path: Path):
    make_lab(tmp_path)
    lab = find_phases(tmp_path)[0].labs[0]
    gpu_skip = CaseResult("test_gpu", "skipped", "gpu: no CUDA device here")
    ok_solution = LabRun("solution", 0, [CaseResult("test_a", "passed"), gpu_skip])
    starter = LabRun("starter", 1, [CaseResult("test_a", "failed"), gpu_skip])
    mutant = LabRun("mutant m", 1, [CaseResult("test_a", "failed"), gpu_skip])
    assert check_labs.judge(lab, ok_solution, starter, [mutant]).ok
    only_skips = LabRun("solution", 0, [gpu_skip])
    assert "no test ran" in check_labs.judge(lab, only_skips, starter, [mutant]).problems[0]


def test_cli_exit_code_reflects_failures(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    make_lab(tmp_path)
    monkeypatch.setattr(
        check_labs,
        "check",
        lambda labs, root, jobs, all_labs=None: [
            check_labs.LabVerdict(lab, LabRun("solution", 0), LabRun("starter", 1), [], ["boom"])
            for lab in labs
        ],
    )
    args = argparse.Namespace(phases=[], jobs=1, root=tmp_path)
    assert check_labs.run(args) == 1
    args.phases = ["42"]
    assert check_labs.run(args) == 2


def test_forked_and_plain_runs_agree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    lab = make_lab(tmp_path, lazy_test=True)
    forked = run_lab(lab, tmp_path, "starter", impl="starter")
    monkeypatch.setenv("COURSE_ZYGOTE", "0")
    plain = run_lab(lab, tmp_path, "starter", impl="starter")
    assert sorted((t.name, t.outcome) for t in forked.tests) == sorted(
        (t.name, t.outcome) for t in plain.tests
    )
    assert (forked.returncode, len(forked.failed), len(forked.passed)) == (1, 2, 1)


def test_heavy_imports_are_found_for_preloading(tmp_path: Path):
    (tmp_path / "solution.py").write_text(
        "import numpy as np\nimport torch\nfrom vllm.v1.core.block_pool import BlockPool\n"
    )
    (tmp_path / "test_lab.py").write_text(
        "import triton.language as tl\nfrom course.runtime import lab_module\n"
    )
    assert preload_for(tmp_path) == ["torch", "vllm.v1.core.block_pool", "triton.language"]


def test_a_stale_delta_fails_check_labs_naming_the_lab_and_the_mutant(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    lab = make_lab(tmp_path, mutants={"subtracts": MUTANT_WRONG})
    # The solution is edited under the mutant: the line its delta removes is gone.
    (lab / "solution.py").write_text(SOLUTION.replace("return a + b", "return sum((a, b))"), encoding="utf-8")
    args = argparse.Namespace(phases=["00"], jobs=1, root=tmp_path)
    assert check_labs.run(args) == 1
    out = capsys.readouterr().out
    assert "FAIL phase-00-fake/labs/lab-01-add" in out
    assert "mutant subtracts of phase-00-fake/labs/lab-01-add no longer applies to solution.py" in out
    assert "expected 'return a + b', found 'return sum((a, b))'" in out


def test_a_delta_that_moved_still_applies(tmp_path: Path):
    lab = make_lab(tmp_path)
    (lab / "solution.py").write_text("# a new first line\n" + SOLUTION, encoding="utf-8")
    [mutant] = find_phases(tmp_path)[0].labs[0].mutants
    path = check_labs.materialize(find_phases(tmp_path)[0].labs[0], mutant, tmp_path / "out")
    assert "return a - b" in path.read_text() and path.read_text().startswith("# a new first line")


def test_mini_vllm_mutants_run_against_a_patched_copy(tmp_path: Path):
    pkg = tmp_path / "mini_vllm"
    (pkg / "mutants").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "calc.py").write_text(SOLUTION)
    (pkg / "test_calc.py").write_text("from mini_vllm.calc import add\n\n\ndef test_add():\n    assert add(2, 3) == 5\n")
    caught = patches.write_diff("Subtracts.", {"mini_vllm/calc.py": (SOLUTION, MUTANT_WRONG)})
    survives = patches.write_diff("Commutes.", {"mini_vllm/calc.py": (SOLUTION, MUTANT_SAME)})
    (pkg / "mutants" / "subtracts.diff").write_text(caught)
    (pkg / "mutants" / "commutes.diff").write_text(survives)
    (pkg / "mutants" / "stale.diff").write_text(caught.replace("return a + b", "return a * b"))
    problems = check_labs.check_mini(tmp_path, jobs=1)
    assert len(problems) == 2, problems
    assert problems[0].startswith("mini_vllm mutant stale no longer applies"), problems
    assert problems[1] == "mini_vllm mutant commutes survives: every test in mini_vllm passes on it"
    assert (pkg / "calc.py").read_text() == SOLUTION, "the real package is never patched"
    assert check_labs.check_mini(tmp_path, jobs=1, names=["subtracts"]) == [], "only the named mutant runs"
    assert check_labs.check_mini(tmp_path, jobs=1, names=["commutes", "nope"]) == [
        "no such mini_vllm mutant: nope (in mini_vllm/mutants/)"
    ]


def test_a_mutant_that_does_not_compile_is_refused_not_counted_as_caught(tmp_path: Path):
    # a lazily loading test would "fail" on it, which proves nothing about the tests' teeth
    make_lab(tmp_path, lazy_test=True, mutants={"typo": MUTANT_WRONG.replace("return a - b", "return a - (b")})
    [lab] = find_phases(tmp_path)[0].labs
    [mutant] = lab.mutants
    with pytest.raises(patches.StaleMutant, match=r"typo: solution.py does not compile \(line \d+"):
        check_labs.materialize(lab, mutant, tmp_path / "out")
