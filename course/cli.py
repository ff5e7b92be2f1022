"""The ``python -m course`` command line: one subcommand per tool."""

from __future__ import annotations

import argparse
import sys

from course import (
    PIN_SHORT,
    PIN_TAG,
    book,
    capstone,
    check_labs,
    citations,
    defect_grader,
    gpucheck,
    grade,
    hint,
    lock,
    minibuild,
    mutant,
    outputs,
    upstream,
)

COMMANDS = (upstream, citations, check_labs, mutant, outputs, gpucheck, grade, minibuild, hint, book, lock)
COMMANDS += (capstone,)  # Phase 19: capstone check, interview


# Phase 19 lab 03's grader, its own small subcommand: `python -m course defect grade`
COMMANDS += (defect_grader,)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m course",
        description=f"vLLM Mastery course tools (upstream pin: vLLM {PIN_TAG} @ {PIN_SHORT}).",
        epilog="Run `python -m course COMMAND --help` for a command's options. `make help` lists the make targets.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module in COMMANDS:
        module.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        return 130
