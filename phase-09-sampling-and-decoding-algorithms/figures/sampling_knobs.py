"""Draw sampling_knobs.svg: one next-token distribution, reshaped by each knob in turn.

Eight tokens with dyadic-ish logits; each panel is the distribution the draw would see after
``mini_vllm.sampler``'s stages: the raw softmax, temperature 2, temperature 0.5, top-k 3,
top-p 0.8, min-p 0.2, and the pipeline order temperature 0.7 -> min-p 0.1 -> top-k 5 -> top-p 0.9.
Run: python phase-09-sampling-and-decoding-algorithms/figures/sampling_knobs.py
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from course.svgfig import BLUE, GREY, INK, Svg
from mini_vllm.sampler import apply_min_p, apply_top_k_top_p

LOGITS = np.array([[2.0, 1.3, 0.9, 0.4, 0.0, -0.5, -1.0, -2.0]])


def dist(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0) -> np.ndarray:
    x = LOGITS / temperature
    if min_p:
        x = apply_min_p(x.copy(), np.array([min_p]))
    e = apply_top_k_top_p(x, np.array([top_k]), np.array([top_p]))
    return (e / e.sum(axis=1, keepdims=True))[0]


PANELS = [
    ("raw softmax", dict()),
    ("temperature 2", dict(temperature=2.0)),
    ("temperature 0.5", dict(temperature=0.5)),
    ("top-k 3", dict(top_k=3)),
    ("top-p 0.8", dict(top_p=0.8)),
    ("min-p 0.2", dict(min_p=0.2)),
    ("T 0.7, min-p 0.1, top-k 5, top-p 0.9", dict(temperature=0.7, min_p=0.1, top_k=5, top_p=0.9)),
]


def draw(rows: list[tuple[str, np.ndarray]], path: Path, cols: int = 4) -> None:
    """Lay the panels out ``cols`` to a row: 4 for a wide page, 1 (a stacked column) for a phone."""
    pw, ph = 250, 130
    grid_rows = -(-len(rows) // cols)
    svg = Svg(
        cols * pw + 20,
        grid_rows * (ph + 20) + 10,
        "How each sampling knob reshapes one distribution",
        "Seven panels of eight bars: the raw softmax, two temperatures, top-k 3, top-p 0.8, min-p 0.2 and "
        "the full pipeline; removed tokens are grey ticks at zero.",
    )
    for n, (title, p) in enumerate(rows):
        x0, y0 = 10 + (n % cols) * pw, 20 + (n // cols) * (ph + 20)
        base, h, bar = y0 + ph - 20, ph - 45, (pw - 30) / len(p)
        svg.text(x0 + 5, y0 + 5, title, 11)
        svg.line(x0 + 5, base, x0 + pw - 15, base, INK)
        for i, v in enumerate(p):
            x = x0 + 8 + i * bar
            if v > 0:
                svg.rect(x, base - h * v, bar - 5, h * v, BLUE, INK, 0.5)
                svg.text(x + (bar - 5) / 2, base - h * v - 3, f"{v:.2f}", 8, "middle")
            else:
                svg.line(x, base - 1, x + bar - 5, base - 1, GREY, 2)
            svg.text(x + (bar - 5) / 2, base + 12, str(i), 9, "middle")
    svg.write(path)


def main() -> None:
    rows = [(title, dist(**kw)) for title, kw in PANELS]
    print("token            " + " ".join(f"{i:>5}" for i in range(LOGITS.shape[1])))
    for title, p in rows:
        print(
            f"{title[:16]:<16} "
            + " ".join(f"{v:5.3f}" if v > 0 else "    -" for v in p)
            + f"   kept {int((p > 0).sum())}"
        )
    draw(rows, Path(__file__).with_name("sampling_knobs.svg"))
    draw(rows, Path(__file__).with_name("sampling_knobs.narrow.svg"), cols=1)
    print("wrote sampling_knobs.svg and its stacked twin sampling_knobs.narrow.svg")


if __name__ == "__main__":
    main()
