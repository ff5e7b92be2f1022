"""A tiny SVG writer for the course's generated diagrams (``phase-NN-*/figures/*.py``).

Why not matplotlib: a diagram is boxes, arrows and labels, and an SVG written here is the same
bytes on every machine and every library version (coordinates rounded to 0.1, fixed ids, no
dates), so ``course outputs --check`` can compare it byte for byte. The figure scripts compute
their numbers (mini_vllm, numpy) and only lay them out with this.
"""

from __future__ import annotations

from pathlib import Path
from xml.sax.saxutils import escape

# One palette for every figure (colour-blind-safe pairs; legible on white).
BLUE, ORANGE, GREEN, GREY, RED, PURPLE = "#4477aa", "#ee7733", "#228833", "#bbbbbb", "#cc3311", "#aa3377"
INK, PAPER, FAINT = "#222222", "#ffffff", "#f2f2f2"


def _n(x: float) -> str:
    """A coordinate: at most one decimal, no trailing zeros, never ``-0``."""
    text = f"{round(float(x), 1):.1f}".rstrip("0").rstrip(".")
    return "0" if text in ("-0", "") else text


class Svg:
    """Collects elements in drawing order; :meth:`write` emits the file."""

    def __init__(self, width: float, height: float, title: str, desc: str) -> None:
        self.width, self.height = width, height
        self.parts: list[str] = [
            f"<title>{escape(title)}</title>",
            f"<desc>{escape(desc)}</desc>",
            f'<rect x="0" y="0" width="{_n(width)}" height="{_n(height)}" fill="{PAPER}"/>',
        ]

    def rect(self, x: float, y: float, w: float, h: float, fill: str = "none", stroke: str = INK,
             width: float = 1, rx: float = 0, dash: bool = False) -> None:
        extra = ' stroke-dasharray="4 3"' if dash else ""
        rounded = f' rx="{_n(rx)}"' if rx else ""
        self.parts.append(
            f'<rect x="{_n(x)}" y="{_n(y)}" width="{_n(w)}" height="{_n(h)}"{rounded} fill="{fill}" '
            f'stroke="{stroke}" stroke-width="{_n(width)}"{extra}/>'
        )

    def text(self, x: float, y: float, s: str, size: float = 12, anchor: str = "start", fill: str = INK,
             bold: bool = False, mono: bool = False) -> None:
        weight = ' font-weight="bold"' if bold else ""
        family = "monospace" if mono else "sans-serif"
        self.parts.append(
            f'<text x="{_n(x)}" y="{_n(y)}" font-family="{family}" font-size="{_n(size)}" '
            f'text-anchor="{anchor}" fill="{fill}"{weight}>{escape(s)}</text>'
        )

    def line(self, x1: float, y1: float, x2: float, y2: float, stroke: str = INK, width: float = 1,
             arrow: bool = False, dash: bool = False) -> None:
        extra = ' marker-end="url(#arrow)"' if arrow else ""
        extra += ' stroke-dasharray="4 3"' if dash else ""
        self.parts.append(
            f'<line x1="{_n(x1)}" y1="{_n(y1)}" x2="{_n(x2)}" y2="{_n(y2)}" stroke="{stroke}" '
            f'stroke-width="{_n(width)}"{extra}/>'
        )

    def polyline(self, points: list[tuple[float, float]], stroke: str = INK, width: float = 1.5) -> None:
        pts = " ".join(f"{_n(x)},{_n(y)}" for x, y in points)
        self.parts.append(f'<polyline points="{pts}" fill="none" stroke="{stroke}" stroke-width="{_n(width)}"/>')

    def circle(self, x: float, y: float, r: float, fill: str = INK) -> None:
        self.parts.append(f'<circle cx="{_n(x)}" cy="{_n(y)}" r="{_n(r)}" fill="{fill}"/>')

    def render(self) -> str:
        head = (
            f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {_n(self.width)} {_n(self.height)}" '
            f'width="{_n(self.width)}" height="{_n(self.height)}" role="img">'
        )
        marker = (
            '<defs><marker id="arrow" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" '
            f'markerHeight="7" orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" fill="{INK}"/>'
            "</marker></defs>"
        )
        return "\n".join([head, marker, *self.parts, "</svg>"]) + "\n"

    def write(self, path: Path) -> None:
        path.write_text(self.render(), encoding="utf-8", newline="\n")
