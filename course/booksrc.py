"""Generate the mdBook source tree (``build/book/src``) from the course pages.

Pages are copied to the same relative paths they have in the repository, with a few link
rewrites so the site works where GitHub would: a link to a folder goes to its ``README.md``, a
link into ``upstream/`` goes to the pinned commit on GitHub, a linked local file (a figure, a
``.py``) is copied next to the page, and a linked ``.md`` page that is not otherwise in the book
is added under "More pages". Each lab page ends with its ``starter.py``.

Only the site gains these (the repository's markdown stays plain): every ``path:line — Symbol``
citation into the pinned tree becomes a link to that line on GitHub; generated output blocks sit
in a ``course-output`` div (they wrap instead of scrolling); each phase gets a short overview
page that folds its pages in the sidebar; every title names its phase ("Phase 02 · Deep dive");
planned phases appear as draft chapters.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote, urlsplit

from course import PIN_COMMIT
from course.citations import COURSE_PREFIXES, OUTPUT_CLOSE, OUTPUT_OPEN_RE, PATH_LINE_RE
from course.discover import LAB_RE, PHASE_RE, PHASE_TITLES, find_phases, first_heading
from course.mdscan import fenced_lines

NOT_PUBLISHED = frozenset({"upstream", "build", ".venv", ".scratch", ".git", "node_modules"})
GITHUB_BLOB = f"https://github.com/vllm-project/vllm/blob/{PIN_COMMIT}/"
TITLE_SEP = " · "  # "Phase 02 · Deep dive": every page title names its phase
PHASE_DOCS = (
    ("00-guide.md", "Guide"),
    ("01-deep-dive.md", "Deep dive"),
    ("02-mini-build.md", "Mini build"),
    ("labs/README.md", "Labs"),
    ("EXERCISES.md", "Exercises"),
    ("INTERVIEW.md", "Interview questions"),
    ("CHEATSHEET.md", "Cheatsheet"),
)
START_PAGES = ("SETUP.md", "KEY_CONCEPTS.md", "UPSTREAM_PIN.md", "mini_vllm/README.md")
DIR_INDEXES = ("README.md", "00-guide.md")  # what a link to a folder opens
REFERENCE_PAGES = ("GLOSSARY.md", "CAREER.md", "TALKING_ABOUT_SERVING.md", "PUBLISHING.md", "CONTRIBUTING.md")

INLINE_LINK_RE = re.compile(r"(!?\[[^\]]*\]\(\s*<?)([^)\s>]+)(>?(?:\s+\"[^\"]*\")?\s*\))")
REF_DEF_RE = re.compile(r"^(\s{0,3}\[[^\]]+\]:\s*<?)(\S+?)(>?(?:\s+.*)?)$")
HTML_ATTR_RE = re.compile(r"""(\b(?:href|src)\s*=\s*["'])([^"']+)(["'])""")
CODE_SPAN_RE = re.compile(r"(`+)(?:.+?)\1")
OVERVIEW = "index.md"  # the generated per-phase overview page (site only)
OUTPUT_CLASS = "course-output"
DOC_BLURBS = {
    "00-guide.md": "the ideas, with worked numbers and pictures",
    "01-deep-dive.md": "the real vLLM source, in reading order, every citation checked",
    "02-mini-build.md": "what this phase adds to `mini_vllm`",
    "labs/README.md": "the labs, in the order to do them",
    "EXERCISES.md": "warm-up to staff-level design, with solution sketches",
    "INTERVIEW.md": "questions with model answers",
    "CHEATSHEET.md": "one page to keep open",
}


@dataclass
class BookSource:
    """What went into the book: chapters (repo-relative paths), copied files, citation links."""

    chapters: list[str] = field(default_factory=list)
    assets: set[str] = field(default_factory=set)
    summary: str = ""
    cited: int = 0  # citations turned into links to the pinned commit


def _title(path: Path, fallback: str) -> str:
    title = first_heading(path) or fallback
    return title.replace("[", "\\[").replace("]", "\\]")


def _is_excluded(rel: Path) -> bool:
    """Paths the site never publishes (generated, vendored or private); .ci/ and .github/ are fine."""
    return any(part in NOT_PUBLISHED or part.endswith(".egg-info") for part in rel.parts[:-1])


def _split_target(target: str) -> tuple[str, str]:
    path, _, fragment = target.partition("#")
    return path, ("#" + fragment if fragment else "")


class _Linker:
    """Rewrites one page's links and records what else the book needs."""

    def __init__(self, root: Path, page: str, chapters: set[str]) -> None:
        self.root = root.resolve()
        self.page_dir = (self.root / page).parent
        self.chapters = chapters
        self.assets: set[str] = set()
        self.extra_pages: set[str] = set()
        self.cited = 0

    def target(self, target: str) -> str:
        parts = urlsplit(target)
        if parts.scheme or parts.netloc or target.startswith(("#", "/")) or not parts.path:
            return target
        raw_path, fragment = _split_target(target)
        resolved = (self.page_dir / unquote(raw_path)).resolve()
        if not resolved.is_relative_to(self.root):
            return target
        rel = resolved.relative_to(self.root)
        if rel.parts and rel.parts[0] == "upstream":
            return GITHUB_BLOB + "/".join(rel.parts[1:]) + fragment
        if _is_excluded(rel):
            return target
        if resolved.is_dir():
            index = next((name for name in DIR_INDEXES if (resolved / name).is_file()), None)
            if index is None:
                return target
            raw_path = (raw_path.rstrip("/") + "/" + index).lstrip("/")
            resolved = resolved / index
            rel = resolved.relative_to(self.root)
        if not resolved.is_file():
            return target
        if resolved.suffix == ".md":
            if rel.as_posix() not in self.chapters:
                self.extra_pages.add(rel.as_posix())
        else:
            self.assets.add(rel.as_posix())
        return raw_path + fragment

    def rewrite(self, text: str) -> str:
        lines = text.split("\n")
        fenced = fenced_lines(lines)
        out: list[str] = []
        in_output = False
        for line, in_fence in zip(lines, fenced, strict=True):
            stripped = line.strip()
            if not in_fence and OUTPUT_OPEN_RE.match(stripped):
                in_output = True
                indent = line[: len(line) - len(line.lstrip())]
                out += [line, f'{indent}<div class="{OUTPUT_CLASS}">', ""]
                continue
            if in_output and stripped == OUTPUT_CLOSE:
                in_output = False
                out += ["", f"{indent}</div>", line]
                continue
            out.append(line if in_fence or in_output else self._rewrite_line(line))
        return "\n".join(out)

    def _rewrite_line(self, line: str) -> str:
        pieces = []
        last = 0
        # Where the author already wrote links: a citation inside one is left alone (no nesting).
        links = [(m.start(), m.end()) for m in INLINE_LINK_RE.finditer(line)]
        for m in CODE_SPAN_RE.finditer(line):
            pieces.append(self._rewrite_prose(line[last : m.start()], links, last))
            inside = any(a <= m.start() < b for a, b in links)
            pieces.append(m.group(0) if inside else self._link_code_span(m.group(0)))
            last = m.end()
        pieces.append(self._rewrite_prose(line[last:], links, last))
        return "".join(pieces)

    def _rewrite_prose(self, text: str, links: list[tuple[int, int]], offset: int) -> str:
        def sub(m: re.Match[str]) -> str:
            return m.group(1) + self.target(m.group(2)) + m.group(3)

        text = self._link_citations(text, links, offset)
        text = INLINE_LINK_RE.sub(sub, text)
        text = REF_DEF_RE.sub(sub, text)
        return HTML_ATTR_RE.sub(sub, text)

    def cite_url(self, path: str, line: int, end: int | None) -> str | None:
        """The GitHub URL for a citation into the pinned tree (None for course-local paths)."""
        path = path.removeprefix("upstream/")
        if path.startswith(COURSE_PREFIXES) or "/" not in path:
            return None
        self.cited += 1
        return f"{GITHUB_BLOB}{path}#L{line}" + (f"-L{end}" if end else "")

    def _link_code_span(self, span: str) -> str:
        """A code span holding a citation (`path:line — Symbol`) becomes a link to its first one."""
        m = PATH_LINE_RE.search(span)
        if not m:
            return span
        url = self.cite_url(m.group("path"), int(m.group("line")), _int(m.group("end")))
        return f"[{span}]({url})" if url else span

    def _link_citations(self, text: str, links: list[tuple[int, int]], offset: int) -> str:
        """Plain-text ``path:line`` citations into the pinned tree become links (``text`` starts at
        ``offset`` in its line; ``links`` are the line's existing links, left alone)."""
        pieces, last = [], 0
        for m in PATH_LINE_RE.finditer(text):
            if any(a <= offset + m.start() < b for a, b in links):
                continue
            url = self.cite_url(m.group("path"), int(m.group("line")), _int(m.group("end")))
            if url:
                pieces += [text[last : m.start()], f"[{m.group(0)}]({url})"]
                last = m.end()
        return "".join(pieces) + text[last:]


def _int(value: str | None) -> int | None:
    return int(value) if value else None


def edited_starters(root: Path) -> set[Path]:
    """Lab ``starter.py`` files whose text differs from git ``HEAD`` (a learner's work in progress)."""
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
        return set()
    if proc.returncode != 0:
        return set()
    return {(root / line[3:].strip()).resolve() for line in proc.stdout.splitlines() if line[:2].strip() == "M"}


def shipped_starter(starter: Path, root: Path, edited: set[Path] | None = None) -> str:
    """The ``starter.py`` the course ships (git ``HEAD``'s), never a learner's local edits.

    The site shows it and the site checks check it, so learner code can never fail ``make book``.
    """
    if edited is None:
        edited = edited_starters(root)
    if starter.resolve() in edited:
        rel = starter.resolve().relative_to(root.resolve()).as_posix()
        proc = subprocess.run(
            ["git", "show", f"HEAD:{rel}"], cwd=root, capture_output=True, text=True, check=False, timeout=30
        )
        if proc.returncode == 0:
            return proc.stdout
    return starter.read_text(encoding="utf-8")


def _hints_section(hints: Path) -> str:
    """The lab's code-level hints, folded: a reader opens them on purpose (``python -m course hint``)."""
    body = hints.read_text(encoding="utf-8")
    body = "\n".join(line for line in body.splitlines() if not line.startswith("# ")).strip("\n")
    body = body.replace("\n## ", "\n#### ")
    if body.startswith("## "):
        body = "#### " + body[3:]
    return (
        "\n\n---\n\n<details>\n<summary>Hints with code (they give the trick away; "
        "<code>python -m course hint</code> shows them one at a time)</summary>\n\n"
        f"{body}\n\n</details>\n"
    )


def _starter_section(starter: Path, root: Path | None = None, edited: set[Path] | None = None) -> str:
    code = (shipped_starter(starter, root, edited) if root else starter.read_text(encoding="utf-8")).rstrip("\n")
    fence = "```"
    while fence in code:
        fence += "`"
    return (
        "\n\n---\n\n## Starter code\n\n"
        "This is `starter.py` exactly as it ships: the file you edit. Every function marked "
        "`NotImplementedError` is yours to write; the tests above say when it is right.\n\n"
        f"{fence}python\n{code}\n{fence}\n"
    )


@dataclass(frozen=True)
class Entry:
    """One SUMMARY line: a part title, a page (label + repo path), a draft chapter or an overview."""

    kind: str  # "part" | "page" | "draft" | "overview"
    label: str
    path: str = ""
    depth: int = 0


def phase_label(number: str, what: str) -> str:
    return f"Phase {number}{TITLE_SEP}{what}"


def _plan(root: Path) -> tuple[list[Entry], set[str], dict[str, str]]:
    """The SUMMARY entries, the chapter paths, and the generated overview pages (path -> text)."""
    entries: list[Entry] = []
    overviews: dict[str, str] = {}

    def page(rel: str, label: str | None = None, depth: int = 0) -> None:
        if (root / rel).is_file():
            entries.append(Entry("page", label or _title(root / rel, Path(rel).stem), rel, depth))

    top_level = sorted(p.name for p in root.glob("*.md") if p.name != "README.md")
    known = set(START_PAGES) | set(REFERENCE_PAGES)
    entries.append(Entry("part", "Getting started"))
    for rel in START_PAGES:
        page(rel)
    written: set[str] = set()
    for phase in find_phases(root):
        if not PHASE_RE.match(phase.path.name):
            continue
        base = phase.path.name
        docs = [(doc, label) for doc, label in PHASE_DOCS if (phase.path / doc).is_file()]
        labs = [lab for lab in phase.labs if lab.readme.is_file()]  # folder order: the one lab order
        if not docs and not labs:
            continue
        if not written:
            entries.append(Entry("part", "Phases"))
        written.add(phase.number)
        overview = f"{base}/{OVERVIEW}"
        overviews[overview] = _overview(root, phase.number, phase.title, docs, [lab.readme for lab in labs])
        entries.append(Entry("overview", phase_label(phase.number, phase.title), overview))
        lab_pages = [
            (lab.readme.relative_to(root).as_posix(), phase_label(phase.number, _title(lab.readme, lab.name)))
            for lab in labs
        ]
        for doc, label in docs:
            page(f"{base}/{doc}", phase_label(phase.number, label), depth=1)
            if doc == "labs/README.md":
                for rel, label in lab_pages:
                    page(rel, label, depth=2)
        if lab_pages and not (phase.path / "labs" / "README.md").is_file():
            entries.append(Entry("draft", phase_label(phase.number, "Labs"), depth=1))
            for rel, label in lab_pages:
                page(rel, label, depth=2)
    planned = [n for n in PHASE_TITLES if n not in written]
    if planned:
        entries.append(Entry("part", "Planned phases"))
        entries += [Entry("draft", phase_label(n, PHASE_TITLES[n])) for n in planned]
    entries.append(Entry("part", "Reference"))
    for rel in REFERENCE_PAGES:
        page(rel)
    for name in top_level:
        if name not in known:
            page(name)
    chapters = {"README.md"} | {e.path for e in entries if e.kind == "page"}
    return entries, chapters, overviews


def _overview(root: Path, number: str, title: str, docs: list[tuple[str, str]], labs: list[Path]) -> str:
    """A phase's landing page on the site: its pages in reading order, its labs in folder order."""
    lines = [f"# {phase_label(number, title)}", "", "The pages of this phase, in the order to read them:", ""]
    for doc, label in docs:
        lines.append(f"- [{label}]({doc}) — {DOC_BLURBS.get(doc, '')}".rstrip(" —"))
    if labs:
        lines += ["", "Its labs, in the order to do them (the folder numbers are that order):", ""]
        for readme in labs:
            lines.append(f"1. [{_title(readme, readme.parent.name)}](labs/{readme.parent.name}/README.md)")
    return "\n".join(lines) + "\n"


def _summary(entries: list[Entry], extras: list[tuple[str, str]]) -> str:
    lines = ["# Summary", "", "[Course home](README.md)"]
    if extras:
        entries = entries + [Entry("part", "More pages")] + [Entry("page", t, p) for t, p in extras]
    previous_part = None
    for e in entries:
        if e.kind == "part":
            previous_part = e.label
            continue
        if previous_part is not None:
            lines += ["", f"# {previous_part}", ""]
            previous_part = None
        indent = "    " * e.depth
        lines.append(f"{indent}- [{e.label}]({e.path})")
    return "\n".join(lines) + "\n"


def generate(root: Path, src: Path) -> BookSource:
    """Write the book source for the course at ``root`` into ``src`` (replacing it)."""
    root = root.resolve()
    if not (root / "README.md").is_file():
        raise FileNotFoundError(f"{root}/README.md (the course home) is missing")
    entries, chapters, overviews = _plan(root)
    edited = edited_starters(root)
    shutil.rmtree(src, ignore_errors=True)
    src.mkdir(parents=True)
    source = BookSource()
    for rel, text in overviews.items():
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_text(text, encoding="utf-8")
        source.chapters.append(rel)
    pending = ["README.md"] + [e.path for e in entries if e.kind == "page"]
    extras: list[tuple[str, str]] = []
    done: set[str] = set()
    while pending:
        rel = pending.pop(0)
        if rel in done:
            continue
        done.add(rel)
        path = root / rel
        linker = _Linker(root, rel, chapters)
        text = linker.rewrite(path.read_text(encoding="utf-8"))
        if LAB_RE.match(path.parent.name) and (path.parent / "HINTS.md").is_file():
            text = text.rstrip("\n") + _hints_section(path.parent / "HINTS.md")
        if LAB_RE.match(path.parent.name) and (path.parent / "starter.py").is_file():
            text = text.rstrip("\n") + _starter_section(path.parent / "starter.py", root, edited)
        out = src / rel
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text, encoding="utf-8")
        source.chapters.append(rel)
        source.assets |= linker.assets
        source.cited += linker.cited
        for extra in sorted(linker.extra_pages - chapters):
            chapters.add(extra)
            extras.append((_title(root / extra, Path(extra).stem), extra))
            pending.append(extra)
    for asset in sorted(source.assets):
        target = src / asset
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(root / asset, target)
    source.summary = _summary(entries, extras)
    (src / "SUMMARY.md").write_text(source.summary, encoding="utf-8")
    return source
