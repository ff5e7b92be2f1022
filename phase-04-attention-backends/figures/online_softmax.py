"""Draw online_softmax.svg: the running state (m, denom, acc) as two tiles of keys stream past.

The example is the guide's (§4.5): one query, head size 1, keys 1, 3, 2, 5 with values 10, 20, 30,
40, in two tiles of two. The script runs the recurrence with numpy, checks it against the dense
softmax, and draws the state after each tile plus every key's weight: after tile 0 the weights are
relative to the running max 3; tile 1's correction exp(3 - 5) rescales them, and they end as
exp(k - 5), exactly the one-shot softmax's numerators.
Run: python phase-04-attention-backends/figures/online_softmax.py
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from course.svgfig import BLUE, FAINT, GREY, INK, ORANGE, Svg

KEYS = np.array([1.0, 3.0, 2.0, 5.0])
VALUES = np.array([10.0, 20.0, 30.0, 40.0])
TILE = 2


def stream() -> list[dict]:
    """The state after each tile, and each seen key's weight relative to the running max."""
    m, denom, acc = -np.inf, 0.0, 0.0
    weights = np.zeros_like(KEYS)
    states = []
    for start in range(0, len(KEYS), TILE):
        s, v = KEYS[start : start + TILE], VALUES[start : start + TILE]
        m_new = max(m, float(s.max()))
        correction = float(np.exp(m - m_new))
        p = np.exp(s - m_new)
        acc = acc * correction + float(p @ v)
        denom = denom * correction + float(p.sum())
        weights = weights * correction
        weights[start : start + TILE] = p
        states.append({"m": m_new, "correction": correction, "denom": denom, "acc": acc, "weights": weights.copy()})
        m = m_new
    return states


def draw(states: list[dict], dense: float, path: Path) -> None:
    svg = Svg(760, 400, "Online softmax over two tiles of keys",
              "Two tiles of keys stream past a running state of max, denominator and accumulator; the "
              "correction exp(3-5) rescales the first tile's weights so they end equal to the dense softmax's.")
    tile_x = [40, 330]
    for t, x in enumerate(tile_x):
        svg.text(x, 24, f"tile {t}", 12, bold=True)
        for j in range(TILE):
            k = t * TILE + j
            svg.rect(x + j * 92, 32, 84, 34, FAINT)
            svg.text(x + j * 92 + 42, 54, f"k={KEYS[k]:g}  v={VALUES[k]:g}", 11, "middle", mono=True)
        st = states[t]
        svg.line(x + 88, 68, x + 88, 92, arrow=True)
        svg.rect(x, 96, 176, 74, "#ffffff", BLUE, 1.5, rx=4)
        svg.text(x + 8, 114, f"m     = {st['m']:g}", 11, mono=True)
        svg.text(x + 8, 132, f"denom = {st['denom']:.4f}", 11, mono=True)
        svg.text(x + 8, 150, f"acc   = {st['acc']:.4f}", 11, mono=True)
        svg.text(x + 8, 166, f"state after tile {t}", 9, fill="#555555")
    svg.line(216, 133, 326, 133, arrow=True)
    c = states[1]["correction"]
    svg.text(271, 124, f"× exp(3 − 5) = {c:.4f}", 10, "middle")
    svg.text(271, 150, "then add tile 1", 10, "middle")
    last = states[-1]
    svg.line(506, 133, 560, 133, arrow=True)
    svg.rect(566, 104, 176, 58, "#ffffff", ORANGE, 1.5, rx=4)
    svg.text(574, 124, "out = acc / denom", 11, mono=True)
    svg.text(574, 142, f"    = {last['acc'] / last['denom']:.4f}", 11, mono=True)
    svg.text(574, 157, f"dense softmax: {dense:.4f}", 9, fill="#555555")
    # each key's weight, relative to the running max, after each tile
    base, h, left = 360, 130, 90
    svg.text(40, 210, "each key's weight in acc and denom (relative to the running max)", 12, bold=True)
    svg.line(left, base, left + 620, base)
    svg.text(left - 8, base - h + 4, "1", 10, "end")
    svg.line(left - 4, base - h, left, base - h)
    svg.text(left - 8, base + 4, "0", 10, "end")
    for k in range(len(KEYS)):
        x = left + 30 + k * 150
        for t, colour in enumerate((GREY, BLUE)):
            w = states[t]["weights"][k]
            bx = x + t * 44
            if w > 0:
                svg.rect(bx, base - h * w, 38, h * w, colour, INK, 0.5)
                svg.text(bx + 19, base - h * w - 4, f"{w:.4f}", 9, "middle")
            else:
                svg.text(bx + 19, base - 4, "unseen", 9, "middle", fill="#777777")
        svg.text(x + 41, base + 16, f"key {KEYS[k]:g}: exp({KEYS[k]:g} − 5) = {np.exp(KEYS[k] - 5):.4f}", 10, "middle")
    svg.rect(left, 384, 12, 10, GREY, INK, 0.5)
    svg.text(left + 16, 393, "after tile 0 (max 3)", 10)
    svg.rect(left + 150, 384, 12, 10, BLUE, INK, 0.5)
    svg.text(left + 166, 393, "after tile 1 (max 5): the corrections telescope to the dense weights", 10)
    svg.write(path)


def main() -> None:
    states = stream()
    dense_w = np.exp(KEYS - KEYS.max())
    dense = float(dense_w @ VALUES / dense_w.sum())
    for t, st in enumerate(states):
        print(f"after tile {t}: m={st['m']:g} correction={st['correction']:.4f} denom={st['denom']:.4f} "
              f"acc={st['acc']:.4f}")
        print(f"              key weights {np.round(st['weights'], 4).tolist()}")
    print(f"online acc/denom = {states[-1]['acc'] / states[-1]['denom']:.4f}; dense = {dense:.4f}")
    assert np.allclose(states[-1]["weights"], dense_w), "the corrections must telescope to exp(k - max)"
    draw(states, dense, Path(__file__).with_name("online_softmax.svg"))
    print("wrote online_softmax.svg")


if __name__ == "__main__":
    main()
