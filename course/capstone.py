"""``python -m course capstone check PLAN.md`` and ``python -m course interview``: Phase 19's tools.

Both are thin front ends over the reference solutions of Phase 19's labs, so the logic has one
home: the plan checker is lab 01's ``check_plan``, the question bank, draws, matrix and report are
lab 02's. ``interview`` is interactive on a terminal; ``--answers FILE`` (JSON, one object per
drawn question: ``{"answer": str, "score": 0-3, "peek": bool, "skipped_math": bool}``) makes it
scriptable, and then it never reads stdin.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from types import ModuleType

from course import ROOT
from course.runtime.harness import use_lab

PLAN_LAB = "phase-19/lab-01-find-and-scope-a-pr"
LOOP_LAB = "phase-19/lab-02-mock-staff-loop"


def _lab(lab_id: str) -> ModuleType:
    return use_lab(lab_id)  # the reference solution, whatever LAB_IMPL says


def add_parser(sub: argparse._SubParsersAction) -> None:
    cap = sub.add_parser("capstone", help="Phase 19: check a one-page PR plan")
    cap_sub = cap.add_subparsers(dest="capstone_command", metavar="ACTION")
    check = cap_sub.add_parser(
        "check", help="check PLAN.md's fields, commit, citations, test file, blast radius"
    )
    check.add_argument("plan", type=Path)
    check.add_argument(
        "--upstream", type=Path, default=ROOT / "upstream", help="the vLLM tree the plan cites"
    )
    check.set_defaults(func=run_check)
    cap.set_defaults(func=lambda args: (cap.print_help(), 2)[1])

    iv = sub.add_parser("interview", help="Phase 19: a seeded mock staff loop over every INTERVIEW.md")
    iv.add_argument("--seed", type=int, default=0)
    iv.add_argument("--phase", type=int, action="append", help="only these phases (repeatable)")
    iv.add_argument("--level", help="fundamentals (phases 00-03), systems (04-08) or staff (09-19)")
    iv.add_argument("--answers", type=Path, help="JSON list of answers: no prompts, no stdin")
    iv.add_argument("--out", type=Path, default=ROOT / "build" / "interview", help="report folder")
    iv.set_defaults(func=run_interview)


def run_check(args: argparse.Namespace) -> int:
    lab = _lab(PLAN_LAB)
    if not args.plan.is_file():
        print(f"no such plan: {args.plan}", file=sys.stderr)
        return 2
    text = args.plan.read_text(encoding="utf-8")
    problems = lab.check_plan(text, args.upstream)
    print(f"{args.plan}: {len(text.splitlines())} lines, {len(text.split())} words")
    if not (args.upstream / "tests").is_dir():
        print(
            f"note: {args.upstream} has no tests/, so the test file was not checked; point --upstream at your clone"
        )
    for p in problems:
        print(f"  {p.code}: {p.message}")
    print("ready to post" if not problems else f"{len(problems)} problem(s)")
    return 1 if problems else 0


def _ask(prompt: str) -> str:
    print(prompt, end="", flush=True)
    return sys.stdin.readline().strip()


def _ask_score() -> int:
    while True:
        text = _ask("score 0-3 (3 cold, 2 hesitated, 1 knew of it, 0 blank): ")
        if text in ("0", "1", "2", "3", ""):
            return int(text or 0)
        print(f"{text!r} is not a score: type 0, 1, 2 or 3")


def run_interview(args: argparse.Namespace) -> int:
    lab = _lab(LOOP_LAB)
    bank = lab.load_bank()
    try:
        picks = lab.draw(bank, seed=args.seed, phases=args.phase, level=args.level)
    except ValueError as exc:
        print(f"interview: {exc}", file=sys.stderr)
        return 2
    scripted = json.loads(args.answers.read_text(encoding="utf-8")) if args.answers else None
    if scripted is not None and len(scripted) < len(picks):
        print(
            f"interview: {args.answers} has {len(scripted)} answers for {len(picks)} questions",
            file=sys.stderr,
        )
        return 2
    scores = []
    for i, q in enumerate(picks):
        print(f"\n[{i + 1}/{len(picks)}] Phase {q.phase:02d} Q{q.number}. {q.title}")
        if scripted is not None:
            given = scripted[i]
            print(f"your answer: {given.get('answer', '')}")
        else:
            given = {"answer": _ask("your answer (one line; say it aloud first): ")}
        print(f"\nmodel answer:\n{q.answer}\n")
        if scripted is None:
            given["score"] = _ask_score()
            given["peek"] = _ask("peeked? [y/N] ").lower().startswith("y")
            given["skipped_math"] = _ask("skipped available arithmetic? [y/N] ").lower().startswith("y")
        try:
            score = lab.Score(q, given["score"], bool(given.get("peek")), bool(given.get("skipped_math")))
            lab.capped(score)
        except (KeyError, ValueError) as exc:
            print(f"interview: answer {i + 1}: {exc}", file=sys.stderr)
            return 2
        scores.append(score)
    args.out.mkdir(parents=True, exist_ok=True)
    text = lab.report(lab.competency_rows(), scores, seed=args.seed, chart=args.out / "matrix.png")
    (args.out / "report.md").write_text(text, encoding="utf-8")
    print(text)
    print(f"wrote {args.out / 'report.md'} and {args.out / 'matrix.png'}")
    return 0
