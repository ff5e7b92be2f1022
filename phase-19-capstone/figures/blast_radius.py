"""Draw blast_radius.svg: who calls ``async_tensor_h2d`` at the pin, and who relies on its default.

Scoping a fix starts with its callers. This script parses every ``.py`` file under
``upstream/vllm`` (no import of vllm), finds each call of ``async_tensor_h2d`` and records
whether it passes ``pin_memory`` (keyword, or the fourth positional argument). Only the calls
that take the default change when the default changes: that set is the fix's blast radius.
Run: python phase-19-capstone/figures/blast_radius.py
"""

from __future__ import annotations

import ast
from collections import Counter
from pathlib import Path

from course import ROOT
from course.svgfig import BLUE, GREY, INK, ORANGE, Svg

TARGET = "async_tensor_h2d"


def calls(tree: Path = ROOT / "upstream") -> list[tuple[str, int, bool]]:
    """(path relative to the tree, line, passes pin_memory) for every call of TARGET."""
    found = []
    for path in sorted((tree / "vllm").rglob("*.py")):
        text = path.read_text(encoding="utf-8", errors="replace")
        if TARGET not in text:
            continue
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.Call):
                name = getattr(node.func, "id", None) or getattr(node.func, "attr", None)
                if name == TARGET:
                    explicit = len(node.args) >= 4 or any(k.arg == "pin_memory" for k in node.keywords)
                    found.append((path.relative_to(tree).as_posix(), node.lineno, explicit))
    return found


def area(path: str) -> str:
    """The subsystem a file belongs to: two levels below vllm/ (vllm/v1/attention → v1/attention)."""
    parts = path.split("/")[1:-1]
    return "/".join(parts[:2]) if parts and parts[0] == "v1" else (parts[0] if parts else "vllm")


def draw(rows: list[tuple[str, int, int]], path: Path) -> None:
    width, left, bar_h, gap, top = 640, 200, 30, 12, 104
    most = max(d + e for _, d, e in rows)
    scale = (width - left - 80) / most
    svg = Svg(
        width,
        top + len(rows) * (bar_h + gap) + 50,
        "Callers of async_tensor_h2d at the pin",
        "One bar per subsystem: orange calls take the pin_memory default (they change if the default "
        "changes), blue calls pass pin_memory themselves (untouched).",
    )
    svg.text(16, 30, "async_tensor_h2d callers at v0.22.1", 21)
    svg.rect(16, 46, 16, 16, ORANGE, ORANGE)
    svg.text(40, 60, "take the default: in the blast radius", 18)
    svg.rect(16, 72, 16, 16, BLUE, BLUE)
    svg.text(40, 86, "pass pin_memory: untouched", 18)
    for i, (name, default, explicit) in enumerate(rows):
        y = top + i * (bar_h + gap)
        svg.text(left - 8, y + bar_h - 8, name, 18, "end")
        svg.rect(left, y, default * scale, bar_h, ORANGE, ORANGE)
        svg.rect(left + default * scale, y, explicit * scale, bar_h, BLUE, BLUE)
        svg.text(left + (default + explicit) * scale + 6, y + bar_h - 8, f"{default} + {explicit}", 18)
    y = top + len(rows) * (bar_h + gap)
    svg.line(left, top - 4, left, y, GREY)
    svg.text(left, y + 26, "call sites", 18, "start", INK)
    svg.write(path)


def main() -> None:
    found = calls()
    per_area: dict[str, Counter] = {}
    for path, _line, explicit in found:
        per_area.setdefault(area(path), Counter())[explicit] += 1
    rows = sorted(((a, c[False], c[True]) for a, c in per_area.items()), key=lambda r: (-r[1] - r[2], r[0]))
    print(f"{len(found)} calls of {TARGET} in {len({p for p, _, _ in found})} files")
    print(f"{'subsystem':<18} default  explicit")
    for name, default, explicit in rows:
        print(f"{name:<18} {default:>7}  {explicit:>8}")
    print("take the default:")
    for path, line, explicit in found:
        if not explicit:
            print(f"  {path}:{line}")
    draw(rows, Path(__file__).with_name("blast_radius.svg"))
    print("wrote blast_radius.svg")


if __name__ == "__main__":
    main()
