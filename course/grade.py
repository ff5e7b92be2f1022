"""The learner's progress at a glance: run every lab against *your* ``starter.py``.

Each lab is graded with ``LAB_IMPL=starter``; a lab is **done** when every test that ran passed,
**in progress** when some pass, **attempted** when none pass but ``starter.py`` differs from git
``HEAD`` (you edited it), **not started** otherwise. Skipped tests (``gpu`` ones on a laptop) are
shown but never count as passes; a done lab says how many on-demand tests (``slow``, ``engine``)
the default run left out. A second table shows each phase's mini-build (``course mini-build``).
"""

from __future__ import annotations

import argparse
import re
import subprocess
import time
from pathlib import Path

from course import ROOT, minibuild
from course.discover import find_phases, labs_in_order, select_phases
from course.labrun import LabRun, run_lab, run_many
from course.report import print_table, progress


def status(run: LabRun, edited: bool = False) -> str:
    if run.collection_error:
        return "error (starter.py does not import)"
    if run.passed and not run.failed:
        left = deselected(run)
        return f"done ({left} slow/engine test(s) not run: make test-slow)" if left else "done"
    if run.passed:
        return "in progress"
    return "attempted" if edited else "not started"


def deselected(run: LabRun) -> int:
    """Tests the default run left out (``slow``/``engine`` ones), read from pytest's last line."""
    found = re.findall(r"(\d+) deselected", run.output or "")
    return int(found[-1]) if found else 0


def edited_starters(root: Path) -> set[Path] | None:
    """``starter.py`` files that differ from git ``HEAD`` (None outside a git checkout)."""
    try:
        proc = subprocess.run(
            ["git", "status", "--porcelain", "--", "phase-*/labs/*/starter.py"],
            cwd=root,
            capture_output=True,
            text=True,
            check=False,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if proc.returncode != 0:
        return None
    return {(root / line[3:].strip()).resolve() for line in proc.stdout.splitlines() if line.strip()}


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "grade",
        help="grade your starter.py files: a progress table per phase",
        description="Run every lab's tests with LAB_IMPL=starter (your work) and print, per phase, "
        "which labs are done, in progress, attempted or not started, then each phase's mini-build "
        "(python -m course mini-build). Always exits 0 unless --strict.",
    )
    p.add_argument("phases", nargs="*", metavar="PHASE", help="phase number or folder (default: all)")
    p.add_argument("-j", "--jobs", type=int, default=2, help="pytest processes at once (default: 2)")
    p.add_argument("--strict", action="store_true", help="exit 1 unless every graded lab is done")
    p.add_argument("--root", type=Path, default=ROOT, help=argparse.SUPPRESS)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        phases = select_phases(find_phases(args.root), args.phases)
    except ValueError as exc:
        print(f"error: {exc}")
        return 2
    labs = labs_in_order(phases)  # progress and tables follow it
    if not labs:
        print("grade: no labs found yet")
        return 1 if args.strict else 0
    progress(f"grading {len(labs)} lab(s) with LAB_IMPL=starter on {args.jobs} worker(s)…")
    start = time.monotonic()
    # Progress follows the one lab order (folder numbers), whatever finishes first.
    results = run_many(
        labs,
        lambda lab: run_lab(lab.path, args.root, "starter", impl="starter"),
        lambda lab, result: f"{lab.path.parent.parent.name}/{lab.name}: {status(result)}",
        args.jobs,
        in_order=True,
    )
    runs = {lab.path: result for lab, result in zip(labs, results, strict=True)}
    edited = edited_starters(args.root) or set()
    states = {lab.path: status(runs[lab.path], (lab.path / "starter.py").resolve() in edited) for lab in labs}
    n_done = sum(st.startswith("done") for st in states.values())
    n_passing = sum(len(r.passed) for r in runs.values())
    n_ran = sum(len(r.passed) + len(r.failed) for r in runs.values())
    print(f"\nSummary: {n_done}/{len(labs)} labs done, {n_passing}/{n_ran} tests passing.")
    all_done = True
    grand = {"labs": 0, "done": 0, "passed": 0, "tests": 0}
    for phase in phases:
        if not phase.labs:
            continue
        rows = []
        totals = {"passed": 0, "failed": 0, "skipped": 0, "done": 0}
        for lab in phase.labs:
            r = runs[lab.path]
            st = states[lab.path]
            rows.append(
                [lab.name, lab.tag, str(len(r.passed)), str(len(r.failed)), str(r.count("skipped")), st]
            )
            totals["passed"] += len(r.passed)
            totals["failed"] += len(r.failed)
            totals["skipped"] += r.count("skipped")
            totals["done"] += st.startswith("done")
            all_done &= st.startswith("done")
        rows.append(
            [
                "total",
                "",
                str(totals["passed"]),
                str(totals["failed"]),
                str(totals["skipped"]),
                f"{totals['done']}/{len(phase.labs)} labs done",
            ]
        )
        print()
        print_table(
            f"Phase {phase.number} — {phase.title}",
            ["lab", "tag", "passed", "failed", "skipped", "status"],
            rows,
        )
        grand["labs"] += len(phase.labs)
        grand["done"] += totals["done"]
        grand["passed"] += totals["passed"]
        grand["tests"] += totals["passed"] + totals["failed"]
    builds = minibuild.grade_rows([p.number for p in phases], args.root)
    if builds:
        print()
        print_table(
            "Mini-builds (python -m course mini-build NN start|check|reset)",
            ["phase", "parts", "state"],
            builds,
        )
    print(
        f"\nOverall: {grand['done']}/{grand['labs']} labs done, {grand['passed']}/{grand['tests']} tests passing "
        f"({time.monotonic() - start:.1f}s). Skipped tests need hardware you do not have; they never count."
    )
    return 1 if (args.strict and not all_done) else 0
