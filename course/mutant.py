"""``python -m course mutant``: write, edit and check mutants without hand-writing a diff.

    python -m course mutant new  LAB NAME        # copy solution.py (or the mutant so far) to edit
    python -m course mutant save LAB NAME --why "what the learner believed, and what breaks"
    python -m course mutant check LAB [NAME ...] # apply each, run the lab's tests, report caught / survived / stale
    python -m course mutant show LAB NAME        # print the mutated solution.py

LAB is a lab folder (``phase-00-foundations/labs/lab-02-kv-memory-calculator``) or ``mini_vllm``
(then ``new`` takes ``--file mini_vllm/block_pool.py``, and the delta patches files relative to
the repository root). The copy to edit lives under ``build/mutants/`` (git ignores it).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

from course import ROOT, check_labs, patches
from course.discover import Lab, rel
from course.labrun import run_lab

MINI = check_labs.MINI


def _lab(arg: str, root: Path) -> Lab | None:
    """The lab named by ``arg`` (``None`` for ``mini_vllm``)."""
    path = Path(arg).resolve() if Path(arg).is_absolute() else (root / arg).resolve()
    if path.name == MINI and path.parent == root.resolve():
        return None
    if not (path / "solution.py").is_file() or not (path / "test_lab.py").is_file():
        raise SystemExit(f"error: {arg} is not a lab folder (no solution.py and test_lab.py there)")
    return Lab(path=path, phase=path.parent.parent.name.split("-")[1])


def _mutant_file(lab: Lab | None, name: str, root: Path) -> Path:
    if not name.replace("_", "").isalnum() or name != name.lower():
        raise SystemExit(f"error: {name!r}: a mutant name is snake_case (letters, digits, underscores)")
    folder = root / MINI / "mutants" if lab is None else lab.path / "mutants"
    return folder / f"{name}.diff"


def _edit_dir(lab: Lab | None, name: str, root: Path) -> Path:
    where = Path(MINI) if lab is None else Path(rel(lab.path, root))
    return root / "build" / "mutants" / where / name


def _base(lab: Lab | None, root: Path) -> Path:
    return root if lab is None else lab.path


def _where(args: argparse.Namespace) -> tuple[Lab | None, Path, Path, Path]:
    """(lab, the mutant's .diff, the edit folder, the folder the diff's paths are relative to)."""
    lab = _lab(args.lab, args.root)
    edit = _edit_dir(lab, args.name, args.root)
    return lab, _mutant_file(lab, args.name, args.root), edit, _base(lab, args.root)


def cmd_new(args: argparse.Namespace) -> int:
    root = args.root
    lab, target, edit, base = _where(args)
    stale = None
    if target.is_file():
        delta = patches.load(target)
        try:
            texts = patches.apply(delta, lambda p: (base / p).read_text(encoding="utf-8"))
        except patches.StaleMutant as exc:  # the file moved on: start from it and redo the change
            stale = exc
            texts = {f.path: (base / f.path).read_text(encoding="utf-8") for f in delta.files}
    elif lab is None:
        if not args.file:
            raise SystemExit("error: a mini_vllm mutant needs --file mini_vllm/<module>.py")
        texts = {args.file: (root / args.file).read_text(encoding="utf-8")}
    else:
        texts = {"solution.py": (lab.path / "solution.py").read_text(encoding="utf-8")}
    if edit.exists():
        shutil.rmtree(edit)
    for name, text in texts.items():
        (edit / name).parent.mkdir(parents=True, exist_ok=True)
        (edit / name).write_text(text, encoding="utf-8")
    if stale is not None:
        print(f"the delta of {args.name} no longer applies ({stale}); the copy is the current file.")
        print("redo the mistake it made, shown here, then save (the header is kept):\n")
        print(target.read_text(encoding="utf-8"))
    shown = ", ".join(rel(edit / n, root) for n in texts)
    why = " --why \"...\"" if not target.is_file() else ""
    print(f"{'editing the existing' if target.is_file() else 'new'} mutant {args.name}: edit {shown}")
    print("  make ONE plausible mistake a learner would make (code only; leave the docstring alone), then:")
    print(f"  python -m course mutant save {args.lab} {args.name}{why}")
    print(f"  python -m course mutant check {args.lab} {args.name}")
    return 0


def cmd_save(args: argparse.Namespace) -> int:
    root = args.root
    _, target, edit, base = _where(args)
    if not edit.is_dir():
        raise SystemExit(f"error: nothing to save: run `python -m course mutant new {args.lab} {args.name}` first")
    header = args.why or (patches.load(target).header if target.is_file() else "")
    if not header.strip():
        raise SystemExit("error: say what the learner believed and what breaks: --why \"...\"")
    edits = {}
    for path in sorted(p for p in edit.rglob("*") if p.is_file()):
        name = path.relative_to(edit).as_posix()
        edits[name] = ((base / name).read_text(encoding="utf-8"), path.read_text(encoding="utf-8"))
    edits = {k: v for k, v in edits.items() if v[0] != v[1]}
    try:
        text = patches.write_diff(header, edits)
    except ValueError as exc:
        raise SystemExit(f"error: {exc}") from None
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text, encoding="utf-8")
    print(f"wrote {rel(target, root)} ({len(text.splitlines())} lines)")
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    _, target, _, base = _where(args)
    for name, text in patches.apply(patches.load(target), lambda p: (base / p).read_text(encoding="utf-8")).items():
        print(f"# ---- {name} with mutant {args.name}")
        sys.stdout.write(text)
    return 0


def cmd_check(args: argparse.Namespace) -> int:
    root = args.root
    lab = _lab(args.lab, root)
    if lab is None:
        problems = check_labs.check_mini(root, jobs=1, names=args.names)
        which = "each named mini_vllm mutant" if args.names else "every mini_vllm mutant"
        print("\n".join(problems) or f"{which} applies and is caught")
        return 1 if problems else 0
    names = args.names or [m.stem for m in lab.mutants]
    status = 0
    with tempfile.TemporaryDirectory(prefix="course-mutant-") as tmp:
        for name in names:
            mutant = _mutant_file(lab, name, root)
            if not mutant.is_file():
                print(f"{name}: no such mutant ({rel(mutant, root)})")
                status = 1
                continue
            try:
                path = check_labs.materialize(lab, mutant, Path(tmp))
            except patches.StaleMutant as exc:
                print(f"STALE    {check_labs.stale_message(lab, mutant, root, exc)}")
                status = 1
                continue
            result = run_lab(lab.path, root, f"mutant {name}", lab_file=path, first_failure=True)
            if result.collection_error:
                verdict, status = "BROKEN  ", 1
            elif result.failed:
                verdict = "caught  "
            else:
                verdict, status = "SURVIVES", 1
            caught_by = f" by {result.failed[0].name}" if result.failed and not result.collection_error else ""
            print(f"{verdict} {name}{caught_by}")
    return status


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "mutant",
        help="write, edit and check a lab's mutants (wrong solutions stored as deltas)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--root", type=Path, default=ROOT, help=argparse.SUPPRESS)
    actions = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    new = actions.add_parser("new", help="copy solution.py (or an existing mutant) to an edit folder")
    new.add_argument("lab")
    new.add_argument("name")
    new.add_argument("--file", help="mini_vllm only: the module to mutate, e.g. mini_vllm/block_pool.py")
    new.set_defaults(func=cmd_new)
    save = actions.add_parser("save", help="write mutants/NAME.diff from the edited copy")
    save.add_argument("lab")
    save.add_argument("name")
    save.add_argument("--why", help="the misconception: why a learner would write this and what breaks")
    save.set_defaults(func=cmd_save)
    check = actions.add_parser("check", help="apply each mutant and run the lab's tests on it")
    check.add_argument("lab")
    check.add_argument("names", nargs="*")
    check.set_defaults(func=cmd_check)
    show = actions.add_parser("show", help="print solution.py with the mutant applied")
    show.add_argument("lab")
    show.add_argument("name")
    show.set_defaults(func=cmd_show)
