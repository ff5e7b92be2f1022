"""Check every internal link and ``#anchor`` in a built mdBook site.

Only the page content (inside ``<main>``) is checked, so theme chrome never produces noise.
An anchor is valid when the target page has an element with that ``id`` (mdBook's heading ids
and explicit ``id="..."`` attributes alike) or a ``name``. Links to the pinned vLLM commit on
GitHub (``…/blob/<sha>/<path>#L<line>``, which every citation becomes) are checked offline against
``upstream/``: the file exists and has that line. Other external ``http(s)`` links, ``mailto:``
and friends are not checked.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

SKIP_PAGES = frozenset({"print.html", "404.html", "toc.html", "index.html"})
EXTERNAL_SCHEMES = ("http", "https", "mailto", "tel", "javascript", "data", "ftp")
NO_TREE = "upstream/ is missing"
LINE_FRAGMENT_RE = re.compile(r"^L(\d+)(?:-L(\d+))?$")


@functools.lru_cache(maxsize=1024)
def _line_count(path: Path) -> int:
    with path.open("rb") as fh:
        return sum(1 for _ in fh)


def check_pinned(href: str, prefix: str, upstream: Path | None) -> str | None:
    """Why a link to the pinned commit (``prefix`` + path + ``#L12``) is broken, or None."""
    path, _, fragment = href[len(prefix) :].partition("#")
    if upstream is None or not (upstream / "vllm").is_dir():
        return f"{NO_TREE}, so links into the pinned tree cannot be checked: run `make upstream`"
    target = upstream / unquote(path)
    if not target.is_file():
        return f"{path} does not exist in upstream/ at the pin"
    if fragment:
        m = LINE_FRAGMENT_RE.match(fragment)
        if not m:
            return f"#{fragment} is not a line anchor (#L12 or #L12-L20)"
        count = _line_count(target)
        for number in filter(None, m.groups()):
            if not 1 <= int(number) <= count:
                return f"{path} has {count} lines, no line {number}"
    return None


class _PageParser(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.ids: set[str] = set()
        self.links: list[str] = []
        self._main_depth = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = dict(attrs)
        for key in ("id", "name"):
            if values.get(key):
                self.ids.add(values[key] or "")
        if tag == "main":
            self._main_depth += 1
        elif self._main_depth:
            for key in ("href", "src"):
                if values.get(key) is not None and tag in ("a", "img", "link", "script", "source", "iframe"):
                    self.links.append(values[key] or "")

    def handle_endtag(self, tag: str) -> None:
        if tag == "main" and self._main_depth:
            self._main_depth -= 1


@dataclass(frozen=True)
class BrokenLink:
    page: str  # html page, relative to the site root
    href: str
    reason: str

    @property
    def source(self) -> str:
        """The markdown page the link came from (book layout mirrors the repository)."""
        return self.page[: -len(".html")] + ".md" if self.page.endswith(".html") else self.page


def _parse(path: Path, cache: dict[Path, _PageParser]) -> _PageParser:
    if path not in cache:
        parser = _PageParser()
        parser.feed(path.read_text(encoding="utf-8", errors="replace"))
        cache[path] = parser
    return cache[path]


def check_site(site: Path, upstream: Path | None = None, pinned: str = "") -> tuple[int, list[BrokenLink]]:
    """Check a built site; returns (links checked, broken links).

    With ``pinned`` (a URL prefix such as ``https://github.com/vllm-project/vllm/blob/<sha>/``),
    links starting with it are checked against the ``upstream`` tree.
    """
    site = site.resolve()
    cache: dict[Path, _PageParser] = {}
    broken: list[BrokenLink] = []
    checked = 0
    for page in sorted(site.rglob("*.html")):
        rel_page = page.relative_to(site).as_posix()
        if rel_page in SKIP_PAGES:
            continue
        parsed = _parse(page, cache)
        for href in parsed.links:
            parts = urlsplit(href)
            if pinned and href.startswith(pinned):
                checked += 1
                reason = check_pinned(href, pinned, upstream)
                if reason:
                    broken.append(BrokenLink(rel_page, href, reason))
                continue
            if parts.scheme in EXTERNAL_SCHEMES or parts.netloc or href.startswith("//"):
                continue
            checked += 1
            target = page if not parts.path else (page.parent / unquote(parts.path))
            if parts.path.endswith("/") or target.is_dir():
                target = target / "index.html"
            target = target.resolve()
            if not target.is_relative_to(site):
                broken.append(BrokenLink(rel_page, href, "points outside the site"))
                continue
            if not target.is_file():
                broken.append(
                    BrokenLink(rel_page, href, f"no such page or file: {target.relative_to(site).as_posix()}")
                )
                continue
            fragment = unquote(parts.fragment)
            if fragment and target.suffix == ".html" and fragment not in _parse(target, cache).ids:
                where = target.relative_to(site).as_posix()
                broken.append(BrokenLink(rel_page, href, f"{where} has no anchor #{fragment}"))
    return checked, broken
