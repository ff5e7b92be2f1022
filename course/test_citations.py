"""The citation checker: parsing, resolving against a tree, and the whole course against upstream/."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from course import ROOT
from course.citations import Citation, check_citation, check_files, parse_citations, run
from course.discover import markdown_files

POOL = '''"""A tiny stand-in for an upstream module."""

MAX_BLOCKS = 8


class Pool:
    size: int

    def __init__(self, n):
        self.free = list(range(n))

    def get_new_blocks(self, n):
        return [self.free.pop() for _ in range(n)]

    async def drain(self):
        pass


def helper():
    return Pool(1)


class Other:
    def get_new_blocks(self, n):
        return []
'''


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    upstream = tmp_path / "upstream"
    (upstream / "vllm").mkdir(parents=True)
    (upstream / "vllm" / "pool.py").write_text(POOL, encoding="utf-8")
    return upstream


def lines_of(text: str) -> dict[str, int]:
    """Line number of the first occurrence of each (stripped) line."""
    found: dict[str, int] = {}
    for i, line in enumerate(text.splitlines(), 1):
        found.setdefault(line.strip(), i)
    return found


def cite(path: str, line: int, symbol: str | None, sha: str | None = None) -> Citation:
    return Citation(Path("page.md"), 1, path, line, symbol, sha)


def one(text: str) -> Citation:
    found = parse_citations(text, Path("page.md"))
    assert len(found) == 1, f"expected one citation in {text!r}, found {found}"
    return found[0]


# ---------------------------------------------------------------- parsing


def test_parses_the_official_form_in_backticks():
    c = one("See `vllm/v1/core/block_pool.py:333 — BlockPool.get_new_blocks` for the allocator.")
    assert (c.path, c.line, c.symbol) == ("vllm/v1/core/block_pool.py", 333, "BlockPool.get_new_blocks")


def test_parses_leading_upstream_sha_and_call_parentheses():
    c = one("`upstream/vllm/v1/core/sched/scheduler.py:329@0decac0 — Scheduler.schedule()`")
    assert (c.path, c.line, c.sha, c.symbol) == (
        "vllm/v1/core/sched/scheduler.py",
        329,
        "0decac0",
        "Scheduler.schedule",
    )


def test_parses_hyphen_en_dash_and_parenthesised_symbols():
    assert one("at vllm/pool.py:12 - Pool.get_new_blocks here").symbol == "Pool.get_new_blocks"
    assert one("at `vllm/pool.py:12` – `get_new_blocks`").symbol == "get_new_blocks"
    assert one("at `vllm/pool.py:6` (Pool) here").symbol == "Pool"


def test_prose_after_a_dash_is_not_mistaken_for_a_symbol():
    c = one("the allocator lives at `vllm/pool.py:12` — the rest is bookkeeping")
    assert c.symbol is None, "a plain English word after a dash must not be read as the cited symbol"


def test_output_blocks_are_skipped_and_fences_only_count_full_citations():
    text = (
        "<!-- output: python x.py -->\n```text\nvllm/pool.py:999 — Nope\n```\n<!-- /output -->\n"
        "```\ntest_lab.py:12: AssertionError\nvllm/pool.py:12 — Pool.get_new_blocks\n```\n"
    )
    found = parse_citations(text, Path("page.md"))
    assert [(c.path, c.line) for c in found] == [("vllm/pool.py", 12)]


def test_urls_and_ports_are_not_citations():
    assert parse_citations("open http://localhost:3000/ and https://x.org/a.py#L3", Path("p.md")) == []


# ---------------------------------------------------------------- checking


def test_accepts_a_method_defined_within_three_lines(tree: Path):
    line = lines_of(POOL)["def get_new_blocks(self, n):"]
    for offset in (-3, 0, 3):
        assert (
            check_citation(cite("vllm/pool.py", line + offset, "Pool.get_new_blocks"), tree, tree.parent)
            is None
        )


def test_rejects_a_definition_more_than_three_lines_away_and_says_where_it_is(tree: Path):
    line = lines_of(POOL)["def get_new_blocks(self, n):"]
    reason = check_citation(cite("vllm/pool.py", line - 4, "Pool.get_new_blocks"), tree, tree.parent)
    assert reason and "not defined within ±3 lines" in reason and f"{line}" in reason


def test_method_must_be_inside_the_named_class(tree: Path):
    line = [i for i, text in enumerate(POOL.splitlines(), 1) if "def get_new_blocks" in text][-1]
    assert check_citation(cite("vllm/pool.py", line, "Other.get_new_blocks"), tree, tree.parent) is None
    reason = check_citation(cite("vllm/pool.py", line, "Pool.get_new_blocks"), tree, tree.parent)
    assert reason and "class Other" in reason


def test_accepts_classes_functions_async_defs_assignments_and_attributes(tree: Path):
    lines = lines_of(POOL)
    ok = [
        ("Pool", lines["class Pool:"]),
        ("helper", lines["def helper():"]),
        ("Pool.drain", lines["async def drain(self):"]),
        ("MAX_BLOCKS", lines["MAX_BLOCKS = 8"]),
        ("Pool.size", lines["size: int"]),
        ("Pool.free", lines["self.free = list(range(n))"]),
        ("pool.helper", lines["def helper():"]),  # module-qualified
    ]
    for symbol, line in ok:
        assert check_citation(cite("vllm/pool.py", line, symbol), tree, tree.parent) is None, symbol


def test_rejects_missing_file_line_past_end_and_foreign_commit(tree: Path):
    assert "does not exist" in check_citation(cite("vllm/nope.py", 1, "x"), tree, tree.parent)
    assert "past the end" in check_citation(cite("vllm/pool.py", 999, None), tree, tree.parent)
    assert "not the pinned commit" in check_citation(
        cite("vllm/pool.py", 6, "Pool", sha="1234567"), tree, tree.parent
    )


def test_cli_reports_page_and_line_and_exits_1(tree: Path, capsys: pytest.CaptureFixture[str]):
    root = tree.parent
    line = lines_of(POOL)["def get_new_blocks(self, n):"]
    (root / "good.md").write_text(f"`vllm/pool.py:{line} — Pool.get_new_blocks`\n", encoding="utf-8")
    args = argparse.Namespace(paths=[], upstream=tree, root=root, verbose=False)
    assert run(args) == 0
    (root / "bad.md").write_text(
        f"intro\n`vllm/pool.py:{line - 5} — Pool.get_new_blocks`\n", encoding="utf-8"
    )
    assert run(args) == 1
    out = capsys.readouterr().out
    assert "bad.md:2:" in out and "1 wrong" in out


# ---------------------------------------------------------------- the real tree


@pytest.mark.upstream(needs="tree")
def test_the_pinned_tree_accepts_333_and_rejects_312():
    upstream = ROOT / "upstream"
    good = cite("vllm/v1/core/block_pool.py", 333, "BlockPool.get_new_blocks")
    bad = cite("vllm/v1/core/block_pool.py", 312, "BlockPool.get_new_blocks")
    assert check_citation(good, upstream, ROOT) is None
    assert check_citation(bad, upstream, ROOT) is not None


@pytest.mark.upstream(needs="tree")
def test_every_citation_in_the_course_resolves():
    citations, failures = check_files(markdown_files(ROOT), ROOT / "upstream", ROOT)
    report = "\n".join(
        f"{f.citation.source.relative_to(ROOT)}:{f.citation.source_line}: `{f.citation}`: {f.reason}"
        for f in failures
    )
    assert not failures, (
        f"{len(failures)} of {len(citations)} citations do not resolve against upstream/:\n{report}"
    )
