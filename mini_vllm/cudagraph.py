"""CUDA graphs, simulated: count kernel launches instead of timing them.

An "op" is a callable on an array; every op a GPU would launch bumps the process-wide
``LaunchCounter``, the only clock here. ``run_eager`` launches once per op per call;
``GraphRunner`` captures on a new shape and replays a seen one in one launch (padding up to the
next ``capture_sizes`` rung, eager above the top one); ``PiecewiseGraphRunner`` captures the runs
of capturable ops between splitting ops (attention) and runs those eagerly.

Mirrors ``vllm/compilation/cuda_graph.py:145 — CUDAGraphWrapper`` (capture on a new key, replay
a known one; ``GraphEntry`` is ``CUDAGraphEntry``), ``vllm/compilation/backends.py:548 —
split_graph`` (the piecewise cut), ``vllm/config/vllm.py:1597 — VllmConfig._set_cudagraph_sizes``
(the ladder 1, 2, 4, every 8 below 256, every 16 above) and
``vllm/v1/cudagraph_dispatcher.py:76 — CudagraphDispatcher._compute_bs_to_padded_graph_size``
(pad up to the next captured size). Phase 05's guide tells the story.

Left out: GPUs, streams, the memory pool, weak-ref outputs, warmup, input-address checks, the
forward context and FULL/PIECEWISE routing (Phase 05 lab 04 builds it), ``BatchDescriptor``
fields but the shape, torch.compile, LoRA, data parallelism. Replays recompute the ops (numpy
cannot record), so only the launch count models the saving.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

Op = Callable[[np.ndarray], np.ndarray]

__all__ = [
    "GraphEntry",
    "GraphRunner",
    "LaunchCounter",
    "PiecewiseGraphRunner",
    "default_capture_sizes",
    "run_eager",
    "select_capture_size",
]


class LaunchCounter:
    """Process-wide count of simulated kernel launches.

    Global on purpose: launch overhead is paid by the one CPU thread that drives the GPU, so
    every runner in the process draws on the same budget.
    """

    n: int = 0

    @classmethod
    def reset(cls) -> None:
        cls.n = 0

    @classmethod
    def bump(cls, k: int = 1) -> None:
        if isinstance(k, bool) or not isinstance(k, int) or k < 0:
            raise ValueError(f"bump(k) needs a non-negative int number of launches, got {k!r}")
        cls.n += k


def _check_ops(ops: Iterable[Op]) -> list[Op]:
    ops = list(ops)
    if not ops:
        raise ValueError("ops must hold at least one callable (a model with no kernels has nothing to capture)")
    for i, op in enumerate(ops):
        if not callable(op):
            raise TypeError(f"ops[{i}] is {type(op).__name__}, not a callable on a numpy array")
    return ops


def _apply(ops: Sequence[Op], x: np.ndarray) -> np.ndarray:
    for op in ops:
        x = op(x)
    return x


def run_eager(ops: Sequence[Op], x: np.ndarray) -> np.ndarray:
    """Run ``ops`` in order, paying one launch per op on every call (no graph at all)."""
    ops = _check_ops(ops)
    x = np.asarray(x)
    for op in ops:
        LaunchCounter.bump(1)
        x = op(x)
    return x


# --- the capture ladder ---------------------------------------------------------------------


def default_capture_sizes(max_size: int) -> list[int]:
    """The default ladder of batch sizes to capture, up to ``max_size`` (inclusive when on-stride).

    1, 2, 4, then every multiple of 8 below 256, then every multiple of 16 from 256 up to
    ``max_size`` — the shape of upstream's default (``VllmConfig._set_cudagraph_sizes``). For
    ``max_size=512`` that is 3 + 31 + 17 = 51 rungs.
    """
    if isinstance(max_size, bool) or not isinstance(max_size, int) or max_size < 1:
        raise ValueError(f"max_size must be a positive int, got {max_size!r}")
    sizes = [s for s in (1, 2, 4) if s <= max_size]
    if max_size >= 8:
        sizes += range(8, min(max_size + 1, 256), 8)  # dense where padding hurts most
    if max_size >= 256:
        sizes += range(256, max_size + 1, 16)
    return sorted(set(sizes))


def select_capture_size(batch: int, sizes: Sequence[int]) -> int | None:
    """The smallest captured size >= ``batch``; ``None`` above the top rung (run eagerly)."""
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise ValueError(f"batch must be a positive int, got {batch!r}")
    ladder = sorted(sizes)
    i = bisect.bisect_left(ladder, batch)
    return ladder[i] if i < len(ladder) else None


def _check_sizes(sizes: Iterable[int]) -> list[int]:
    sizes = sorted(set(sizes))
    if not sizes or any(isinstance(s, bool) or not isinstance(s, int) or s < 1 for s in sizes):
        raise ValueError(f"capture_sizes must be a non-empty list of positive ints, got {sizes!r}")
    return sizes


def _pad_rows(x: np.ndarray, size: int) -> np.ndarray:
    if x.shape[0] == size:
        return x
    pad = np.zeros((size - x.shape[0],) + x.shape[1:], dtype=x.dtype)  # junk rows, never read back
    return np.concatenate([x, pad])


def _padded_call(x: np.ndarray, sizes: list[int] | None, graphed: Callable, eager: Callable) -> np.ndarray:
    """Pad dim 0 up to the next rung, call ``graphed``, slice the real rows back out."""
    x = np.asarray(x)
    if sizes is None:
        return graphed(x)
    if x.ndim == 0:
        raise ValueError("with capture_sizes the input needs a batch dimension (dim 0)")
    size = select_capture_size(x.shape[0], sizes)
    if size is None:  # above the largest captured size: upstream dispatches CUDAGraphMode.NONE
        return eager(x)
    return graphed(_pad_rows(x, size))[: x.shape[0]]


# --- capture and replay ---------------------------------------------------------------------


@dataclass
class GraphEntry:
    """One captured graph: upstream's ``CUDAGraphEntry``, keyed by shape."""

    shape: tuple[int, ...]  # the key (upstream: the BatchDescriptor)
    static_input: np.ndarray  # the one buffer every replay reads: copy new inputs INTO it
    output: np.ndarray  # the one buffer every replay writes (upstream: entry.output)
    num_ops: int  # launches the recording holds
    graph: Callable[[], None]  # the recording, bound to static_input/output (upstream: entry.cudagraph)


class GraphRunner:
    """Capture on a new input shape, replay on a seen one; one dict entry per shape."""

    def __init__(self, ops: Sequence[Op], capture_sizes: Iterable[int] | None = None) -> None:
        self.ops = _check_ops(ops)
        self.capture_sizes = None if capture_sizes is None else _check_sizes(capture_sizes)
        self.graphs: dict[tuple[int, ...], GraphEntry] = {}  # Constraint 1: one graph per shape

    @property
    def num_captured(self) -> int:
        return len(self.graphs)

    def __call__(self, x: np.ndarray) -> np.ndarray:
        return _padded_call(x, self.capture_sizes, self._run_keyed, lambda a: run_eager(self.ops, a))

    def _run_keyed(self, x: np.ndarray) -> np.ndarray:
        # upstream: cuda_graph.py:257-263, look the key up (creating the entry on first sight)
        entry = self.graphs.get(x.shape)
        if entry is None:
            return self._capture(x)
        return self._replay(entry, x)

    def _capture(self, x: np.ndarray) -> np.ndarray:
        # capture (upstream cuda_graph.py:265-344): the buffers are allocated once, here, and
        # every op is launched while "recording" (torch.cuda.graph at line 313)
        static_input = np.array(x, copy=True)
        output = np.array(run_eager(self.ops, static_input), copy=True)
        ops = self.ops

        def graph() -> None:  # reads THIS static_input, writes THIS output, forever
            np.copyto(output, _apply(ops, static_input))

        self.graphs[x.shape] = GraphEntry(x.shape, static_input, output, len(ops), graph)
        return output

    def _replay(self, entry: GraphEntry, x: np.ndarray) -> np.ndarray:
        # replay (upstream cuda_graph.py:346-361); upstream the model runner does the copy-in
        np.copyto(entry.static_input, x)  # Constraint 2: copy in, never rebind
        LaunchCounter.bump(1)  # the entire win (entry.cudagraph.replay(), line 360): one launch
        entry.graph()
        return entry.output  # overwritten by the next replay of this shape


class Segment(NamedTuple):
    capturable: bool  # True: replayed as one graph; False: launched op by op
    ops: list[Op]  # the consecutive ops in this piece
    runner: GraphRunner | None  # the piece's graphs (None for an eager piece)


class PiecewiseGraphRunner:
    """Graphs between the uncapturable ops; the uncapturable ops run eagerly in between."""

    def __init__(
        self,
        ops: Sequence[Op],
        is_capturable: Callable[[int], bool],
        capture_sizes: Iterable[int] | None = None,
    ) -> None:
        self.ops = _check_ops(ops)
        self.capture_sizes = None if capture_sizes is None else _check_sizes(capture_sizes)
        groups: list[tuple[bool, list[Op]]] = []  # upstream: backends.py:548 split_graph
        for i, op in enumerate(self.ops):
            cap = bool(is_capturable(i))
            if groups and groups[-1][0] == cap:
                groups[-1][1].append(op)  # keep consecutive ops of one kind together
            else:
                groups.append((cap, [op]))
        self.segments = [Segment(cap, seg, GraphRunner(seg) if cap else None) for cap, seg in groups]

    @property
    def num_graphs(self) -> int:
        """Capturable pieces, i.e. graphs replayed per call."""
        return sum(seg.capturable for seg in self.segments)

    def __call__(self, x: np.ndarray) -> np.ndarray:
        return _padded_call(x, self.capture_sizes, self._thread, lambda a: run_eager(self.ops, a))

    def _thread(self, x: np.ndarray) -> np.ndarray:
        for seg in self.segments:
            x = seg.runner(x) if seg.capturable else run_eager(seg.ops, x)
        return x
