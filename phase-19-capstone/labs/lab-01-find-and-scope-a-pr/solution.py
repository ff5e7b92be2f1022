"""Lab 19-01 reference: the one-page PR plan checker behind ``python -m course capstone check``.

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
    fields: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in text.splitlines():
        m = FIELD_RE.match(line)
        if m and m.group("name").strip() in FIELDS:
            name = m.group("name").strip()
            current = [m.group("rest")] if name not in fields else []
            fields.setdefault(name, current)
        elif current is not None:
            current.append(line)
    return {name: "\n".join(lines).strip() for name, lines in fields.items()}


def check_plan(text: str, tree: Path) -> list[Problem]:
    """Every problem of the plan against the source tree ``tree`` (a vLLM checkout at the commit)."""
    problems: list[Problem] = []
    lines, words = text.splitlines(), len(text.split())
    if len(lines) > MAX_LINES or words > MAX_WORDS:
        problems.append(
            Problem(
                "too-long",
                f"{len(lines)} lines and {words} words; one page is at most {MAX_LINES} lines and {MAX_WORDS} words",
            )
        )
    fields = parse_plan(text)
    for name in FIELDS:
        if not fields.get(name):
            problems.append(
                Problem("missing-field", f"'{name}:' is missing or empty; add a line starting '{name}:'")
            )

    issue = fields.get("Issue", "")
    if issue and not re.match(r"^(#\d+\b|new\b)", issue):
        problems.append(
            Problem(
                "bad-issue",
                f"Issue should start '#NNNNN' or 'new' (an issue you will file), got {issue[:40]!r}",
            )
        )

    commit = fields.get("Reproduced at", "").split()
    if commit and not SHA_RE.match(commit[0].strip("`")):
        problems.append(
            Problem(
                "bad-commit",
                f"Reproduced at needs the full 40-hex commit (git rev-parse HEAD), got {commit[0]!r}",
            )
        )

    cause = fields.get("Cause", "")
    if cause and not any(True for _ in _cites(cause)):
        problems.append(Problem("no-citation", "Cause must cite at least one path:line — Symbol in the tree"))
    problems += citation_problems(text, tree)

    test_plan = fields.get("Test plan", "")
    if test_plan:
        m = TEST_PATH_RE.search(test_plan)
        if not m:
            problems.append(
                Problem(
                    "no-test-file", "Test plan must name the test file, e.g. tests/v1/core/test_scheduler.py"
                )
            )
        elif (tree / "tests").is_dir() and not (tree / m.group(1)).is_file():
            problems.append(
                Problem(
                    "missing-test-file", f"{m.group(1)} does not exist in {tree}: extend an existing suite"
                )
            )

    radius = fields.get("Blast radius", "")
    if radius:
        values = [
            v.strip()
            for v in re.split(r"[,/]", radius.splitlines()[0].split("—")[0].split(" - ")[0])
            if v.strip()
        ]
        bad = [v for v in values if v not in BLAST_RADIUS]
        if bad or not values or ("none" in values and len(values) > 1):
            problems.append(
                Problem(
                    "bad-blast-radius",
                    f"Blast radius takes {', '.join(BLAST_RADIUS)} ('none' alone), got {values}",
                )
            )

    questions = fields.get("Open questions", "")
    asked = [ln for ln in questions.splitlines() if re.match(r"^\s*(?:\d+[.)]|[-*])\s+", ln)] or (
        [questions] if questions else []
    )
    if len(asked) > MAX_QUESTIONS:
        problems.append(
            Problem(
                "too-many-questions",
                f"{len(asked)} open questions; ask the maintainers at most {MAX_QUESTIONS}",
            )
        )
    return problems


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
