"""Draw slot_hit_rate.svg: how often an adapter is already resident, against the number of slots.

2,000 requests spread over 16 tenants' adapters go through ``mini_vllm.lora.LoRASlotManager``
(LRU, ``max_loras`` slots), once with every tenant equally busy and once with 80 % of requests
on 3 hot tenants. Every miss is an adapter copied into a slot.
Run: python phase-11-multi-lora/figures/slot_hit_rate.py
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from course.svgfig import BLUE, GREY, ORANGE, Svg
from mini_vllm.lora import LoRAAdapter, LoRASlotManager

TENANTS, REQUESTS, HOT, HOT_SHARE = 16, 2000, 3, 0.8
SLOTS = list(range(1, TENANTS + 1))


def trace(hot_share: float, seed: int = 0) -> list[int]:
    rng = np.random.default_rng(seed)
    return [int(rng.integers(HOT)) + 1 if rng.random() < hot_share else int(rng.integers(HOT, TENANTS)) + 1
            for _ in range(REQUESTS)]


def hit_rate(ids: list[int], max_loras: int) -> float:
    manager = LoRASlotManager(max_loras)
    dummy = LoRAAdapter.random(2, 2, 1, seed=0)
    for lora_id in ids:
        manager.activate_adapter(lora_id, dummy)
    return manager.stats.hits / len(ids)


def draw(series: dict[str, tuple[str, list[float]]], path: Path) -> None:
    svg = Svg(720, 320, "Adapter hit rate against max_loras",
              "LRU hit rate for 16 tenants: uniform traffic rises linearly as max_loras/16; "
              "skewed traffic is high from 4 slots on")
    left, top, w, h = 60, 30, 600, 220
    svg.line(left, top + h, left + w, top + h)
    svg.line(left, top, left, top + h)
    for pct in (0, 25, 50, 75, 100):
        y = top + h - h * pct / 100
        svg.line(left - 4, y, left, y)
        svg.text(left - 6, y + 4, f"{pct}%", 10, "end")
        svg.line(left, y, left + w, y, GREY, 0.5)
    x_of = {s: left + w * (s - 1) / (len(SLOTS) - 1) for s in SLOTS}
    for s in SLOTS:
        svg.text(x_of[s], top + h + 14, str(s), 10, "middle")
    svg.text(left + w / 2, top + h + 32, "max_loras (slots)", 11, "middle")
    for i, (label, (colour, rates)) in enumerate(series.items()):
        points = [(x_of[s], top + h - h * r) for s, r in zip(SLOTS, rates)]
        svg.polyline(points, colour, 2)
        for x, y in points:
            svg.circle(x, y, 2.5, colour)
        svg.line(left + 10 + 260 * i, 300, left + 30 + 260 * i, 300, colour, 2)
        svg.text(left + 36 + 260 * i, 304, label, 10)
    svg.write(path)


def main() -> None:
    uniform = [hit_rate(trace(HOT / TENANTS), s) for s in SLOTS]
    skewed = [hit_rate(trace(HOT_SHARE), s) for s in SLOTS]
    print(f"{REQUESTS} requests over {TENANTS} adapters, LRU slots (mini_vllm.lora.LoRASlotManager)")
    print("max_loras  uniform  80% on 3   max_loras/16")
    for s, u, k in zip(SLOTS, uniform, skewed):
        if s in (1, 2, 3, 4, 6, 8, 12, 16):
            print(f"{s:9d}  {u:6.1%}  {k:8.1%}   {s / TENANTS:6.1%}")
    draw({"every tenant equally busy": (ORANGE, uniform), "80% of requests on 3 tenants": (BLUE, skewed)},
         Path(__file__).with_suffix(".svg"))
    print("wrote slot_hit_rate.svg")


if __name__ == "__main__":
    main()
