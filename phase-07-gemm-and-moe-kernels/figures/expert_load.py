"""Draw expert_load.svg: tokens per expert after top-2 routing, with and without a favourite.

A seeded router: 256 tokens with Gaussian hidden states (width 64), a Gaussian router matrix
(64 x 8), softmax, top-2 per token (a token never picks one expert twice). The right panel adds
a bias of +1.5 to expert 7's logit, the way a router that learned a favourite behaves. The layer
waits for its busiest expert (the barrier of §7.8), so the step costs max/mean fair shares.
Run: python phase-07-gemm-and-moe-kernels/figures/expert_load.py
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from course.svgfig import BLUE, GREY, INK, ORANGE, RED, Svg

TOKENS, HIDDEN, EXPERTS, TOP_K, BIAS = 256, 64, 8, 2, 1.5


def loads(bias: float) -> np.ndarray:
    rng = np.random.default_rng(7)
    x = rng.normal(size=(TOKENS, HIDDEN))
    w = rng.normal(size=(HIDDEN, EXPERTS)) / np.sqrt(HIDDEN)
    logits = x @ w
    logits[:, EXPERTS - 1] += bias
    top = np.argsort(-logits, axis=1, kind="stable")[:, :TOP_K]  # softmax keeps the order
    return np.bincount(top.ravel(), minlength=EXPERTS)


def draw(panels: list[tuple[str, np.ndarray]], path: Path, stacked: bool = False) -> None:
    """Side by side for a wide page; ``stacked`` (one above the other) for a phone."""
    pw, ph, left, top = 380, 200, 50, 40
    step_x, step_y = (0, ph + 90) if stacked else (pw + 20, 0)
    svg = Svg(
        left + pw + 20 + step_x,
        top + ph + 60 + step_y,
        "Tokens per expert after top-2 routing",
        "Two bar charts of eight experts: a balanced router keeps every expert near the mean of 64; "
        "a router with a favourite sends expert 7 far more, and the layer waits for it.",
    )
    ymax = max(int(p.max()) for _, p in panels) * 1.15
    for n, (title, p) in enumerate(panels):
        x0, y0 = left + n * step_x, top + n * step_y

        def sy(v: float, y0: float = y0) -> float:
            return y0 + ph - v / ymax * ph

        svg.text(x0, y0 - 18, title, 12, bold=True)
        svg.line(x0, y0 + ph, x0 + pw - 20, y0 + ph)
        mean = p.mean()
        bw = (pw - 40) / EXPERTS
        for e, v in enumerate(p):
            colour = RED if v == p.max() else (ORANGE if n else BLUE)
            svg.rect(x0 + 10 + e * bw, sy(v), bw - 8, y0 + ph - sy(v), colour, INK, 0.5)
            svg.text(x0 + 10 + e * bw + (bw - 8) / 2, sy(v) - 4, str(int(v)), 10, "middle")
            svg.text(x0 + 10 + e * bw + (bw - 8) / 2, y0 + ph + 14, str(e), 10, "middle")
        svg.line(x0, sy(mean), x0 + pw - 20, sy(mean), GREY, 1.5, dash=True)
        svg.text(x0 + 2, sy(mean) - 4 if n else y0 + 2, f"mean {mean:g} (dashed)", 10)
        svg.text(x0, y0 + ph + 34, f"max / mean = {p.max() / mean:.2f} fair shares per step", 11)
    svg.write(path)


def main() -> None:
    panels = [("balanced router", loads(0.0)), (f"expert 7 favoured (+{BIAS} logit)", loads(BIAS))]
    print(f"{TOKENS} tokens x top-{TOP_K} = {TOKENS * TOP_K} assignments over {EXPERTS} experts (seed 7)")
    for title, p in panels:
        print(f"  {title:<28} loads {p.tolist()}  max/mean {p.max() / p.mean():.2f}")
    draw(panels, Path(__file__).with_name("expert_load.svg"))
    draw(panels, Path(__file__).with_name("expert_load.narrow.svg"), stacked=True)
    print("wrote expert_load.svg and its stacked twin expert_load.narrow.svg")


if __name__ == "__main__":
    main()
