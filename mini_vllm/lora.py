"""Multi-LoRA: per-request low-rank adapters, slots with LRU eviction, the ``max_loras`` rule.

Mirrors ``vllm/lora/request.py`` (``LoRARequest``: ``lora_int_id >= 1``; no adapter is ``None``),
``vllm/lora/model_manager.py`` (``LRUCacheLoRAModelManager`` as ``LoRASlotManager``: ``max_loras``
slots in ``lora_index_to_id``, ``activate_adapter`` evicting the least recently used), the
per-token slot indices of ``convert_mapping`` (``vllm/lora/punica_wrapper/utils.py``; -1 for base
tokens), ``PunicaWrapperCPU.add_lora_linear`` as ``apply_batched`` (shrink ``x @ A^T``, expand
``@ B^T`` per slot; rows at -1 are skipped, as the Triton kernels do) and the ``max_loras`` check
of ``Scheduler.schedule``'s waiting loop as ``claim_adapter`` / ``admit_waiting`` (running
requests' adapters count first; a waiting request with a new adapter past the limit waits).

The toy model has no hidden states, so an adapter patches its output projection: the input row
is the one-hot of the last token and ``scaling * (x A^T) B^T`` lands on the logits
(``lora_logits``). Phase 11's guide tells the story.

Left out: loading PEFT checkpoints, the CPU cache tier (``max_cpu_loras``), pinning, several
target layers and packed q/k/v slices, TP sharding, LoRA on embeddings and MoE, rank padding,
and the token-budget and KV checks that follow the LoRA check (the scheduler owns those).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

BASE = -1  # slot index of a row that uses no adapter


@dataclass(frozen=True)
class LoRARequest:
    """Names an adapter. ``lora_int_id`` ≥ 1 is its identity everywhere downstream."""

    lora_name: str
    lora_int_id: int
    lora_path: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.lora_int_id, int) or isinstance(self.lora_int_id, bool):
            raise TypeError(f"lora_int_id must be an int, got {type(self.lora_int_id).__name__}")
        if self.lora_int_id < 1:
            raise ValueError(f"lora_int_id must be >= 1 (0 means 'no adapter'), got {self.lora_int_id}")


@dataclass(frozen=True)
class LoRAAdapter:
    """One adapter's weights for one linear layer: ``W' = W + scaling · B @ A``.

    ``A`` is ``(r, in)`` (shrink, "down"), ``B`` is ``(out, r)`` (expand, "up").
    """

    A: np.ndarray
    B: np.ndarray
    scaling: float = 1.0

    def __post_init__(self) -> None:
        A, B = np.asarray(self.A), np.asarray(self.B)
        if A.ndim != 2 or B.ndim != 2:
            raise ValueError(f"A must be (r, in) and B (out, r); got shapes {A.shape} and {B.shape}")
        if A.shape[0] != B.shape[1]:
            raise ValueError(f"rank mismatch: A is {A.shape} (r={A.shape[0]}) but B is {B.shape} (r={B.shape[1]})")
        if A.shape[0] < 1:
            raise ValueError("rank must be at least 1")
        if not np.isfinite(self.scaling):
            raise ValueError(f"scaling must be finite, got {self.scaling}")
        object.__setattr__(self, "A", A)
        object.__setattr__(self, "B", B)

    @property
    def rank(self) -> int:
        return self.A.shape[0]

    @property
    def in_features(self) -> int:
        return self.A.shape[1]

    @property
    def out_features(self) -> int:
        return self.B.shape[0]

    @classmethod
    def random(cls, in_features: int, out_features: int, rank: int, seed: int, alpha: float | None = None,
               std: float = 0.5) -> LoRAAdapter:
        """A seeded adapter; ``scaling = alpha / rank`` (``alpha`` defaults to ``rank``: scaling 1)."""
        rng = np.random.default_rng(seed)
        A = rng.standard_normal((rank, in_features)) * std
        B = rng.standard_normal((out_features, rank)) * std
        return cls(A, B, (rank if alpha is None else alpha) / rank)


def lora_delta(x: np.ndarray, A: np.ndarray, B: np.ndarray, scaling: float) -> np.ndarray:
    """``scaling · (x @ Aᵀ) @ Bᵀ``: shrink to r, then expand; never forms ``B @ A``."""
    return scaling * ((x @ A.T) @ B.T)


def apply_batched(
    x: np.ndarray,
    adapter_index_per_row: Sequence[int] | np.ndarray,
    slots: Sequence[LoRAAdapter | None],
    out: np.ndarray | None = None,
) -> np.ndarray:
    """Add each row's adapter delta to ``out`` (zeros when ``None``) and return it.

    Row ``i`` uses ``slots[adapter_index_per_row[i]]``; index −1 (``BASE``) rows are left exactly
    as they were. Rows are grouped by slot: one shrink and one expand per distinct slot, however
    many rows share it (the punica/SGMV strategy). Raises ``ValueError`` for an index outside
    ``-1 .. len(slots) - 1``, an index that points at an empty slot, or mismatched shapes.
    """
    x = np.asarray(x)
    idx = np.asarray(adapter_index_per_row)
    if x.ndim != 2:
        raise ValueError(f"x must be (rows, in_features), got shape {x.shape}")
    if idx.shape != (x.shape[0],):
        raise ValueError(f"need one adapter index per row: {x.shape[0]} rows, got index shape {idx.shape}")
    if idx.size and not np.issubdtype(idx.dtype, np.integer):
        raise TypeError(f"adapter indices must be integers, got dtype {idx.dtype}")
    bad = idx[(idx < BASE) | (idx >= len(slots))]
    if bad.size:
        raise ValueError(f"adapter index {int(bad[0])} is outside -1..{len(slots) - 1} ({len(slots)} slots)")
    used = sorted(int(s) for s in np.unique(idx) if s != BASE)
    for s in used:
        adapter = slots[s]
        if adapter is None:
            raise ValueError(f"rows point at slot {s}, which holds no adapter")
        if adapter.in_features != x.shape[1]:
            raise ValueError(f"slot {s} expects in_features={adapter.in_features}, x has {x.shape[1]}")
    if out is None:
        width = slots[used[0]].out_features if used else _width(slots)
        out = np.zeros((x.shape[0], width), dtype=np.result_type(x, np.float64))
    elif out.shape[0] != x.shape[0]:
        raise ValueError(f"out has {out.shape[0]} rows, x has {x.shape[0]}")
    for s in used:
        adapter = slots[s]
        if adapter.out_features != out.shape[1]:
            raise ValueError(f"slot {s} produces {adapter.out_features} columns, out has {out.shape[1]}")
        rows = np.flatnonzero(idx == s)  # each row belongs to one slot: no duplicate indices
        out[rows] += lora_delta(x[rows], adapter.A, adapter.B, adapter.scaling)
    return out


def _width(slots: Sequence[LoRAAdapter | None]) -> int:
    for adapter in slots:
        if adapter is not None:
            return adapter.out_features
    raise ValueError("cannot infer the output width: every slot is empty and no `out` was given")


def lora_logits(
    logits: np.ndarray,
    last_tokens: np.ndarray,
    adapter_index_per_row: Sequence[int] | np.ndarray,
    slots: Sequence[LoRAAdapter | None],
) -> np.ndarray:
    """The toy model's logits with each row's adapter applied to its output projection.

    The toy model's projection input is the one-hot of the last token, so
    ``x @ Aᵀ = A[:, token]``. Returns a new array; base rows are the input logits unchanged.
    """
    logits = np.asarray(logits, dtype=np.float64)
    last_tokens = np.asarray(last_tokens)
    x = np.zeros((logits.shape[0], logits.shape[1]))
    x[np.arange(len(last_tokens)), last_tokens] = 1.0
    return apply_batched(x, adapter_index_per_row, slots, out=logits.copy())


class SlotStats(NamedTuple):
    hits: int  # activate_adapter found the adapter already in a slot
    loads: int  # it had to be copied into a slot (a miss)
    evictions: int  # a load that first pushed out the least recently used adapter


class LoRASlotManager:
    """``max_loras`` slots holding adapters by ``lora_int_id``, evicted least recently used first.

    Mirrors ``LRUCacheLoRAModelManager``: ``activate_adapter`` on a resident id is a hit (it only
    refreshes recency); on a new id with every slot taken it evicts the least recently used
    adapter, then loads into the first free slot (lowest index). Weights live in ``slots``.
    """

    def __init__(self, max_loras: int) -> None:
        if not isinstance(max_loras, int) or max_loras < 1:
            raise ValueError(f"max_loras must be a positive int, got {max_loras!r}")
        self.max_loras = max_loras
        self.lora_index_to_id: list[int | None] = [None] * max_loras
        self.slots: list[LoRAAdapter | None] = [None] * max_loras
        self._lru: OrderedDict[int, None] = OrderedDict()  # oldest first
        self._hits = self._loads = self._evictions = 0

    def activate_adapter(self, lora_id: int, adapter: LoRAAdapter) -> bool:
        """Make ``lora_id`` resident. Returns True if it was loaded now, False on a hit."""
        if lora_id < 1:
            raise ValueError(f"lora_int_id must be >= 1, got {lora_id}")
        if lora_id in self._lru:
            self._lru.move_to_end(lora_id)
            self._hits += 1
            return False
        if len(self._lru) >= self.max_loras:
            oldest = next(iter(self._lru))
            self.deactivate_adapter(oldest)
            self._evictions += 1
        index = self.lora_index_to_id.index(None)  # first free slot
        self.lora_index_to_id[index] = lora_id
        self.slots[index] = adapter
        self._lru[lora_id] = None
        self._loads += 1
        return True

    def deactivate_adapter(self, lora_id: int) -> bool:
        """Free ``lora_id``'s slot and drop its weights. False if it was not resident.

        Upstream's ``_deactivate_adapter`` only clears ``lora_index_to_id``; the old weights stay in
        the buffers until the next ``set_lora`` resets and overwrites them.
        """
        if lora_id not in self._lru:
            return False
        del self._lru[lora_id]
        index = self.lora_index_to_id.index(lora_id)
        self.lora_index_to_id[index] = None
        self.slots[index] = None
        return True

    def resident(self) -> list[int]:
        """Resident adapter ids, least recently used first."""
        return list(self._lru)

    @property
    def stats(self) -> SlotStats:
        return SlotStats(self._hits, self._loads, self._evictions)

    def token_lora_indices(self, lora_ids_per_row: Sequence[int | None]) -> np.ndarray:
        """Slot index per row (−1 for ``None`` or 0, i.e. base), as ``convert_mapping`` builds it."""
        out = np.empty(len(lora_ids_per_row), dtype=np.int64)
        for i, lora_id in enumerate(lora_ids_per_row):
            if lora_id is None or lora_id == 0:
                out[i] = BASE
            elif lora_id in self._lru:
                out[i] = self.lora_index_to_id.index(lora_id)
            else:
                raise ValueError(f"row {i} uses adapter {lora_id}, which is not resident: activate it first")
        return out


def admit_waiting(
    scheduled_loras: set[int] | frozenset[int],
    waiting_lora_ids: Sequence[int | None],
    max_loras: int,
) -> list[int]:
    """Which waiting requests the ``max_loras`` rule lets in this step (their positions, in order).

    ``scheduled_loras`` are the adapters of the running requests already scheduled this step.
    Walking the waiting queue first come first served: a base request (``None``) always passes;
    a request whose adapter is already claimed passes; a new adapter passes while fewer than
    ``max_loras`` are claimed, and is then claimed. Any other request is skipped for this step,
    and the walk continues: a skip is not a barrier.
    """
    if not isinstance(max_loras, int) or max_loras < 1:
        raise ValueError(f"max_loras must be a positive int, got {max_loras!r}")
    claimed = set(scheduled_loras)
    if len(claimed) > max_loras:
        raise ValueError(f"the running requests already use {len(claimed)} adapters > max_loras={max_loras}")
    admitted: list[int] = []
    for pos, lora_id in enumerate(waiting_lora_ids):
        if lora_id is not None and lora_id < 1:
            raise ValueError(f"waiting request {pos} has lora_int_id {lora_id}; use None for 'no adapter'")
        if claim_adapter(claimed, lora_id, max_loras):
            admitted.append(pos)
        # else: it would exceed max_loras: skip it, keep walking
    return admitted


def claim_adapter(claimed: set[int], lora_id: int | None, max_loras: int) -> bool:
    """The ``max_loras`` rule for one waiting request; the scheduler's waiting loop calls it.

    True (pass) for a base request (``None``), for an adapter already in ``claimed``, and for a
    new adapter while fewer than ``max_loras`` are claimed, which is then added to ``claimed``.
    False (skip this request for this step) otherwise; ``claimed`` is then unchanged.
    """
    if lora_id is None or lora_id in claimed:
        return True
    if len(claimed) >= max_loras:
        return False
    claimed.add(lora_id)
    return True
