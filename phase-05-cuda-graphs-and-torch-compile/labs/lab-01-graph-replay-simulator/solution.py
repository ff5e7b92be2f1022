"""Lab 03-01 — the graph replay simulator (reference solution).

The reference implementation of this lab *is* the course engine's module
``mini_vllm/cudagraph.py``: ``LaunchCounter``, ``run_eager``, ``GraphEntry`` and ``GraphRunner``
there are exactly what ``starter.py`` asks you to write. This file re-exports them under the
lab's names (so the tests grade the engine's own code) and prints the figures the README shows.

Read ``mini_vllm/cudagraph.py`` side by side with ``vllm/compilation/cuda_graph.py`` in
``upstream/``: ``GraphRunner._capture`` is the ``with torch.cuda.graph(...)`` branch of
``CUDAGraphWrapper.__call__``, ``GraphRunner._replay`` is its ``entry.cudagraph.replay()``.
"""

from __future__ import annotations

import numpy as np

from mini_vllm.cudagraph import GraphEntry, GraphRunner, LaunchCounter, run_eager

__all__ = ["OPS", "GraphEntry", "GraphRunner", "LaunchCounter", "run_eager"]

# The lab's model: three "kernels" whose composition multiplies by 10 (1 -> 10, 5 -> 50).
OPS = [lambda x: x * 2, lambda x: x + 3, lambda x: (x - 3) * 5]


def main() -> None:
    x = np.ones(4)
    print("launches for k calls of a 3-op model (same shape every call)")
    print(f"{'k':>5} {'eager':>7} {'graph':>7} {'eager/graph':>12}")
    for k in (1, 2, 10, 100):
        LaunchCounter.reset()
        for _ in range(k):
            run_eager(OPS, x)
        eager = LaunchCounter.n
        LaunchCounter.reset()
        runner = GraphRunner(OPS)
        for _ in range(k):
            runner(x)
        print(f"{k:>5} {eager:>7} {LaunchCounter.n:>7} {eager / LaunchCounter.n:>12.2f}")

    print("\nstatic buffer: capture with 1.0, replay with 5.0")
    LaunchCounter.reset()
    runner = GraphRunner(OPS)
    first = runner(np.full(4, 1.0)).copy()
    second = runner(np.full(4, 5.0))
    print(f"capture output {first[0]:.0f}, replay output {second[0]:.0f}, launches {LaunchCounter.n}")

    print("\nshapes (4,) then (8,) then (4,) again")
    LaunchCounter.reset()
    runner = GraphRunner(OPS)
    for n in (4, 8, 4):
        before = LaunchCounter.n
        runner(np.ones(n))
        print(f"shape ({n},): launches {LaunchCounter.n - before}, graphs cached {runner.num_captured}")


if __name__ == "__main__":
    main()
