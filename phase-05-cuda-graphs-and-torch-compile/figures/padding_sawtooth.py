"""Draw padding_sawtooth.svg: the junk rows a batch pays when it is padded up the capture ladder.

The ladder is ``mini_vllm.cudagraph.default_capture_sizes(512)`` (vLLM's default shape: 1, 2, 4,
every 8 below 256, every 16 up to 512) and each batch runs the graph of
``select_capture_size(batch, ladder)``; above the top rung the batch runs eagerly (no padding).
Run: python phase-05-cuda-graphs-and-torch-compile/figures/padding_sawtooth.py
"""

from __future__ import annotations

import math
from pathlib import Path

from course.svgfig import BLUE, GREY, INK, ORANGE, Svg
from mini_vllm.cudagraph import default_capture_sizes, select_capture_size

TOP = 512
SHOWN = TOP  # batches 1..512; a larger batch runs eagerly, with no padding at all


def junk_share(batch: int, ladder: list[int]) -> float:
    rung = select_capture_size(batch, ladder)
    return 0.0 if rung is None else (rung - batch) / rung


def draw(ladder: list[int], shares: list[float], path: Path) -> None:
    left, top, pw, ph = 60, 30, 860, 230
    svg = Svg(
        left + pw + 30,
        top + ph + 70,
        "Padding up the capture ladder",
        "Share of each padded batch that is junk rows, for batch sizes 1 to 512 on the default ladder, "
        "log-scaled batch axis: tall teeth at small batches where rungs are far apart relative to the "
        "batch, small teeth later; past 512 a batch runs eagerly, with no padding.",
    )
    ymax = 0.5

    def sx(b: float) -> float:  # log2 axis: the small batches, where padding hurts, get the room
        return left + math.log2(b) / math.log2(SHOWN) * pw

    def sy(v: float) -> float:
        return top + ph - min(v, ymax) / ymax * ph

    svg.line(left, top + ph, left + pw, top + ph)
    svg.line(left, top, left, top + ph)
    for v in (0.0, 0.1, 0.2, 0.3, 0.4, 0.5):
        svg.line(left - 4, sy(v), left + pw, sy(v), GREY, 0.5)
        svg.text(left - 8, sy(v) + 4, f"{v:.0%}", 10, "end")
    for b in (1, 2, 4, 8, 16, 32, 64, 128, 256, 512):
        svg.line(sx(b), top + ph, sx(b), top + ph + 4)
        svg.text(sx(b), top + ph + 17, str(b), 10, "middle")
    svg.text(left + pw / 2, top + ph + 36, "batch (tokens in the step, log scale)", 11, "middle")
    svg.text(left, top - 12, "junk share of the padded batch", 11)
    svg.polyline([(sx(b), sy(v)) for b, v in enumerate(shares, 1)], BLUE, 1.2)
    svg.text(sx(TOP), top + 16, f"past {TOP}: eager, no padding", 10, "end")
    for b in (3, 5, 33, 257):
        v = shares[b - 1]
        svg.circle(sx(b), sy(v), 3, ORANGE)
        svg.text(sx(b) + 6, sy(v) - 4, f"{b}→{select_capture_size(b, ladder)}: {v:.1%}", 10, fill=INK)
    svg.write(path)


def main() -> None:
    ladder = default_capture_sizes(TOP)
    shares = [junk_share(b, ladder) for b in range(1, SHOWN + 1)]
    print(f"ladder: {len(ladder)} rungs, {ladder[:5]} ... {ladder[-3:]}")
    for lo, hi in ((1, 8), (9, 64), (65, 256), (257, 512)):
        part = shares[lo - 1 : hi]
        print(
            f"batches {lo:>3}-{hi:<3}: worst junk share {max(part):5.1%}, mean {sum(part) / len(part):5.1%}"
        )
    draw(ladder, shares, Path(__file__).with_name("padding_sawtooth.svg"))
    print("wrote padding_sawtooth.svg")


if __name__ == "__main__":
    main()
