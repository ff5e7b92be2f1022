"""The book's page checks catch each slip they exist for, and pass the clean form of it."""

from __future__ import annotations

from pathlib import Path

from course import bookcheck
from course.discover import find_phases
from course.linkcheck import check_pinned
from course.sitestyle import code_columns

LIMIT = code_columns()


def messages(text: str) -> list[str]:
    return [str(p) for p in bookcheck.check_page(text, "page.md")]


def test_a_line_starting_with_plus_is_flagged_outside_code_only():
    text = "The sum is 68\n+ 7 x 4 = 96.\n\n> quoted\n> + also a bullet\n\n```text\n+ fine in code\n```\n"
    found = messages(text)
    assert [m.split(": ")[0] for m in found] == ["page.md:2", "page.md:5"], found
    assert "becomes a bullet" in found[0]
    assert messages("The sum is 68 +\n7 x 4 = 96.\n") == []


def test_a_code_line_wider_than_the_column_fails_and_one_that_fits_passes():
    fits, overflows = "x" * LIMIT, "x" * (LIMIT + 1)
    assert messages(f"```text\n{fits}\n```\n") == []
    found = messages(f"```text\n{overflows}\n```\n")
    assert len(found) == 1 and f"{LIMIT + 1} columns; at most {LIMIT}" in found[0], found
    assert messages(f"{overflows}\n") == [], "prose wraps; only code lines are measured"


def test_code_width_counts_wide_characters_twice_and_nesting_narrows_the_column():
    assert bookcheck.display_width("块表") == 4
    cjk = "块" * (LIMIT // 2 + 1)
    assert messages(f"```text\n{cjk}\n```\n"), "East Asian wide characters take two columns"
    nested = "x" * (code_columns(1) + 1)
    assert messages(f"- an item\n\n  ```text\n  {nested}\n  ```\n"), "a fence in a list item has less room"
    aside = "x" * (code_columns(1, in_aside=True) + 1)
    assert messages(f"> ```text\n> {aside}\n> ```\n"), "a fence in a blockquote has the prose width"
    assert not messages(f"> ```text\n> {aside[:-1]}\n> ```\n")


def test_generated_output_blocks_are_exempt_because_they_wrap():
    long = "y" * (LIMIT + 20)
    block = f"<!-- output: python solution.py -->\n```text\n{long}\n```\n<!-- /output -->\n"
    assert messages(block) == []
    assert messages(block + f"```text\n{long}\n```\n"), "the exemption ends with the output block"


def test_emoji_are_flagged_and_ordinary_symbols_are_not():
    found = messages("> **🔬 Going deeper** and a ⭐ phase\n")
    assert len(found) == 1 and "MICROSCOPE" in found[0] and "WHITE MEDIUM STAR" in found[0], found
    assert messages("→ ← ≈ ≤ ─ │ █ ▁ ✓ 块\n") == []


def make_phase(root: Path, labs: dict[str, str], table: list[str]) -> None:
    """A phase with lab folders (name -> title) and a labs/README.md table listing ``table``."""
    base = root / "phase-02-paged-attention" / "labs"
    for name, title in labs.items():
        (base / name).mkdir(parents=True)
        (base / name / "test_lab.py").write_text("")
        (base / name / "README.md").write_text(f"# {title}\n")
    rows = "\n".join(f"| {i} | [{n}]({n}/README.md) |" for i, n in enumerate(table, 1))
    (base / "README.md").write_text(f"# Labs\n\n| Order | Lab |\n|---|---|\n{rows}\n")


LABS = {
    "lab-01-alloc": "Lab 01 — Alloc",
    "lab-02-share": "Lab 02 — Share",
    "lab-03-kernel": "Lab 03 — Kernel",
}
SIDEBAR = "\n".join(f"        - [x](phase-02-paged-attention/labs/{n}/README.md)" for n in LABS)
GRADED = [f"phase-02-paged-attention/{n}" for n in LABS]


def order_problems(root: Path, summary: str = SIDEBAR, graded: list[str] = GRADED) -> list[str]:
    return [str(p) for p in bookcheck.check_lab_order(root, find_phases(root), summary, graded)]


def test_lab_order_passes_when_table_titles_sidebar_and_grader_follow_the_folders(tmp_path: Path):
    make_phase(tmp_path, LABS, list(LABS))
    assert order_problems(tmp_path) == []


def test_a_lab_table_in_another_order_fails(tmp_path: Path):
    make_phase(tmp_path, LABS, ["lab-01-alloc", "lab-03-kernel", "lab-02-share"])
    found = order_problems(tmp_path)
    assert len(found) == 1 and found[0].startswith("phase-02-paged-attention/labs/README.md: the lab table")
    assert "lists lab-01 → lab-03 → lab-02" in found[0], found


def test_a_lab_missing_from_the_table_fails(tmp_path: Path):
    make_phase(tmp_path, LABS, ["lab-01-alloc", "lab-02-share"])
    assert "missing lab-03-kernel" in order_problems(tmp_path)[0]


def test_a_title_numbered_differently_from_its_folder_fails(tmp_path: Path):
    make_phase(tmp_path, {**LABS, "lab-03-kernel": "Lab 05 — Kernel"}, list(LABS))
    assert order_problems(tmp_path) == [
        "phase-02-paged-attention/labs/lab-03-kernel/README.md:1: title says 'Lab 05' but the folder is lab 03"
    ]


def test_a_sidebar_or_grader_in_another_order_fails(tmp_path: Path):
    make_phase(tmp_path, LABS, list(LABS))
    swapped = "\n".join(reversed(SIDEBAR.splitlines()))
    assert (
        "SUMMARY.md (the sidebar): phase 02's labs must follow folder order"
        in order_problems(tmp_path, swapped)[0]
    )
    assert order_problems(tmp_path, graded=GRADED[::-1])[0].startswith("course grade: the graded labs")


def test_titles_must_be_unique_and_name_their_phase():
    summary = """\
- [Setup](SETUP.md)
- [Phase 02 · Guide](phase-02-x/00-guide.md)
- [Deep dive](phase-02-x/01-deep-dive.md)
- [Phase 02 · Guide](phase-02-x/labs/README.md)
- [Phase 08 · Planned]()
- [Phase 02 · Lab 01 — Phase 02: blocks](phase-02-x/labs/lab-01-y/README.md)
"""
    found = [str(p) for p in bookcheck.check_titles(summary)]
    assert found == [
        "phase-02-x/01-deep-dive.md: title 'Deep dive' must name its phase ('Phase 02 · …')",
        "phase-02-x/labs/README.md: title 'Phase 02 · Guide' is also the title of phase-02-x/00-guide.md",
        "phase-02-x/labs/lab-01-y/README.md: title 'Phase 02 · Lab 01 — Phase 02: blocks' names its phase "
        "twice: drop it from the page's heading",
    ]


PIN = "https://github.com/vllm-project/vllm/blob/abc/"


def test_a_citation_link_must_land_on_a_line_of_a_file_in_upstream(tmp_path: Path):
    (tmp_path / "vllm" / "v1").mkdir(parents=True)
    (tmp_path / "vllm" / "v1" / "pool.py").write_text("a = 1\nb = 2\nc = 3\n")
    assert check_pinned(PIN + "vllm/v1/pool.py#L3", PIN, tmp_path) is None
    assert check_pinned(PIN + "vllm/v1/pool.py#L2-L3", PIN, tmp_path) is None
    assert check_pinned(PIN + "vllm/v1/pool.py#L4", PIN, tmp_path) == "vllm/v1/pool.py has 3 lines, no line 4"
    assert (
        check_pinned(PIN + "vllm/v1/pool.py#L1-L9", PIN, tmp_path) == "vllm/v1/pool.py has 3 lines, no line 9"
    )
    assert "does not exist in upstream/" in check_pinned(PIN + "vllm/v1/gone.py#L1", PIN, tmp_path)
    assert "not a line anchor" in check_pinned(PIN + "vllm/v1/pool.py#top", PIN, tmp_path)
    assert "run `make upstream`" in check_pinned(PIN + "vllm/v1/pool.py#L1", PIN, tmp_path / "missing"), (
        "without the tree the check must fail, never skip"
    )


def test_a_learners_long_line_in_starter_never_fails_the_site(tmp_path: Path):
    import subprocess

    from course.booksrc import shipped_starter

    lab = tmp_path / "phase-00-x" / "labs" / "lab-01-y"
    lab.mkdir(parents=True)
    shipped = 'def f():\n    raise NotImplementedError("write f")\n'
    (lab / "starter.py").write_text(shipped)
    (lab / "README.md").write_text("# Lab 01\n")
    for args in (
        ["init", "-q"],
        ["add", "."],
        ["-c", "user.email=a@b", "-c", "user.name=a", "commit", "-qm", "x"],
    ):
        subprocess.run(["git", *args], cwd=tmp_path, check=True, capture_output=True)
    (lab / "starter.py").write_text("def f():\n    return " + "1 + " * 60 + "1\n")  # the learner's work
    rel = "phase-00-x/labs/lab-01-y/README.md"
    assert bookcheck.check_pages(tmp_path, [rel]) == [], (
        "the site checks the shipped starter, not the learner's"
    )
    assert shipped_starter(lab / "starter.py", tmp_path) == shipped
