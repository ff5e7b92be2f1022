"""Check every ``path:line — Symbol`` citation in the course against the pinned tree.

A citation is ``path:line`` (``path`` relative to ``upstream/``; a leading ``upstream/`` is
accepted, and so is ``@<sha>`` after the line if the sha is the pin's) followed by
`` — Symbol``, `` – Symbol``, `` - Symbol`` or `` (Symbol)``. ``Symbol`` is ``name``,
``Class.method`` or ``Class.attr`` (a trailing ``()`` is fine). The checker requires that:

* the file exists in ``upstream/`` (paths under ``mini_vllm/``, ``course/`` or ``phase-NN-…/``
  resolve against the course itself) and has that line;
* the symbol's last component is *defined* within ±3 lines: ``def``/``async def``/``class``,
  ``NAME =``, ``NAME:`` (annotated) or ``self.NAME =`` (for non-Python files: the name occurs);
* for ``Class.member`` the definition sits inside ``class Class`` (the nearest enclosing class).

A bare ``path:line`` (no symbol) is still checked for the file and the line.
Generated output blocks are skipped; inside other code fences only full citations count.
"""

from __future__ import annotations

import argparse
import functools
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from course import PIN_COMMIT, ROOT
from course.discover import markdown_files, rel
from course.mdscan import fenced_lines
from course.pydefs import FUNCTION_LOCAL, MODULE, definitions

WINDOW = 3
COURSE_PREFIXES = ("mini_vllm/", "course/", "phase-")
EXTENSIONS = (
    "py",
    "pyi",
    "h",
    "hpp",
    "cuh",
    "cu",
    "cpp",
    "c",
    "json",
    "yaml",
    "yml",
    "toml",
    "jinja",
    "sh",
    "txt",
    "md",
)

PATH_LINE_RE = re.compile(
    r"(?<![\w./-])(?P<tick>`?)"
    r"(?P<path>(?:[\w.-]+/)*[\w.-]+\.(?:" + "|".join(EXTENSIONS) + r"))"
    r":(?P<line>\d+)(?:[-–](?P<end>\d+))?(?:@(?P<sha>[0-9a-f]{7,40}))?(?![\w:])"
)
SYMBOL_RE = re.compile(
    r"(?P<close>`)?(?:\s+[—–-]\s+|\s*\()(?P<open>`)?"
    r"(?P<symbol>[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)(?P<call>\(\))?(?P<end>`)?"
)
OUTPUT_OPEN_RE = re.compile(r"^<!-- output: .* -->\s*$")
OUTPUT_CLOSE = "<!-- /output -->"


@dataclass(frozen=True)
class Citation:
    """One citation found in a markdown page."""

    source: Path  # the markdown file
    source_line: int
    path: str  # as written (minus a leading "upstream/")
    line: int
    symbol: str | None
    sha: str | None
    end: int | None = None  # last line of a range citation (path:12-20)

    def __str__(self) -> str:
        sym = f" — {self.symbol}" if self.symbol else ""
        return f"{self.path}:{self.line}{sym}"


def parse_citations(text: str, source: Path) -> list[Citation]:
    """All citations in a markdown text, skipping generated output blocks."""
    found = []
    lines = text.splitlines()
    fenced = fenced_lines(lines)
    in_output = False
    for number, (line, in_fence) in enumerate(zip(lines, fenced, strict=True), 1):
        stripped = line.strip()
        if not in_fence and OUTPUT_OPEN_RE.match(stripped):
            in_output = True
            continue
        if in_output:
            in_output = stripped != OUTPUT_CLOSE
            continue
        for m in PATH_LINE_RE.finditer(line):
            symbol = _symbol_after(m, line)
            if in_fence and not symbol:
                continue
            path = m.group("path")
            path = path.removeprefix("upstream/")
            end = int(m.group("end")) if m.group("end") else None
            found.append(Citation(source, number, path, int(m.group("line")), symbol, m.group("sha"), end))
    return found


def _symbol_after(m: re.Match[str], line: str) -> str | None:
    """The symbol a ``path:line`` match is followed by, if it is one.

    In the official form (one code span: ``path:line — Symbol`` inside backticks) any identifier counts.
    Elsewhere the word must look like code (dotted, snake_case, CamelCase, a call or backticked),
    so prose such as "at block_pool.py:333 — the allocator" is read as a bare citation.
    """
    s = SYMBOL_RE.match(line, m.end())
    if not s:
        return None
    symbol = s.group("symbol")
    one_span = bool(m.group("tick")) and not s.group("close") and not s.group("open") and bool(s.group("end"))
    backticked = bool(s.group("open") and s.group("end"))
    codeish = "." in symbol or "_" in symbol or symbol != symbol.lower() or bool(s.group("call"))
    return symbol if (one_span or backticked or codeish) else None


def _definition_re(name: str, python: bool) -> re.Pattern[str]:
    if not python:
        return re.compile(rf"\b{re.escape(name)}\b")
    n = re.escape(name)
    return re.compile(rf"^\s*(?:(?:async\s+)?def\s+{n}\b|class\s+{n}\b|(?:self\.)?{n}\s*(?::|=(?!=)))")


@functools.lru_cache(maxsize=512)
def _lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8", errors="replace").splitlines()


def check_citation(cite: Citation, upstream: Path, course_root: Path) -> str | None:
    """Why the citation is wrong, or None when it resolves."""
    if cite.sha and not PIN_COMMIT.startswith(cite.sha):
        return f"@{cite.sha} is not the pinned commit {PIN_COMMIT[:7]}"
    base = course_root if cite.path.startswith(COURSE_PREFIXES) else upstream
    target = base / cite.path
    if not target.is_file():
        where = "the course" if base is course_root else "upstream/"
        hint = ""
        if base is upstream and cite.path.startswith(("tests/", "csrc/", "docs/", "examples/")):
            hint = " (the wheel-route tree has no tests/, csrc/, docs/ or examples/: cite files it has)"
        elif base is upstream and "/" not in cite.path:
            hint = " (write the full path relative to upstream/, e.g. vllm/v1/core/block_pool.py)"
        return f"file {cite.path} does not exist in {where}{hint}"
    lines = _lines(target)
    for number in (cite.line, cite.end or cite.line):
        if not 1 <= number <= len(lines):
            return f"line {number} is past the end of {cite.path} ({len(lines)} lines)"
    if not cite.symbol:
        return None
    parts = cite.symbol.split(".")
    if target.suffix in (".py", ".pyi") and _quick_accept(cite, lines, parts):
        return None
    defs = definitions(target) if target.suffix in (".py", ".pyi") else None
    if defs is None:
        return _check_text(cite, lines, parts)
    name = parts[-1]
    named = [d for d in defs if d.name == name]
    near = sorted(
        (d for d in named if abs(d.line - cite.line) <= WINDOW), key=lambda d: abs(d.line - cite.line)
    )
    if not near:
        where = sorted({d.line for d in named})
        hint = (
            f" (defined at line {', '.join(map(str, where[:5]))})" if where else " (not defined in this file)"
        )
        return f"{name!r} is not defined within ±{WINDOW} lines of {cite.line}{hint}"
    if len(parts) == 1:
        return None
    owner = parts[-2]
    module_names = set(Path(cite.path).with_suffix("").parts)
    if any(d.owner == owner or (d.owner is MODULE and owner in module_names) for d in near):
        return None
    found = near[0].owner
    inside = (
        "module level"
        if found is MODULE
        else ("a function body" if found == FUNCTION_LOCAL else f"class {found}")
    )
    return f"{name!r} near line {cite.line} is defined in {inside}, not inside class {owner}"


def _quick_accept(cite: Citation, lines: list[str], parts: list[str]) -> bool:
    """Fast line-based check: a definition within the window, inside the named class if any.

    Only ever accepts; anything it cannot confirm goes to the exact ``ast`` check, which also
    explains the failure.
    """
    pattern = _definition_re(parts[-1], python=True)
    lo, hi = max(1, cite.line - WINDOW), min(len(lines), cite.line + WINDOW)
    hits = [i for i in range(lo - 1, hi) if pattern.search(lines[i])]
    if not hits or len(parts) == 1:
        return bool(hits)
    return any(_enclosing_class(lines, i) == parts[-2] for i in hits)


def _enclosing_class(lines: list[str], index: int) -> str | None:
    """The nearest ``class`` above ``lines[index]`` that is less indented (through enclosing defs)."""
    indent = len(lines[index]) - len(lines[index].lstrip())
    for text in reversed(lines[:index]):
        stripped = text.lstrip()
        level = len(text) - len(stripped)
        if not stripped or level >= indent:
            continue
        if stripped.startswith("class "):
            return stripped[6:].split("(")[0].split(":")[0].strip()
        if stripped.startswith(("def ", "async def ")):
            if level == 0:
                return None
            indent = level  # a nested def: keep climbing towards its class
    return None


def _check_text(cite: Citation, lines: list[str], parts: list[str]) -> str | None:
    """Fallback for non-Python files (and unparsable ones): a line-based look for the name."""
    name = parts[-1]
    pattern = _definition_re(name, python=cite.path.endswith((".py", ".pyi")))
    lo, hi = max(1, cite.line - WINDOW), min(len(lines), cite.line + WINDOW)
    if any(pattern.search(lines[i]) for i in range(lo - 1, hi)):
        return None
    elsewhere = [i + 1 for i, text in enumerate(lines) if pattern.search(text)]
    hint = f" (found at line {', '.join(map(str, elsewhere[:5]))})" if elsewhere else " (not in this file)"
    return f"{name!r} is not defined within ±{WINDOW} lines of {cite.line}{hint}"


@dataclass(frozen=True)
class Failure:
    citation: Citation
    reason: str


def check_files(files: list[Path], upstream: Path, course_root: Path) -> tuple[list[Citation], list[Failure]]:
    citations: list[Citation] = []
    failures: list[Failure] = []
    for md in files:
        for cite in parse_citations(md.read_text(encoding="utf-8", errors="replace"), md):
            citations.append(cite)
            reason = check_citation(cite, upstream, course_root)
            if reason:
                failures.append(Failure(cite, reason))
    return citations, failures


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "citations",
        help="verify every path:line — Symbol citation against upstream/",
        description="Find citations (`path:line — Symbol`) in the course markdown and check each against "
        "the pinned tree: the file and line exist and the symbol is defined within ±3 lines.",
    )
    p.add_argument(
        "paths", nargs="*", metavar="PATH", help="markdown files or folders (default: the whole course)"
    )
    p.add_argument(
        "--upstream", type=Path, default=ROOT / "upstream", help="the pinned tree (default: upstream/)"
    )
    p.add_argument("--root", type=Path, default=ROOT, help=argparse.SUPPRESS)
    p.add_argument("-v", "--verbose", action="store_true", help="list every citation checked")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    upstream: Path = args.upstream
    if not (upstream / "vllm").is_dir():
        print(
            f"error: {upstream} has no vllm/ tree: run `make upstream` (python -m course upstream) first",
            file=sys.stderr,
        )
        return 2
    try:
        files = markdown_files(args.root, args.paths)
    except FileNotFoundError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    citations, failures = check_files(files, upstream, args.root)
    if args.verbose:
        for cite in citations:
            print(f"  {rel(cite.source, args.root)}:{cite.source_line}: {cite}")
    for fail in failures:
        cite = fail.citation
        print(f"{rel(cite.source, args.root)}:{cite.source_line}: `{cite}`: {fail.reason}")
    pages = len({c.source for c in citations})
    status = "FAIL" if failures else "ok"
    print(
        f"citations: {status}: {len(citations)} checked in {pages} page(s) of {len(files)} scanned, "
        f"{len(failures)} wrong"
    )
    return 1 if failures else 0
