"""MUTANT — replay bumps the counter once per op, as if it were still launching every kernel.

Outputs stay right, so only the launch accounting catches it: the graph never wins.

Otherwise the reference solution (mini_vllm/cudagraph.py), unchanged.
"""

from __future__ import annotations

import numpy as np

from mini_vllm.cudagraph import GraphEntry, LaunchCounter, run_eager
from mini_vllm.cudagraph import GraphRunner as _ReferenceRunner

__all__ = ["OPS", "GraphEntry", "GraphRunner", "LaunchCounter", "run_eager"]

OPS = [lambda x: x * 2, lambda x: x + 3, lambda x: (x - 3) * 5]


class GraphRunner(_ReferenceRunner):
    def _replay(self, entry: GraphEntry, x: np.ndarray) -> np.ndarray:
        np.copyto(entry.static_input, x)
        LaunchCounter.bump(entry.num_ops)  # BUG: a replay is ONE launch, not num_ops
        entry.graph()
        return entry.output
