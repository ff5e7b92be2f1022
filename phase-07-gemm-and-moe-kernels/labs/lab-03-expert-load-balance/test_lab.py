import math

import numpy as np

from course.runtime import lab_module

lab = lab_module(__file__)   # solution.py by default; LAB_IMPL=starter grades starter.py


E = 8


def _hot_loads():
    # The lab's fixture: 64 tokens, top-2, 8 experts, p_hot = 0.6 towards expert 7, seed 42.
    return lab.expert_loads(lab.hot_router(64, 2, E, hot_expert=7, p_hot=0.6, seed=42), E)


def test_loads_count_assignments():
    ids = np.array([[0, 3], [3, 3], [1, 0]])           # token 1 routed to expert 3 twice
    loads = lab.expert_loads(ids, 5)
    assert loads.tolist() == [2, 1, 0, 3, 0], (
        f"loads must count every (token, expert) entry: expert 0 twice, 1 once, 3 three times (token 1 counts twice), "
        f"unused experts 2 and 4 zero -> [2, 1, 0, 3, 0]; got {loads.tolist()}. Use np.bincount(..., minlength=num_experts)"
    )
    assert _hot_loads().tolist() == [5, 6, 8, 5, 8, 7, 5, 84], "the seed-42 hot fixture has loads [5, 6, 8, 5, 8, 7, 5, 84]"


def test_uniform_routing_is_nearly_balanced():
    loads = lab.expert_loads(lab.uniform_router(800, 2, E, seed=0), E)
    assert loads.sum() == 1600, f"800 tokens x top-2 = 1600 assignments, counted {loads.sum()}"
    imb = lab.imbalance(loads)
    assert imb < 1.3, f"uniform routing of 1600 assignments over 8 experts is nearly balanced (max/mean < 1.3), got {imb:.3f}"
    assert lab.imbalance(np.full(8, 16)) == 1.0, "perfectly equal loads have imbalance exactly 1.0 (max / mean)"


def test_hot_expert_blows_up_imbalance():
    imb = lab.imbalance(_hot_loads())
    assert imb > 3, f"with 84 of 128 assignments on one expert the imbalance is 84/16 = 5.25 fair shares, got {imb:.2f}"
    assert math.isclose(imb, 5.25), f"imbalance is max load / mean load = 84 / 16 = 5.25, got {imb}"


def test_ep_step_time_is_the_max_device():
    loads = np.array([5, 1, 2, 3])
    assert lab.ep_step_time(loads, 4) == 5, "one expert per device: the step is the busiest expert's load, 5"
    assert lab.ep_step_time(loads, 2) == 7, (
        "2 devices, round-robin: device 0 holds experts 0 and 2 (5 + 2 = 7), device 1 holds 1 and 3 (1 + 3 = 4); "
        f"the barrier waits for 7, got {lab.ep_step_time(loads, 2)}"
    )
    assert lab.ep_step_time(loads, 2, placement=np.array([0, 0, 1, 1])) == 6, (
        "with placement [0, 0, 1, 1] device 0 has 5 + 1 = 6 and device 1 has 2 + 3 = 5: step 6"
    )
    assert lab.ep_step_time(_hot_loads(), 4) == 89, "hot fixture on 4 devices: the device with experts 3 and 7 carries 5 + 84 = 89"


def test_imbalance_burns_parallel_efficiency():
    hot, flat = _hot_loads(), np.full(E, 16)
    assert hot.sum() == flat.sum() == 128, "both load vectors carry the same 128 assignments of useful work"
    slow = lab.ep_step_time(hot, E) / lab.ep_step_time(flat, E)
    assert slow > 2.5, f"same total work, but the hot expert makes the 8-device step {slow:.2f}x longer (84 vs 16); expected > 2.5x"
    assert lab.parallel_efficiency(flat, E) == 1.0, "balanced loads keep every device busy: efficiency 1.0"
    eff = lab.parallel_efficiency(hot, E)
    assert math.isclose(eff, 128 / (8 * 84)), f"efficiency = sum(loads) / (devices x step) = 128 / (8 x 84) = 0.19, got {eff:.3f}"


def test_capacity_drops_only_the_overflow():
    loads = np.array([10, 2, 6, 6])                     # mean 6
    assert lab.dropped_tokens(loads, 1.0) == 4, "capacity 6: only expert 0 overflows, by 10 - 6 = 4"
    assert lab.dropped_tokens(loads, 1.5) == 1, "capacity floor(1.5 x 6) = 9: drops 10 - 9 = 1"
    assert lab.dropped_tokens(loads, 0.5) == 7 + 0 + 3 + 3, (
        "capacity floor(0.5 x 6) = 3: drops 7 + 0 + 3 + 3 = 13; only the part above capacity is dropped, never a whole expert"
    )
    assert lab.dropped_tokens(loads, 1.1) == 4, (
        f"capacity floor(1.1 x 6) = floor(6.6) = 6 (an expert holds whole assignments: round DOWN), so 10 - 6 = 4 "
        f"are dropped; got {lab.dropped_tokens(loads, 1.1)}"
    )


def test_capacity_drops_only_the_overflow_cf1():
    loads = _hot_loads()
    assert lab.dropped_tokens(loads, 1.0) == 68, (
        f"hot fixture, cf = 1.0: capacity 128 / 8 = 16 per expert, the hot expert holds 84, so 84 - 16 = 68 of 128 are dropped; "
        f"got {lab.dropped_tokens(loads, 1.0)}"
    )
    assert lab.dropped_tokens(loads, 5.25) == 0, "cf = 5.25 gives capacity 84: nothing is dropped"
    assert lab.dropped_tokens(loads, 5.0) == 4, "cf = 5.0 gives capacity 80: 4 dropped"


def test_expected_active_experts():
    assert lab.expected_active_experts(1, 2, 8) == 2, "one token touches exactly its k experts"
    got = lab.expected_active_experts(8, 2, 8)
    assert math.isclose(got, 8 * (1 - 0.75 ** 8)), f"Mixtral decode at batch 8 touches 8 x (1 - (6/8)^8) = 7.2 experts, got {got:.2f}"
    sim = np.mean([len(set(lab.uniform_router(8, 2, 8, seed=s).reshape(-1).tolist())) for s in range(300)])
    assert abs(sim - got) < 0.1, f"simulated distinct experts at batch 8 ({sim:.2f}) should match the formula ({got:.2f})"
    assert lab.expected_active_experts(64, 8, 256) > 220, "DeepSeek-V3 (256 experts, top-8) at batch 64 touches over 220 experts"


def test_parallel_efficiency_honours_the_placement():
    # Hot fixture on 4 devices. Round-robin puts the hot expert 7 with expert 3 (5 + 84 = 89); giving it a
    # device of its own and spreading the other seven over three devices makes the step 84.
    hot = _hot_loads()
    rebalanced = np.array([0, 0, 1, 1, 2, 2, 2, 3])
    assert lab.ep_step_time(hot, 4, placement=rebalanced) == 84, (
        "placement [0,0,1,1,2,2,2,3]: the hot expert alone sets the step, 84"
    )
    eff = lab.parallel_efficiency(hot, 4, placement=rebalanced)
    assert math.isclose(eff, 128 / (4 * 84)), (
        f"with placement {rebalanced.tolist()} the efficiency is 128 / (4 x 84) = {128 / 336:.4f}, got {eff:.4f} "
        f"(round-robin would give 128 / (4 x 89) = {128 / 356:.4f}): pass the placement on to ep_step_time"
    )
