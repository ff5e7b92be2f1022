"""MUTANT — captures once and replays that one graph for every later input, whatever its shape.

Forgets Constraint 1 (a graph only replays for the shape it was captured with): a new shape
never pays a capture and there is only ever one dict entry.

Otherwise the reference solution (mini_vllm/cudagraph.py), unchanged.
"""

from __future__ import annotations

import numpy as np

from mini_vllm.cudagraph import GraphEntry, LaunchCounter, run_eager
from mini_vllm.cudagraph import GraphRunner as _ReferenceRunner

__all__ = ["OPS", "GraphEntry", "GraphRunner", "LaunchCounter", "run_eager"]

OPS = [lambda x: x * 2, lambda x: x + 3, lambda x: (x - 3) * 5]


class GraphRunner(_ReferenceRunner):
    def _run_keyed(self, x: np.ndarray) -> np.ndarray:
        if not self.graphs:  # BUG: should look up x.shape, not "any graph at all"
            return self._capture(x)
        entry = next(iter(self.graphs.values()))
        LaunchCounter.bump(1)
        n = min(x.shape[0], entry.static_input.shape[0])
        entry.static_input[:n] = x[:n]
        entry.graph()
        return entry.output
