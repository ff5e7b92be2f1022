"""Glossary checks: every glossary link in the course lands on an entry, and every term a
phase introduces in a "New words" line is a link to an entry with a definition and a
Chinese term.

An entry is a table row of GLOSSARY.md that starts with an explicit anchor::

    | <a id="kv-cache"></a>**KV cache** | KV 缓存 | The stored keys and values ... |
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from course import ROOT

ENTRY = re.compile(r'^\|\s*<a id="([a-z0-9-]+)"></a>\*\*(.+?)\*\*[^|]*\|([^|]*)\|([^|]*)\|')
LINK = re.compile(r"\[([^\]]+)\]\(([^)\s]*GLOSSARY\.md)(?:#([^)\s]*))?\)")
NEW_WORDS = re.compile(r"New words:?\*{0,2}:?(.*)$")
CJK = re.compile(r"[\u3400-\u9fff]")
SKIP_DIRS = {".venv", "upstream", "build", ".scratch", ".git", "node_modules"}


@dataclass(frozen=True)
class Entry:
    anchor: str
    term: str
    chinese: str
    definition: str


@dataclass(frozen=True)
class Problem:
    where: str
    what: str

    def __str__(self) -> str:
        return f"{self.where}: {self.what}"


def anchor_for(term: str) -> str:
    """The course's anchor rule: lowercase, every run of non-alphanumerics becomes one '-'."""
    return re.sub(r"[^a-z0-9]+", "-", term.lower()).strip("-")


def parse_glossary(path: Path) -> dict[str, Entry]:
    entries: dict[str, Entry] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        m = ENTRY.match(line)
        if m:
            anchor, term, chinese, definition = (g.strip() for g in m.groups())
            entries[anchor] = Entry(anchor, term, chinese, definition)
    return entries


def course_markdown(root: Path) -> list[Path]:
    """Every Markdown file of the course, pruning virtualenvs, build output and upstream/."""
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS and not d.startswith("."))
        out += [Path(dirpath) / f for f in sorted(filenames) if f.endswith(".md")]
    return out


def check(root: Path = ROOT) -> list[Problem]:
    glossary = root / "GLOSSARY.md"
    problems: list[Problem] = []
    entries = parse_glossary(glossary)
    seen: dict[str, int] = {}
    for line_no, line in enumerate(glossary.read_text(encoding="utf-8").splitlines(), 1):
        m = ENTRY.match(line)
        if not m:
            continue
        e = entries[m.group(1)]
        where = f"GLOSSARY.md:{line_no}"
        if e.anchor in seen:
            problems.append(Problem(where, f"anchor #{e.anchor} defined twice (also line {seen[e.anchor]})"))
        seen[e.anchor] = line_no
        if len(e.definition) < 20:
            problems.append(Problem(where, f"entry #{e.anchor} has no real definition"))
        if not CJK.search(e.chinese):
            problems.append(Problem(where, f"entry #{e.anchor} has no Chinese term"))
    for md in course_markdown(root):
        rel = md.relative_to(root)
        for line_no, line in enumerate(md.read_text(encoding="utf-8").splitlines(), 1):
            where = f"{rel}:{line_no}"
            for text, target, anchor in LINK.findall(line):
                if (md.parent / target).resolve() != glossary.resolve():
                    problems.append(Problem(where, f"glossary link [{text}] points at {target}, not the course GLOSSARY.md"))
                elif anchor and anchor not in entries:
                    problems.append(Problem(where, f"[{text}] links to GLOSSARY.md#{anchor}, which has no entry"))
            m = NEW_WORDS.search(line)
            if m and "🆕" in line and line.lstrip().startswith(">"):
                rest = m.group(1)
                linked = LINK.findall(rest)
                if not linked:
                    problems.append(Problem(where, "a New words line with no glossary links"))
                leftover = LINK.sub("", rest)
                leftover = re.sub(r"[\s,;·.*_()/&—–-]+|\band\b", "", leftover)
                if leftover:
                    problems.append(Problem(where, f"New words term(s) without a glossary link: {leftover[:60]!r}"))
                for text, _target, anchor in linked:
                    if not anchor:
                        problems.append(Problem(where, f"New word [{text}] links to GLOSSARY.md without an #anchor"))
    return problems


def main(argv: list[str] | None = None) -> int:
    problems = check()
    for p in problems:
        print(p)
    n = len(parse_glossary(ROOT / "GLOSSARY.md"))
    print(f"glossary: {n} entries, {len(problems)} problem(s)")
    return 1 if problems else 0
