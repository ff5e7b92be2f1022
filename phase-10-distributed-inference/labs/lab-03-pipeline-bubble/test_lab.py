"""Lab 10-03 tests: the pipeline grid, its bubble, and the microbatches a bubble budget needs."""

import math
from fractions import Fraction

import pytest

from course.runtime import lab_module

lab = lab_module(__file__)   # solution.py by default; LAB_IMPL=starter grades starter.py


def test_total_ticks():
    for p, m in [(1, 1), (4, 1), (2, 4), (8, 63), (1, 100)]:
        got = lab.pipeline_total_ticks(p, m)
        assert got == p + m - 1, f"p={p}, m={m}: the last microbatch enters at tick m-1 and needs p ticks: {p + m - 1}, got {got}"
    assert lab.pipeline_total_ticks(4, 1) >= 4, "one request never finishes faster than p ticks: PP adds no speed to a single stream"


def test_bubble_formula():
    assert lab.bubble_fraction(1, 1) == 0 and lab.bubble_fraction(1, 50) == 0, "one stage has no bubble"
    assert lab.bubble_fraction(4, 1) == 0.75, "m=1, p=4: three of four GPUs wait at every tick: 75%"
    assert lab.bubble_fraction(2, 4) == 0.2, "p=2, m=4: 1/5"
    assert lab.bubble_fraction(8, 10**6) < 1e-5, "m >> p drives the bubble towards 0"
    for p in (2, 3, 8):
        assert lab.bubble_fraction(p, 1) == (p - 1) / p, "m=1 leaves (p-1)/p idle"
        values = [lab.bubble_fraction(p, m) for m in range(1, 20)]
        assert values == sorted(values, reverse=True) and values[-1] > 0, "more microbatches, smaller bubble, never zero"


def test_schedule_grid_matches_the_formula():
    for p, m in [(1, 1), (1, 3), (2, 4), (4, 1), (3, 7), (8, 5)]:
        grid = lab.simulate_schedule(p, m)
        ticks = lab.pipeline_total_ticks(p, m)
        assert len(grid) == p and all(len(row) == ticks for row in grid), f"grid must be {p} x {ticks}"
        idle = sum(cell is None for row in grid for cell in row)
        assert idle / (p * ticks) == lab.bubble_fraction(p, m), (
            f"p={p}, m={m}: {idle} idle cells of {p * ticks} must equal bubble_fraction exactly"
        )
        assert Fraction(idle, p * ticks) == Fraction(p - 1, p + m - 1)


def test_stage_never_runs_two_microbatches_at_once():
    grid = lab.simulate_schedule(4, 6)
    for s, row in enumerate(grid):
        busy = [b for b in row if b is not None]
        assert sorted(busy) == list(range(6)), f"stage {s} must run every microbatch exactly once, got {row}"
    # and the flow: each microbatch visits stages 0..p-1 on consecutive ticks
    for b in range(6):
        ticks = [row.index(b) for row in grid]
        assert ticks == [b + s for s in range(4)], f"microbatch {b} must be at stage s at tick s+b, got ticks {ticks}"


def test_min_microbatches_for_a_bubble_budget():
    assert lab.min_microbatches_for_bubble(8, 0.10) == 63, "p=8, 10%: (p-1)(1/0.1 - 1) = 63"
    assert lab.min_microbatches_for_bubble(2, 0.10) == 9
    assert lab.min_microbatches_for_bubble(16, 0.10) == 135, "deeper pipelines need proportionally more microbatches"
    for p, budget in [(4, 0.10), (8, 0.25), (16, 0.05), (5, 0.3)]:
        m = lab.min_microbatches_for_bubble(p, budget)
        assert lab.bubble_fraction(p, m) <= budget, f"p={p}: m={m} misses the {budget} budget"
        assert m == 1 or lab.bubble_fraction(p, m - 1) > budget, f"p={p}: m={m} is not the smallest"


def test_budget_exactly_on_the_boundary():
    for p in (2, 3, 8):
        for m in range(1, 120):
            budget = lab.bubble_fraction(p, m)
            got = lab.min_microbatches_for_bubble(p, budget)
            assert got == m, (
                f"p={p}: the budget {budget!r} is met exactly by m={m}, got {got}: a float ceiling of "
                f"(p-1)(1/budget-1) can land one high; check the candidate against bubble_fraction"
            )


def test_budget_edges():
    assert lab.min_microbatches_for_bubble(1, 0) == 1, "one stage meets even a zero budget"
    assert lab.min_microbatches_for_bubble(8, 1) == 1 and lab.min_microbatches_for_bubble(8, 0.875) == 1
    assert lab.min_microbatches_for_bubble(8, 0.8749) == 2


def test_straggler_sets_the_clock():
    for times, m in [((1, 1, 1, 1), 16), ((1, 2, 1, 1), 16), ((3, 1), 5), ((0.5,), 7), ((1, 1, 4), 1)]:
        want = sum(times) + (m - 1) * max(times)
        got = lab.pipeline_time(times, m)
        assert math.isclose(got, want, rel_tol=1e-12), (
            f"stages {times}, m={m}: fill once (sum) then one microbatch per slowest-stage time: {want}, got {got}"
        )
    assert lab.pipeline_time((1, 1, 1, 1), 16) == lab.pipeline_total_ticks(4, 16), "equal unit stages = the tick count"


def test_every_promised_error():
    for bad in (0, -1, 2.0, True):
        with pytest.raises(ValueError, match="num_stages"):
            lab.bubble_fraction(bad, 4)
        with pytest.raises(ValueError, match="num_microbatches"):
            lab.pipeline_total_ticks(4, bad)
    with pytest.raises(ValueError, match="num_microbatches"):
        lab.simulate_schedule(2, 0)
    for budget in (-0.1, 1.5, float("nan")):
        with pytest.raises(ValueError, match="budget"):
            lab.min_microbatches_for_bubble(4, budget)
    with pytest.raises(ValueError, match="never"):
        lab.min_microbatches_for_bubble(4, 0)
    with pytest.raises(ValueError, match="stage_times"):
        lab.pipeline_time([], 4)
    with pytest.raises(ValueError, match="stage_times"):
        lab.pipeline_time([1, 0], 4)


# --- the straggler rule in expert parallelism: EPLB's arithmetic ------------------------------------
LOADS = [90, 10, 10, 10, 40, 10, 20, 10]


def test_eplb_gives_the_spare_slots_to_the_hot_experts():
    counts = lab.eplb_replica_counts(LOADS, 12)
    assert counts == [4, 1, 1, 1, 2, 1, 1, 1], (
        f"got {counts}: each of the 4 spare slots goes to the expert with the highest load PER REPLICA now "
        f"(90 -> 45 -> 40 from expert 4 -> 30 ...), not to the expert with the highest total load every time"
    )
    assert lab.eplb_replica_counts(LOADS, 8) == [1] * 8, "no spare slot: one replica each"
    assert lab.eplb_replica_counts([5, 5, 5, 5], 6) == [2, 2, 1, 1], "a tie goes to the lowest expert index"
    assert lab.eplb_replica_counts([0, 0, 3], 5) == [1, 1, 3], "idle experts never get a spare replica"


def test_eplb_rank_loads_against_no_replication():
    loads = lab.eplb_rank_loads(LOADS, 12, 4)
    assert loads == pytest.approx([52.5, 52.5, 52.5, 42.5]), (
        f"got {loads}: place replicas heaviest first (22.5 x 4, then 20 x 3, then 10 x 5), each on the least "
        f"loaded rank that still has one of its 3 slots free"
    )
    assert max(loads) < 100 and sum(loads) == pytest.approx(sum(LOADS)), "replication moves load, never creates it"
    assert lab.eplb_rank_loads(LOADS, 16, 4) == pytest.approx([50, 50, 155 / 3, 145 / 3])
    assert lab.eplb_rank_loads([7], 1, 1) == [7.0], "one expert, one slot, one rank"


def test_eplb_rank_capacity_is_a_hard_limit():
    loads = lab.eplb_rank_loads([100, 1, 1, 1, 1, 1, 1, 1], 8, 4)
    assert loads == pytest.approx([101, 2, 2, 2]), (
        f"got {loads}: each rank holds exactly 2 replicas; once ranks 1-3 are full the last light expert must go "
        f"to rank 0, next to the hot one, even though rank 0 is the busiest"
    )


def test_eplb_errors():
    with pytest.raises(ValueError, match="cannot hold 8 experts"):
        lab.eplb_replica_counts(LOADS, 7)
    with pytest.raises(ValueError, match="do not split evenly over 4 ranks"):
        lab.eplb_rank_loads(LOADS, 10, 4)
    with pytest.raises(ValueError, match="loads >= 0"):
        lab.eplb_replica_counts([1, -2], 4)
    with pytest.raises(ValueError, match="num_ranks"):
        lab.eplb_rank_loads(LOADS, 8, 0)


@pytest.fixture(scope="module")
def eplb_policy():
    from vllm.distributed.eplb.policy.default import DefaultEplbPolicy

    return DefaultEplbPolicy


@pytest.mark.upstream
def test_your_eplb_equals_vllm_default_policy(eplb_policy):
    import numpy as np
    import torch

    rng = np.random.default_rng(3)
    cases = [(LOADS, 12, 4), (LOADS, 16, 4), ([5, 5, 5, 5], 8, 2), ([100, 1, 1, 1, 1, 1, 1, 1], 8, 4)]
    cases += [(rng.integers(1, 100, 8).tolist(), 16, 4) for _ in range(3)] + [(rng.integers(0, 50, 16).tolist(), 24, 8)]
    for loads, slots, ranks in cases:
        phy2log = eplb_policy.rebalance_experts(torch.tensor([loads], dtype=torch.float64), slots, 1, 1, ranks)[0]
        counts = np.bincount(phy2log.numpy(), minlength=len(loads))
        per = slots // ranks
        real = [sum(loads[e] / counts[e] for e in phy2log[r * per:(r + 1) * per].tolist()) for r in range(ranks)]
        assert lab.eplb_replica_counts(loads, slots) == counts.tolist(), (
            f"loads {loads}, {slots} slots: vLLM's DefaultEplbPolicy gives {counts.tolist()} replicas"
        )
        assert lab.eplb_rank_loads(loads, slots, ranks) == pytest.approx(real, rel=1e-6), (
            f"loads {loads}, {slots} slots, {ranks} ranks: vLLM's placement loads the ranks {real}"
        )
