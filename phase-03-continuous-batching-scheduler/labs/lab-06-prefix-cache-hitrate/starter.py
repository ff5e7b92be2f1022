"""Lab 06-06 starter (CPU path): the REAL vLLM 0.22.1 scheduler's prefix-cache hit rate.

Sixteen requests share a 410-token "system prompt" and each adds a 14-token question. Write
``predict_prefix_hits`` (what each request will find cached, before running anything),
``hit_rate``, and ``measure`` (run the prompts through vLLM's own Scheduler on CPU with
``mini_vllm.testing.real_vllm`` and read vLLM's PrefixCacheStats). ``make_prompts`` and ``main``
are provided.
Grade with: LAB_IMPL=starter pytest phase-03-continuous-batching-scheduler/labs/lab-06-prefix-cache-hitrate -q
"""

from __future__ import annotations

import os
from typing import NamedTuple

SYSTEM_LEN = 410  # shared tokens: 25 full blocks of 16 + 10
QUESTION_LEN = 14  # unique tokens per request
NUM_REQUESTS = 16
BLOCK_SIZE = 16
MAX_TOKENS = 4


class Measured(NamedTuple):
    queries: int  # prompt tokens looked up in the prefix cache (vLLM's PrefixCacheStats.queries)
    hits: int  # of those, tokens found cached (PrefixCacheStats.hits)
    scheduled_tokens: int  # tokens the scheduler handed out over the whole run
    steps: int  # schedule() calls until every request finished


def _tokens(n: int, seed: int) -> list[int]:
    """n deterministic token ids in [32, 432) (the stub model's vocabulary is 512)."""
    return [32 + (seed * 131 + 17 * i) % 400 for i in range(n)]


def make_prompts(
    num_requests: int = NUM_REQUESTS,
    system_len: int = SYSTEM_LEN,
    question_len: int = QUESTION_LEN,
    shared: bool = True,
) -> list[list[int]]:
    """Prompts as token ids: a system part (the same for all when ``shared``) + a unique question."""
    system = _tokens(system_len, seed=1)
    return [
        (system if shared else _tokens(system_len, seed=1000 + i)) + _tokens(question_len, seed=100 + i)
        for i in range(num_requests)
    ]


def predict_prefix_hits(prompts: list[list[int]], block_size: int = BLOCK_SIZE) -> list[int]:
    """Tokens each request finds in the prefix cache, in admission order, before running anything.

    A request hits the longest run of *full* blocks, from its start, that an earlier request
    already registered, and never the block holding its last token: at most
    ``(len(prompt) - 1) // block_size`` blocks. A request registers all its full blocks when it is
    admitted (vLLM caches at allocation time), so later requests admitted in the same step
    already hit them. Assumes a pool large enough that nothing is evicted, and a budget that
    admits each prompt in one chunk.
    """
    raise NotImplementedError(
        "predict_prefix_hits: walk the prompts in order with a set of seen block prefixes (tuple(prompt[:end])); "
        "count leading full blocks already seen, at most (len(prompt) - 1) // block_size of them; then add all "
        "of this prompt's full blocks to the set"
    )


def hit_rate(queries: int, hits: int) -> float:
    """hits / queries, and 0.0 when nothing was looked up (caching off)."""
    raise NotImplementedError(
        "hit_rate: hits / queries, and 0.0 when queries is 0"
    )


def measure(
    prompts: list[list[int]],
    enable_caching: bool,
    arrive_together: bool = True,
    block_size: int = BLOCK_SIZE,
    max_tokens: int = MAX_TOKENS,
    num_gpu_blocks: int = 1024,
    max_num_batched_tokens: int = 2048,
) -> Measured:
    """Run ``prompts`` through the real vLLM scheduler and read what it reports.

    ``arrive_together``: all requests are added before the first step; otherwise request i is
    added just before step i. Every step's ``StepRecord.prefix_cache`` holds that step's
    ``(requests, queries, hits, ...)`` from vLLM's ``PrefixCacheStats``; sum them.
    """
    raise NotImplementedError(
        "measure: build mini_vllm.testing.real_vllm.RealScheduler(SchedConfig(...)) with these knobs, add the "
        "requests (all first, or request i before step i), call real.step() until nothing is unfinished, and sum "
        "each StepRecord's prefix_cache[1] (queries), prefix_cache[2] (hits) and num_scheduled_tokens"
    )


# The engine's own counters (vllm/v1/metrics/loggers.py, PrometheusStatLogger): one Counter per
# engine, labelled with its model name and engine index. The "external_" ones count KV-connector hits.
PREFIX_QUERIES = "vllm:prefix_cache_queries"
PREFIX_HITS = "vllm:prefix_cache_hits"


def engine_prefix_counters(metrics: list) -> tuple[int, int]:
    """``(queries, hits)`` from what ``LLM.get_metrics()`` returns after a run.

    ``metrics`` is a list of ``vllm.v1.metrics.reader`` objects (``Counter``, ``Gauge``,
    ``Histogram``, ``Vector``), each with a ``name`` and ``labels``. Sum the values of the
    counters named exactly ``PREFIX_QUERIES`` and ``PREFIX_HITS`` over every label set (a
    data-parallel deployment has one per engine); (0, 0) when there are none.
    """
    raise NotImplementedError(
        "engine_prefix_counters: sum metric.value over the metrics named exactly PREFIX_QUERIES, and over those "
        "named exactly PREFIX_HITS (one Counter per engine, told apart by metric.labels); return (queries, hits)"
    )


def main() -> None:
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")  # keep vLLM's import warnings off stdout
    prompts = make_prompts()
    predicted = predict_prefix_hits(prompts)
    n, length = len(prompts), len(prompts[0])
    print(f"{n} requests: {SYSTEM_LEN} shared + {QUESTION_LEN} unique tokens = {length} each; "
          f"block_size {BLOCK_SIZE}, max_tokens {MAX_TOKENS}")
    print(f"predicted hits per request: {predicted[:3]} ... {predicted[-1]}  (sum {sum(predicted)})")
    print(f"predicted queries: {n} x {length} = {n * length}; hit rate {hit_rate(n * length, sum(predicted)):.2%}")
    print("\nthe real vLLM 0.22.1 Scheduler on CPU:")
    print(f"  {'run':<34} {'queries':>7} {'hits':>6} {'hit rate':>9} {'scheduled':>9} {'steps':>5}")
    runs = [
        ("caching ON, arriving together", prompts, True, True),
        ("caching ON, one per step", prompts, True, False),
        ("caching OFF", prompts, False, True),
        ("caching ON, nothing shared", make_prompts(shared=False), True, True),
    ]
    for name, ps, caching, together in runs:
        m = measure(ps, caching, together)
        print(f"  {name:<34} {m.queries:>7} {m.hits:>6} {hit_rate(m.queries, m.hits):>9.2%} "
              f"{m.scheduled_tokens:>9} {m.steps:>5}")


if __name__ == "__main__":
    main()
