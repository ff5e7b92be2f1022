"""Checks the book build runs on the course pages, beyond links: each returns the problems found.

* **Lab order** — folder numbers are the recommended order. A phase's ``labs/README.md`` tables
  must list its labs in folder order, each lab's title must carry its folder number ("Lab 03"
  in ``lab-03-…``), and the sidebar and ``course grade`` must walk the labs in that order.
* **Titles** — every page title in the sidebar (hence the tab title and search results) is
  unique, and a phase's pages name their phase ("Phase 02 · Deep dive").
* **Markdown pitfalls** — a line outside code that starts with ``+ `` becomes a bullet (a worked
  sum loses its "+", a ``**`` pair split across it shows raw).
* **Code width** — a hand-written code line wider than the content column would be cut off at
  1400 px (generated output blocks wrap instead; see ``course.sitestyle``).
* **Glyphs** — emoji need an emoji font most machines lack; they render as empty boxes.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass
from pathlib import Path

from course.citations import OUTPUT_CLOSE, OUTPUT_OPEN_RE
from course.discover import LAB_RE, Phase, first_heading
from course.mdscan import fenced_lines
from course.sitestyle import code_columns

PLUS_BULLET_RE = re.compile(r"^(?:\s*>)*\s*\+\s")
LAB_LINK_RE = re.compile(r"\]\(\s*<?(?:\./)?(lab-\d\d-[a-z0-9-]+)/?")
LAB_TITLE_RE = re.compile(r"^Lab (\d+)\b")
SUMMARY_LINK_RE = re.compile(r"^(\s*)- \[(.*)\]\((.*)\)\s*$")
SUMMARY_LAB_RE = re.compile(r"^(phase-\d\d-[a-z0-9-]+)/labs/(lab-\d\d-[a-z0-9-]+)/README\.md$")
PHASE_PAGE_RE = re.compile(r"^(phase-(\d\d)-[a-z0-9-]+)/")
# Characters shown as emoji by default (Unicode Emoji_Presentation) in the Basic Multilingual
# Plane, plus the emoji variation selector; everything from U+1F000 up is pictographic too.
EMOJI_BMP = frozenset(
    "⌚⌛⏩⏪⏫⏬⏰⏳◽◾☔☕♈♉♊♋♌♍♎♏♐♑♒♓♿⚓⚡⚪⚫⚽⚾⛄⛅⛎⛔⛪⛲⛳⛵⛺⛽✅✊✋✨❌❎❓❔❕❗➕➖➗➰➿⬛⬜⭐⭕\ufe0f"
)


@dataclass(frozen=True)
class Problem:
    where: str  # "path:line" (repo-relative) or a path
    message: str

    def __str__(self) -> str:
        return f"{self.where}: {self.message}"


EMOJI_RE = re.compile("[" + "".join(sorted(EMOJI_BMP)) + "\U0001f000-\U0010ffff]")


def display_width(text: str) -> int:
    """Monospace columns: East Asian wide characters take two, a tab four."""
    if text.isascii():
        return len(text) + 3 * text.count("\t")
    return sum(2 if unicodedata.east_asian_width(c) in "WF" else 4 if c == "\t" else 1 for c in text)


QUOTE_RE = re.compile(r"^(?:\s*>\s?)*")


def _fence_room(fence_line: str) -> tuple[int, int]:
    """(columns that fit, indent to strip from its lines) for a code block opened by ``fence_line``."""
    quotes = QUOTE_RE.match(fence_line).group(0)
    rest = fence_line[len(quotes) :]
    spaces = len(rest) - len(rest.lstrip(" "))
    depth = quotes.count(">")
    return code_columns(depth + (spaces + 3) // 4, in_aside=depth > 0), spaces


def _code_text(line: str, indent: int) -> str:
    """A code line as rendered: without blockquote markers and the fence's own indentation."""
    rest = line[len(QUOTE_RE.match(line).group(0)) :]
    return rest[min(indent, len(rest) - len(rest.lstrip(" "))) :]


def check_page(text: str, where: str) -> list[Problem]:
    """The pitfall, code-width and glyph checks on one markdown page (``where`` names it)."""
    problems: list[Problem] = []
    lines = text.split("\n")
    fenced = fenced_lines(lines)
    in_output = False
    limit, indent = code_columns(), 0
    for number, (line, in_fence) in enumerate(zip(lines, fenced, strict=True), 1):
        stripped = line.strip()
        if not in_fence and OUTPUT_OPEN_RE.match(stripped):
            in_output = True
        elif in_output and stripped == OUTPUT_CLOSE:
            in_output = False
        if in_fence and (number == 1 or not fenced[number - 2]):
            limit, indent = _fence_room(line)  # a fence opens: how much room does it have?
        bad = sorted(set(EMOJI_RE.findall(line)))
        if bad:
            names = ", ".join(f"{c} ({unicodedata.name(c, hex(ord(c)))})" for c in bad)
            problems.append(Problem(f"{where}:{number}", f"{names} needs an emoji font; write words instead"))
        if not in_fence and PLUS_BULLET_RE.match(line):
            problems.append(
                Problem(
                    f"{where}:{number}",
                    "a line starting with '+ ' becomes a bullet; move the '+' to the end of the line above",
                )
            )
        width = display_width(_code_text(line, indent)) if in_fence else 0
        if in_fence and not in_output and width > limit:
            problems.append(
                Problem(
                    f"{where}:{number}",
                    f"code line is {width} columns; at most {limit} fit the page at 1400 px "
                    "(wrap it or shorten it)",
                )
            )
    return problems


def check_pages(root: Path, pages: list[str]) -> list[Problem]:
    """``check_page`` over repo-relative ``pages``, plus each lab page's ``starter.py`` shown with it."""
    from course.booksrc import edited_starters, shipped_starter

    problems: list[Problem] = []
    edited = edited_starters(root)
    for rel in pages:
        path = root / rel
        if not path.is_file():
            continue
        problems += check_page(path.read_text(encoding="utf-8"), rel)
        hints = path.parent / "HINTS.md"
        if LAB_RE.match(path.parent.name) and hints.is_file():
            problems += check_page(hints.read_text(encoding="utf-8"), hints.relative_to(root).as_posix())
        starter = path.parent / "starter.py"
        if LAB_RE.match(path.parent.name) and starter.is_file():
            code = "```python\n" + shipped_starter(starter, root, edited) + "\n```"  # never the learner's edits
            for p in check_page(code, rel):
                line = int(p.where.rsplit(":", 1)[1]) - 1
                problems.append(Problem(f"{starter.relative_to(root).as_posix()}:{line}", p.message))
    return problems


def readme_lab_order(text: str) -> list[str]:
    """Lab folders in the order a ``labs/README.md``'s table rows first link them."""
    order: list[str] = []
    lines = text.split("\n")
    for line, in_fence in zip(lines, fenced_lines(lines), strict=True):
        if in_fence or not line.lstrip().startswith("|"):
            continue
        for name in LAB_LINK_RE.findall(line):
            if name not in order:
                order.append(name)
    return order


def _order_problem(where: str, what: str, got: list[str], want: list[str]) -> Problem | None:
    if got == want:
        return None
    missing = [n for n in want if n not in got]
    extra = [n for n in got if n not in want]
    detail = []
    if missing:
        detail.append(f"missing {', '.join(missing)}")
    if extra:
        detail.append(f"not lab folders: {', '.join(extra)}")
    if not detail:
        detail.append(f"lists {' → '.join(n[:6] for n in got)}")
    return Problem(
        where, f"{what} must follow folder order ({' → '.join(n[:6] for n in want)}): {'; '.join(detail)}"
    )


def check_lab_order(
    root: Path, phases: list[Phase], summary: str, graded: list[str] | None = None
) -> list[Problem]:
    """labs/README.md tables, lab titles, the sidebar (``summary``) and ``graded`` follow folder order.

    ``graded`` is the order ``course grade`` reports labs in (``phase/lab`` names).
    """
    problems: list[Problem] = []
    sidebar: dict[str, list[str]] = {}
    for line in summary.splitlines():
        m = SUMMARY_LINK_RE.match(line)
        lab = SUMMARY_LAB_RE.match(m.group(3)) if m else None
        if lab:
            sidebar.setdefault(lab.group(1), []).append(lab.group(2))
    for phase in phases:
        want = [lab.name for lab in phase.labs]
        if not want:
            continue
        base = phase.path.name
        readme = phase.path / "labs" / "README.md"
        if readme.is_file():
            got = readme_lab_order(readme.read_text(encoding="utf-8"))
            problem = _order_problem(f"{base}/labs/README.md", "the lab table", got, want)
            if problem:
                problems.append(problem)
        else:
            problems.append(Problem(f"{base}/labs/README.md", "missing: the phase's lab list in order"))
        on_site = [lab.name for lab in phase.labs if lab.readme.is_file()]
        problem = _order_problem(
            "SUMMARY.md (the sidebar)", f"phase {phase.number}'s labs", sidebar.get(base, []), on_site
        )
        if problem:
            problems.append(problem)
        for lab in phase.labs:
            title = first_heading(lab.readme) if lab.readme.is_file() else None
            m = LAB_TITLE_RE.match(title or "")
            folder = LAB_RE.match(lab.name).group(1)
            if m and int(m.group(1)) != int(folder):
                problems.append(
                    Problem(
                        f"{base}/labs/{lab.name}/README.md:1",
                        f"title says 'Lab {m.group(1)}' but the folder is lab {folder}",
                    )
                )
    if graded is not None:
        want = [f"{p.path.name}/{lab.name}" for p in phases for lab in p.labs]
        problem = _order_problem("course grade", "the graded labs", graded, want)
        if problem:
            problems.append(problem)
    return problems


def check_titles(summary: str) -> list[Problem]:
    """Every page in the sidebar has its own title; a phase's pages start with 'Phase NN · '."""
    problems: list[Problem] = []
    seen: dict[str, str] = {}
    for line in summary.splitlines():
        m = SUMMARY_LINK_RE.match(line)
        if not m or not m.group(3):  # draft chapters have no page, hence no title
            continue
        title, path = m.group(2).replace("\\[", "[").replace("\\]", "]"), m.group(3)
        if title in seen:
            problems.append(Problem(path, f"title {title!r} is also the title of {seen[title]}"))
        seen.setdefault(title, path)
        phase = PHASE_PAGE_RE.match(path)
        if phase and not title.startswith(f"Phase {phase.group(2)} · "):
            problems.append(
                Problem(path, f"title {title!r} must name its phase ('Phase {phase.group(2)} · …')")
            )
        elif phase and f"Phase {phase.group(2)}" in title[len(f"Phase {phase.group(2)} · ") :]:
            problems.append(
                Problem(path, f"title {title!r} names its phase twice: drop it from the page's heading")
            )
    return problems
