"""The defect grader's own teeth, on a tiny stand-in ``vllm`` package (fast: no torch in the child).

Every rule gets a submission that breaks it, and a good submission must pass while leaving the
pinned tree and the installed package untouched. ``course/defect_grader_mutants/*.diff`` are
plausible wrong graders (deltas against ``course/defect_grader.py``); each must fail one scenario
(marker ``slow``: ``make test-slow`` and CI run it).
"""

from __future__ import annotations

import difflib
import hashlib
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from course import ROOT, patches
from course import defect_grader as real_grader

MUTANTS = sorted((ROOT / "course" / "defect_grader_mutants").glob("*.diff"))

OPS = '''\
"""Stand-in for a pinned module: index -1 means "no slot", but Python's slots[-1] is the last one."""


def slot_for(index, slots):
    """The slot row ``index`` uses, or None for -1 (no slot)."""
    return slots[index]


def double(x):
    return 2 * x
'''
FIXED = OPS.replace("    return slots[index]\n", "    return None if index < 0 else slots[index]\n")
WRONG_FIX = OPS.replace("    return slots[index]\n", "    return None if index <= 0 else slots[index]\n")
NO_FIX = OPS.replace('"""The slot row', '"""Look up the slot row')
REGRESSION = "from vllm.ops import slot_for\n\n\ndef test_minus_one_is_no_slot():\n    assert slot_for(-1, 'abc') is None\n"
PASSES_AT_PIN = "from vllm.ops import slot_for\n\n\ndef test_one():\n    assert slot_for(1, 'abc') == 'b'\n"
EXTRA = "LIMIT = 3\n"
SKIPS = "import pytest\n\n\ndef test_later():\n    pytest.skip('not today')\n"
HANGS = "def test_hangs():\n    while True:\n        pass\n"
NEARBY = (
    "import vllm.sub\nfrom vllm.ops import double, slot_for\n\n\ndef test_real_slots():\n"
    "    assert [slot_for(i, 'abc') for i in range(3)] == ['a', 'b', 'c']\n    assert double(4) == 8\n"
)


def diff(old: str, new: str, path: str = "upstream/vllm/ops.py") -> str:
    return "".join(difflib.unified_diff(old.splitlines(True), new.splitlines(True), f"a/{path}", f"b/{path}"))


def digest(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


class Fake:
    """A pinned tree, an installed package and a nearby check, all in ``tmp``."""

    def __init__(self, g, tmp: Path):
        self.g, self.tmp = g, tmp
        for where in ("upstream/vllm", "site/vllm"):
            (tmp / where).mkdir(parents=True)
            (tmp / where / "__init__.py").write_text("", encoding="utf-8")
            (tmp / where / "ops.py").write_text(OPS, encoding="utf-8")
            (tmp / where / "extra.py").write_text(EXTRA, encoding="utf-8")
        (tmp / "site/vllm/sub").mkdir()
        (tmp / "site/vllm/sub/__init__.py").write_text("X = 1\n", encoding="utf-8")
        (tmp / "checks").mkdir()
        (tmp / "checks/test_nearby_ops.py").write_text(NEARBY, encoding="utf-8")
        self.env = g.Env(
            upstream=tmp / "upstream",
            site_vllm=tmp / "site/vllm",
            checks_dir=tmp / "checks",
            nearby={"vllm/ops.py": ["test_nearby_ops.py"]},
            timeout=30,
        )

    def grade(self, patch: str, test_source: str = REGRESSION, selector: str = "", timeout: float = 30):
        test = self.tmp / "test_mine.py"
        test.write_text(test_source, encoding="utf-8")
        self.env.timeout = timeout
        saved = os.environ.pop("PYTHONDONTWRITEBYTECODE", None)  # the grader must not rely on the caller's
        try:
            return self.g.grade(patch, f"{test}{selector}", self.env)
        finally:
            if saved is not None:
                os.environ["PYTHONDONTWRITEBYTECODE"] = saved

    def refused(self, kind: str, patch: str, **kw) -> str:
        try:
            report = self.grade(patch, **kw)
        except self.g.GradeFailure as exc:
            assert exc.kind == kind, f"refused as {exc.kind!r}, expected {kind!r}: {exc}"
            return str(exc)
        raise AssertionError(f"accepted ({report.render()}), expected a refusal of kind {kind!r}")


# ------------------------------------------------------------------------- scenarios (g = grader)


def scenario_outside_paths(f: Fake):
    f.tmp.joinpath("upstream/setup.py").write_text("x = 1\n", encoding="utf-8")
    for path in ("vllm/ops.py", "upstream/setup.py", "upstream/vllm/../setup.py", "mini_vllm/ops.py"):
        msg = f.refused("outside", diff(OPS, FIXED, path))
        assert "upstream/vllm/" in msg, f"the message must say where patches may go: {msg}"
    new_file = "--- /dev/null\n+++ b/upstream/vllm/new.py\n@@ -0,0 +1 @@\n+x = 1\n"
    f.refused("outside", new_file)


def scenario_stale_patch(f: Fake):
    stale = diff(OPS.replace("slots[index]", "slots[i]"), FIXED.replace("slots[index]", "slots[i]"))
    assert "does not apply" in f.refused("does-not-apply", stale)
    f.refused("empty", "")


def scenario_line_limit_boundary(f: Fake):
    lim = f.g.MAX_DIFF_LINES
    for extra, ok in ((0, True), (1, False)):
        k = 0
        while len(diff(OPS, FIXED + "# note\n" * k).splitlines()) < lim + extra:
            k += 1
        patch = diff(OPS, FIXED + "# note\n" * k)
        assert len(patch.splitlines()) == lim + extra
        if ok:
            report = f.grade(patch)
            assert report.diff_lines == lim, f"a {lim}-line diff was counted as {report.diff_lines}"
        else:
            assert f"{lim + 1} lines" in f.refused("too-long", patch)


def scenario_good_fix_leaves_the_tree_alone(f: Fake):
    before = digest(f.tmp / "upstream"), digest(f.tmp / "site")
    report = f.grade(diff(OPS, FIXED))
    assert (report.before, report.after) == ("failed", "passed"), report.render()
    assert report.nearby == {"test_nearby_ops": "passed"}, report.nearby
    assert report.diff_lines == len(diff(OPS, FIXED).splitlines())
    assert (digest(f.tmp / "upstream"), digest(f.tmp / "site")) == before, (
        "grading wrote into the pinned tree or the installed package (a patched file, a __pycache__)"
    )


def scenario_git_and_plain_diff_headers(f: Fake):
    """``git diff`` output (with its ``diff --git``/``index`` lines) and ``diff -u`` (no a/ b/,
    timestamps) both grade; a file without nearby checks gets a note, not a refusal."""
    fix = diff(OPS, FIXED)
    extra = diff(EXTRA, "LIMIT = 4\n", "upstream/vllm/extra.py")
    git = (
        "diff --git a/upstream/vllm/ops.py b/upstream/vllm/ops.py\nindex 1a2b3c4..5d6e7f8 100644\n"
        + fix
        + "diff --git a/upstream/vllm/extra.py b/upstream/vllm/extra.py\nindex 0a1b2c3..4d5e6f7 100644\n"
        + extra
    )
    report = f.grade(git)
    assert report.files == ["vllm/ops.py", "vllm/extra.py"], report.files
    assert report.diff_lines == len((fix + extra).splitlines()), "git's own lines are not the diff's size"
    assert any("vllm/extra.py" in n for n in report.notes), report.notes
    plain = fix.replace("--- a/upstream/", "--- upstream/").replace("+++ b/upstream/", "+++ upstream/")
    plain = plain.replace("ops.py\n", "ops.py\t2026-01-01 00:00:00.000000000 +0000\n", 2)
    assert f.grade(plain).after == "passed"


def scenario_passes_before(f: Fake):
    assert "not a regression test" in f.refused("passes-before", diff(OPS, FIXED), test_source=PASSES_AT_PIN)


def scenario_fails_after(f: Fake):
    f.refused("fails-after", diff(OPS, NO_FIX))


def scenario_breaks_nearby(f: Fake):
    assert "test_nearby_ops" in f.refused("breaks-nearby", diff(OPS, WRONG_FIX))


def scenario_no_test_and_timeout(f: Fake):
    f.refused("no-test", diff(OPS, FIXED), selector="::test_not_there")
    f.refused("timeout", diff(OPS, FIXED), test_source=HANGS, timeout=1)
    assert "skipped" in f.refused("no-test", diff(OPS, FIXED), test_source=SKIPS)


SCENARIOS = [
    scenario_outside_paths,
    scenario_stale_patch,
    scenario_line_limit_boundary,
    scenario_good_fix_leaves_the_tree_alone,
    scenario_git_and_plain_diff_headers,
    scenario_passes_before,
    scenario_fails_after,
    scenario_breaks_nearby,
    scenario_no_test_and_timeout,
]


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda s: s.__name__.removeprefix("scenario_"))
def test_grader(scenario, tmp_path):
    scenario(Fake(real_grader, tmp_path))


def load_mutant(path: Path, tmp: Path):
    mutant = patches.load(path)
    text = patches.apply(mutant, lambda rel: (ROOT / rel).read_text(encoding="utf-8"))[
        "course/defect_grader.py"
    ]
    target = tmp / f"grader_{path.stem}.py"
    target.write_text(text, encoding="utf-8")
    spec = importlib.util.spec_from_file_location(f"grader_{path.stem}", target)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules[spec.name]
    return module


def test_there_are_grader_mutants():
    assert len(MUTANTS) >= 4, [m.name for m in MUTANTS]


@pytest.mark.slow  # ~2 s of child processes per mutant; make test-slow and CI's slow stage run it
@pytest.mark.parametrize("mutant", MUTANTS, ids=lambda p: p.stem)
def test_every_grader_mutant_is_caught(mutant, tmp_path):
    g = load_mutant(mutant, tmp_path)
    for i, scenario in enumerate(SCENARIOS):
        try:
            scenario(Fake(g, tmp_path / f"s{i}"))
        except AssertionError:
            return
    pytest.fail(f"grader mutant {mutant.stem} passes every scenario: add one that catches it")


def test_cli_refuses_a_patch_outside_upstream(tmp_path):
    patch = tmp_path / "fix.diff"
    patch.write_text(diff(OPS, FIXED, "mini_vllm/ops.py"), encoding="utf-8")
    test = tmp_path / "test_x.py"
    test.write_text(REGRESSION, encoding="utf-8")
    proc = subprocess.run(
        [sys.executable, "-m", "course", "defect", "grade", "--patch", str(patch), "--test", str(test)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 1 and "REFUSED (outside)" in proc.stdout, proc.stdout + proc.stderr
