"""Lab 11-03 starter: the adapter slot cache (LRU over max_loras slots) and the scheduler's cap.

Grade with: LAB_IMPL=starter pytest phase-11-multi-lora/labs/lab-03-adapter-slot-cache -q
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence
from typing import NamedTuple

import numpy as np

HIT, LOAD, EVICT_LOAD = "hit", "load", "evict+load"


class Ensured(NamedTuple):
    outcome: str  # HIT, LOAD (into a free slot) or EVICT_LOAD
    slot: int  # the slot the adapter now occupies
    evicted: int | None  # the adapter pushed out, for EVICT_LOAD


class CacheStats(NamedTuple):
    hits: int
    misses: int  # LOAD + EVICT_LOAD
    evictions: int


class Admission(NamedTuple):
    admitted: list[int]  # positions in the waiting queue, in order
    deferred: list[int]  # positions skipped this step because of the adapter cap


class AdapterSlotCache:
    """``max_loras`` slots of adapter ids, least recently used evicted first.

    ``ensure(id)`` makes ``id`` resident: a resident id is a hit and becomes the most recently used;
    otherwise it is loaded into the lowest free slot, after evicting the least recently used
    adapter if no slot is free. Adapter ids are ints ≥ 1; ``ValueError`` otherwise, and for
    ``max_loras < 1``.
    """

    def __init__(self, max_loras: int) -> None:
        if not isinstance(max_loras, int) or max_loras < 1:
            raise ValueError(f"max_loras must be a positive int, got {max_loras!r}")
        self.slots: list[int | None] = [None] * max_loras
        self._order: OrderedDict[int, int] = OrderedDict()  # id -> slot, least recent first
        self._hits = self._misses = self._evictions = 0

    def ensure(self, adapter_id: int) -> Ensured:
        """Make ``adapter_id`` resident; say whether it was a HIT, a LOAD or an EVICT_LOAD."""
        raise NotImplementedError(
            "validate the id; hit: move_to_end; miss: evict the oldest of self._order when no "
            "slot is free, load into the lowest free slot, count"
        )

    def resident(self) -> list[int]:
        """Resident adapter ids, least recently used first."""
        raise NotImplementedError(
            'return the ids in self._order (least recently used first)'
        )

    def stats(self) -> CacheStats:
        return CacheStats(self._hits, self._misses, self._evictions)


def max_schedulable(waiting: Sequence[int | None], max_loras: int, running: Iterable[int] = ()) -> Admission:
    """One step's admission walk over the waiting queue, first come first served.

    ``running`` are the adapters the already-scheduled running requests use; they count against
    ``max_loras``. ``None`` is a base request: always admitted, never claims a slot. A request
    whose adapter is already claimed is admitted for free. A new adapter is admitted (and claimed)
    while fewer than ``max_loras`` are claimed; otherwise the request is deferred and the walk goes
    on. ``ValueError`` for ``max_loras < 1``, an id < 1, or running adapters beyond the cap.
    """
    raise NotImplementedError(
        "walk the queue: None or an already-claimed adapter -> admit; a new adapter -> "
        "admit and claim while fewer than max_loras are claimed, else defer (and keep "
        "walking)"
    )


def skewed_traffic(n: int, adapters: int = 16, hot: int = 3, hot_share: float = 0.8, seed: int = 0) -> list[int]:
    """``n`` adapter ids in 1..adapters: ``hot_share`` of requests go to the ``hot`` lowest ids."""
    rng = np.random.default_rng(seed)
    ids = []
    for _ in range(n):
        if rng.random() < hot_share:
            ids.append(int(rng.integers(hot)) + 1)
        else:
            ids.append(int(rng.integers(hot, adapters)) + 1)
    return ids


def hit_rate(trace: Sequence[int], max_loras: int) -> float:
    cache = AdapterSlotCache(max_loras)
    for adapter in trace:
        cache.ensure(adapter)
    s = cache.stats()
    return s.hits / (s.hits + s.misses)


def main() -> None:
    cache = AdapterSlotCache(2)
    print("2 slots, requests for adapters 1 2 1 3 2:")
    for a in (1, 2, 1, 3, 2):
        e = cache.ensure(a)
        evicted = f", evicted {e.evicted}" if e.evicted else ""
        print(f"  ensure({a}) -> {e.outcome:10s} slot {e.slot}{evicted}; resident (LRU first) {cache.resident()}")
    print(f"  stats: {cache.stats()}")
    n = 2000
    skewed = skewed_traffic(n)
    uniform = skewed_traffic(n, hot_share=3 / 16)  # every adapter equally likely
    print(f"\n{n} requests over 16 adapters, 4 slots:")
    print(f"  80% on 3 hot adapters: LRU hit rate {hit_rate(skewed, 4):.1%}")
    print(f"  uniform:               LRU hit rate {hit_rate(uniform, 4):.1%} (max_loras/k = 4/16 = 25%)")
    for slots in (2, 8, 16):
        print(f"  uniform, {slots:2d} slots:     LRU hit rate {hit_rate(uniform, slots):.1%}")
    queue = [1, None, 2, 3, 1, None, 3, 4]
    print(f"\nwaiting queue (adapter per request): {queue}, max_loras=2")
    step, left = 0, list(range(len(queue)))
    while left:
        step += 1
        adm = max_schedulable([queue[i] for i in left], 2)
        print(f"  step {step}: admit {[left[i] for i in adm.admitted]}, defer {[left[i] for i in adm.deferred]}")
        left = [left[i] for i in adm.deferred]


if __name__ == "__main__":
    main()
