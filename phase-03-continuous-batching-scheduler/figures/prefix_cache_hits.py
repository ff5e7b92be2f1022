"""Draw prefix_cache_hits.svg: per-request prefix-cache hits when 16 requests share a system prompt.

The workload is lab 06's: sixteen prompts of 410 shared tokens plus 14 of their own, block size
16, one request arriving per step. They run on ``mini_vllm.LLMEngine`` with prefix caching on; the
hits of each admission are read from the KV-cache manager's ``PrefixCacheStats`` (the same
counters vLLM reports, which lab 06 reads from the real scheduler). Bars: each request's prompt
split into tokens found cached and tokens computed; line: the hit rate so far.
Run: python phase-03-continuous-batching-scheduler/figures/prefix_cache_hits.py
"""

from __future__ import annotations

from pathlib import Path

from course.svgfig import BLUE, GREY, INK, ORANGE, Svg
from mini_vllm import LLMEngine, SamplingParams

SYSTEM_LEN, QUESTION_LEN, NUM_REQUESTS, BLOCK_SIZE = 410, 14, 16, 16


def tokens(n: int, seed: int) -> list[int]:
    return [32 + (seed * 131 + 17 * i) % 200 for i in range(n)]  # ids inside the byte vocabulary


def measure() -> list[tuple[int, int]]:
    """(prompt tokens looked up, tokens found cached) for each request, in arrival order."""
    engine = LLMEngine(num_gpu_blocks=1024, block_size=BLOCK_SIZE, enable_prefix_caching=True)
    kv = engine.scheduler.kv_cache_manager
    system = tokens(SYSTEM_LEN, seed=1)
    per_request = []
    for i in range(NUM_REQUESTS):
        engine.add_request(system + tokens(QUESTION_LEN, seed=100 + i), SamplingParams(max_tokens=4, temperature=0.0))
        engine.step()  # admits it (and advances the others)
        stats = kv.make_prefix_cache_stats()
        per_request.append((stats.queries, stats.hits))
    while engine.has_unfinished_requests():
        engine.step()
    return per_request


def draw(per_request: list[tuple[int, int]], path: Path) -> None:
    svg = Svg(760, 330, "Prefix-cache hits per request",
              "The first request computes all 424 prompt tokens; each later one finds 400 cached and computes "
              "24. The running hit rate climbs toward 15 x 400 / (16 x 424).")
    left, top, h, w = 60, 30, 220, 620
    most = max(q for q, _ in per_request)
    bar = w / len(per_request)
    svg.line(left, top + h, left + w, top + h)
    for tick in (0, 100, 200, 300, 400):
        y = top + h - h * tick / most
        svg.line(left - 4, y, left, y)
        svg.text(left - 6, y + 4, str(tick), 10, "end")
    svg.text(16, top - 12, "prompt tokens", 11)
    running_q = running_h = 0
    points = []
    for i, (queries, hits) in enumerate(per_request):
        x = left + i * bar + 4
        hit_h, comp_h = h * hits / most, h * (queries - hits) / most
        svg.rect(x, top + h - hit_h - comp_h, bar - 8, comp_h, ORANGE, INK, 0.5)
        if hits:
            svg.rect(x, top + h - hit_h, bar - 8, hit_h, BLUE, INK, 0.5)
        svg.text(x + (bar - 8) / 2, top + h + 14, str(i), 10, "middle")
        running_q += queries
        running_h += hits
        points.append((x + (bar - 8) / 2, top + h - h * running_h / running_q))
    svg.polyline(points, INK, 2)
    for x, y in points:
        svg.circle(x, y, 2.5)
    right = left + w
    svg.line(right, top, right, top + h, GREY)
    for pct in (0, 25, 50, 75, 100):
        y = top + h - h * pct / 100
        svg.line(right, y, right + 4, y, GREY)
        svg.text(right + 7, y + 4, f"{pct}%", 10)
    svg.text(756, top - 12, "hit rate so far", 11, "end")
    svg.text(left + w / 2, top + h + 32, "request, in arrival order (one per step)", 11, "middle")
    svg.rect(left, 305, 12, 10, BLUE, INK, 0.5)
    svg.text(left + 16, 314, "found in the prefix cache", 10)
    svg.rect(left + 170, 305, 12, 10, ORANGE, INK, 0.5)
    svg.text(left + 186, 314, "computed", 10)
    svg.line(left + 260, 310, left + 280, 310, INK, 2)
    svg.text(left + 286, 314, f"hit rate so far: cumulative hits / lookups, {100 * running_h / running_q:.2f}% "
             f"after {len(per_request)}", 10)
    svg.write(path)


def main() -> None:
    per_request = measure()
    hits = [h for _, h in per_request]
    queries = sum(q for q, _ in per_request)
    print(f"{NUM_REQUESTS} requests of {SYSTEM_LEN} shared + {QUESTION_LEN} own tokens, block size {BLOCK_SIZE}")
    followers = f"{hits[1]} each" if len(set(hits[1:])) == 1 else str(hits[1:])
    print(f"tokens found cached: request 0: {hits[0]}; requests 1-{len(hits) - 1}: {followers}")
    print(f"lookups {queries}, hits {sum(hits)}: hit rate {100 * sum(hits) / queries:.2f}%")
    print(f"cached per follower: {hits[1]} = {hits[1] // BLOCK_SIZE} full blocks of {BLOCK_SIZE}")
    draw(per_request, Path(__file__).with_name("prefix_cache_hits.svg"))
    print("wrote prefix_cache_hits.svg")


if __name__ == "__main__":
    main()
