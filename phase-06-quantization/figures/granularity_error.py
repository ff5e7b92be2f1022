"""Draw granularity_error.svg: how the scale's granularity decides the error, at 8 and 4 bits.

A seeded Gaussian 64 x 256 weight matrix with one row 100x louder (the §6.4 situation), quantized
symmetrically (round to nearest, scale = max|w| / qmax over the values that share it) per tensor,
per output channel and per group of 32 inputs. The bars are the relative error
``||W_q - W|| / ||W||`` over the 63 quiet rows, on a log axis.
Run: python phase-06-quantization/figures/granularity_error.py
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from course.svgfig import BLUE, GREEN, GREY, INK, ORANGE, Svg

ROWS, COLS, LOUD_ROW, GROUP = 64, 256, 3, 32


def fake_quant(w: np.ndarray, bits: int, granularity: str) -> np.ndarray:
    qmax = 2 ** (bits - 1) - 1
    if granularity == "per tensor":
        amax = np.abs(w).max(keepdims=True)
    elif granularity == "per channel":
        amax = np.abs(w).max(axis=1, keepdims=True)
    else:  # per group of GROUP inputs
        amax = np.abs(w.reshape(ROWS, COLS // GROUP, GROUP)).max(axis=2, keepdims=True)
        scale = amax / qmax
        q = np.clip(np.round(w.reshape(ROWS, COLS // GROUP, GROUP) / scale), -qmax, qmax)
        return (q * scale).reshape(ROWS, COLS)
    scale = amax / qmax
    return np.clip(np.round(w / scale), -qmax, qmax) * scale


def errors() -> dict[tuple[int, str], float]:
    w = np.random.default_rng(0).normal(size=(ROWS, COLS))
    w[LOUD_ROW] *= 100
    quiet = np.arange(ROWS) != LOUD_ROW
    out = {}
    for bits in (8, 4):
        for gran in ("per tensor", "per channel", f"per group of {GROUP}"):
            wq = fake_quant(w, bits, gran)
            out[bits, gran] = float(np.linalg.norm((wq - w)[quiet]) / np.linalg.norm(w[quiet]))
    return out


def draw(err: dict[tuple[int, str], float], path: Path) -> None:
    left, top, pw, ph = 70, 30, 560, 220
    svg = Svg(
        left + pw + 190,
        top + ph + 60,
        "Quantization error of the quiet rows, by granularity",
        "Relative error of 63 quiet rows next to one loud row, at 8 and 4 bits, per tensor, per channel "
        "and per group of 32, on a log axis: per tensor is worst by one to two orders of magnitude.",
    )
    lo, hi = -3.0, 0.0  # 0.1% .. 100%

    def sy(v: float) -> float:
        return top + ph - (math.log10(v) - lo) / (hi - lo) * ph

    svg.line(left, top + ph, left + pw, top + ph)
    for exp in range(-3, 1):
        y = sy(10.0**exp)
        svg.line(left - 4, y, left + pw, y, GREY, 0.5)
        svg.text(left - 8, y + 4, f"{10.0**exp * 100:g}%", 10, "end")
    colours = {"per tensor": ORANGE, "per channel": BLUE, f"per group of {GROUP}": GREEN}
    bw = 60
    for i, bits in enumerate((8, 4)):
        x0 = left + 60 + i * 260
        svg.text(x0 + 1.5 * bw + 10, top + ph + 20, f"int{bits}", 12, "middle", bold=True)
        for j, gran in enumerate(colours):
            v = err[bits, gran]
            x = x0 + j * (bw + 10)
            svg.rect(x, sy(v), bw, top + ph - sy(v), colours[gran], INK, 0.5)
            svg.text(x + bw / 2, sy(v) - 5, f"{v:.2%}", 10, "middle")
    for k, (gran, colour) in enumerate(colours.items()):
        y = top + 10 + k * 22
        svg.rect(left + pw + 20, y, 14, 14, colour, INK, 0.5)
        svg.text(left + pw + 40, y + 11, gran, 11)
    svg.text(left, top - 12, "relative error of the quiet rows (log)", 11)
    svg.write(path)


def main() -> None:
    err = errors()
    print(f"W: {ROWS} x {COLS} Gaussian (seed 0), row {LOUD_ROW} x100; error over the {ROWS - 1} quiet rows")
    for (bits, gran), v in err.items():
        print(f"  int{bits}  {gran:<16} {v:8.3%}")
    draw(err, Path(__file__).with_name("granularity_error.svg"))
    print("wrote granularity_error.svg")


if __name__ == "__main__":
    main()
