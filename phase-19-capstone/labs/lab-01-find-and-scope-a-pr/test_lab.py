from pathlib import Path

import pytest

from course.runtime import lab_module

lab = lab_module(__file__)  # solution.py by default; LAB_IMPL=starter grades starter.py

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
SHA = "0decac0d96c42b49572498019f0a0e3600f50398"
GOOD = {
    "Issue": "#12345 — the widget drops its seed",
    "Reproduced at": SHA,
    "Cause": "`vllm/widget.py:3 — spin` reads the seed after the batch is built.\nSo mixed batches lose it.",
    "Fix sketch": "read it first (`vllm/widget.py:7 — Widget`).",
    "Test plan": "tests/test_widget.py — a mixed batch, assert equal tokens",
    "Blast radius": "LoRA, spec",
    "Out of scope": "the GPU path",
    "Open questions": "1. Is the order intended?\n2. Backport?",
}


@pytest.fixture
def tree(tmp_path):
    (tmp_path / "vllm").mkdir()
    (tmp_path / "vllm" / "widget.py").write_text(
        "import os\n\ndef spin(x):\n    return x\n\n\nclass Widget:\n    pass\n"
    )
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_widget.py").write_text("def test_it():\n    pass\n")
    return tmp_path


def plan(**change):
    fields = {**GOOD, **change}
    return "# Plan\n\n" + "\n\n".join(f"{k}: {v}" for k, v in fields.items() if v is not None) + "\n"


def codes(problems):
    return [p.code for p in problems]


def test_good_plan_has_no_problems(tree):
    got = lab.check_plan(plan(), tree)
    assert got == [], f"a complete, correct plan must pass, got {got}"


def test_parse_plan_fields_and_continuations():
    fields = lab.parse_plan(plan(**{"Fix sketch": None}).replace("Out of scope:", "**Out of scope:**"))
    assert list(fields) == [f for f in lab.FIELDS if f != "Fix sketch"], (
        f"fields in order, got {list(fields)}"
    )
    assert fields["Cause"].endswith("So mixed batches lose it."), "a field runs until the next field line"
    assert fields["Out of scope"] == "the GPU path", "the bold form **Field:** is a field too"
    assert fields["Open questions"] == "1. Is the order intended?\n2. Backport?", (
        f"got {fields['Open questions']!r}"
    )
    mention = lab.parse_plan("Issue: #1\nsee the Cause: below\nCause: x\nIssue: #2\n")
    assert mention["Issue"] == "#1\nsee the Cause: below", (
        "only a line that STARTS with a field name opens it; the first copy wins"
    )


@pytest.mark.parametrize(
    "field",
    [
        "Issue",
        "Reproduced at",
        "Cause",
        "Fix sketch",
        "Test plan",
        "Blast radius",
        "Out of scope",
        "Open questions",
    ],
)
def test_each_missing_field_is_named(tree, field):
    for text in (plan(**{field: None}), plan(**{field: ""}).replace(f"{field}: \n", f"{field}:\n")):
        got = lab.check_plan(text, tree)
        assert codes(got) == ["missing-field"], (
            f"without '{field}' expect exactly one missing-field, got {got}"
        )
        assert field in got[0].message, f"the message must name '{field}', got {got[0].message!r}"


@pytest.mark.parametrize("bad", [SHA[:7], SHA[:39], SHA + "0", SHA.upper(), "g" + SHA[1:], "HEAD", "v0.22.1"])
def test_bad_commit(tree, bad):
    got = lab.check_plan(plan(**{"Reproduced at": bad + " (pin)"}), tree)
    assert codes(got) == ["bad-commit"], (
        f"Reproduced at {bad!r} is not a full lowercase 40-hex sha, got {got}"
    )
    assert codes(lab.check_plan(plan(**{"Reproduced at": f"`{SHA}` (the pin)"}), tree)) == [], (
        "a backticked sha is fine"
    )


def test_one_page_boundaries(tree):
    base = plan()
    pad_lines = lab.MAX_LINES - len(base.splitlines())
    assert codes(lab.check_plan(base + "\n" * pad_lines, tree)) == [], (
        f"exactly {lab.MAX_LINES} lines fits one page"
    )
    got = lab.check_plan(base + "\n" * (pad_lines + 1), tree)
    assert codes(got) == ["too-long"], f"{lab.MAX_LINES + 1} lines is over a page, got {got}"
    words = len(base.split())
    fits = base.replace("the GPU path", "the GPU path" + " w" * (lab.MAX_WORDS - words))
    assert codes(lab.check_plan(fits, tree)) == [], f"exactly {lab.MAX_WORDS} words fits one page"
    got = lab.check_plan(fits.replace("GPU path", "GPU path w"), tree)
    assert codes(got) == ["too-long"], f"{lab.MAX_WORDS + 1} words is over a page, got {got}"


@pytest.mark.parametrize(
    "cite",
    [
        "vllm/widget.py:99 — spin",
        "vllm/widget.py:7 — spin",
        "vllm/nope.py:3 — spin",
        "vllm/widget.py:3 — Gadget",
    ],
)
def test_bad_citation_anywhere(tree, cite):
    for field in ("Cause", "Fix sketch", "Out of scope"):
        got = lab.check_plan(plan(**{field: f"see `{cite}` here"}), tree)
        assert codes(got) == ["bad-citation"], f"`{cite}` in {field} does not resolve in the tree, got {got}"
        assert cite.split(" — ")[0] in got[0].message, f"name the citation, got {got[0].message!r}"


def test_cause_needs_a_citation(tree):
    got = lab.check_plan(plan(Cause="the seed is read too late"), tree)
    assert codes(got) == ["no-citation"], f"a cause without path:line is a guess, got {got}"


def test_test_file(tree):
    got = lab.check_plan(plan(**{"Test plan": "tests/test_gadget.py — assert"}), tree)
    assert codes(got) == ["missing-test-file"], f"tests/test_gadget.py is not in the tree, got {got}"
    got = lab.check_plan(plan(**{"Test plan": "a new regression test"}), tree)
    assert codes(got) == ["no-test-file"], f"a test plan must name its file, got {got}"
    (tree / "tests" / "test_widget.py").unlink()
    (tree / "tests" / "test_widget.py").mkdir()
    got = lab.check_plan(plan(), tree)
    assert codes(got) == ["missing-test-file"], f"a folder named like the test file is not a file, got {got}"
    flat = tree / "flat"
    (flat / "vllm").mkdir(parents=True)
    (flat / "vllm" / "widget.py").write_text((tree / "vllm" / "widget.py").read_text())
    assert codes(lab.check_plan(plan(), flat)) == [], (
        "a tree without tests/ (the wheel route) cannot check the file"
    )


@pytest.mark.parametrize("ok", ["TP", "quant", "LoRA", "spec", "none", "TP, quant, LoRA, spec", "TP / LoRA"])
def test_blast_radius_allowed(tree, ok):
    assert codes(lab.check_plan(plan(**{"Blast radius": ok}), tree)) == [], (
        f"{ok!r} is an allowed blast radius"
    )


@pytest.mark.parametrize("bad", ["kernels", "LoRA, kernels", "none, TP", "lora", "everything", ","])
def test_blast_radius_refused(tree, bad):
    got = lab.check_plan(plan(**{"Blast radius": bad}), tree)
    assert codes(got) == ["bad-blast-radius"], (
        f"{bad!r} is not from {lab.BLAST_RADIUS} ('none' alone), got {got}"
    )


def test_open_questions_at_most_two(tree):
    assert codes(lab.check_plan(plan(**{"Open questions": "Is the order intended?"}), tree)) == [], (
        "one question is fine"
    )
    got = lab.check_plan(plan(**{"Open questions": "1. a?\n2. b?\n3. c?"}), tree)
    assert codes(got) == ["too-many-questions"], f"three questions is one too many, got {got}"
    got = lab.check_plan(plan(**{"Open questions": "- a?\n- b?\n- c?"}), tree)
    assert codes(got) == ["too-many-questions"], f"bulleted questions count too, got {got}"


@pytest.mark.parametrize("bad", ["12345", "issue 12345", "https://github.com/x/y/issues/1", "#abc"])
def test_bad_issue(tree, bad):
    got = lab.check_plan(plan(Issue=bad), tree)
    assert codes(got) == ["bad-issue"], f"Issue {bad!r} should start '#NNNNN' or 'new', got {got}"
    assert codes(lab.check_plan(plan(Issue="new — file it with this plan"), tree)) == [], "'new' is allowed"


def test_problems_accumulate(tree):
    got = lab.check_plan(plan(Issue=None, **{"Reproduced at": "HEAD", "Blast radius": "kernels"}), tree)
    assert sorted(codes(got)) == ["bad-blast-radius", "bad-commit", "missing-field"], (
        f"report every problem, got {got}"
    )


@pytest.mark.upstream
def test_worked_plan_resolves_at_the_pin():
    text = (HERE / "PLAN.md").read_text(encoding="utf-8")
    got = lab.check_plan(text, ROOT / "upstream")
    assert got == [], f"the shipped plan must be ready to post, got {got}"
    assert lab.parse_plan(text)["Reproduced at"].startswith(SHA), "the worked plan was reproduced at the pin"
