"""Mini-builds a learner can do and grade: ``python -m course mini-build NN start|check|reset``.

``course/minibuilds.toml`` names, per phase, the function bodies of ``mini_vllm`` that make up the
phase's build (grouped in parts) and the tests that grade each part.

* ``start`` replaces each named body with a stub that raises ``NotImplementedError`` carrying the
  part's task; the signature, the docstring and everything else in the file stay as they were.
* ``check`` runs each part's tests and prints which parts pass (exit 1 until all do).
* ``reset`` restores the reference bodies from git ``HEAD`` (or, outside git, from the copy
  ``start`` saved under ``.minibuild/``).
* ``status`` (or no phase) lists every phase's mini-build and whether stubs are in place.

``check-labs`` calls :func:`contract_problems`: for every part, the package with only that part's
stubs must fail the part's tests, and the reference package must pass them (the same contract as a
lab's starter and solution). ``course grade`` calls :func:`grade_rows`. The root ``conftest.py``
calls :func:`stubbed_files` so that any pytest run on a stubbed package says so in its header.
"""

from __future__ import annotations

import argparse
import ast
import os
import shutil
import subprocess
import sys
import tempfile
import tomllib
from dataclasses import dataclass
from pathlib import Path

from course import ROOT

TABLE = Path(__file__).with_name("minibuilds.toml")
MARK = "mini-build "  # every stub's message starts with it: "mini-build 03 · schedule: ..."
STATE_DIR = ".minibuild"  # gitignored: the saved reference copies and the started phases


@dataclass(frozen=True)
class Target:
    """One body to stub: ``path`` (relative to the root) and a qualified ``name`` (``Class.method``)."""

    path: str
    name: str

    @classmethod
    def parse(cls, spec: str) -> Target:
        path, sep, name = spec.partition("::")
        if not sep or not path.endswith(".py") or not name:
            raise ValueError(f"stub target {spec!r}: write it as 'mini_vllm/module.py::Class.method'")
        return cls(path, name)

    def __str__(self) -> str:
        return f"{self.path}::{self.name}"


@dataclass(frozen=True)
class Part:
    name: str
    stubs: tuple[Target, ...]
    tests: tuple[str, ...]
    task: str


@dataclass(frozen=True)
class PhaseBuild:
    number: str
    kind: str  # "package" or "lab"
    parts: tuple[Part, ...] = ()
    lab: str = ""

    @property
    def files(self) -> list[str]:
        return sorted({t.path for p in self.parts for t in p.stubs})

    def stub_message(self, part: Part, target: Target) -> str:
        return (
            f"{MARK}{self.number} · {part.name}: {target.name} is yours to write: {part.task}. "
            f"`python -m course mini-build {self.number} check` grades it; "
            f"`python -m course mini-build {self.number} reset` restores the reference."
        )


def load(table: Path = TABLE) -> dict[str, PhaseBuild]:
    """The mini-build table, keyed by phase number; raises ``ValueError`` on a malformed entry."""
    data = tomllib.loads(table.read_text(encoding="utf-8"))
    builds: dict[str, PhaseBuild] = {}
    for entry in data.get("phase", []):
        number = str(entry.get("number", ""))
        if len(number) != 2 or not number.isdigit() or number in builds:
            raise ValueError(f"{table.name}: phase number {number!r} must be two digits and appear once")
        kind = entry.get("kind", "package")
        if kind == "lab":
            if not entry.get("lab"):
                raise ValueError(
                    f"{table.name}: phase {number} of kind 'lab' needs lab = 'phase-…/labs/lab-…'"
                )
            builds[number] = PhaseBuild(number, "lab", lab=entry["lab"])
            continue
        if kind != "package":
            raise ValueError(f"{table.name}: phase {number}: kind must be 'package' or 'lab', got {kind!r}")
        parts = []
        for raw in entry.get("part", []):
            missing = [k for k in ("name", "stubs", "tests", "task") if not raw.get(k)]
            if missing:
                raise ValueError(
                    f"{table.name}: phase {number}, part {raw.get('name', '?')!r} lacks {missing}"
                )
            parts.append(
                Part(
                    raw["name"],
                    tuple(Target.parse(s) for s in raw["stubs"]),
                    tuple(raw["tests"]),
                    raw["task"],
                )
            )
        if not parts:
            raise ValueError(f"{table.name}: phase {number} of kind 'package' names no parts")
        builds[number] = PhaseBuild(number, "package", tuple(parts))
    return builds


# ------------------------------------------------------------------ stubbing one file
def _find(tree: ast.Module, qualname: str) -> ast.FunctionDef | ast.AsyncFunctionDef | None:
    scope: list[ast.stmt] = tree.body
    node = None
    for piece in qualname.split("."):
        node = next(
            (
                n
                for n in scope
                if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) and n.name == piece
            ),
            None,
        )
        if node is None:
            return None
        scope = node.body
    return node if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) else None


def _docstring_end(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> int | None:
    first = fn.body[0]
    if (
        isinstance(first, ast.Expr)
        and isinstance(first.value, ast.Constant)
        and isinstance(first.value.value, str)
    ):
        return first.end_lineno
    return None


def stub_source(text: str, stubs: list[tuple[str, str]]) -> str:
    """``text`` with each ``(qualname, message)`` body replaced by ``raise NotImplementedError(message)``.

    The ``def`` line(s), decorators and docstring stay; everything after the docstring goes.
    Raises ``ValueError`` when a name is missing or its body is only a docstring.
    """
    tree = ast.parse(text)
    lines = text.splitlines(keepends=True)
    spans = []
    for qualname, message in stubs:
        fn = _find(tree, qualname)
        if fn is None:
            raise ValueError(f"no function or method {qualname!r} in this file")
        doc_end = _docstring_end(fn)
        first = fn.body[1] if doc_end is not None and len(fn.body) > 1 else fn.body[0]
        if doc_end is not None and len(fn.body) == 1:
            raise ValueError(f"{qualname} has only a docstring: nothing to stub")
        start = (doc_end + 1) if doc_end is not None else first.lineno  # 1-based, first line to drop
        if doc_end is None and first.lineno == fn.lineno:
            raise ValueError(f"{qualname} is a one-line def: write its body on its own lines to stub it")
        indent = " " * first.col_offset
        spans.append((start, fn.end_lineno, f"{indent}raise NotImplementedError({message!r})\n"))
    for start, end, stub in sorted(spans, reverse=True):
        lines[start - 1 : end] = [stub]
    out = "".join(lines)
    ast.parse(out)  # a stub must leave an importable module
    return out


def is_stub(text: str, qualname: str) -> bool:
    """Whether ``qualname`` in ``text`` is still a mini-build stub (a lone ``raise NotImplementedError``)."""
    try:
        fn = _find(ast.parse(text), qualname)
    except SyntaxError:
        return False
    if fn is None:
        return False
    body = fn.body[1:] if _docstring_end(fn) is not None else fn.body
    if len(body) != 1 or not isinstance(body[0], ast.Raise):
        return False
    return MARK in (ast.get_source_segment(text, body[0]) or "")


def stubbed_text(build: PhaseBuild, path: str, text: str, parts: tuple[Part, ...] | None = None) -> str:
    stubs = [
        (t.name, build.stub_message(part, t))
        for part in (parts or build.parts)
        for t in part.stubs
        if t.path == path
    ]
    return stub_source(text, stubs) if stubs else text


def stubbed_files(root: Path = ROOT) -> list[str]:
    """Files of ``mini_vllm`` holding a mini-build stub (a cheap text scan; used by conftest)."""
    folder = root / "mini_vllm"
    found = []
    for path in sorted(folder.glob("*.py")) if folder.is_dir() else []:
        if path.name.startswith("test_"):
            continue
        try:
            if f"NotImplementedError('{MARK}" in path.read_text(encoding="utf-8"):
                found.append(f"mini_vllm/{path.name}")
        except OSError:
            continue
    return found


# ------------------------------------------------------------------ git and saved copies
def _git_head(root: Path, path: str) -> str | None:
    try:
        proc = subprocess.run(
            ["git", "show", f"HEAD:{path}"], cwd=root, capture_output=True, text=True, check=False, timeout=30
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout if proc.returncode == 0 else None


def _saved(root: Path, number: str, path: str) -> Path:
    return root / STATE_DIR / number / path


def reference_text(root: Path, number: str, path: str) -> str | None:
    """The reference of ``path``: git ``HEAD``'s, else the copy ``start`` saved."""
    text = _git_head(root, path)
    if text is None and _saved(root, number, path).is_file():
        text = _saved(root, number, path).read_text(encoding="utf-8")
    return text


def started(root: Path) -> set[str]:
    folder = root / STATE_DIR
    return {p.name for p in folder.iterdir() if p.is_dir()} if folder.is_dir() else set()


# ------------------------------------------------------------------ running a part's tests
@dataclass
class PartResult:
    part: Part
    passed: int
    failed: int
    stubs_left: int
    output: str = ""
    broken: bool = False  # the tests could not even be collected

    @property
    def ok(self) -> bool:
        return self.passed > 0 and not self.failed and not self.broken

    def verdict(self) -> str:
        if self.broken:
            return "error: the tests could not be collected (does the module import?)"
        if self.ok:
            return "done"
        if self.stubs_left:
            return f"to do ({self.stubs_left} stub(s) left)"
        return f"{self.failed} test(s) failing"


def run_part(
    part: Part, cwd: Path, pythonpath: str | None = None, timeout: float = 300
) -> tuple[int, int, bool, str]:
    """Run a part's tests from ``cwd``: ``(passed, failed, collection_broken, output)``."""
    from course.labrun import UNNEEDED_PLUGINS, lab_env, parse_junit

    env = lab_env(extra={"COURSE_STRICT": "0"})
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    with tempfile.TemporaryDirectory(prefix="course-minibuild-") as tmp:
        report = Path(tmp) / "report.xml"
        args = [
            sys.executable,
            "-m",
            "pytest",
            *part.tests,
            "-q",
            "--no-header",
            "-rN",
            f"--junitxml={report}",
        ]
        for plugin in UNNEEDED_PLUGINS:
            args += ["-p", f"no:{plugin}"]
        try:
            proc = subprocess.run(
                args, cwd=cwd, env=env, capture_output=True, text=True, check=False, timeout=timeout
            )
        except subprocess.TimeoutExpired:
            return 0, 1, False, f"timed out after {timeout:.0f}s"
        tests = parse_junit(report) if report.is_file() else []
    output = proc.stdout + proc.stderr
    passed = sum(t.outcome == "passed" for t in tests)
    failed = sum(t.outcome in ("failed", "error") for t in tests)
    broken = any(t.name.startswith("<collect>") for t in tests) or proc.returncode not in (0, 1)
    return passed, failed, broken, output


def check_parts(build: PhaseBuild, root: Path = ROOT) -> list[PartResult]:
    results = []
    for part in build.parts:
        left = 0
        for t in part.stubs:
            path = root / t.path
            left += path.is_file() and is_stub(path.read_text(encoding="utf-8"), t.name)
        passed, failed, broken, output = run_part(part, root)
        results.append(PartResult(part, passed, failed, left, output, broken))
    return results


# ------------------------------------------------------------------ the commands
def _labs_using(root: Path, files: list[str]) -> list[str]:
    modules = {Path(f).stem for f in files}
    users = []
    for lab in sorted(root.glob("phase-*/labs/lab-*")):
        for py in lab.glob("*.py"):
            text = py.read_text(encoding="utf-8", errors="replace")
            direct = any(f"mini_vllm.{m}" in text or f"mini_vllm import {m}" in text for m in modules)
            if direct or "mini_vllm.engine" in text or "from mini_vllm import" in text:  # the engine uses them all
                users.append(f"{lab.parent.parent.name}/labs/{lab.name}")
                break
    return users


def start(build: PhaseBuild, root: Path, force: bool = False) -> int:
    if build.kind == "lab":
        print(
            f"Phase {build.number}'s mini-build is a lab's starter, not a change to mini_vllm: edit "
            f"{build.lab}/starter.py, then `python -m course mini-build {build.number} check` "
            f"(or `make grade-lab LAB={build.lab}`)."
        )
        return 0
    texts: dict[str, str] = {}
    for path in build.files:
        current = (root / path).read_text(encoding="utf-8")
        reference = reference_text(root, build.number, path)
        if reference is not None and current != reference and not force:
            print(
                f"error: {path} differs from the reference (git HEAD): your edits would be replaced by stubs. "
                f"Commit or stash them, or pass --force."
            )
            return 1
        texts[path] = current
    for path, text in texts.items():
        saved = _saved(root, build.number, path)
        saved.parent.mkdir(parents=True, exist_ok=True)
        if not saved.exists():
            saved.write_text(text, encoding="utf-8")
        (root / path).write_text(stubbed_text(build, path, text), encoding="utf-8")
    print(
        f"mini-build {build.number}: stubs are in place. Write these bodies (signatures and docstrings kept):"
    )
    for part in build.parts:
        print(f"  {part.name}: {part.task}")
        for t in part.stubs:
            print(f"      {t}")
    users = _labs_using(root, build.files)
    if users:
        print(
            "While the stubs are in place, these labs use the stubbed modules (directly or through the "
            "engine) and may fail with NotImplementedError('mini-build …'); every pytest run says so "
            "in its header:\n  " + "\n  ".join(users)
        )
    print(
        f"Grade yourself: python -m course mini-build {build.number} check   "
        f"Undo: python -m course mini-build {build.number} reset"
    )
    return 0


def check(build: PhaseBuild, root: Path) -> int:
    from course.report import print_table

    if build.kind == "lab":
        from course.labrun import run_lab

        run = run_lab(root / build.lab, root, "starter", impl="starter")
        print(f"mini-build {build.number} (lab {build.lab}, LAB_IMPL=starter): {run.summary()}")
        return 0 if run.passed and not run.failed else 1
    results = check_parts(build, root)
    rows = [[r.part.name, str(r.passed), str(r.failed), r.verdict(), " ".join(r.part.tests)] for r in results]
    print_table(f"mini-build {build.number}", ["part", "passed", "failed", "status", "tests"], rows)
    done = sum(r.ok for r in results)
    print(f"\n{done}/{len(results)} parts done.")
    for r in results:
        if not r.ok:
            print(
                f"  {r.part.name}: run `.venv/bin/python -m pytest {' '.join(_quote(a) for a in r.part.tests)}`"
            )
    return 0 if done == len(results) else 1


def _quote(arg: str) -> str:
    return f'"{arg}"' if " " in arg else arg


def reset(build: PhaseBuild, root: Path) -> int:
    if build.kind == "lab":
        print(
            f"Phase {build.number}'s mini-build lives in {build.lab}/starter.py: nothing in mini_vllm to reset."
        )
        return 0
    for path in build.files:
        reference = reference_text(root, build.number, path)
        if reference is None:
            print(f"error: no reference for {path} (not a git checkout, and `start` saved no copy)")
            return 1
        (root / path).write_text(reference, encoding="utf-8")
        print(f"restored {path}")
    shutil.rmtree(root / STATE_DIR / build.number, ignore_errors=True)
    return 0


def status(builds: dict[str, PhaseBuild], root: Path) -> int:
    from course.report import print_table

    stubbed = set(stubbed_files(root))
    rows = []
    for number, build in sorted(builds.items()):
        if build.kind == "lab":
            rows.append([number, f"{build.lab}/starter.py", "-", "a lab's starter"])
            continue
        with_stubs = [f for f in build.files if f in stubbed]
        state = "stubs in place" if with_stubs else ("started" if number in started(root) else "reference")
        rows.append([number, ", ".join(build.files), str(len(build.parts)), state])
    print_table("mini-builds", ["phase", "files", "parts", "state"], rows)
    return 0


def grade_rows(numbers: list[str], root: Path = ROOT) -> list[list[str]]:
    """Rows for ``course grade``: ``[phase, parts done, state]``; tests run only for started phases."""
    try:
        builds = load()
    except (OSError, ValueError) as exc:
        return [["-", "-", f"error: {exc}"]]
    begun = started(root) | {n for n, b in builds.items() for f in b.files if f in set(stubbed_files(root))}
    rows = []
    for number in numbers:
        build = builds.get(number)
        if build is None or build.kind == "lab" or not all((root / f).is_file() for f in build.files):
            continue
        if number not in begun:
            rows.append(
                [number, f"-/{len(build.parts)}", f"not started (python -m course mini-build {number} start)"]
            )
            continue
        results = check_parts(build, root)
        done = sum(r.ok for r in results)
        state = (
            "done"
            if done == len(results)
            else "in progress: " + ", ".join(f"{r.part.name} {r.verdict()}" for r in results if not r.ok)
        )
        rows.append([number, f"{done}/{len(results)}", state])
    return rows


# ------------------------------------------------------------------ the check-labs contract
def _copy_package(root: Path, into: Path) -> None:
    shutil.copytree(
        root / "mini_vllm", into / "mini_vllm", ignore=shutil.ignore_patterns("mutants", "__pycache__")
    )
    for name in ("conftest.py", "pyproject.toml"):
        if (root / name).is_file():
            shutil.copy2(root / name, into / name)
    if (root / "upstream").exists():
        (into / "upstream").symlink_to((root / "upstream").resolve())


def contract_problems(
    numbers: list[str] | None = None, root: Path = ROOT, jobs: int = 2, quiet: bool = False
) -> tuple[list[list[str]], list[str]]:
    """Every part: its stubs alone fail its tests; the reference passes them. ``(rows, problems)``."""
    from concurrent.futures import ThreadPoolExecutor

    from course.report import progress

    try:
        builds = load()
    except (OSError, ValueError) as exc:
        return [], [f"course/minibuilds.toml: {exc}"]
    chosen = [
        b
        for n, b in sorted(builds.items())
        if b.kind == "package"
        and (numbers is None or n in numbers)
        and all((root / f).is_file() for f in b.files)  # a scratch root without the package: nothing to prove
    ]
    problems: list[str] = []
    if stubbed_files(root):
        return [], [
            f"mini-build stubs are in place in {stubbed_files(root)}: run `mini-build NN reset` first"
        ]
    jobs_list: list[tuple[PhaseBuild, Part, Path | None]] = []
    with tempfile.TemporaryDirectory(prefix="course-minibuild-") as tmp:
        for build in chosen:
            for i, part in enumerate(build.parts):
                jobs_list.append((build, part, None))
                copy = Path(tmp) / f"{build.number}-{i}"
                _copy_package(root, copy)
                try:
                    for path in {t.path for t in part.stubs}:
                        text = (root / path).read_text(encoding="utf-8")
                        (copy / path).write_text(stubbed_text(build, path, text, (part,)), encoding="utf-8")
                except (OSError, ValueError, SyntaxError) as exc:
                    problems.append(f"mini-build {build.number} · {part.name}: cannot stub: {exc}")
                    continue
                jobs_list.append((build, part, copy))

        def one(job: tuple[PhaseBuild, Part, Path | None]) -> tuple[int, int, bool, str]:
            build, part, copy = job
            if copy is None:
                result = run_part(part, root)
            else:
                result = run_part(part, copy, pythonpath=f"{copy}{os.pathsep}{root}")
            if not quiet:
                label = "reference" if copy is None else "stubbed"
                progress(
                    f"  mini-build {build.number} · {part.name} · {label}: {result[0]} passed, {result[1]} failed"
                )
            return result

        with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
            outcomes = list(pool.map(one, jobs_list))
    by_part: dict[tuple[str, str], dict[str, tuple[int, int, bool, str]]] = {}
    for (build, part, copy), outcome in zip(jobs_list, outcomes, strict=True):
        by_part.setdefault((build.number, part.name), {})["reference" if copy is None else "stubbed"] = (
            outcome
        )
    rows = []
    for (number, name), runs in by_part.items():
        ref, stub = runs.get("reference"), runs.get("stubbed")
        bad = []
        if ref and (ref[2] or ref[1] or not ref[0]):
            bad.append(f"the reference does not pass ({ref[0]} passed, {ref[1]} failed)\n{_tail(ref[3])}")
        if stub and (stub[2] or not stub[1]):
            why = "its tests could not be collected" if stub[2] else "every test passes on the stubs"
            bad.append(f"the stubbed package does not fail its definition of done: {why}\n{_tail(stub[3])}")
        problems += [f"mini-build {number} · {name}: {b}" for b in bad]
        rows.append(
            [
                number,
                f"mini-build: {name}",
                f"{ref[0]} passed" if ref else "-",
                f"{stub[1]}/{stub[0] + stub[1]} fail" if stub else "-",
                "-",
                "FAIL" if bad else "OK",
            ]
        )
    return rows, problems


def _tail(text: str, lines: int = 12) -> str:
    return "\n".join("      " + line for line in text.strip().splitlines()[-lines:])


# ------------------------------------------------------------------ command line
def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "mini-build",
        help="a phase's mini-build: stub the bodies (start), grade them (check), restore them (reset)",
        description="start: replace the phase's named mini_vllm bodies with stubs that raise "
        "NotImplementedError with the task (signatures and docstrings stay). check: run the phase's "
        "definition-of-done tests and report each part. reset: restore the reference from git HEAD. "
        "status: every phase's state. The table is course/minibuilds.toml.",
    )
    p.add_argument("phase", nargs="?", help="phase number, e.g. 03 (omit for the status of every phase)")
    p.add_argument("action", nargs="?", default="status", choices=("start", "check", "reset", "status"))
    p.add_argument("--force", action="store_true", help="start even if the files have uncommitted edits")
    p.add_argument("--root", type=Path, default=ROOT, help=argparse.SUPPRESS)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        builds = load()
    except (OSError, ValueError) as exc:
        print(f"error: {exc}")
        return 2
    if args.phase in (None, "status"):
        return status(builds, args.root)
    number = args.phase.zfill(2) if args.phase.isdigit() else args.phase
    build = builds.get(number)
    if build is None:
        print(f"error: no mini-build for phase {args.phase!r}; phases: {', '.join(sorted(builds))}")
        return 2
    if args.action == "status":
        return status({number: build}, args.root)
    return {
        "start": lambda: start(build, args.root, args.force),
        "check": lambda: check(build, args.root),
        "reset": lambda: reset(build, args.root),
    }[args.action]()


def stubbed_header(root: Path = ROOT) -> str | None:
    """The line conftest prints when stubs are in place (None when the package is whole)."""
    files = stubbed_files(root)
    if not files:
        return None
    numbers = sorted(started(root)) or ["NN"]
    return (
        f"course: mini-build in progress — {', '.join(files)} hold stubs; tests and labs that reach them "
        f"fail with NotImplementedError('mini-build …'). "
        + " / ".join(f"python -m course mini-build {n} check|reset" for n in numbers)
    )
