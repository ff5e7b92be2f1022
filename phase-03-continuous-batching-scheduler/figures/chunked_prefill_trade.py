"""Draw chunked_prefill_trade.svg: what three decoding streams feel when a 256-token prompt lands.

Three short requests are decoding on ``mini_vllm.LLMEngine`` when a 256-token prompt B arrives.
Each engine step is drawn as a segment whose width is the number of tokens it computes (the
stand-in for its duration that lab 03 uses: a prefill-heavy step is compute-bound). Below each
timeline, a tick marks every moment the decoding streams receive a token. Without a cap, B's whole
prompt is one wide step and the streams wait through it; with ``long_prefill_token_threshold=64``
the same work arrives as four narrow steps and the streams keep ticking.
Run: python phase-03-continuous-batching-scheduler/figures/chunked_prefill_trade.py
"""

from __future__ import annotations

from pathlib import Path

from course.svgfig import BLUE, FAINT, GREY, INK, ORANGE, Svg
from mini_vllm import LLMEngine, SamplingParams

STREAMS = 3
LONG_PROMPT = 256
CAPS = (0, 64)
STEPS_AFTER = 9  # steps drawn after B arrives
GREEDY = {"temperature": 0.0, "ignore_eos": True}


def timeline(cap: int) -> tuple[list[tuple[int, int]], int]:
    """Per step after B arrives: (B's prompt tokens, decode tokens); and the step B first samples."""
    engine = LLMEngine(max_num_batched_tokens=2048, long_prefill_token_threshold=cap)
    for i in range(STREAMS):
        engine.add_request(f"stream {i}: hello", SamplingParams(max_tokens=40, **GREEDY))
    engine.step()  # the streams' prefills: from here on they decode
    b = engine.add_request([97 + (7 * i) % 26 for i in range(LONG_PROMPT)], SamplingParams(max_tokens=4, **GREEDY))
    steps: list[tuple[int, int]] = []
    first = [0]
    schedule = engine.scheduler.schedule

    def probe():
        out = schedule()
        prefill = 0
        for request in out.scheduled_requests:
            if request.request_id == b and request.num_computed_tokens < request.num_prompt_tokens:
                prefill = out.num_scheduled_tokens[b]  # B's prompt tokens (after it, B decodes too)
        steps.append((prefill, out.total_num_scheduled_tokens - prefill))
        for request in out.scheduled_requests:
            if request.request_id == b and not first[0] and engine.scheduler.needs_sample(request, prefill):
                first[0] = len(steps)
        return out

    engine.scheduler.schedule = probe
    for _ in range(STEPS_AFTER):
        engine.step()
    return steps, first[0]


def draw(runs: dict[int, tuple[list[tuple[int, int]], int]], path: Path) -> None:
    svg = Svg(760, 300, "Chunked prefill spreads one long prompt over several steps",
              "Two timelines of engine steps drawn to scale by tokens computed. Without a cap one 259-token "
              "step leaves the decoding streams waiting; with a cap of 64 the streams keep receiving tokens.")
    left, scale = 150, 590 / max(sum(a + d for a, d in steps) for steps, _ in runs.values())
    for row, (cap, (steps, first)) in enumerate(runs.items()):
        y = 40 + row * 120
        label = "no cap" if cap == 0 else f"cap = {cap}"
        svg.text(20, y + 20, label, 13, bold=True)
        svg.text(20, y + 36, "long_prefill_token_", 10)
        svg.text(20, y + 48, f"threshold={cap}", 10)
        total = sum(a + d for a, d in steps) * scale
        svg.rect(left, y + 36, total, 14, FAINT, GREY, 0.5)
        x = left
        for i, (b_tokens, decode) in enumerate(steps, start=1):
            w_b, w_d = b_tokens * scale, decode * scale
            if b_tokens:
                svg.rect(x, y, w_b, 30, ORANGE, INK, 0.5)
            svg.rect(x + w_b, y, max(w_d, 1), 30, BLUE, INK, 0.5)
            if w_b > 30:
                svg.text(x + w_b / 2, y + 20, f"B: {b_tokens}", 11, "middle", fill="#ffffff", bold=True)
            x += w_b + w_d
            svg.line(x, y + 36, x, y + 50, INK, 1.5)  # every stream gets a token when the step ends
            if i == first:
                svg.line(x, y - 4, x, y + 30, INK, 1.5, dash=True)
                svg.text(x - 4, y - 6, "B's first token", 10, "end")
        gaps = [a + d for a, d in steps]
        svg.text(left, y + 66, f"each tick = one token for every stream; longest wait between ticks: {max(gaps)} "
                 f"tokens of work", 11)
    svg.text(left, 282, f"time, drawn as tokens computed per step (the same {sum(a + d for a, d in runs[0][0])} "
             "in both rows)", 11)
    svg.rect(left + 430, 274, 12, 10, ORANGE, INK, 0.5)
    svg.text(left + 446, 283, "B's prompt", 10)
    svg.rect(left + 510, 274, 12, 10, BLUE, INK, 0.5)
    svg.text(left + 526, 283, "decode tokens", 10)
    svg.write(path)


def main() -> None:
    runs = {cap: timeline(cap) for cap in CAPS}
    for cap, (steps, first) in runs.items():
        per_step = [a + d for a, d in steps]
        print(f"threshold={cap:<3} tokens per step:  {per_step}")
        print(f"              B's prompt tokens: {[a for a, _ in steps]}")
        print(f"              B's first token in step {first}; longest step {max(per_step)}, total {sum(per_step)}")
    draw(runs, Path(__file__).with_name("chunked_prefill_trade.svg"))
    print("wrote chunked_prefill_trade.svg")


if __name__ == "__main__":
    main()
