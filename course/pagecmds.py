"""Every ``pytest`` command a course page prints must run what it says.

``python -m course.pagecmds`` finds the pytest commands in the pages (fenced blocks and inline
code), collects the tests they name in one ``pytest --collect-only`` run, and then applies each
command's own selection the way a learner's run would: its paths and node ids, its ``-k`` and
``-m`` expressions, and the root conftest's on-demand markers (``slow``, ``engine``: deselected
unless the command sets ``COURSE_SLOW=1`` / ``COURSE_ENGINE=1`` or its ``-m`` names them). A
command is wrong when it selects nothing, or when it deselects a test it names by node id.
Commands with placeholders (``<lab>``, ``…``, ``NN``) are skipped. Exit 1 with one line per
problem. ``course/test_pagecmds.py`` runs it.
"""

from __future__ import annotations

import os
import re
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path

from course import ROOT
from course.mdscan import fenced_lines

ON_DEMAND = {"slow": "COURSE_SLOW", "engine": "COURSE_ENGINE"}  # as in the root conftest.py
CMD_RE = re.compile(r"((?:[A-Z_]+=\S+\s+)*(?:\S*python3?\s+-m\s+)?pytest\b[^`#|;&\n]*)")
VALUE_OPTIONS = {"-k", "-m", "-p", "-o", "-c", "--rootdir", "--timeout", "--junitxml", "--maxfail", "-n"}
PLACEHOLDER = re.compile(r"<|>|…|\.\.\.|\bNN\b|\$|\{|\*")


@dataclass
class Command:
    page: str
    line: int
    text: str
    env: dict[str, str] = field(default_factory=dict)
    paths: list[str] = field(default_factory=list)
    keyword: str | None = None
    markexpr: str | None = None


def pages(root: Path) -> list[Path]:
    found = sorted(root.glob("phase-*/**/*.md")) + [root / n for n in ("README.md", "SETUP.md")]
    found += [root / "mini_vllm" / "README.md"]
    return [p for p in found if p.is_file() and "mutants" not in p.parts]


def parse(text: str, page: str, line: int) -> Command | None:
    """A command from its text, or None when it is not a runnable pytest line."""
    text = text.strip().rstrip("\\").strip()
    if PLACEHOLDER.search(text):
        return None
    try:
        words = shlex.split(text)
    except ValueError:
        return None
    cmd = Command(page, line, text)
    while words and re.fullmatch(r"[A-Z_]+=\S*", words[0]):
        key, _, value = words.pop(0).partition("=")
        cmd.env[key] = value
    if words and words[0].endswith(("python", "python3")):
        words = words[2:] if words[1:2] == ["-m"] else []
    if not words or words[0] != "pytest":
        return None
    args = words[1:]
    i = 0
    while i < len(args):
        arg = args[i]
        if arg in VALUE_OPTIONS:
            value = args[i + 1] if i + 1 < len(args) else ""
            if arg == "-k":
                cmd.keyword = value
            elif arg == "-m":
                cmd.markexpr = value
            i += 2
            continue
        if not arg.startswith("-"):
            cmd.paths.append(arg.rstrip("/"))
        i += 1
    return cmd if cmd.paths else None


def find_commands(root: Path = ROOT) -> list[Command]:
    commands = []
    for page in pages(root):
        lines = page.read_text(encoding="utf-8").splitlines()
        fenced = fenced_lines(lines)
        for number, (line, in_fence) in enumerate(zip(lines, fenced, strict=True), 1):
            chunks = [line] if in_fence else re.findall(r"`([^`]*pytest[^`]*)`", line)
            for chunk in chunks:
                for match in CMD_RE.finditer(chunk):
                    cmd = parse(match.group(1), str(page.relative_to(root)), number)
                    if cmd:
                        commands.append(cmd)
    return commands


def _wanted(marker: str, markexpr: str | None, env: dict[str, str]) -> bool:
    """The root conftest's on-demand rule, taken from the loaded conftest when there is one."""
    conftest = sys.modules.get("conftest")
    rule = getattr(conftest, "on_demand_wanted", None)
    if rule is not None:
        return rule(marker, markexpr or "", env)
    if env.get(ON_DEMAND[marker], "") not in ("", "0", "false", "False"):
        return True
    return marker in set(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", markexpr or "")) - {"and", "or", "not"}


def check(root: Path = ROOT) -> list[str]:
    """Problems, one line each (runs one ``pytest --collect-only`` in this process)."""
    import pytest
    from _pytest.mark import KeywordMatcher, MarkMatcher
    from _pytest.mark.expression import Expression

    commands = find_commands(root)
    problems = []
    paths = sorted({p.split("::")[0] for c in commands for p in c.paths})
    missing = [p for p in paths if not (root / p).exists()]
    for c in commands:
        for p in c.paths:
            if p.split("::")[0] in missing:
                problems.append(f"{c.page}:{c.line}: `{c.text}` names {p}, which does not exist")
    paths = [p for p in paths if p not in missing]

    class Grab:
        items: list = []

        def pytest_collection_finish(self, session):
            Grab.items = list(session.items)

    os.environ.update({"COURSE_SLOW": "1", "COURSE_ENGINE": "1"})  # collect the on-demand tests too
    grab = Grab()
    code = pytest.main(
        ["--collect-only", "-qq", "-p", "no:cacheprovider", "--rootdir", str(root), *paths], [grab]
    )
    if code not in (0, 5):
        problems.append(f"pytest --collect-only failed (exit {code}) on the paths the pages name")
    items = [(item.nodeid, item) for item in Grab.items]
    for c in commands:
        named = [p for p in c.paths if p.split("::")[0] not in missing]
        chosen = [
            (nid, item)
            for nid, item in items
            if any(nid == p or nid.startswith(p + "::") or nid.startswith(p + "/") for p in named)
        ]
        selected = []
        dropped = []
        for nid, item in chosen:
            ok = True
            if c.keyword and not Expression.compile(c.keyword).evaluate(KeywordMatcher.from_item(item)):
                ok = False
            if c.markexpr and not Expression.compile(c.markexpr).evaluate(
                MarkMatcher.from_markers(item.iter_markers())
            ):
                ok = False
            for marker in ON_DEMAND:
                if item.get_closest_marker(marker) and not _wanted(marker, c.markexpr, c.env):
                    ok = False
            (selected if ok else dropped).append(nid)
        if named and not selected:
            problems.append(f"{c.page}:{c.line}: `{c.text}` selects no test")
        for p in named:
            if "::" in p and any(nid == p or nid.startswith(p + "[") for nid in dropped):
                problems.append(f"{c.page}:{c.line}: `{c.text}` names {p} but deselects it")
    return problems


def main() -> int:
    problems = check(ROOT)
    for line in problems:
        print(line)
    print(f"pagecmds: {len(find_commands(ROOT))} pytest commands in the pages, {len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
