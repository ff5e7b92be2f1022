"""Grade a fix for a real defect of the pinned vLLM: a regression test plus a patch to ``upstream/vllm``.

``python -m course defect grade --patch fix.diff --test test_fix.py[::test_name]`` (Phase 19 lab 03).
A submission passes when, in this order:

1. the patch is a unified diff whose files all live under ``upstream/vllm/`` and already exist there;
2. the diff is under ``MAX_DIFF_LINES + 1`` lines (file headers, hunk headers and hunk bodies);
3. it applies exactly (no fuzz) to the pinned files;
4. the test, run against the pinned files, **fails** (a regression test proves the defect);
5. the test, run against the patched files, **passes**;
6. the course's behaviour checks of every touched module (``course/defect_checks/``) still pass.

Nothing under ``upstream/`` or the installed ``vllm`` changes. Each run builds a scratch package in
a temporary folder: a real ``vllm/`` directory whose entries are symbolic links to the installed
package, except along the path of each touched file, where the file is a real copy (pinned or
patched). The scratch folder goes first on ``PYTHONPATH``, so the child ``pytest`` imports the copy;
a ``conftest.py`` there refuses to run if ``vllm`` resolves anywhere else. The two children (pinned,
patched) start together; every child has a timeout and writes no bytecode.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

from course import ROOT, patches
from course.runtime import cpu_env

MAX_DIFF_LINES = 99  # "under 100 lines"
PATCH_ROOT = "upstream/vllm/"
CHECKS_DIR = Path(__file__).resolve().parent / "defect_checks"
# Behaviour checks of a module that every fix of it must keep passing (they pass at the pin too).
NEARBY = {
    "vllm/utils/torch_utils.py": ["test_nearby_torch_utils.py"],
    "vllm/lora/ops/torch_ops/lora_ops.py": ["test_nearby_lora_ops.py"],
}
TIMEOUT_S = 120.0
GIT_NOISE = ("diff --git ", "index ", "similarity index", "old mode", "new mode")

PYTEST_INI = (
    "[pytest]\nmarkers =\n    upstream: the course's marker for tests that need vllm (nothing to do here)\n"
)
SHADOW_CONFTEST = """\
import importlib.util, os

_spec = importlib.util.find_spec("vllm")
_where = os.path.dirname(_spec.origin) if _spec and _spec.origin else None
if _where != os.environ["DEFECT_SHADOW_VLLM"]:
    raise RuntimeError(f"vllm resolves to {_where}, not the scratch copy {os.environ['DEFECT_SHADOW_VLLM']}")
"""


class GradeFailure(Exception):
    """A submission the grader refuses; ``kind`` names the rule, the message says what to fix."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


@dataclass
class Report:
    files: list[str]
    diff_lines: int
    before: str  # the test's outcome on the pinned files
    after: str  # ... on the patched files
    nearby: dict[str, str] = field(default_factory=dict)  # check id -> outcome
    notes: list[str] = field(default_factory=list)

    def render(self) -> str:
        lines = [
            f"files: {', '.join(self.files)}",
            f"diff: {self.diff_lines} lines (limit {MAX_DIFF_LINES})",
            f"your test at the pin: {self.before}",
            f"your test patched:    {self.after}",
            "nearby checks: " + (", ".join(f"{k} {v}" for k, v in self.nearby.items()) or "none"),
        ]
        return "\n".join(lines + [f"note: {n}" for n in self.notes])


@dataclass
class Env:
    """Where the grader reads from: the pinned tree, the installed package, the nearby checks."""

    upstream: Path = ROOT / "upstream"
    site_vllm: Path | None = None  # default: the installed vllm package
    checks_dir: Path = CHECKS_DIR
    nearby: dict[str, list[str]] = field(default_factory=lambda: dict(NEARBY))
    timeout: float = TIMEOUT_S

    def package(self) -> Path:
        if self.site_vllm is not None:
            return self.site_vllm
        spec = importlib.util.find_spec("vllm")
        if spec is None or not spec.submodule_search_locations:
            raise GradeFailure("setup", "vllm is not installed in this interpreter: run `make` first")
        return Path(list(spec.submodule_search_locations)[0])


def parse_patch(text: str) -> patches.Mutant:
    """The learner's diff, as ``course.patches`` reads it (``a/``/``b/`` prefixes optional)."""
    lines = []
    for line in text.splitlines():
        if line.startswith(GIT_NOISE):
            continue
        if line.startswith("--- /dev/null") or line.startswith("+++ /dev/null"):
            raise GradeFailure(
                "outside", "the patch creates or deletes a file: fix existing files under upstream/vllm/"
            )
        for head, prefix in (("--- ", "a/"), ("+++ ", "b/")):
            if line.startswith(head) and not line.startswith(head + prefix):
                line = head + prefix + line[len(head) :].split("\t")[0].strip()
        lines.append(line)
    if not any(line.startswith("--- a/") for line in lines):
        raise GradeFailure(
            "empty", "the patch has no '--- a/upstream/vllm/<file>' header: write a unified diff"
        )
    try:
        return patches.parse("learner patch\n\n" + "\n".join(lines) + "\n", name="your patch")
    except patches.StaleMutant as exc:
        raise GradeFailure("malformed", f"the patch is not a well-formed unified diff: {exc}") from None


def diff_lines(mutant: patches.Mutant) -> int:
    """Lines of the diff: two file headers per file, one header per hunk, every hunk line."""
    return sum(2 + sum(1 + len(h.lines) for h in f.hunks) for f in mutant.files)


def check_paths(mutant: patches.Mutant, env: Env) -> list[str]:
    """The touched files as package paths (``vllm/...``); refuses anything outside upstream/vllm."""
    out = []
    for f in mutant.files:
        path = f.path
        if not path.startswith(PATCH_ROOT) or ".." in Path(path).parts:
            raise GradeFailure(
                "outside",
                f"the patch touches {path}: only files under {PATCH_ROOT} may change "
                "(your regression test goes in the test file, not in the patch)",
            )
        if not (env.upstream / path[len("upstream/") :]).is_file():
            raise GradeFailure(
                "outside", f"{path} does not exist in the pinned tree: patch existing files only"
            )
        if not f.hunks:
            raise GradeFailure("empty", f"the patch names {path} but changes nothing in it")
        out.append(path[len("upstream/") :])
    return out


def patched_texts(mutant: patches.Mutant, env: Env) -> tuple[dict[str, str], dict[str, str]]:
    """(pinned, patched) text of every touched file, keyed ``vllm/...``; the pinned tree is only read."""
    pinned, patched = {}, {}
    for f in mutant.files:
        rel = f.path[len("upstream/") :]
        pinned[rel] = (env.upstream / rel).read_text(encoding="utf-8")
        try:
            patched[rel] = patches.apply_hunks(pinned[rel], f.hunks, f.path)
        except patches.StaleMutant as exc:
            raise GradeFailure(
                "does-not-apply", f"the patch does not apply to the pinned {f.path}: {exc}"
            ) from None
    return pinned, patched


def build_shadow(package: Path, dest: Path, files: dict[str, str]) -> Path:
    """A ``vllm/`` under ``dest`` that links every entry of ``package`` except ``files``, which are copies."""
    wanted = {tuple(Path(rel).parts[1:]): text for rel, text in files.items()}

    def mirror(src: Path, dst: Path, todo: dict[tuple[str, ...], str]) -> None:
        dst.mkdir()
        heads = {parts[0] for parts in todo}
        for entry in sorted(src.iterdir()):
            if entry.name == "__pycache__":
                continue
            if entry.name not in heads:
                (dst / entry.name).symlink_to(entry)
                continue
            sub = {parts[1:]: text for parts, text in todo.items() if parts[0] == entry.name}
            if () in sub:
                (dst / entry.name).write_text(sub[()], encoding="utf-8")
            else:
                mirror(entry, dst / entry.name, sub)
        for parts in todo:
            if not (dst / parts[0]).exists():
                raise GradeFailure("outside", f"{dst / parts[0]} is not in the installed vllm package")

    mirror(package, dest / "vllm", wanted)
    return dest / "vllm"


def _split_test(test: str) -> tuple[Path, str]:
    path, _, name = test.partition("::")
    return Path(path).resolve(), name


def start_pytest(stage: Path, selectors: list[str]) -> subprocess.Popen:
    """Start one child ``pytest`` in the stage folder ``stage`` (its own scratch ``vllm`` under pkg/)."""
    child = dict(os.environ)
    cpu_env.apply_env(child)
    parts = [p for p in child.get("PYTHONPATH", "").split(os.pathsep) if p]
    child["PYTHONPATH"] = os.pathsep.join([str(stage / "pkg"), *parts, str(ROOT)])
    child["DEFECT_SHADOW_VLLM"] = str(stage / "pkg" / "vllm")
    child.pop("PYTEST_ADDOPTS", None)
    child["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"  # plain pytest, as upstream's tests need; starts faster
    child["PYTHONDONTWRITEBYTECODE"] = "1"  # a linked folder's __pycache__ is the installed package's
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--junitxml=junit.xml", *selectors]
    return subprocess.Popen(
        cmd, cwd=stage, env=child, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


def finish_pytest(proc: subprocess.Popen, stage: Path, env: Env) -> tuple[int, str, dict[str, str]]:
    """Wait for ``proc`` (at most ``env.timeout``); returns (exit code, output, {file stem: outcome})."""
    try:
        out, _ = proc.communicate(timeout=env.timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise GradeFailure(
            "timeout", f"pytest ran past {env.timeout:.0f} s: a test that hangs is not a regression test"
        ) from None
    seen: dict[str, set[str]] = {}
    xml = stage / "junit.xml"
    if xml.exists():
        for case in ET.parse(xml).getroot().iter("testcase"):
            stem = case.get("classname", "").split(".")[0]
            bad = case.find("failure") is not None or case.find("error") is not None
            seen.setdefault(stem, set()).add(
                "failed" if bad else "skipped" if case.find("skipped") is not None else "passed"
            )
    outcome = {s: next(o for o in ("failed", "passed", "skipped") if o in got) for s, got in seen.items()}
    return proc.returncode, out, outcome


def _tail(text: str, n: int = 25) -> str:
    return "\n".join(text.strip().splitlines()[-n:])


def prepare_stage(
    stage: Path, package: Path, files: dict[str, str], test_path: Path, name: str, checks: list[Path]
) -> list[str]:
    """Fill ``stage``: the shadow guard, the test, the checks, a scratch ``vllm``; returns the selectors."""
    (stage / "pkg").mkdir(parents=True)
    (stage / "conftest.py").write_text(SHADOW_CONFTEST, encoding="utf-8")
    (stage / "pytest.ini").write_text(PYTEST_INI, encoding="utf-8")
    shutil.copyfile(test_path, stage / "test_regression.py")
    for c in checks:
        shutil.copyfile(c, stage / c.name)
    build_shadow(package, stage / "pkg", files)
    return ["test_regression.py" + (f"::{name}" if name else "")] + [c.name for c in checks]


def judge_before(report: Report, test: str, run: tuple[int, str, dict[str, str]]) -> None:
    """The run on the pinned files: the test must have run, and failed."""
    rc, out, outcome = run
    if rc == 5 or "no tests ran" in out:
        raise GradeFailure("no-test", f"no test ran from {test}: check the file and the ::name\n{_tail(out)}")
    if rc == 0 and outcome.get("test_regression") == "skipped":
        raise GradeFailure(
            "no-test", f"{test} was skipped at the pin, not run: a skipped test proves nothing"
        )
    if rc not in (0, 1, 2):
        raise GradeFailure("setup", f"pytest could not run (exit {rc}); its output:\n{_tail(out)}")
    if rc == 0:
        raise GradeFailure(
            "passes-before",
            f"{test} passes on the pinned files: it does not reproduce the defect, so it is not a "
            "regression test. Make it exercise the failing path (the default, the -1 row, ...)",
        )
    report.before = "failed" if rc == 1 else f"error (pytest exit {rc})"


def judge_after(report: Report, test: str, run: tuple[int, str, dict[str, str]], checks: list[Path]) -> None:
    """The run on the patched files: the test passes, and so does every nearby check."""
    rc, out, outcome = run
    report.after = outcome.get("test_regression", "error")
    if report.after != "passed":
        raise GradeFailure(
            "fails-after",
            f"{test} still fails with your patch applied: the patch does not fix it\n{_tail(out)}",
        )
    for c in checks:
        report.nearby[c.stem] = outcome.get(c.stem, "not run")
    broken = [k for k, v in report.nearby.items() if v != "passed"]
    if broken or rc != 0:
        raise GradeFailure(
            "breaks-nearby",
            f"your patch breaks the nearby checks {', '.join(broken) or '(see output)'}: "
            f"the fix changed behaviour that was right\n{_tail(out)}",
        )


def grade(patch_text: str, test: str, env: Env | None = None) -> Report:
    """Grade one submission; raises ``GradeFailure`` naming the first rule it breaks."""
    env = env or Env()
    mutant = parse_patch(patch_text)
    rels = check_paths(mutant, env)
    n_lines = diff_lines(mutant)
    if n_lines > MAX_DIFF_LINES:
        raise GradeFailure(
            "too-long",
            f"the diff is {n_lines} lines; the limit is {MAX_DIFF_LINES} (under 100): "
            "fix the defect and nothing else, and leave refactors for another PR",
        )
    pinned, patched = patched_texts(mutant, env)
    test_path, name = _split_test(test)
    if not test_path.is_file():
        raise GradeFailure("no-test", f"no test file at {test_path}")
    package = env.package()
    report = Report(rels, n_lines, "", "")
    checks: list[Path] = []
    for rel in rels:
        found = [env.checks_dir / c for c in env.nearby.get(rel, [])]
        checks += [c for c in found if c not in checks]
        if not found:
            report.notes.append(f"the course has no nearby checks for {rel}: only your test judged the fix")

    with tempfile.TemporaryDirectory(prefix="defect-grade-") as tmp:
        before_dir, after_dir = Path(tmp) / "before", Path(tmp) / "after"
        before_sel = prepare_stage(before_dir, package, pinned, test_path, name, [])
        after_sel = prepare_stage(after_dir, package, patched, test_path, name, checks)
        # both children at once (two cores: half the wall time); the verdict still reads before first
        running = [start_pytest(before_dir, before_sel), start_pytest(after_dir, after_sel)]
        try:
            judge_before(report, test, finish_pytest(running[0], before_dir, env))
            judge_after(report, test, finish_pytest(running[1], after_dir, env), checks)
        finally:
            for proc in running:
                if proc.poll() is None:
                    proc.kill()
                    proc.communicate()
    return report


# --------------------------------------------------------------------------------------- CLI


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "defect",
        help="grade a fix for a real defect of the pinned vLLM (Phase 19 lab 03)",
        description="`defect grade`: run your regression test before and after your patch on a scratch copy.",
    )
    dsub = p.add_subparsers(dest="defect_command", metavar="ACTION", required=True)
    g = dsub.add_parser("grade", help="grade one regression test + patch")
    g.add_argument("--patch", type=Path, required=True, help="unified diff against upstream/vllm/... paths")
    g.add_argument("--test", required=True, help="the regression test: FILE or FILE::test_name")
    g.add_argument("--timeout", type=float, default=TIMEOUT_S, help="seconds per pytest run")
    g.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        report = grade(args.patch.read_text(encoding="utf-8"), args.test, Env(timeout=args.timeout))
    except GradeFailure as exc:
        print(f"REFUSED ({exc.kind}): {exc}")
        return 1
    print(report.render())
    print("PASS: a regression test and a fix")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m course.defect_grader")
    add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    raise SystemExit(main())
