"""Prove every lab's tests have teeth.

For each lab (``phase-NN-*/labs/lab-NN-*/`` with a ``test_lab.py``):

* the **solution** passes (and at least one test actually runs);
* the **starter** fails every test that runs (``gpu`` skips are ignored): a starter test that
  passes is a test that does not exercise the learner's code;
* every **mutant** (``mutants/*.py``, a plausible wrong solution) fails at least one test, and a
  lab without mutants is itself a failure.
"""

from __future__ import annotations

import argparse
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from course import ROOT, zygote_client
from course.discover import Lab, find_phases, rel, select_phases
from course.labrun import LabRun, run_lab
from course.report import print_table, progress


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


def judge(lab: Lab, solution: LabRun, starter: LabRun, mutants: list[LabRun]) -> LabVerdict:
    """Apply the three rules to the runs of one lab."""
    v = LabVerdict(lab, solution, starter, mutants)
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
                f"{run.label}: tests could not be collected (a mutant must be a complete, importable "
                f"solution with one mistake):\n{_tail(run.output)}"
            )
        elif not run.failed:
            v.problems.append(f"{run.label} survives: every test passes on it")
    return v


def _tail(text: str, lines: int = 15) -> str:
    return "\n".join("      " + line for line in text.strip().splitlines()[-lines:])


def check(labs: list[Lab], root: Path, jobs: int = 2) -> list[LabVerdict]:
    """Run every lab three ways (solution, starter, each mutant) on ``jobs`` workers."""
    tasks: list[tuple[Lab, str, str | None, Path | None]] = []
    for lab in labs:
        tasks.append((lab, "solution", "solution", None))
        tasks.append((lab, "starter", "starter", None))
        for mutant in lab.mutants:
            tasks.append((lab, f"mutant {mutant.name}", None, mutant))
    done = 0
    lock = threading.Lock()

    def one(task: tuple[Lab, str, str | None, Path | None]) -> LabRun:
        nonlocal done
        lab, label, impl, lab_file = task
        start = time.monotonic()
        result = run_lab(
            lab.path, root, label, impl=impl, lab_file=lab_file, first_failure=lab_file is not None
        )
        with lock:
            done += 1
            progress(
                f"  [{done}/{len(tasks)}] {rel(lab.path, root)} · {label}: {result.summary()} "
                f"({time.monotonic() - start:.1f}s)"
            )
        return result

    try:
        with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
            results = list(pool.map(one, tasks))
    finally:
        zygote_client.shutdown()
    by_lab: dict[Path, list[LabRun]] = {}
    for (lab, *_), result in zip(tasks, results):
        by_lab.setdefault(lab.path, []).append(result)
    verdicts = []
    for lab in labs:
        runs = by_lab[lab.path]
        verdicts.append(judge(lab, runs[0], runs[1], runs[2:]))
    return verdicts


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "check-labs",
        help="solution passes, starter fails, every mutant is caught",
        description="For every lab: the solution passes, the starter fails every test that runs, and each "
        "mutants/*.py (a plausible wrong solution) fails at least one test.",
    )
    p.add_argument("phases", nargs="*", metavar="PHASE", help="phase number or folder (default: all)")
    p.add_argument("-j", "--jobs", type=int, default=2, help="pytest processes at once (default: 2)")
    p.add_argument("--root", type=Path, default=ROOT, help=argparse.SUPPRESS)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        phases = select_phases(find_phases(args.root), args.phases)
    except ValueError as exc:
        print(f"error: {exc}")
        return 2
    labs = [lab for phase in phases for lab in phase.labs]
    if not labs:
        print("check-labs: no labs found (nothing to check)")
        return 0
    runs = sum(2 + len(lab.mutants) for lab in labs)
    progress(f"check-labs: {len(labs)} lab(s), {runs} pytest runs on {args.jobs} worker(s)")
    start = time.monotonic()
    verdicts = check(labs, args.root, args.jobs)
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
                f"{killed}/{len(v.mutants)} caught",
                "OK" if v.ok else "FAIL",
            ]
        )
    print()
    print_table("check-labs", ["phase", "lab", "solution", "starter", "mutants", "verdict"], rows)
    bad = [v for v in verdicts if not v.ok]
    for v in bad:
        print(f"\nFAIL {rel(v.lab.path, args.root)}")
        for problem in v.problems:
            print(f"  - {problem}")
    print(
        f"\ncheck-labs: {len(verdicts) - len(bad)}/{len(verdicts)} labs OK in {time.monotonic() - start:.1f}s"
    )
    return 1 if bad else 0
