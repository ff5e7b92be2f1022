"""Draw batch_timeline.svg: four requests sharing mini_vllm's loop, one column per engine step.

The steps are recorded by lab 04's reference ``trace_batches`` (a probe on the scheduler's
output), so the picture is exactly what the engine decided: prefill chunks, the chunk that
completes a prompt and samples, decodes, and the steps a request waits for a seat.
Run: python phase-01-architecture-and-request-lifecycle/figures/batch_timeline.py
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from course.svgfig import BLUE, FAINT, GREEN, INK, ORANGE, Svg

HERE = Path(__file__).resolve().parent
LAB = HERE.parent / "labs" / "lab-04-watch-the-batch" / "solution.py"
PROMPTS = ["hello world", "goodbye", "hey you", "tell me a joke"]
MAX_TOKENS = [3, 5, 2, 3]
ENGINE = dict(max_num_seqs=2, max_num_batched_tokens=10)


def load_lab():
    spec = importlib.util.spec_from_file_location("lab_01_04_solution", LAB)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def classify(ids, steps, prompt_lens):
    """Per request, per step: 'P' (prefill chunk), 'S' (chunk that completes the prompt and samples),
    'D' (decode), 'W' (added, not yet finished, not scheduled) or '' (finished)."""
    done = dict.fromkeys(ids, 0)
    plen = dict(zip(ids, prompt_lens))
    finished_at = {}
    total = {rid: plen[rid] + cap - 1 for rid, cap in zip(ids, MAX_TOKENS)}  # tokens the request computes
    grid = {rid: [] for rid in ids}
    for number, step in enumerate(steps):
        for rid in ids:
            n = step.get(rid, 0)
            if n == 0:
                grid[rid].append("" if rid in finished_at else "W")
                continue
            if done[rid] < plen[rid]:
                grid[rid].append("S" if done[rid] + n >= plen[rid] else "P")
            else:
                grid[rid].append("D")
            done[rid] += n
            if done[rid] >= total[rid]:
                finished_at[rid] = number
    return grid


def draw(ids, steps, grid, path: Path) -> None:
    cell, left, top = 46, 150, 40
    width, height = max(left + cell * len(steps) + 20, left + 4 * 150 + 20), top + 34 * len(ids) + 70
    svg = Svg(
        width,
        height,
        "Four requests sharing one engine loop",
        "One row per request and one column per engine step: blue prefill chunks, green the chunk that "
        "completes a prompt and samples, orange decodes, grey waiting for a seat.",
    )
    colours = {"P": BLUE, "S": GREEN, "D": ORANGE, "W": FAINT}
    for j, step in enumerate(steps):
        x = left + j * cell
        svg.text(x + cell / 2, top - 8, str(j + 1), 11, "middle")
        svg.text(x + cell / 2, top + 34 * len(ids) + 16, f"{sum(step.values())} tok", 10, "middle")
    svg.text(left - 10, top - 8, "step", 11, "end")
    svg.text(left - 10, top + 34 * len(ids) + 16, "scheduled", 10, "end")
    for i, rid in enumerate(ids):
        y = top + i * 34
        svg.text(left - 10, y + 21, f"{rid} ({len(PROMPTS[i])} + {MAX_TOKENS[i]})", 11, "end", mono=True)
        for j, kind in enumerate(grid[rid]):
            if kind:
                n = steps[j].get(rid, 0)
                svg.rect(left + j * cell + 2, y + 4, cell - 4, 26, colours[kind], INK, 0.5, rx=3)
                if n:
                    svg.text(left + j * cell + cell / 2, y + 21, str(n), 11, "middle")
    ly = top + 34 * len(ids) + 40
    for k, (kind, label) in enumerate(
        [("P", "prefill chunk"), ("S", "last chunk, samples"), ("D", "decode"), ("W", "waiting for a seat")]
    ):
        x = left + k * 150
        svg.rect(x, ly, 14, 14, colours[kind], INK, 0.5, rx=2)
        svg.text(x + 20, ly + 11, label, 11)
    svg.write(path)


def main() -> None:
    lab = load_lab()
    ids, steps = lab.trace_batches(PROMPTS, MAX_TOKENS, **ENGINE)
    print(f"engine: {ENGINE}; (prompt tokens + max_tokens) per request")
    for line in lab.render_batches(ids, steps, [len(p) for p in PROMPTS]):
        print("  " + line)
    grid = classify(ids, steps, [len(p) for p in PROMPTS])
    draw(ids, steps, grid, HERE / "batch_timeline.svg")
    print("wrote batch_timeline.svg")


if __name__ == "__main__":
    main()
