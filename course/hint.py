"""``python -m course hint LAB [N]``: the second level of a lab's hints, one at a time.

A starter's ``NotImplementedError`` says what to do in words (the first level). The code that does
it lives in the lab's ``HINTS.md``, one ``## N. title`` section per hint, so a learner reads it only
when they ask: ``hint 09-01`` lists the titles, ``hint 09-01 2`` prints hint 2. The site shows the
same file folded under the lab (``course.booksrc``).
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from course import ROOT
from course.discover import find_phases

HINTS = "HINTS.md"
SECTION_RE = re.compile(r"^## (\d+)\. (.+)$", re.M)


def find_lab(root: Path, spec: str) -> Path:
    """A lab folder from ``09-01``, ``09/01``, ``9 1`` or a path; raises ``ValueError``."""
    path = (root / spec).resolve()
    if path.is_dir() and (path / "test_lab.py").is_file():
        return path
    m = re.fullmatch(r"(\d{1,2})[-/ .](\d{1,2})", spec.strip())
    if not m:
        raise ValueError(f"{spec!r}: name a lab as PHASE-LAB (09-01) or by its folder")
    phase, lab = m.group(1).zfill(2), m.group(2).zfill(2)
    for p in find_phases(root):
        if p.number == phase:
            for candidate in p.labs:
                if candidate.name.startswith(f"lab-{lab}-"):
                    return candidate.path
    raise ValueError(f"no lab {phase}-{lab}")


def sections(text: str) -> list[tuple[int, str, str]]:
    """``(number, title, body)`` of each ``## N. title`` section."""
    found = list(SECTION_RE.finditer(text))
    out = []
    for i, m in enumerate(found):
        end = found[i + 1].start() if i + 1 < len(found) else len(text)
        out.append((int(m.group(1)), m.group(2).strip(), text[m.end() : end].strip("\n")))
    return out


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "hint",
        help="a lab's code-level hints, one at a time (the starter's messages are the first level)",
        description="With only LAB: list the lab's hints. With N: print hint N from the lab's HINTS.md.",
    )
    p.add_argument("lab", help="PHASE-LAB, e.g. 09-01, or the lab's folder")
    p.add_argument("number", nargs="?", type=int, help="which hint to show")
    p.add_argument("--root", type=Path, default=ROOT, help=argparse.SUPPRESS)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        lab = find_lab(args.root, args.lab)
    except ValueError as exc:
        print(f"error: {exc}")
        return 2
    hints = lab / HINTS
    if not hints.is_file():
        print(f"{lab.name} has no {HINTS}: its starter's messages and README are all the help there is.")
        return 0
    found = sections(hints.read_text(encoding="utf-8"))
    if args.number is None:
        print(f"{lab.name}: {len(found)} hint(s). Each shows code; try the starter's message first.")
        for number, title, _ in found:
            print(f"  {number}. {title}")
        print(f"Show one: python -m course hint {args.lab} N")
        return 0
    for number, title, body in found:
        if number == args.number:
            print(f"{number}. {title}\n\n{body}")
            return 0
    print(f"error: {lab.name} has hints {', '.join(str(n) for n, _, _ in found)}; no hint {args.number}")
    return 2
