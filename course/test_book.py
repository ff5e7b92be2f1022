"""The website builder: a tiny synthetic course builds with mdBook; broken links, anchors and
citation links into the pinned tree fail it, and so do the page checks of ``course.bookcheck``."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from course import book
from course.linkcheck import check_site

GUIDE = """# Phase 00 guide

[Course home](../README.md) · [Glossary entry](../GLOSSARY.md#kv-cache) · [labs](labs/) ·
[section](#02-dont-panic) · [the allocator](../upstream/vllm/v1/core/block_pool.py)

The pool hands out blocks in `vllm/v1/core/block_pool.py:3 — BlockPool.get_new_blocks`; the
free list is vllm/v1/core/block_pool.py:1 — BlockPool, and `mini_vllm/block_pool.py:1 — BlockPool`
stays plain (it is ours).

![a figure](labs/lab-01-demo/figure.png)

## 0.2 Don't Panic

{extra}
"""


def write_course(root: Path, extra: str = "") -> Path:
    files = {
        "README.md": "# vLLM Mastery\n\nStart with [Phase 00](phase-00-foundations/00-guide.md) or "
        "[the glossary](GLOSSARY.md).\n",
        "SETUP.md": "# Setup\n\nBack [home](README.md).\n",
        "GLOSSARY.md": '# Glossary\n\n<a id="kv-cache"></a>\n**KV cache** — stored keys and values.\n',
        "phase-00-foundations/00-guide.md": GUIDE.format(extra=extra),
        "phase-00-foundations/labs/README.md": "# Labs\n\n| Order | Lab |\n|---|---|\n| 1 | [Lab 01](lab-01-demo/README.md) |\n",
        "phase-00-foundations/labs/lab-01-demo/README.md": "# Lab 01 — Demo [CPU-OK]\n\nRun [the tests](test_lab.py); "
        "[a mutant](mutants/off_by_one.py); [CI](../../../.ci/run).\n",
        "phase-00-foundations/labs/lab-01-demo/mutants/off_by_one.py": "def add(a, b):\n    return a + b + 1\n",
        ".ci/run": "#!/usr/bin/env bash\n",
        "phase-00-foundations/labs/lab-01-demo/starter.py": 'def add(a, b):\n    raise NotImplementedError("sum them")\n',
        "phase-00-foundations/labs/lab-01-demo/test_lab.py": "from course.runtime import lab_module\n",
        "upstream/vllm/v1/core/block_pool.py": "class BlockPool:\n\n    def get_new_blocks(self, n):\n        pass\n",
    }
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text, encoding="utf-8")
    (root / "phase-00-foundations/labs/lab-01-demo/figure.png").write_bytes(b"\x89PNG\r\n\x1a\n")
    return root


@pytest.fixture(scope="module", autouse=True)
def need_mdbook():
    try:
        book.find_mdbook()
    except FileNotFoundError as exc:
        pytest.skip(str(exc))


def build(root: Path) -> tuple[int, str]:
    import contextlib
    import io

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        code = book.run(argparse.Namespace(root=root, serve=False, port=0))
    return code, buf.getvalue()


@pytest.fixture(scope="module")
def good(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int, str]:
    root = write_course(tmp_path_factory.mktemp("good"))
    return (root, *build(root))


def test_a_clean_course_builds_with_links_checked(good):
    root, code, out = good
    assert code == 0, out
    html = root / "build/book/html"
    assert (html / "index.html").is_file() and (html / "README.html").is_file(), (
        "README pages keep their name"
    )
    assert (html / "searchindex.json").is_file() or list(html.glob("searchindex*.js")), (
        "search must be enabled"
    )
    assert (root / "book.toml").read_text().count('src = "build/book/src"') == 1


def test_summary_folds_each_phase_names_pages_by_phase_and_shows_the_starter(good):
    root, _, _ = good
    summary = (root / "build/book/src/SUMMARY.md").read_text()
    assert "- [Phase 00 · Foundations](phase-00-foundations/index.md)" in summary, (
        "a folding chapter per phase"
    )
    assert "    - [Phase 00 · Guide](phase-00-foundations/00-guide.md)" in summary, "titles name their phase"
    assert (
        "        - [Phase 00 · Lab 01 — Demo \\[CPU-OK\\]](phase-00-foundations/labs/lab-01-demo/README.md)"
        in summary
    )
    assert "# Planned phases" in summary and "- [Phase 19 · Capstone — Maintainer & Startup]()" in summary
    toml = (root / "book.toml").read_text()
    assert "[output.html.fold]" in toml and "additional-css" in toml
    lab = (root / "build/book/src/phase-00-foundations/labs/lab-01-demo/README.md").read_text()
    assert "## Starter code" in lab and 'raise NotImplementedError("sum them")' in lab


def test_links_are_adapted_for_the_site(good):
    root, _, _ = good
    guide = (root / "build/book/src/phase-00-foundations/00-guide.md").read_text()
    assert "(labs/README.md)" in guide, "a link to a folder should open its README"
    assert (
        "https://github.com/vllm-project/vllm/blob/0decac0d96c42b49572498019f0a0e3600f50398/vllm/v1/core/block_pool.py"
        in guide
    )
    pin = "https://github.com/vllm-project/vllm/blob/0decac0d96c42b49572498019f0a0e3600f50398/"
    assert (
        f"[`vllm/v1/core/block_pool.py:3 — BlockPool.get_new_blocks`]({pin}vllm/v1/core/block_pool.py#L3)"
        in guide
    )
    assert f"[vllm/v1/core/block_pool.py:1]({pin}vllm/v1/core/block_pool.py#L1) — BlockPool" in guide
    assert "`mini_vllm/block_pool.py:1 — BlockPool`\nstays plain" in guide, "course paths are not linked"
    original = (root / "phase-00-foundations/00-guide.md").read_text()
    assert "github.com" not in original, "the repository's markdown stays plain"
    assert (root / "build/book/html/phase-00-foundations/labs/lab-01-demo/figure.png").is_file()
    for linked in (
        "phase-00-foundations/labs/lab-01-demo/test_lab.py",
        ".ci/run",
        "phase-00-foundations/labs/lab-01-demo/mutants/off_by_one.py",
    ):
        assert (root / "build/book/html" / linked).is_file(), f"linked file {linked} should be published"


@pytest.fixture(scope="module")
def broken(tmp_path_factory: pytest.TempPathFactory) -> tuple[int, str]:
    root = write_course(
        tmp_path_factory.mktemp("broken"),
        extra="See [the missing page](01-deep-dive.md) and [a typo](../GLOSSARY.md#kv-cahce).\n\n"
        "The pool is `vllm/v1/core/block_pool.py:40 — BlockPool`, past the file's end.\n\n"
        "The sum is 68\n+ 3 decodes.",
    )
    return build(root)


def test_a_broken_link_fails_the_build_naming_page_and_target(broken):
    code, out = broken
    assert code == 1
    assert (
        "phase-00-foundations/00-guide.md: broken link `01-deep-dive.md`: "
        "phase-00-foundations/01-deep-dive.md does not exist"
    ) in out


def test_a_broken_anchor_fails_the_build(broken):
    code, out = broken
    assert code == 1
    assert (
        "phase-00-foundations/00-guide.md: broken link `../GLOSSARY.md#kv-cahce`: GLOSSARY.md has no anchor #kv-cahce"
        in out
    )


def test_link_checker_sees_heading_ids_and_explicit_ids(tmp_path: Path):
    (tmp_path / "a.html").write_text(
        '<main><h2 id="intro">x</h2><a href="b.html#here">b</a>'
        '<a href="#intro">i</a><a href="https://example.com/#nope">e</a></main>'
    )
    (tmp_path / "b.html").write_text('<main><span id="here"></span><a href="a.html#gone">a</a></main>')
    checked, bad = check_site(tmp_path)
    assert checked == 3
    assert [(b.page, b.href) for b in bad] == [("b.html", "a.html#gone")]


def test_a_citation_link_past_the_end_of_the_file_fails_the_build(broken):
    code, out = broken
    assert code == 1
    assert "vllm/v1/core/block_pool.py#L40`: vllm/v1/core/block_pool.py has 4 lines, no line 40" in out, out


def test_a_page_check_problem_fails_the_build_naming_the_line(broken):
    _, out = broken
    assert "phase-00-foundations/00-guide.md:19: a line starting with '+ ' becomes a bullet" in out, out


def test_citations_already_inside_a_link_are_left_alone(tmp_path: Path):
    from course.booksrc import GITHUB_BLOB, _Linker

    linker = _Linker(tmp_path, "page.md", set())
    cite = "vllm/v1/core/block_pool.py:130"
    assert linker._rewrite_line(f"[`{cite} — BlockPool`](https://example.com)") == (
        f"[`{cite} — BlockPool`](https://example.com)"
    )
    assert linker._rewrite_line(f"[the pool at {cite}](https://example.com)") == (
        f"[the pool at {cite}](https://example.com)"
    )
    assert linker._rewrite_line(f"{cite}-140 (BlockPool)") == (
        f"[{cite}-140]({GITHUB_BLOB}vllm/v1/core/block_pool.py#L130-L140) (BlockPool)"
    ), "a range citation links the range"
    assert linker.cited == 1


def test_search_leaves_out_output_blocks_code_and_reference_tables():
    from course.book import strip_for_search

    page = (
        "# Title\n\nProse with `allocate_slots`.\n\n"
        '<!-- output: python x.py -->\n<div class="course-output">\n\n```text\n42 blocks\n```\n\n</div>\n'
        "<!-- /output -->\n\n```python\nkth = 1\n```\n\n"
        "| mini | upstream |\n|---|---|\n| a | `v/a.py:1 — A` |\n| b | `v/b.py:2 — B` |\n\n"
        "| Test | checks |\n|---|---|\n| `test_x` | x |\n\n"
        "| Lab | what |\n|---|---|\n| 01 | blocks |\n"
    )
    out = strip_for_search(page)
    assert "allocate_slots" in out and "# Title" in out and "| 01 | blocks |" in out
    assert "42 blocks" not in out and "kth = 1" not in out
    assert "v/a.py" not in out and "test_x" not in out


def test_slim_index_keeps_words_drops_breadcrumbs_and_numbers():
    import json

    from course.book import SEARCH_PREFIX, SEARCH_SUFFIX, TEASER_CHARS, slim_index_js

    def node(docs=None, **children):
        return {"docs": docs or {}, "df": len(docs or {}), **children}

    data = {
        "search_options": {
            "fields": {"body": {"boost": 1}, "breadcrumbs": {"boost": 1}, "title": {"boost": 2}}
        },
        "index": {
            "fields": ["body", "breadcrumbs", "title"],
            "index": {
                "body": {
                    "root": node(
                        k=node(v=node({"3": {"tf": 1.4142135623730951}, "1": {"tf": 1.0}})),
                        **{"4": node({"1": {"tf": 1.0}})},
                    )
                },
                "breadcrumbs": {"root": node(p=node({"1": {"tf": 1.0}}))},
                "title": {"root": node()},
            },
            "documentStore": {
                "docs": {
                    "1": {"body": "it's a \\ path", "breadcrumbs": "Phase » kv"},
                    "3": {"body": "word " * 200, "breadcrumbs": "Phase » kv"},
                }
            },
        },
    }
    raw = json.dumps(data).replace("\\", "\\\\").replace("'", "\\'")
    out = slim_index_js(SEARCH_PREFIX + raw + SEARCH_SUFFIX)
    import re

    back = json.loads(
        re.sub(r"\\(.)", r"\1", out.strip()[len(SEARCH_PREFIX) : -len(SEARCH_SUFFIX)], flags=re.S)
    )
    index = back["index"]
    assert "breadcrumbs" not in index["index"] and "breadcrumbs" not in back["search_options"]["fields"]
    assert index["fields"] == ["body", "title"]
    body = index["index"]["body"]["root"]
    assert body["k"]["v"]["docs"] == {"3": {"tf": 1.4}, "1": {"tf": 1}} and "4" not in body, (
        "words stay (weights to one decimal, whole ones as integers), numbers go"
    )
    docs = index["documentStore"]["docs"]
    assert docs["1"]["body"] == "it's a \\ path", "the JS escapes round-trip"
    assert docs["3"]["body"].endswith("word …") and len(docs["3"]["body"]) <= TEASER_CHARS + 2, (
        "a long section's stored text is cut at a word boundary"
    )
