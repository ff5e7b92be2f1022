"""Prove every lab's tests have teeth.

For each lab (``phase-NN-*/labs/lab-NN-*/`` with a ``test_lab.py``):

* the **solution** passes (and at least one test actually runs);
* the **starter** fails every test that runs (``gpu`` skips are ignored): a starter test that
  passes is a test that does not exercise the learner's code;
* every **mutant** (``mutants/*.diff``: a misconception, then a delta against ``solution.py``;
  see ``course.patches``) applies exactly and fails at least one test; a lab without mutants, and
  a mutant whose delta no longer applies, are failures;
* the **static rules** of ``course.labrules`` hold: the starter has the solution's public names and
  signatures, every cross-lab load is declared in ``lab.toml``, points at an earlier lab and
  makes no cycle, and the README describes its tests and mutants rather than counting them.

``mini_vllm/mutants/*.diff`` (paths relative to the repository root) are checked the same way when
no phase is selected (or with the selector ``mini_vllm``): each is applied to a temporary copy of
the package and ``pytest mini_vllm`` must fail on it.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from course import ROOT, labrules, minibuild, patches
from course.discover import Lab, find_phases, rel, select_phases
from course.labrun import LabRun, run_lab, run_many
from course.report import print_table, progress

MINI = "mini_vllm"


@dataclass
class LabVerdict:
    lab: Lab
    solution: LabRun | None = None
    starter: LabRun | None = None
    mutants: list[LabRun] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def judge(
    lab: Lab, solution: LabRun, starter: LabRun, mutants: list[LabRun], static: list[str] | None = None
) -> LabVerdict:
    """Apply the rules to the runs of one lab (``static``: problems found before running)."""
    v = LabVerdict(lab, solution, starter, mutants, list(static or []))
    if solution.collection_error:
        v.problems.append(f"solution: tests could not be collected:\n{_tail(solution.output)}")
    elif solution.failed:
        names = ", ".join(t.name for t in solution.failed)
        v.problems.append(f"solution fails: {names}\n{_tail(solution.output)}")
    elif not solution.passed:
        v.problems.append("solution: no test ran (all skipped or none collected)")

    if starter.collection_error:
        v.problems.append(
            f"starter: tests could not be collected (starter.py must import cleanly):\n"
            f"{_tail(starter.output)}"
        )
    else:
        passing = [t.name for t in starter.passed]
        if passing:
            v.problems.append(
                "starter passes (these tests do not exercise learner code): " + ", ".join(passing)
            )
        elif solution.passed and not starter.failed:
            v.problems.append("starter: no test ran, so nothing shows the starter is incomplete")

    if not lab.mutants:
        v.problems.append("no mutants/: add at least one plausible wrong solution (see CONTRIBUTING.md)")
    for run in mutants:
        if run.collection_error:
            v.problems.append(
                f"{run.label}: tests could not be collected (a mutant must leave an importable "
                f"solution with one mistake):\n{_tail(run.output)}"
            )
        elif not run.failed:
            v.problems.append(f"{run.label} survives: every test passes on it")
    return v


def _tail(text: str, lines: int = 15) -> str:
    return "\n".join("      " + line for line in text.strip().splitlines()[-lines:])


def materialize(lab: Lab, mutant: Path, into: Path) -> Path:
    """Write ``solution.py`` with ``mutant`` applied under ``into``; raises ``StaleMutant``."""
    delta = patches.load(mutant)
    if [f.path for f in delta.files] != ["solution.py"]:
        raise patches.StaleMutant(f"{mutant.stem}: a lab mutant patches solution.py only (--- a/solution.py)")
    text = patches.apply(delta, lambda name: (lab.path / name).read_text(encoding="utf-8"))["solution.py"]
    must_compile(text, f"{mutant.stem}: solution.py")
    target = into / lab.path.parent.parent.name / lab.name / mutant.stem / "solution.py"
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text, encoding="utf-8")
    return target


def must_compile(text: str, label: str) -> None:
    """A mutant is a program with one mistake: one that does not even compile would be "caught" by any
    test that imports it lazily, proving nothing. Raises ``StaleMutant`` naming the line."""
    try:
        compile(text, label, "exec")
    except SyntaxError as exc:
        raise patches.StaleMutant(f"{label} does not compile (line {exc.lineno}: {exc.msg})") from None


def stale_message(lab: Lab, mutant: Path, root: Path, exc: Exception) -> str:
    return (
        f"mutant {mutant.stem} of {rel(lab.path, root)} no longer applies to solution.py: {exc}. "
        f"Re-create it: python -m course mutant new {rel(lab.path, root)} {mutant.stem}"
    )


def check(labs: list[Lab], root: Path, jobs: int = 2, all_labs: list[Lab] | None = None) -> list[LabVerdict]:
    """Check every lab: static rules, then solution, starter and each mutant on ``jobs`` workers."""
    static = labrules.static_problems(labs, all_labs or labs)
    tasks: list[tuple[Lab, str, str | None, Path | None]] = []
    with tempfile.TemporaryDirectory(prefix="course-mutants-") as tmp:
        for lab in labs:
            tasks.append((lab, "solution", "solution", None))
            tasks.append((lab, "starter", "starter", None))
            for mutant in lab.mutants:
                try:
                    path = materialize(lab, mutant, Path(tmp))
                except patches.StaleMutant as exc:
                    static[lab.path].append(stale_message(lab, mutant, root, exc))
                    continue
                tasks.append((lab, f"mutant {mutant.stem}", None, path))
        results = run_many(
            tasks,
            lambda task: run_lab(
                task[0].path, root, task[1], impl=task[2], lab_file=task[3], first_failure=task[3] is not None
            ),
            lambda task, result: f"{rel(task[0].path, root)} · {task[1]}: {result.summary()}",
            jobs,
        )
    by_lab: dict[Path, list[LabRun]] = {}
    for (lab, *_), result in zip(tasks, results, strict=True):
        by_lab.setdefault(lab.path, []).append(result)
    return [judge(lab, *by_lab[lab.path][:2], by_lab[lab.path][2:], static[lab.path]) for lab in labs]


# ------------------------------------------------------------------ mini_vllm's own mutants
def focused_tests(delta: patches.Mutant, copy: Path) -> list[Path]:
    """The test file named after the one module a mutant patches (``mini_vllm/x.py`` ->
    ``mini_vllm/test_x.py``; a package module also tries ``test_<package>.py``), when it exists.

    Only a hint for speed: a mutant that file does not catch still runs the whole suite.
    """
    paths = {f.path for f in delta.files}
    if len(paths) != 1:
        return []
    module = Path(next(iter(paths)))
    names = [f"test_{module.stem}.py"]
    if module.parent.name != MINI:
        names.append(f"test_{module.parent.name}.py")
    found = [copy / MINI / n for n in names if (copy / MINI / n).is_file()]
    return found[:1]


def mini_mutants(root: Path) -> list[Path]:
    folder = root / MINI / "mutants"
    return sorted(folder.glob("*.diff")) if folder.is_dir() else []


def check_mini(root: Path, jobs: int = 2, names: list[str] | None = None) -> list[str]:
    """Problems with ``mini_vllm/mutants/*.diff`` (only ``names``, when given): each must apply and make
    ``pytest mini_vllm`` fail."""
    mutants = mini_mutants(root)
    if names:
        known = {m.stem: m for m in mutants}
        missing = [n for n in names if n not in known]
        if missing:
            return [f"no such mini_vllm mutant: {', '.join(missing)} (in {MINI}/mutants/)"]
        mutants = [known[n] for n in names]
    if not mutants:
        return []
    problems: list[str] = []
    copies: list[tuple[Path, Path]] = []
    with tempfile.TemporaryDirectory(prefix="course-mini-mutants-") as tmp:
        for mutant in mutants:
            copy = Path(tmp) / mutant.stem
            shutil.copytree(root / MINI, copy / MINI, ignore=shutil.ignore_patterns("mutants", "__pycache__"))
            for name in ("conftest.py", "pyproject.toml"):
                if (root / name).is_file():
                    shutil.copy2(root / name, copy / name)
            if (root / "upstream").exists():
                (copy / "upstream").symlink_to((root / "upstream").resolve())
            try:
                delta = patches.load(mutant)
                bad = [f.path for f in delta.files if not f.path.startswith(MINI + "/")]
                if bad:
                    raise patches.StaleMutant(
                        f"patches {bad}: a mini_vllm mutant patches mini_vllm/ files only"
                    )
                texts = patches.apply(delta, lambda name: (root / name).read_text(encoding="utf-8"))
                for name, text in texts.items():
                    if name.endswith(".py"):
                        must_compile(text, f"{mutant.stem}: {name}")
            except patches.StaleMutant as exc:
                problems.append(f"mini_vllm mutant {mutant.stem} no longer applies: {exc}")
                continue
            for name, text in texts.items():
                (copy / name).write_text(text, encoding="utf-8")
            copies.append((mutant, copy))
        env = {"PYTHONPATH": f"{{}}:{root}", "COURSE_STRICT": "0"}

        def run_mutant(item: tuple[Path, Path]) -> LabRun:
            mutant, copy = item
            kwargs = dict(first_failure=True, fork=False,
                          extra_env={**env, "PYTHONPATH": env["PYTHONPATH"].format(copy)})  # fmt: skip
            label = f"mini_vllm mutant {mutant.stem}"
            focused = focused_tests(patches.load(mutant), copy)
            if focused:  # the mutated module's own tests first: most mutants die there, in seconds
                run = run_lab(focused[0], copy, label, **kwargs) if len(focused) == 1 else None
                if run is not None and run.failed and not run.collection_error:
                    return run
            return run_lab(copy / MINI, copy, label, **kwargs)  # the whole suite, as before

        results = run_many(
            copies,
            run_mutant,
            lambda item, result: f"mini_vllm · mutant {item[0].stem}: {result.summary()}",
            jobs,
        )
    for (mutant, _), run in zip(copies, results, strict=True):
        if run.collection_error:
            problems.append(
                f"mini_vllm mutant {mutant.stem}: tests could not be collected:\n{_tail(run.output)}"
            )
        elif not run.failed:
            problems.append(f"mini_vllm mutant {mutant.stem} survives: every test in mini_vllm passes on it")
    return problems


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "check-labs",
        help="solution passes, starter fails, every mutant is caught",
        description="For every lab: the solution passes, the starter fails every test that runs, and each "
        "mutants/*.diff (a plausible wrong solution, as a delta) applies and fails at least one test; the "
        "starter keeps the solution's public surface; cross-lab loads are declared. PHASE may be 'mini_vllm'.",
    )
    p.add_argument("phases", nargs="*", metavar="PHASE", help="phase number or folder (default: all)")
    p.add_argument("-j", "--jobs", type=int, default=2, help="pytest processes at once (default: 2)")
    p.add_argument("--root", type=Path, default=ROOT, help=argparse.SUPPRESS)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    wanted = [p for p in args.phases if Path(p.rstrip("/")).name != MINI]
    with_mini = not args.phases or len(wanted) < len(args.phases)
    try:
        every = find_phases(args.root)
        phases = select_phases(every, wanted) if wanted or not with_mini else every
    except ValueError as exc:
        print(f"error: {exc}")
        return 2
    if args.phases and not wanted:
        phases = []
    labs = [lab for phase in phases for lab in phase.labs]
    all_labs = [lab for phase in every for lab in phase.labs]
    if not labs and not (with_mini and mini_mutants(args.root)):
        print("check-labs: no labs found (nothing to check)")
        return 0
    runs = sum(2 + len(lab.mutants) for lab in labs)
    progress(f"check-labs: {len(labs)} lab(s), {runs} pytest runs on {args.jobs} worker(s)")
    start = time.monotonic()
    verdicts = check(labs, args.root, args.jobs, all_labs) if labs else []
    mini_problems = check_mini(args.root, args.jobs) if with_mini else []
    # Each phase's mini-build (course/minibuilds.toml): stubbed parts fail, the reference passes.
    numbers = None if not wanted else [p.number for p in phases]
    build_rows, build_problems = (
        minibuild.contract_problems(numbers, args.root, args.jobs)
        if (phases or not args.phases)
        else ([], [])
    )
    rows = []
    for v in verdicts:
        starter = v.starter
        starter_cell = f"{len(starter.failed)}/{len(starter.ran)} fail" if starter else "-"
        killed = sum(1 for m in v.mutants if m.failed and not m.collection_error)
        rows.append(
            [
                v.lab.phase,
                v.lab.name,
                v.solution.summary() if v.solution else "-",
                starter_cell,
                f"{killed}/{len(v.lab.mutants)} caught",
                "OK" if v.ok else "FAIL",
            ]
        )
    if with_mini and mini_mutants(args.root):
        n = len(mini_mutants(args.root))
        rows.append(
            ["-", MINI, "-", "-", f"{n - len(mini_problems)}/{n} caught", "FAIL" if mini_problems else "OK"]
        )
    rows += build_rows
    print()
    print_table("check-labs", ["phase", "lab", "solution", "starter", "mutants", "verdict"], rows)
    bad = [v for v in verdicts if not v.ok]
    for v in bad:
        print(f"\nFAIL {rel(v.lab.path, args.root)}")
        for problem in v.problems:
            print(f"  - {problem}")
    if mini_problems:
        print(f"\nFAIL {MINI}")
        for problem in mini_problems:
            print(f"  - {problem}")
    if build_problems:
        print("\nFAIL mini-builds (course/minibuilds.toml)")
        for problem in build_problems:
            print(f"  - {problem}")
    print(
        f"\ncheck-labs: {len(verdicts) - len(bad)}/{len(verdicts)} labs OK, "
        f"{len(build_rows) - sum(r[-1] == 'FAIL' for r in build_rows)}/{len(build_rows)} mini-build parts OK "
        f"in {time.monotonic() - start:.1f}s"
    )
    return 1 if bad or mini_problems or build_problems else 0
