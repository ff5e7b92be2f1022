"""Mutants as small deltas: read, write and apply the course's ``mutants/*.diff`` files.

A mutant file is free text naming the misconception (why a learner would write it, what breaks),
a blank line, then a unified diff::

    Divides with / instead of //: 29.8 "users" come back, but a partial sequence cannot be served.

    --- a/solution.py
    +++ b/solution.py
    @@ -64,3 +64,3 @@
         if free <= 0:
             return 0
    -    return free // per_seq
    +    return free / per_seq

Lab mutants patch ``solution.py`` (paths relative to the lab folder); ``mini_vllm/mutants/*.diff``
patch files relative to the repository root (``--- a/mini_vllm/block_pool.py``), one section per
file. The applier is exact: every context and removed line must match the file as it is now (a
hunk may sit at another line number, as after an edit above it, but nothing is fuzzed). A delta
that no longer applies raises ``StaleMutant`` saying which hunk and which line differ.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, field
from pathlib import Path

HUNK_RE = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")
CONTEXT = 2  # lines of context written around each change


class StaleMutant(ValueError):
    """A mutant's delta does not apply to the file it patches (the file changed under it)."""


@dataclass
class Hunk:
    old_start: int  # 1-based line number in the original file
    lines: list[str] = field(default_factory=list)  # " x", "-x", "+x" (no newline)

    @property
    def old(self) -> list[str]:
        return [line[1:] for line in self.lines if line[:1] in (" ", "-")]

    @property
    def new(self) -> list[str]:
        return [line[1:] for line in self.lines if line[:1] in (" ", "+")]


@dataclass
class FilePatch:
    path: str  # relative, without the a/ prefix
    hunks: list[Hunk] = field(default_factory=list)


@dataclass
class Mutant:
    name: str
    header: str  # the misconception, in prose
    files: list[FilePatch]
    source: Path | None = None


def parse(text: str, name: str = "mutant", source: Path | None = None) -> Mutant:
    """Split a mutant file into its prose header and its per-file hunks."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith("--- a/")), None)
    if start is None:
        raise StaleMutant(f"{name}: no '--- a/<file>' line: a mutant file is prose, a blank line, then a diff")
    header = "\n".join(lines[:start]).strip()
    if not header:
        raise StaleMutant(f"{name}: the header is empty: say which misconception this mutant encodes")
    files: list[FilePatch] = []
    i = start
    while i < len(lines):
        line = lines[i]
        if line.startswith("--- a/"):
            if i + 1 >= len(lines) or not lines[i + 1].startswith("+++ b/"):
                raise StaleMutant(f"{name}: line {i + 2}: expected '+++ b/<file>' after {line!r}")
            files.append(FilePatch(line[len("--- a/") :].strip()))
            i += 2
            continue
        match = HUNK_RE.match(line)
        if match and files:
            hunk = Hunk(int(match.group(1)))
            old_len = int(match.group(2) or 1)
            new_len = int(match.group(4) or 1)
            i += 1
            n_old = n_new = 0
            while i < len(lines) and (n_old < old_len or n_new < new_len):
                body = lines[i]
                if body.startswith("\\"):  # "\ No newline at end of file"
                    i += 1
                    continue
                tag = body[:1] or " "  # an empty context line may have lost its space
                if tag not in " -+":
                    break
                hunk.lines.append(tag + body[1:])
                n_old += tag in " -"
                n_new += tag in " +"
                i += 1
            if (n_old, n_new) != (old_len, new_len):
                raise StaleMutant(f"{name}: hunk at line {hunk.old_start} is truncated or miscounted")
            files[-1].hunks.append(hunk)
            continue
        if line.strip() and not line.startswith("\\"):
            raise StaleMutant(f"{name}: line {i + 1} is neither a diff header nor a hunk: {line!r}")
        i += 1
    return Mutant(name, header, files, source)


def load(path: Path) -> Mutant:
    return parse(path.read_text(encoding="utf-8"), name=path.stem, source=path)


def apply_hunks(original: str, hunks: list[Hunk], label: str) -> str:
    """Apply ``hunks`` to ``original`` exactly (hunks may have moved, never changed)."""
    lines = original.splitlines()
    out: list[str] = []
    pos = 0  # next unconsumed line of ``lines``
    offset = 0
    for n, hunk in enumerate(hunks, 1):
        old = hunk.old
        want = max(pos, hunk.old_start - 1 + offset) if old else hunk.old_start + offset
        at = _find(lines, old, want, pos)
        if at is None:
            raise StaleMutant(f"{label}: hunk {n} (line {hunk.old_start}) no longer applies: {_why(lines, old, want)}")
        out.extend(lines[pos:at])
        out.extend(hunk.new)
        pos = at + len(old)
        offset = at - (hunk.old_start - 1)
    out.extend(lines[pos:])
    return "\n".join(out) + ("\n" if original.endswith("\n") or not original else "")


def _find(lines: list[str], old: list[str], want: int, lo: int) -> int | None:
    """The start nearest ``want`` (not before ``lo``) where ``old`` stands in ``lines``."""
    if not old:
        return want if lo <= want <= len(lines) else None
    span = len(lines) - len(old)
    for delta in range(0, len(lines) + 1):
        for at in (want - delta, want + delta) if delta else (want,):
            if lo <= at <= span and lines[at : at + len(old)] == old:
                return at
    return None


def _why(lines: list[str], old: list[str], want: int) -> str:
    """Name the first line of a hunk that differs from the file at the hunk's own position."""
    for k, expected in enumerate(old):
        i = want + k
        got = lines[i] if 0 <= i < len(lines) else "<end of file>"
        if got != expected:
            return f"line {i + 1} expected {expected.strip()!r}, found {got.strip()!r}"
    return "its lines are not found in order"


def apply(mutant: Mutant, read) -> dict[str, str]:
    """The patched text of every file the mutant touches; ``read(path)`` gives the current text."""
    return {fp.path: apply_hunks(read(fp.path), fp.hunks, f"{mutant.name} ({fp.path})") for fp in mutant.files}


def write_diff(header: str, edits: dict[str, tuple[str, str]]) -> str:
    """A mutant file: ``header``, a blank line, then one diff section per changed file."""
    body: list[str] = []
    for path, (before, after) in edits.items():
        diff = list(
            difflib.unified_diff(
                before.splitlines(), after.splitlines(), f"a/{path}", f"b/{path}", n=CONTEXT, lineterm=""
            )
        )
        body.extend(diff)
    if not body:
        raise ValueError("the edited copy is identical to the original: change something first")
    return header.strip() + "\n\n" + "\n".join(body) + "\n"
