from itertools import pairwise

import pytest

from course.runtime import lab_module

lab = lab_module(__file__)   # solution.py by default; LAB_IMPL=starter grades starter.py


def test_eager_formula():
    for n, k in [(1, 1), (3, 100), (300, 7)]:
        got = lab.eager_launches(n, k)
        assert got == k * n, f"eager_launches({n}, {k}) must be k * n = {k * n}, got {got}"
    assert lab.eager_launches(300, 0) == 0, "zero calls launch nothing"
    with pytest.raises(ValueError):
        lab.eager_launches(0, 5)


def test_graph_formula():
    assert lab.graph_launches(3, 100) == 102, (
        f"100 graphed calls of 3 ops: capture 3 + 99 replays = 102, got {lab.graph_launches(3, 100)}"
    )
    assert lab.graph_launches(300, 1) == 300, "the first call is the capture: it pays all 300 launches"
    assert lab.graph_launches(300, 10, capture_cost_ops=1500) == 1509, (
        f"capture_cost_ops replaces the capture cost: 1500 + 9 = 1509, got {lab.graph_launches(300, 10, 1500)}"
    )
    assert lab.graph_launches(300, 0) == 0, "zero calls means no capture yet: 0 launches"


def test_crossover_second_call():
    for n in (2, 3, 32, 300):
        got = lab.crossover(n)
        assert got == 2, (
            f"crossover({n}) with capture cost n must be call 2: at k=1 both paid n (a tie is not a "
            f"win), at k=2 the graph paid n + 1 < 2n; got {got}"
        )
    assert lab.crossover(300, capture_cost_ops=1500) == 6, (
        "capture cost 5n delays the crossover: smallest k with 1500 + k - 1 < 300k is k = 6"
    )
    assert lab.crossover(4, capture_cost_ops=20) == 7, "n=4, c=20: 20 + k - 1 < 4k first holds at k = 7"
    for n, c in ((4, 1), (3, 2), (300, 299)):
        got = lab.crossover(n, capture_cost_ops=c)
        assert got == 1 and lab.graph_launches(n, 1, c) < lab.eager_launches(n, 1), (
            f"crossover({n}, capture_cost_ops={c}) should be 1: a capture of {c} launches is already below one eager "
            f"call's {n}, so graphs win on the first call; got {got}. Do not assume the first call is a tie"
        )


def test_crossover_never_for_single_op():
    assert lab.crossover(1) is None, (
        "a 1-op model gains nothing: a replay costs the same one launch as eager, so the capture "
        f"is never repaid; expected None, got {lab.crossover(1)}"
    )
    assert lab.crossover(1, capture_cost_ops=5) is None, "a dearer capture for n=1 is still never repaid"


def test_asymptote_approaches_num_ops():
    n = 300
    ratios = [lab.asymptotic_speedup(n, k) for k in (1, 2, 10, 100, 1000, 10_000, 1_000_000)]
    assert ratios[0] == pytest.approx(1.0), f"after one call both paid n launches: ratio 1, got {ratios[0]}"
    assert all(a < b for a, b in pairwise(ratios)), f"the ratio must rise with k, got {ratios}"
    assert all(r < n for r in ratios), f"the ratio approaches n={n} from below and never reaches it: {ratios}"
    assert ratios[-1] > 299.9, f"after 10**6 calls the ratio should be within 0.1 of {n}, got {ratios[-1]}"
    slow = lab.asymptotic_speedup(n, 100_000_000, capture_cost_ops=5 * n)
    assert slow > 299.9, f"a dearer capture delays the payoff but never lowers the ceiling, got {slow}"


def test_pipelined_step_time():
    e = lab.eager_step_us(300, 5.0, 2.0)
    g = lab.graph_step_us(300, 5.0, 2.0)
    assert e == pytest.approx(1502.0), (
        f"eager, launch-bound (kernel 2 us < launch 5 us): 5 + 299 x 5 + 2 = 1502 us, got {e}; "
        f"the GPU waits for each launch"
    )
    assert g == pytest.approx(605.0), f"graph: one 5 us replay + 300 x 2 us = 605 us, got {g}"
    assert lab.eager_step_us(300, 5.0, 10.0) == pytest.approx(3005.0), (
        "GPU-bound (kernel 10 us > launch 5 us): 5 + 300 x 10 = 3005 us, the launches hide behind the kernels"
    )
    assert lab.predicted_speedup(300, 5.0, 2.0) == pytest.approx(1502 / 605)


def test_speedup_fades_when_gpu_bound():
    speedups = [lab.predicted_speedup(300, 5.0, k) for k in (0.1, 1.0, 2.0, 5.0, 50.0)]
    assert all(a > b for a, b in pairwise(speedups[:-1])), (
        f"as each kernel gets longer the graph's win must shrink, got {speedups}"
    )
    assert speedups[0] > 30, f"tiny kernels: the graph removes almost all the time, got {speedups[0]:.1f}x"
    assert speedups[-1] == pytest.approx(1.0, abs=0.01), (
        f"GPU-bound steps gain ~nothing from a graph (it saves CPU launches only), got {speedups[-1]:.3f}x"
    )


def test_replay_cost_is_a_parameter_zero_included():
    assert lab.graph_step_us(300, 5.0, 2.0, replay_us=20.0) == pytest.approx(620.0), (
        f"a 20 us replay launch: 20 + 300 x 2 = 620 us, got {lab.graph_step_us(300, 5.0, 2.0, replay_us=20.0)}; "
        f"use replay_us when given"
    )
    assert lab.graph_step_us(300, 5.0, 2.0, replay_us=0.0) == pytest.approx(600.0), (
        f"replay_us=0.0 is a real value (a free replay), not 'unset': 0 + 600 = 600 us, got "
        f"{lab.graph_step_us(300, 5.0, 2.0, replay_us=0.0)}; test `replay_us is None`, not truthiness"
    )
    assert lab.predicted_speedup(300, 5.0, 2.0, replay_us=20.0) == pytest.approx(1502 / 620)


def test_speedup_of_zero_calls_is_refused():
    try:
        lab.asymptotic_speedup(300, 0)          # 0 launches / 0 launches: no ratio exists yet
    except ValueError:
        return
    except ZeroDivisionError:
        raise AssertionError("asymptotic_speedup(300, 0) divided 0 by 0: raise ValueError for k == 0 first") from None
    raise AssertionError("asymptotic_speedup(300, 0) must raise ValueError: after zero calls there is no ratio")
