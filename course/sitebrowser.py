"""The built website in a real browser: Debian's Chromium driven by Playwright's Python client.

Not part of the CPU suite (its name does not match ``test_*.py``): CI runs it as its own stage,
``python -m pytest course/sitebrowser.py`` (``make browser-test``). It builds the book, serves it
on localhost and checks what a reader would notice: the home page loads without a console error,
a lab page shows its starter, a key-concept card opens, a search for "block table" finds pages
named by phase, citations link to the pinned commit, code fits the column at 1400 px, no table is
cut off and no fixed arrow covers the content at 1400 px, the sidebar folds, a 400 px page never
scrolls sideways, and a multi-panel figure stacks its panels at 400 px (and only there).

The browser is the system one (``COURSE_CHROMIUM``, else ``chromium`` on PATH); Playwright never
downloads its own. Without one it skips with the reason on a laptop, and fails in CI (``CI`` or
``COURSE_STRICT`` set), so the stage can never pass by skipping. Set
``COURSE_SCREENSHOTS=docs/screenshots`` to (re)write the committed screenshots.
"""

from __future__ import annotations

import functools
import http.server
import os
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from course import ROOT
from course.book import build
from course.booksrc import GITHUB_BLOB

# Building the book and starting Chromium can take a while on a loaded 2-core runner.
pytestmark = pytest.mark.timeout(240)

TRUTHY = ("1", "true", "yes")
LAB_PAGE = "phase-02-paged-attention/labs/lab-01-block-allocator/README.html"
DEEP_DIVE = "phase-02-paged-attention/01-deep-dive.html"
NARROW_PAGES = ("GLOSSARY.html", LAB_PAGE, DEEP_DIVE, "phase-04-attention-backends/00-guide.html")
WIDE_CODE_PAGES = (
    "phase-04-attention-backends/00-guide.html",
    "phase-07-gemm-and-moe-kernels/00-guide.html",
    LAB_PAGE,
)


def must_not_skip() -> bool:
    return any(os.environ.get(name, "").lower() in TRUTHY for name in ("CI", "COURSE_STRICT"))


def find_chromium() -> str | None:
    explicit = os.environ.get("COURSE_CHROMIUM")
    if explicit:
        return explicit if Path(explicit).is_file() else None
    return next(filter(None, map(shutil.which, ("chromium", "chromium-browser", "google-chrome"))), None)


def unavailable(reason: str) -> None:
    if must_not_skip():
        pytest.fail(f"browser test cannot run in CI: {reason}", pytrace=False)
    pytest.skip(reason)


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        unavailable("the `playwright` Python package is missing (pip install -e '.[dev]')")
    executable = find_chromium()
    if executable is None:
        unavailable("no Chromium found (apt-get install chromium, or set COURSE_CHROMIUM=/path/to/chrome)")
    with sync_playwright() as pw:
        chromium = pw.chromium.launch(executable_path=executable, args=["--no-sandbox"])
        yield chromium
        chromium.close()


@pytest.fixture(scope="module")
def site() -> Iterator[str]:
    """Build the book and serve it; yields the base URL."""
    _, html = build(ROOT)
    handler = functools.partial(_QuietHandler, directory=str(html))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


def open_page(browser, url: str, width: int = 1400):
    """A fresh page at ``url`` that records console errors and uncaught exceptions."""
    page = browser.new_page(viewport={"width": width, "height": 900})
    page.errors = []
    page.on("console", lambda msg: page.errors.append(msg.text) if msg.type == "error" else None)
    page.on("pageerror", lambda exc: page.errors.append(str(exc)))
    page.goto(url, wait_until="load")
    return page


def screenshot(page, name: str) -> None:
    folder = os.environ.get("COURSE_SCREENSHOTS")
    if folder:
        Path(folder).mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(Path(folder) / name))


def test_home_loads_without_console_errors(browser, site):
    page = open_page(browser, site + "index.html")
    assert "vLLM Mastery" in page.title()
    assert page.locator("main h1").first.is_visible()
    assert page.errors == [], f"console errors on the home page: {page.errors}"
    page.close()


def test_sidebar_folds_and_names_pages_by_phase(browser, site):
    page = open_page(browser, site + "index.html")
    sidebar = page.locator("#mdbook-sidebar, nav.sidebar").first
    lab_link = sidebar.locator(f'a[href$="{LAB_PAGE}"]').first
    assert not lab_link.is_visible(), "on the home page the phases are folded: no lab entry shows"
    assert sidebar.get_by_text("Phase 02 · PagedAttention").first.is_visible()
    assert sidebar.get_by_text("Phase 08 · Speculative Decoding").first.is_visible(), (
        "planned phases show as drafts"
    )
    page.close()
    page = open_page(browser, site + LAB_PAGE)
    assert page.title().startswith("Phase 02 · Lab 01"), page.title()
    link = page.locator(f'#mdbook-sidebar a[href$="{LAB_PAGE}"], nav.sidebar a[href$="{LAB_PAGE}"]').first
    assert link.is_visible(), "the current page's phase unfolds"
    following = page.locator("a.nav-chapters.next, a.mobile-nav-chapters.next").first.get_attribute("href")
    assert "labs/lab-02-" in following, (
        f"the next arrow should lead to lab 02 (folder order), not {following}"
    )
    page.close()


def test_a_lab_page_shows_its_starter(browser, site):
    page = open_page(browser, site + LAB_PAGE)
    heading = page.locator("main h2#starter-code")
    assert heading.is_visible(), "the lab page should end with its starter code"
    starter = page.locator("main pre code", has_text="NotImplementedError").last
    assert starter.is_visible()
    assert "class BlockPool" in starter.inner_text()
    assert page.errors == [], page.errors
    screenshot(page, "lab-page-with-starter.png")
    heading.scroll_into_view_if_needed()
    screenshot(page, "lab-page-starter-code.png")
    page.close()


def test_a_key_concept_card_opens(browser, site):
    page = open_page(browser, site + "KEY_CONCEPTS.html")
    card = page.locator("main details").first
    assert card.get_attribute("open") is None
    card.locator("summary").click()
    assert card.get_attribute("open") is not None
    assert card.locator("p").first.is_visible(), "an opened card shows its text"
    card.scroll_into_view_if_needed()
    screenshot(page, "key-concepts-card-open.png")
    page.close()


def test_search_for_block_table_returns_phase_named_results(browser, site):
    page = open_page(browser, site + "index.html")
    page.locator("#mdbook-search-toggle").click()
    page.locator("#mdbook-searchbar").fill("block table")
    results = page.locator("#mdbook-searchresults li")
    results.first.wait_for(state="visible", timeout=10_000)
    texts = results.all_inner_texts()
    named = [t for t in texts if t.lstrip().startswith("Phase ")]
    assert len(named) >= 3, f"expected results naming their phase, got: {[t[:60] for t in texts]}"
    pages = {t.split("\n")[0].rsplit("»", 1)[0].strip() for t in named}  # "Phase 02 · … » Phase 02 · Guide"
    assert len(pages) >= 3, f"results from different pages should read differently: {pages}"
    screenshot(page, "search-block-table.png")
    page.close()


def test_citations_link_to_the_pinned_commit(browser, site):
    page = open_page(browser, site + DEEP_DIVE)
    links = page.locator(f'main a[href^="{GITHUB_BLOB}"]')
    assert links.count() > 20, "a deep dive's citations should link to the pinned commit"
    href = links.first.get_attribute("href")
    assert "#L" in href, href
    links.first.scroll_into_view_if_needed()
    page.evaluate("window.scrollBy(0, -200)")
    screenshot(page, "deep-dive-linked-citations.png")
    page.close()


def overflowing_code(page) -> list[str]:
    return page.evaluate(
        """() => [...document.querySelectorAll('main pre > code')]
            .filter(c => !c.closest('.course-output') && c.scrollWidth > c.clientWidth + 1)
            .map(c => c.textContent.split('\\n').find(l => l.length > 100) || c.textContent.slice(0, 80))"""
    )


def test_no_code_line_is_cut_off_at_1400_px(browser, site):
    for rel in WIDE_CODE_PAGES:
        page = open_page(browser, site + rel, width=1400)
        assert overflowing_code(page) == [], f"{rel}: code wider than the column"
        page.close()


TABLE_PAGES = tuple(
    f"{phase.name}/01-deep-dive.html"
    for phase in sorted(ROOT.glob("phase-*"))
    if (phase / "01-deep-dive.md").is_file()
)


def test_no_table_is_cut_off_at_1400_px(browser, site):
    cut = {}
    for rel in TABLE_PAGES:
        page = open_page(browser, site + rel, width=1400)
        wide = page.evaluate(
            """() => [...document.querySelectorAll('main .table-wrapper')]
                .filter(w => w.scrollWidth > w.clientWidth + 1)
                .map(w => `${w.scrollWidth} px in ${w.clientWidth}: ${w.innerText.slice(0, 60)}`)"""
        )
        if wide:
            cut[rel] = wide
        page.close()
    assert not cut, f"tables wider than the column at 1400 px (they need a sideways scroll): {cut}"


def test_no_fixed_arrow_covers_the_content_at_1400_px(browser, site):
    for rel in ("phase-12-structured-outputs/01-deep-dive.html", LAB_PAGE):
        page = open_page(browser, site + rel, width=1400)
        covering = page.evaluate(
            """() => { const m = document.querySelector('main').getBoundingClientRect();
                return [...document.querySelectorAll('a.nav-chapters, .nav-wide-wrapper a')]
                  .filter(a => getComputedStyle(a).display !== 'none' && a.offsetParent !== null)
                  .map(a => a.getBoundingClientRect())
                  .filter(r => r.width > 0 && r.left < m.right && r.right > m.left)
                  .map(r => [Math.round(r.left), Math.round(r.right)]); }"""
        )
        assert covering == [], f"{rel}: previous/next arrows over the content at 1400 px: {covering}"
        nxt = page.locator("a.mobile-nav-chapters.next").first
        assert nxt.is_visible(), f"{rel}: the arrows at the foot of the page replace the side ones"
        page.close()


FIGURE_PAIRS = [
    ("phase-09-sampling-and-decoding-algorithms/00-guide.html", "sampling_knobs"),
    ("phase-07-gemm-and-moe-kernels/00-guide.html", "expert_load"),
]


def _shown(page, name):
    """[visible wide, visible narrow, narrow's shown width, its natural width, page width, viewport]."""
    return page.evaluate(
        """(name) => { const pick = (f) => document.querySelector(`main .checkbox-label > img[src$="/${f}"]`);
            const wide = pick(name + '.svg'), narrow = pick(name + '.narrow.svg');
            const seen = (i) => i.getBoundingClientRect().width > 0;
            return [seen(wide), seen(narrow), Math.round(narrow.getBoundingClientRect().width),
                    narrow.naturalWidth, document.documentElement.scrollWidth,
                    document.documentElement.clientWidth]; }""",
        name,
    )


@pytest.mark.parametrize("rel,name", FIGURE_PAIRS)
def test_a_multi_panel_figure_stacks_its_panels_at_400_px(browser, site, rel, name):
    page = open_page(browser, site + rel, width=400)
    wide, narrow, width, natural, page_width, viewport = _shown(page, name)
    assert narrow and not wide, (
        f"{rel} at 400 px: {name}.narrow.svg (the stacked panels) must show and {name}.svg must not "
        f"(shown: wide {wide}, narrow {narrow}); the narrow one goes right after the wide one"
    )
    assert width >= min(natural, 330), f"the stacked {name} shows {width} px wide (natural {natural})"
    assert page_width <= viewport, f"{rel} scrolls sideways at 400 px"
    page.close()
    page = open_page(browser, site + rel, width=1400)
    wide, narrow, *_ = _shown(page, name)
    assert wide and not narrow, f"{rel} at 1400 px: only the side-by-side {name}.svg shows"
    page.close()


def test_a_400_px_page_does_not_scroll_sideways(browser, site):
    for rel in NARROW_PAGES:
        page = open_page(browser, site + rel, width=400)
        width = page.evaluate(
            "() => [document.documentElement.scrollWidth, document.documentElement.clientWidth]"
        )
        assert width[0] <= width[1], (
            f"{rel} scrolls sideways at 400 px: {width[0]} px of content in {width[1]}"
        )
        page.close()
