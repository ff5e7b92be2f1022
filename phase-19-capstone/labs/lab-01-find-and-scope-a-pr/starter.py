"""Lab 19-01 starter: the one-page PR plan checker behind ``python -m course capstone check``.

A plan is a Markdown page with eight fields, each a line that starts ``Field:`` (bold
``**Field:**`` is fine) and runs until the next field. ``check_plan`` returns every problem it
finds, each with a code from ``CODES``; an empty list means the plan is ready to post on the issue.
``citation_problems`` is provided: it is the course's own citation resolver (``course.citations``),
not a second one. ``python …/solution.py`` checks the worked plan ``PLAN.md`` beside this file.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import NamedTuple

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]

FIELDS = (
    "Issue",
    "Reproduced at",
    "Cause",
    "Fix sketch",
    "Test plan",
    "Blast radius",
    "Out of scope",
    "Open questions",
)
MAX_LINES = 60  # one page: at most 60 lines (blank lines count) ...
MAX_WORDS = 600  # ... and at most 600 words, whichever binds first
MAX_QUESTIONS = 2
BLAST_RADIUS = ("TP", "quant", "LoRA", "spec", "none")
CODES = (
    "missing-field",
    "too-long",
    "bad-issue",
    "bad-commit",
    "no-citation",
    "bad-citation",
    "no-test-file",
    "missing-test-file",
    "bad-blast-radius",
    "too-many-questions",
)

FIELD_RE = re.compile(r"^\s*(?:[-*]\s+)?(?:\*\*)?(?P<name>[A-Za-z ]+?):(?:\*\*)?(?:\s+|$)(?P<rest>.*)$")
SHA_RE = re.compile(r"^[0-9a-f]{40}$")
TEST_PATH_RE = re.compile(r"(?<![\w/.-])(tests/(?:[\w.-]+/)*test_[\w-]+\.py)\b")


class Problem(NamedTuple):
    code: str  # one of CODES
    message: str  # what is wrong and what to write instead


def citation_problems(text: str, tree: Path) -> list[Problem]:
    """One ``bad-citation`` per ``path:line`` in ``text`` that does not resolve in ``tree``."""
    from course.citations import check_citation, parse_citations

    out = []
    for cite in parse_citations(text, Path("PLAN.md")):
        why = check_citation(cite, tree, ROOT)
        if why:
            out.append(Problem("bad-citation", f"{cite}: {why}"))
    return out


# ---- yours ---------------------------------------------------------------------------------------


def parse_plan(text: str) -> dict[str, str]:
    """The fields of a plan: ``{name: value}``, value = the rest of the field's line plus the lines
    up to the next field, stripped. Only names in ``FIELDS`` start a field; a repeated field
    keeps its first value."""
    raise NotImplementedError(
        "split the text into fields: a line matching FIELD_RE whose name is in FIELDS opens a field; "
        "other lines continue the current one"
    )


def check_plan(text: str, tree: Path) -> list[Problem]:
    """Every problem of the plan against the source tree ``tree`` (a vLLM checkout at the commit)."""
    raise NotImplementedError(
        "one Problem per defect, codes from CODES: page size, each missing field, the Issue form, a 40-hex "
        "commit, a citation in Cause, citation_problems(text, tree), the test file (when tree has tests/), "
        "blast-radius values, at most MAX_QUESTIONS questions"
    )


def _cites(text: str):
    from course.citations import parse_citations

    return parse_citations(text, Path("PLAN.md"))


# ---- provided: the worked plan -------------------------------------------------------------------


def main(argv: list[str]) -> int:
    path = Path(argv[0]) if argv else HERE / "PLAN.md"
    tree = ROOT / "upstream"
    problems = check_plan(path.read_text(encoding="utf-8"), tree)
    text = path.read_text(encoding="utf-8")
    print(
        f"{path.name}: {len(text.splitlines())} lines, {len(text.split())} words, {len(parse_plan(text))}/{len(FIELDS)} fields"
    )
    if not (tree / "tests").is_dir():
        print("test file: not checked (this tree has no tests/: the wheel route); check it in your clone")
    for p in problems:
        print(f"  {p.code}: {p.message}")
    print("ready to post" if not problems else f"{len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
