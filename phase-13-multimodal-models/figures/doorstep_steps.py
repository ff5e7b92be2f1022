"""Draw doorstep_steps.svg: the three-request trace, step by step, under the encoder rules.

Requests A (image at 40), B (image at 10) and C (A's image, at 20), 80-token images, a token
budget of 256 and an encoder budget of 100 per step, scheduled by ``mini_vllm``'s encoder rules
(``mini_vllm.testing.mm_traces.simulate``, which the course's tests check against the real vLLM
scheduler). Each row is one request's prompt; the image span is outlined; the fill says in which
step each position was computed, grey for the prefix-cache hit.
Run: python phase-13-multimodal-models/figures/doorstep_steps.py
"""

from __future__ import annotations

from pathlib import Path

from course.svgfig import BLUE, FAINT, GREY, INK, ORANGE, RED, Svg
from mini_vllm.multimodal import MultiModalFeature, PlaceholderRange
from mini_vllm.testing.mm_traces import MMArrival, simulate

TOKEN_BUDGET, ENCODER_BUDGET, CACHE = 256, 100, 400


def arrivals() -> list[MMArrival]:
    shared = tuple(range(3, 23))
    img = lambda name, at: (MultiModalFeature(name, PlaceholderRange(at, 80)),)  # noqa: E731
    return [
        MMArrival("A", shared + tuple(range(100, 210)), img("imgA", 40)),
        MMArrival("B", tuple(range(300, 400)), img("imgB", 10)),
        MMArrival("C", shared + tuple(range(400, 490)), img("imgA", 20), prefix_hit=16),
    ]


def draw(reqs: list[MMArrival], spans: dict[str, list[tuple[int, int, int]]], path: Path) -> None:
    svg = Svg(760, 250, "Three requests under a 100-token encoder budget",
              "A encodes its image in step 0; B stops at its image's doorstep after 10 tokens and encodes it "
              "in step 1; C reuses A's image from the encoder cache and starts after a 16-token prefix hit.")
    left, top, row, scale = 50, 40, 52, 4.6
    colours = [BLUE, ORANGE]
    for r, a in enumerate(reqs):
        y = top + r * row
        svg.text(left - 12, y + 19, a.request_id, 13, "end")
        svg.rect(left, y, len(a.prompt_token_ids) * scale, 28, FAINT, GREY)
        for step, start, end in spans[a.request_id]:
            fill = GREY if step < 0 else colours[step]
            svg.rect(left + start * scale, y, (end - start) * scale, 28, fill, INK, 0.5)
        for f in a.features:
            p = f.mm_position
            svg.rect(left + p.offset * scale, y - 4, p.length * scale, 36, "none", RED, 2, dash=True)
            svg.text(left + (p.offset + p.length / 2) * scale, y - 8, f"{f.identifier} [{p.offset}, {p.end})", 10, "middle")
        for step, start, end in spans[a.request_id]:
            if step >= 0:
                svg.text(left + (start + end) / 2 * scale, y + 19, str(end - start), 11, "middle", "#ffffff")
    y = top + 3 * row + 8
    for i, (label, fill) in enumerate([("step 0", BLUE), ("step 1", ORANGE), ("prefix-cache hit", GREY)]):
        svg.rect(left + i * 150, y, 12, 10, fill, INK, 0.5)
        svg.text(left + i * 150 + 16, y + 9, label, 10)
    svg.rect(left + 450, y, 12, 10, "none", RED, 2, dash=True)
    svg.text(left + 466, y + 9, "image placeholders", 10)
    svg.text(left, y + 30, "token position (each request's prompt, 1 unit = 1 token)", 10)
    svg.write(path)


def main() -> None:
    reqs = arrivals()
    steps = simulate(reqs, TOKEN_BUDGET, ENCODER_BUDGET, CACHE)
    done = {a.request_id: a.prefix_hit for a in reqs}
    spans: dict[str, list[tuple[int, int, int]]] = {a.request_id: [] for a in reqs}
    for a in reqs:
        if a.prefix_hit:
            spans[a.request_id].append((-1, 0, a.prefix_hit))
    print(f"token budget {TOKEN_BUDGET}, encoder budget {ENCODER_BUDGET}/step, encoder cache {CACHE} embeddings")
    for step, s in enumerate(steps):
        cells = []
        for rid, (n, enc) in s.scheduled.items():
            spans[rid].append((step, done[rid], done[rid] + n))
            cells.append(f"{rid} [{done[rid]}, {done[rid] + n}) encode {list(enc)}")
            done[rid] += n
        used = sum(next(a for a in reqs if a.request_id == rid).features[i].mm_position.length
                   for rid, (_, enc) in s.scheduled.items() for i in enc)
        tokens = sum(n for n, _ in s.scheduled.values())
        print(f"step {step}: {tokens} tokens, {used} encoder tokens | " + " | ".join(cells))
    draw(reqs, spans, Path(__file__).with_name("doorstep_steps.svg"))
    print("wrote doorstep_steps.svg")


if __name__ == "__main__":
    main()
