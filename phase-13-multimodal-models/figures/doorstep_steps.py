"""Draw doorstep_steps.svg: the three-request trace, step by step, under the encoder rules.

Requests A (image at 40), B (image at 10) and C (A's image, at 20), 80-token images, a token
budget of 256 and an encoder budget of 100 per step, scheduled by ``mini_vllm``'s ``Scheduler``
with prefix caching on (``mini_vllm.testing.mm_traces.run_mini``, which the course's tests check
against the real vLLM scheduler). Each row is one request's prompt; the image span is outlined; the fill says in which
step each position was computed, grey for the prefix-cache hit.
Run: python phase-13-multimodal-models/figures/doorstep_steps.py
"""

from __future__ import annotations

from pathlib import Path

from course.svgfig import BLUE, FAINT, GREY, INK, ORANGE, RED, Svg
from mini_vllm.testing.mm_traces import MMArrival, run_mini, three_requests

TOKEN_BUDGET, ENCODER_BUDGET, CACHE = 256, 100, 400


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
    reqs = three_requests(prefix_hit_for_c=0)  # the scheduler finds C's prefix hit itself
    steps = run_mini(reqs, TOKEN_BUDGET, ENCODER_BUDGET, CACHE, enable_prefix_caching=True)
    # a request's prefix hit is whatever of its prompt no step computed (each has max_tokens=1)
    done = {a.request_id: len(a.prompt_token_ids) - sum(s.scheduled.get(a.request_id, (0,))[0] for s in steps) for a in reqs}
    spans: dict[str, list[tuple[int, int, int]]] = {a.request_id: [] for a in reqs}
    for a in reqs:
        if done[a.request_id]:
            spans[a.request_id].append((-1, 0, done[a.request_id]))
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
