"""Regenerate the "numbers are computed, never typed" blocks in the course markdown.

A block looks exactly like this (the command runs from the repository root; a leading
``python`` means the interpreter running this tool)::

    <!-- output: python phase-00-foundations/labs/lab-01-kv-cache-speedup/solution.py -->
    ```text
    (whatever the command prints)
    ```
    <!-- /output -->

``outputs`` rewrites each block with the command's stdout (trailing whitespace stripped per line);
``outputs --check`` rewrites nothing and fails listing every stale block with a short diff.
Each distinct command runs once per invocation.

**Figures.** A command may also draw images (``.png`` or ``.svg`` anywhere in the course tree,
for example ``phase-02-paged-attention/figures/block_table.py`` writing ``block_table.svg``).
Every image is read before the commands run and again after; an image a command changed is a
stale figure, and so is a new one. The rule that decides "changed": an SVG must be byte-identical
(the figure scripts write fixed ids and no dates); a PNG must decode to the same size and the same
RGBA pixels, so a different zlib or PNG encoder does not count as a change. ``--check`` puts every
image back exactly as it was; a plain run keeps the new bytes only where the rule saw a change.

**GPU measurements.** A block may name a second command that only a GPU can run::

    <!-- output: python X/bench.py --predict | gpu: python X/bench.py -->

When ``results/gpu/*.json`` (written by ``make gpu-check``, see ``course/gpucheck.py``) holds a
successful run of the ``gpu:`` command, the block shows that run, headed "measured on <device>",
one section per device file; otherwise it shows what the first command prints (the prediction).
"""

from __future__ import annotations

import argparse
import difflib
import os
import re
import shlex
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from course import ROOT, gpucheck
from course.discover import EXCLUDED_DIRS, markdown_files, rel
from course.mdscan import fenced_lines
from course.report import progress
from course.runtime import cpu_env

OPEN_RE = re.compile(r"^<!-- output: (?P<cmd>.+?) -->\s*$")
FENCE_OPEN = "```text"
FENCE = "```"
CLOSE = "<!-- /output -->"
SHELL_CHARS = set("|;&<>`$")
TIMEOUT_S = 600
GPU_SEP = " | gpu: "
IMAGE_SUFFIXES = (".png", ".svg")


class BlockError(ValueError):
    """A malformed output block or a command that failed."""


@dataclass(frozen=True)
class Block:
    """One output block: ``body`` is lines ``start:end`` (0-based, end exclusive) of its file."""

    path: Path
    line: int  # 1-based line of the <!-- output: --> comment
    command: str
    start: int
    end: int
    body: tuple[str, ...]
    gpu_command: str | None = None  # measured on a GPU box when results/gpu/ holds a run of it


def find_blocks(path: Path) -> list[Block]:
    """Every output block in a markdown file; raises BlockError on a malformed one."""
    lines = path.read_text(encoding="utf-8").splitlines()
    fenced = fenced_lines(lines)  # an example block shown inside a code fence is not a block
    blocks = []
    i = 0
    while i < len(lines):
        m = OPEN_RE.match(lines[i])
        if not m or fenced[i]:
            i += 1
            continue
        where = f"{path}:{i + 1}"
        if i + 1 >= len(lines) or lines[i + 1].strip() != FENCE_OPEN:
            raise BlockError(f"{where}: an output comment must be followed by a ```text fence")
        j = i + 2
        while j < len(lines) and lines[j].strip() != FENCE:
            j += 1
        if j + 1 >= len(lines) or lines[j + 1].strip() != CLOSE:
            raise BlockError(f"{where}: the ```text block must be closed by ``` and then {CLOSE}")
        command, _, gpu_command = m.group("cmd").partition(GPU_SEP)
        blocks.append(
            Block(
                path, i + 1, command.strip(), i + 2, j, tuple(lines[i + 2 : j]), gpu_command.strip() or None
            )
        )
        i = j + 2
    return blocks


def output_env(root: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(root), env.get("PYTHONPATH", "")) if p)
    env.update(PYTHONHASHSEED="0", MPLBACKEND="Agg", COURSE_OUTPUTS="1", PYTHONDONTWRITEBYTECODE="1")
    env.pop("LAB_IMPL", None)
    env.pop("COURSE_LAB_FILE", None)
    if not _has_cuda():
        env["TRITON_INTERPRET"] = "1"
    cpu_env.apply_env(env, cuda=None if _has_cuda() else False)  # tier-1 CPU wiring, as conftest.py applies it
    return env


def _has_cuda() -> bool:
    return Path("/dev/nvidiactl").exists() or Path("/proc/driver/nvidia").exists()


def argv_for(command: str) -> list[str]:
    """The argv for a block's command: ``python`` becomes this interpreter; no shell syntax."""
    if SHELL_CHARS & set(command):
        raise BlockError(f"command {command!r} uses shell syntax; output blocks run one plain command")
    argv = shlex.split(command)
    if argv and argv[0] in ("python", "python3"):
        argv[0] = sys.executable
    return argv


def run_command(command: str, root: Path) -> list[str]:
    """Run a block's command from ``root``; return its stdout lines, cleaned."""
    try:
        proc = subprocess.run(
            argv_for(command),
            cwd=root,
            env=output_env(root),
            check=False,
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
        )
    except FileNotFoundError as exc:
        raise BlockError(f"command {command!r} cannot start: {exc}") from None
    except subprocess.TimeoutExpired:
        raise BlockError(f"command {command!r} took longer than {TIMEOUT_S}s") from None
    if proc.returncode != 0:
        raise BlockError(f"command {command!r} exited {proc.returncode}:\n{proc.stderr.strip()[-3000:]}")
    lines = [line.rstrip() for line in proc.stdout.splitlines()]
    while lines and not lines[-1]:
        lines.pop()
    if any(line.lstrip().startswith(FENCE) for line in lines):
        raise BlockError(f"command {command!r} printed a ``` line, which would end the block early")
    return lines


def image_files(root: Path) -> list[Path]:
    """Every .png/.svg under ``root``, outside generated and private folders."""
    found = []
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d not in EXCLUDED_DIRS and not d.startswith("."))
        found.extend(Path(folder) / f for f in sorted(files) if f.endswith(IMAGE_SUFFIXES))
    return found


def same_image(path: Path, old: bytes, new: bytes) -> bool:
    """The freshness rule: SVG (and anything else) byte for byte; PNG pixel for pixel."""
    if old == new:
        return True
    if path.suffix != ".png":
        return False
    try:
        import io

        from PIL import Image
    except ImportError:  # without Pillow only identical bytes count as the same picture
        return False
    try:
        with Image.open(io.BytesIO(old)) as a, Image.open(io.BytesIO(new)) as b:
            return a.size == b.size and a.convert("RGBA").tobytes() == b.convert("RGBA").tobytes()
    except OSError:  # one of them is not a readable PNG
        return False


def _figure_reports(
    before: dict[Path, bytes], root: Path, check: bool, results: dict[str, list[str] | BlockError]
) -> list[str]:
    """Compare every image with its snapshot; restore per the rules in the module docstring."""
    reports = []
    for path in image_files(root):
        new = path.read_bytes()
        old = before.get(path)
        if old is not None and same_image(path, old, new):
            if old != new:
                path.write_bytes(old)  # same picture, different encoding: keep the committed bytes
            continue
        drawers = sorted(c for c, out in results.items() if isinstance(out, list) and path.name in "\n".join(out))
        by = f" (drawn by `{drawers[0]}`)" if drawers else ""
        what = "new figure" if old is None else "stale figure"
        reports.append(f"{rel(path, root)}: {what}{by}")
        if check:
            if old is None:
                path.unlink()
            else:
                path.write_bytes(old)
    return reports


def refresh(
    files: list[Path], root: Path, check: bool, jobs: int = 2, allow_sample: bool = False
) -> tuple[list[str], list[str], int]:
    """Refresh (or check) the blocks of ``files`` and the figures their commands draw.

    Returns (stale reports, errors, number of blocks). ``allow_sample`` lets the tests feed a
    sample results file (never set by the command line).
    """
    errors: list[str] = []
    blocks: list[Block] = []
    for md in files:
        try:
            blocks.extend(find_blocks(md))
        except (BlockError, UnicodeDecodeError) as exc:
            errors.append(str(exc))
    try:
        measured = gpucheck.measured_outputs(root, allow_sample=allow_sample)
    except gpucheck.ResultsError as exc:
        errors.append(str(exc))
        measured = {}
    commands = sorted({b.command for b in blocks if b.gpu_command not in measured})
    results: dict[str, list[str] | BlockError] = {}

    def one(command: str) -> tuple[str, list[str] | BlockError]:
        start = time.monotonic()
        try:
            out: list[str] | BlockError = run_command(command, root)
        except BlockError as exc:
            out = exc
        progress(f"  ran: {command} ({time.monotonic() - start:.1f}s)")
        return command, out

    if commands:
        progress(f"outputs: {len(blocks)} block(s), {len(commands)} distinct command(s)")
    before = {p: p.read_bytes() for p in image_files(root)}
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        for command, out in pool.map(one, commands):
            results[command] = out

    stale: list[str] = []
    by_file: dict[Path, list[Block]] = {}
    for b in blocks:
        by_file.setdefault(b.path, []).append(b)
    for md, file_blocks in by_file.items():
        lines = md.read_text(encoding="utf-8").splitlines()
        changed = False
        for b in reversed(file_blocks):
            shown_command = b.command
            if b.gpu_command in measured:
                out = measured[b.gpu_command]
                shown_command = b.gpu_command
            else:
                out = results[b.command]
            if isinstance(out, BlockError):
                errors.append(f"{rel(md, root)}:{b.line}: {out}")
                continue
            if list(b.body) == out:
                continue
            diff = difflib.unified_diff(
                list(b.body), out, "in the page", "the command prints now", lineterm="", n=1
            )
            shown = list(diff)
            more = f"\n    … {len(shown) - 20} more diff lines" if len(shown) > 20 else ""
            stale.append(
                f"{rel(md, root)}:{b.line}: stale output of `{shown_command}`\n    "
                + "\n    ".join(shown[:20])
                + more
            )
            lines[b.start : b.end] = out
            changed = True
        if changed and not check:
            md.write_text("\n".join(lines) + "\n", encoding="utf-8")
    stale.extend(_figure_reports(before, root, check, results))
    return stale, errors, len(blocks)


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "outputs",
        help="regenerate the <!-- output: CMD --> blocks (or --check them)",
        description="Run the command each generated output block names (from the repo root) and write its "
        "stdout into the block. With --check, change nothing and fail if any block is stale.",
    )
    p.add_argument(
        "paths", nargs="*", metavar="PATH", help="markdown files or folders (default: the whole course)"
    )
    p.add_argument("--check", action="store_true", help="rewrite nothing; exit 1 listing every stale block")
    p.add_argument("-j", "--jobs", type=int, default=2, help="commands to run at once (default: 2)")
    p.add_argument("--root", type=Path, default=ROOT, help=argparse.SUPPRESS)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        files = markdown_files(args.root, args.paths)
    except FileNotFoundError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    stale, errors, count = refresh(files, args.root, args.check, args.jobs)
    for report in stale:
        print(report if args.check else report.splitlines()[0].replace("stale output", "refreshed output").replace("stale figure", "redrew figure"))
    for error in errors:
        print(f"error: {error}", file=sys.stderr)
    if args.check:
        verdict = "FAIL" if (stale or errors) else "ok"
        print(f"outputs --check: {verdict}: {count} block(s), {len(stale)} stale, {len(errors)} error(s)")
        if stale:
            print("run `make outputs` (python -m course outputs) and commit the result")
        return 1 if (stale or errors) else 0
    print(f"outputs: {count} block(s), {len(stale)} refreshed, {len(errors)} error(s)")
    return 1 if errors else 0
