"""Lab 11-03: adapter slot cache and the max_loras admission cap.

Grades solution.py, or starter.py with LAB_IMPL=starter.
"""

import random

import pytest

from course.runtime import lab_module
from mini_vllm.lora import LoRAAdapter, LoRASlotManager, admit_waiting

lab = lab_module(__file__)   # solution.py by default; LAB_IMPL=starter grades starter.py

HIT, LOAD, EVICT = "hit", "load", "evict+load"


def test_fill_then_hit():
    c = lab.AdapterSlotCache(2)
    got = [tuple(c.ensure(a)) for a in (1, 2, 1)]
    assert got == [(LOAD, 0, None), (LOAD, 1, None), (HIT, 0, None)], (
        "two free slots fill in order (slot 0, then 1); the third request is a hit on slot 0"
    )
    assert tuple(c.ensure(3)) == (EVICT, 1, 2), "a third adapter evicts the least recently used (2) and takes its slot"
    assert tuple(c.stats()) == (1, 3, 1), "1 hit, 3 misses (2 loads + 1 evict+load), 1 eviction"


def test_lru_evicts_the_coldest():
    c = lab.AdapterSlotCache(3)
    for a in (1, 2, 3, 1):  # re-touch 1: now 2 is the coldest
        c.ensure(a)
    assert c.ensure(4).evicted == 2, "adapter 1 was used again, so 2 is the least recently used (FIFO would evict 1)"
    assert c.resident() == [3, 1, 4], "resident() lists least recently used first"
    assert c.ensure(1).outcome == HIT


def test_repeated_hit_on_the_newest_changes_nothing():
    c = lab.AdapterSlotCache(2)
    for a in (1, 2, 2, 2):
        c.ensure(a)
    assert c.resident() == [1, 2] and c.ensure(3).evicted == 1, "hits on the newest keep 1 the coldest"


def test_freed_slot_is_reused_and_one_slot_thrashes():
    c = lab.AdapterSlotCache(1)
    got = [c.ensure(a).outcome for a in (1, 2, 1, 1)]
    assert got == [LOAD, EVICT, EVICT, HIT], "one slot: alternating adapters evict each other every time"
    assert c.slots == [1] and tuple(c.stats()) == (1, 3, 2)


def test_skewed_traffic_loves_lru():
    skewed = lab.skewed_traffic(2000)  # 80% of requests on 3 of 16 adapters (~20%)
    lru = lab.hit_rate(skewed, 4)
    uniform = lab.hit_rate(lab.skewed_traffic(2000, hot_share=3 / 16), 4)
    assert lru > 0.70, f"with 4 slots, 80/20 traffic over 16 adapters should hit > 70% under LRU, got {lru:.1%}"
    assert abs(uniform - 4 / 16) < 0.03, f"uniform traffic over 16 adapters with 4 slots hits ≈ 4/16, got {uniform:.1%}"
    fifo, order = 0, []
    for a in skewed:  # FIFO for comparison: a hit does not refresh
        if a in order:
            fifo += 1
        else:
            order = (order + [a])[-4:]
    assert lru > fifo / 2000 + 0.05, f"LRU ({lru:.1%}) must beat FIFO ({fifo / 2000:.1%}) on skewed traffic"


def test_cache_agrees_with_mini_vllm_slot_manager():
    rng = random.Random(5)
    for slots in (1, 2, 4):
        c, m = lab.AdapterSlotCache(slots), LoRASlotManager(slots)
        dummy = LoRAAdapter.random(2, 2, 1, seed=0)
        for _ in range(300):
            a = rng.randint(1, 7)
            e = c.ensure(a)
            m.activate_adapter(a, dummy)
            assert c.slots == m.lora_index_to_id, f"slot layout differs from mini_vllm after adapter {a}"
            assert e.slot == m.lora_index_to_id.index(a), (
                f"ensure({a}) returned slot {e.slot}, but the adapter sits in slot {m.lora_index_to_id.index(a)}: "
                "a hit must report the slot the adapter occupies"
            )
        assert c.resident() == m.resident()
        s = m.stats
        assert tuple(c.stats()) == (s.hits, s.loads, s.evictions)


def test_scheduler_caps_distinct_adapters_per_step():
    adm = lab.max_schedulable([1, 2, 3, 1, 2, 4], 2)
    assert adm.admitted == [0, 1, 3, 4], "1 and 2 claim the two slots FCFS; later 1s and 2s reuse them for free"
    assert adm.deferred == [2, 5], "3 and 4 would be a third and fourth adapter: deferred"
    adm = lab.max_schedulable([3, 1], 2, running=[1, 2])
    assert adm == ([1], [0]), "running requests' adapters count first: 3 waits, 1 rides along"


def test_base_requests_never_consume_slots():
    assert lab.max_schedulable([None, 1, None, 2, None], 1) == ([0, 1, 2, 4], [3])
    assert lab.max_schedulable([None] * 5, 1).admitted == [0, 1, 2, 3, 4]


def test_deferral_is_not_a_barrier():
    adm = lab.max_schedulable([1, 2, 1, None, 1], 1)
    assert adm.admitted == [0, 2, 3, 4], (
        "request 1 (adapter 2) is deferred but the walk continues: later requests that fit are admitted "
        "(unlike Phase 03's KV-exhaustion break, this is a skip, not a stop)"
    )


def test_admission_agrees_with_mini_vllm_and_drains():
    rng = random.Random(11)
    for max_loras in (1, 2, 3):
        queue = [rng.choice([None, 1, 2, 3, 4, 5]) for _ in range(30)]
        left = list(range(len(queue)))
        for step in range(100):
            adm = lab.max_schedulable([queue[i] for i in left], max_loras)
            assert adm.admitted == admit_waiting(set(), [queue[i] for i in left], max_loras), (
                f"step {step}: your admission differs from mini_vllm.lora.admit_waiting (max_loras={max_loras})"
            )
            assert sorted(adm.admitted + adm.deferred) == list(range(len(left))), "every request is admitted or deferred"
            ids = {queue[left[i]] for i in adm.admitted} - {None}
            assert len(ids) <= max_loras
            left = [left[i] for i in adm.deferred]
            if not left:
                break
        else:
            pytest.fail(f"queue not drained after 100 steps with max_loras={max_loras}: is a deferred request ever admitted?")


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: lab.AdapterSlotCache(2).ensure(0), ">= 1"),
        (lambda: lab.max_schedulable([1], 0), "positive"),
        (lambda: lab.max_schedulable([0], 2), "None"),
        (lambda: lab.max_schedulable([], 1, running=[1, 2]), "more than max_loras"),
    ],
)
def test_promised_errors(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_running_adapters_are_counted_distinct():
    try:
        adm = lab.max_schedulable([1, None, 2], 1, running=[1, 1, 1])
    except ValueError as exc:
        pytest.fail(f"running=[1, 1, 1] is three requests on ONE adapter, within max_loras=1; you raised {exc!r}: "
                    "count distinct running adapters, not running requests")
    assert adm == ([0, 1], [2]), (
        f"running=[1, 1, 1] with max_loras=1: adapter 1 holds the one slot, so the 1 and the base request ride "
        f"along and adapter 2 waits; got {adm}"
    )


@pytest.mark.parametrize("queue, running", [([1, 0], ()), ([None, 0], [1]), ([2, None, -3], [1])])
def test_bad_id_is_refused_even_when_the_cap_is_full(queue, running):
    try:
        adm = lab.max_schedulable(queue, 1, running=running)
    except ValueError:
        return
    pytest.fail(f"waiting {queue} (running {list(running)}, max_loras=1) holds an id < 1, but you returned {adm}: "
                "check every waiting id, not only the ones that would claim a free slot")


def test_refused_ensure_changes_nothing():
    with pytest.raises(ValueError, match="positive"):
        lab.AdapterSlotCache(0)
    c = lab.AdapterSlotCache(2)
    c.ensure(1)
    with pytest.raises(ValueError):
        c.ensure(-1)
    assert c.resident() == [1] and tuple(c.stats()) == (0, 1, 0) and c.slots == [1, None]
