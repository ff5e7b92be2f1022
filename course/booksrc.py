"""Generate the mdBook source tree (``build/book/src``) from the course pages.

Pages are copied to the same relative paths they have in the repository, with a few link
rewrites so the site works where GitHub would: a link to a folder goes to its ``README.md``, a
link into ``upstream/`` goes to the pinned commit on GitHub, a linked local file (a figure, a
``.py``) is copied next to the page, and a linked ``.md`` page that is not otherwise in the book
is added under "More pages". Each lab page ends with its ``starter.py``.
"""

from __future__ import annotations

import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote, urlsplit

from course import PIN_COMMIT
from course.discover import LAB_RE, PHASE_RE, find_phases, first_heading
from course.mdscan import fenced_lines

NOT_PUBLISHED = frozenset({"upstream", "build", ".venv", ".scratch", ".git", "node_modules"})
GITHUB_BLOB = f"https://github.com/vllm-project/vllm/blob/{PIN_COMMIT}/"
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


@dataclass
class BookSource:
    """What went into the book: chapters (repo-relative paths) and copied files."""

    chapters: list[str] = field(default_factory=list)
    assets: set[str] = field(default_factory=set)
    summary: str = ""


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
        return "\n".join(
            line if in_fence else self._rewrite_line(line)
            for line, in_fence in zip(lines, fenced, strict=True)
        )

    def _rewrite_line(self, line: str) -> str:
        pieces = []
        last = 0
        for m in CODE_SPAN_RE.finditer(line):
            pieces.append(self._rewrite_prose(line[last : m.start()]))
            pieces.append(m.group(0))
            last = m.end()
        pieces.append(self._rewrite_prose(line[last:]))
        return "".join(pieces)

    def _rewrite_prose(self, text: str) -> str:
        def sub(m: re.Match[str]) -> str:
            return m.group(1) + self.target(m.group(2)) + m.group(3)

        text = INLINE_LINK_RE.sub(sub, text)
        text = REF_DEF_RE.sub(sub, text)
        return HTML_ATTR_RE.sub(sub, text)


def _starter_section(starter: Path) -> str:
    code = starter.read_text(encoding="utf-8").rstrip("\n")
    fence = "```"
    while fence in code:
        fence += "`"
    return (
        "\n\n---\n\n## Starter code\n\n"
        "This is `starter.py` exactly as it ships: the file you edit. Every function marked "
        "`NotImplementedError` is yours to write; the tests above say when it is right.\n\n"
        f"{fence}python\n{code}\n{fence}\n"
    )


def _plan(root: Path) -> tuple[list[tuple[str, str, int]], set[str]]:
    """The SUMMARY entries: (kind, text-or-path, depth) with kind part / page / draft."""
    entries: list[tuple[str, str, int]] = []

    def page(rel: str, label: str | None = None, depth: int = 0) -> None:
        if (root / rel).is_file():
            entries.append(("page", f"{label or _title(root / rel, Path(rel).stem)}\t{rel}", depth))

    top_level = sorted(p.name for p in root.glob("*.md") if p.name != "README.md")
    known = set(START_PAGES) | set(REFERENCE_PAGES)
    entries.append(("part", "Getting started", 0))
    for rel in START_PAGES:
        page(rel)
    for phase in find_phases(root):
        if not PHASE_RE.match(phase.path.name):
            continue
        base = phase.path.name
        docs = [(doc, label) for doc, label in PHASE_DOCS if (phase.path / doc).is_file()]
        lab_readmes = sorted(
            p for p in phase.path.glob("labs/lab-*/README.md") if LAB_RE.match(p.parent.name)
        )
        if not docs and not lab_readmes:
            continue
        entries.append(("part", f"Phase {phase.number} — {phase.title}", 0))
        for doc, label in docs:
            page(f"{base}/{doc}", label)
            if doc == "labs/README.md":
                for readme in lab_readmes:
                    page(readme.relative_to(root).as_posix(), depth=1)
        if lab_readmes and not (phase.path / "labs" / "README.md").is_file():
            entries.append(("draft", "Labs", 0))
            for readme in lab_readmes:
                page(readme.relative_to(root).as_posix(), depth=1)
    entries.append(("part", "Reference", 0))
    for rel in REFERENCE_PAGES:
        page(rel)
    for name in top_level:
        if name not in known:
            page(name)
    chapters = {"README.md"} | {e[1].split("\t")[1] for e in entries if e[0] == "page"}
    return entries, chapters


def _summary(entries: list[tuple[str, str, int]], extras: list[tuple[str, str]]) -> str:
    lines = ["# Summary", "", "[Course home](README.md)"]
    if extras:
        entries = entries + [("part", "More pages", 0)] + [("page", f"{t}\t{p}", 0) for t, p in extras]
    previous_part = None
    for kind, text, depth in entries:
        if kind == "part":
            previous_part = text
            continue
        if previous_part is not None:
            lines += ["", f"# {previous_part}", ""]
            previous_part = None
        indent = "    " * depth
        if kind == "draft":
            lines.append(f"{indent}- [{text}]()")
        else:
            label, rel = text.split("\t")
            lines.append(f"{indent}- [{label}]({rel})")
    return "\n".join(lines) + "\n"


def generate(root: Path, src: Path) -> BookSource:
    """Write the book source for the course at ``root`` into ``src`` (replacing it)."""
    root = root.resolve()
    if not (root / "README.md").is_file():
        raise FileNotFoundError(f"{root}/README.md (the course home) is missing")
    entries, chapters = _plan(root)
    shutil.rmtree(src, ignore_errors=True)
    src.mkdir(parents=True)
    source = BookSource()
    pending = ["README.md"] + [e[1].split("\t")[1] for e in entries if e[0] == "page"]
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
        if LAB_RE.match(path.parent.name) and (path.parent / "starter.py").is_file():
            text = text.rstrip("\n") + _starter_section(path.parent / "starter.py")
        out = src / rel
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text, encoding="utf-8")
        source.chapters.append(rel)
        source.assets |= linker.assets
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
