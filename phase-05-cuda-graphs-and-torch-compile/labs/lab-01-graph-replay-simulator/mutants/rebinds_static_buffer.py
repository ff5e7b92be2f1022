"""MUTANT — replay rebinds ``entry.static_input = x`` instead of copying into the captured buffer.

The recorded graph still reads the buffer it was captured with, so every replay silently
returns the capture-time answer (10 instead of 50). This is the classic CUDA-graph bug:
``static = new`` instead of ``static.copy_(new)``.

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
        entry.static_input = np.array(x, copy=True)  # BUG: rebinding; the graph never sees it
        LaunchCounter.bump(1)
        entry.graph()
        return entry.output
