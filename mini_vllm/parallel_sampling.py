"""Parallel sampling (``SamplingParams.n > 1``): one request fanned out into ``n`` children.

Mirrors ``vllm/v1/engine/parallel_sampling.py`` (``ParentRequest``), which the front end
(``LLMEngine.add_request``) uses to split a request before the engine core ever sees it::

    parent "req-3", n = 3, seed = 10
      child "0_req-3"  seed 10     child "1_req-3"  seed 11     child "2_req-3"  seed 12
      (no seed: each child draws from its own generator, so the samples still differ)

The children are ordinary requests: scheduled, cached and preempted one by one. Their prompts are
identical, so with prefix caching on the prompt's full blocks are computed once and shared (a
child admitted after another finds them cached). When a child finishes, ``get_outputs`` files its
completion under its index; the parent is finished once every child is, and its output lists
the ``n`` completions in index order.

Left out: streaming (upstream's ``RequestOutputKind.DELTA``/``CUMULATIVE`` hand each child's
output back as it comes; mini is always ``FINAL_ONLY``), the shared cached child
``SamplingParams`` of an unseeded parent (a frozen dataclass is cheap to copy), and the
generation-token statistics (``observe_num_generation_tokens``).
"""

from __future__ import annotations

from dataclasses import replace

from .outputs import CompletionOutput
from .sampling_params import SamplingParams


class ParentRequest:
    """Child ids and params for a request with ``n`` samples, and the aggregation of their outputs."""

    def __init__(self, request_id: str, sampling_params: SamplingParams) -> None:
        if not isinstance(request_id, str) or not request_id:
            raise ValueError(f"request_id must be a non-empty str, got {request_id!r}")
        if not isinstance(sampling_params, SamplingParams):
            raise TypeError(f"sampling_params must be a SamplingParams, got {type(sampling_params).__name__}")
        self.request_id = request_id
        self.sampling_params = sampling_params
        self.child_requests: set[str] = set()  # children not finished yet
        self.output_aggregator: list[CompletionOutput | None] = [None] * sampling_params.n

    @property
    def n(self) -> int:
        return self.sampling_params.n

    @staticmethod
    def child_request_id(index: int, request_id: str) -> str:
        """Child ``index``'s id: ``"{index}_{request_id}"``, as upstream names it."""
        return f"{index}_{request_id}"

    def get_child_info(self, index: int) -> tuple[str, SamplingParams]:
        """``(child request id, child params)`` for child ``index``; registers the child as running.

        The child's params are the parent's with ``n = 1`` and, when the parent is seeded,
        ``seed + index``, so every child is reproducible and no two draw the same stream.
        """
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < self.n:
            raise ValueError(f"child index must be in 0..{self.n - 1}, got {index!r}")
        seed = self.sampling_params.seed
        params = replace(self.sampling_params, n=1, seed=None if seed is None else seed + index)
        child_id = self.child_request_id(index, self.request_id)
        self.child_requests.add(child_id)
        return child_id, params

    def get_outputs(self, child_request_id: str, output: CompletionOutput) -> tuple[list[CompletionOutput], bool]:
        """File one child's finished completion; return the completions so far and whether all are in.

        Upstream returns nothing until the last child is in; mini's ``step()`` reports the parent
        each time a child finishes, so it returns the finished completions so far, in index order.
        """
        if not output.finished():
            raise ValueError(f"child {child_request_id!r} is not finished; mini aggregates finished outputs only")
        if child_request_id not in self.child_requests:
            raise ValueError(f"{child_request_id!r} is not a running child of {self.request_id!r}")
        if not 0 <= output.index < self.n:
            raise ValueError(f"completion index {output.index} is outside 0..{self.n - 1}")
        self.child_requests.remove(child_request_id)
        self.output_aggregator[output.index] = output
        done = [c for c in self.output_aggregator if c is not None]
        return done, not self.child_requests
