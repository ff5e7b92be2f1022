"""Lab 03-01 — the graph replay simulator (starter: write the counter, eager, capture and replay).

A CUDA graph records a fixed sequence of kernel launches once and replays it with a single
call. You model it with numpy, where an "op" is any callable on an array and the only clock is
a launch counter:

* ``LaunchCounter`` — a process-wide count of simulated kernel launches;
* ``run_eager(ops, x)`` — run every op, paying one launch per op, on every call;
* ``GraphRunner(ops)`` — keyed on ``x.shape``: the first call with a shape *captures* (one
  launch per op, then a cached ``GraphEntry`` holding a static input buffer); later calls with
  that shape *replay* (copy ``x`` into the static buffer, then exactly one launch).

The reference is the course engine's ``mini_vllm/cudagraph.py``; upstream it is
``CUDAGraphWrapper.__call__`` in ``vllm/compilation/cuda_graph.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

_Op = Callable[[np.ndarray], np.ndarray]

# The lab's model: three "kernels" whose composition multiplies by 10 (1 -> 10, 5 -> 50).
OPS = [lambda x: x * 2, lambda x: x + 3, lambda x: (x - 3) * 5]


class LaunchCounter:
    """Process-wide count of simulated kernel launches (class-level, shared by every runner)."""

    n: int = 0

    @classmethod
    def reset(cls) -> None:
        """Set the count back to zero."""
        raise NotImplementedError("set the class attribute: cls.n = 0")

    @classmethod
    def bump(cls, k: int = 1) -> None:
        """Add ``k`` launches; reject a negative or non-int ``k`` with ValueError."""
        raise NotImplementedError("validate k (an int >= 0, else ValueError), then cls.n += k")


def run_eager(ops: Sequence[_Op], x: np.ndarray) -> np.ndarray:
    """Run ``ops`` in order on ``x``, bumping the counter once per op, and return the result."""
    raise NotImplementedError("loop: LaunchCounter.bump(1); x = op(x) — for every op, on every call")


@dataclass
class GraphEntry:
    """One captured graph (upstream: CUDAGraphEntry). Provided."""

    shape: tuple[int, ...]  # the key
    static_input: np.ndarray  # the one buffer every replay reads: copy new inputs INTO it
    output: np.ndarray  # the one buffer every replay writes
    num_ops: int  # launches the recording holds
    graph: Callable[[], None]  # the recording: recomputes output from static_input


class GraphRunner:
    """Capture on a new input shape, replay on a seen one; one ``GraphEntry`` per shape."""

    def __init__(self, ops: Sequence[_Op]) -> None:
        self.ops = list(ops)
        self.graphs: dict[tuple[int, ...], GraphEntry] = {}

    @property
    def num_captured(self) -> int:
        return len(self.graphs)

    def __call__(self, x: np.ndarray) -> np.ndarray:
        """Capture if ``x.shape`` is new, else replay; return the output either way.

        Capture: copy ``x`` into a NEW static buffer, run the ops with one launch each
        (``run_eager``), keep a copy of the output, and store a ``GraphEntry`` whose ``graph``
        is a closure that recomputes the ops from *that* static buffer into *that* output
        (``np.copyto(output, ...)``). Replay: ``np.copyto(entry.static_input, x)`` — never
        ``entry.static_input = x`` — then ``LaunchCounter.bump(1)``, ``entry.graph()``, and
        return ``entry.output``.
        """
        raise NotImplementedError(
            "look up self.graphs.get(x.shape): None -> capture (run_eager on a fresh static copy, "
            "store a GraphEntry); else np.copyto(entry.static_input, x), bump(1), entry.graph()"
        )


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
