"""Lab 18-01: the simulator's three metrics, the SLO-filtered grid search, steps to seconds, the Pareto front."""

import functools

import pytest

from course.runtime import lab_module

lab = lab_module(__file__)  # solution.py by default; LAB_IMPL=starter grades starter.py

GRID = ([40, 512], [0, 32, 64])  # the six configs


def prompt(n, salt=0):
    return "".join(chr(97 + (7 * i + 3 * salt) % 26) for i in range(n))


CHAT = ((0, prompt(8, 0), 24), (2, prompt(64, 1), 4), (2, prompt(64, 2), 4))  # a decode stream + two prompts
LONE = ((0, prompt(256, 3), 4),)
PREFILL_HEAVY = ((0, prompt(128, 4), 2), (0, prompt(128, 5), 2), (1, prompt(96, 6), 2))


@functools.cache
def sim(arrivals, budget, threshold=0, seqs=256):
    return lab.simulate(list(arrivals), budget, threshold, seqs)


def test_throughput_more_budget_never_more_steps():
    budgets = [16, 32, 40, 64, 128, 512]
    for name, work in (("chat", CHAT), ("lone", LONE), ("prefill-heavy", PREFILL_HEAVY)):
        for threshold in (0, 32):
            steps = [sim(work, b, threshold).total_steps for b in budgets]
            assert steps == sorted(steps, reverse=True), (
                f"{name}, threshold {threshold}: total_steps over budgets {budgets} = {steps}; a bigger token "
                f"budget can only merge steps, never add one"
            )
    lone = [sim(LONE, b).total_steps for b in (32, 512)]
    assert lone == [11, 4], (
        f"a 256-token prompt (4 output tokens) takes 8 chunks + 3 decodes = 11 steps at budget 32 and "
        f"1 + 3 = 4 at budget 512, got {lone}: pass max_num_batched_tokens to the engine"
    )


def test_spike_threshold_is_per_request_budget_is_global():
    unchunked = sim(CHAT, 512, 0).max_step_tokens
    assert unchunked == 129, (
        f"both 64-token prompts and the decode in one step: 64 + 64 + 1 = 129, got {unchunked}"
    )
    chunked = sim(CHAT, 512, 32).max_step_tokens
    assert chunked == 65, (
        f"threshold 32 caps each request's chunk, not the step: two 32-token chunks + one decode = 65, got "
        f"{chunked}. long_prefill_token_threshold is per request; only the budget bounds a whole step"
    )
    for threshold in (0, 32, 64):
        capped = sim(CHAT, 40, threshold).max_step_tokens
        assert capped == 40, f"budget 40 bounds every step to 40 tokens (threshold {threshold}), got {capped}"
    steps = {t: sim(CHAT, 512, t).total_steps for t in (0, 32)}
    assert steps[0] == steps[32] == 24, (
        f"beside a 24-token decode stream the chunks ride in steps that run anyway: 24 steps either way, "
        f"got {steps}"
    )
    alone = {t: sim(LONE, 512, t).total_steps for t in (0, 32)}
    assert alone[32] - alone[0] == 7, (
        f"a lone 256-token prompt pays the whole bill: 8 chunk steps instead of 1, 7 extra, got {alone}"
    )


def test_queueing_shows_up_in_ttft():
    work = ((0, prompt(16, 7), 6), (0, prompt(16, 8), 6), (0, prompt(16, 9), 6))
    wide = sim(work, 512, 0, 256).ttft_steps
    assert wide == {"r0": 1, "r1": 1, "r2": 1}, f"with room for all, every request starts at once, got {wide}"
    narrow = sim(work, 512, 0, 1)
    assert narrow.ttft_steps == {"r0": 1, "r1": 7, "r2": 13}, (
        f"max_num_seqs=1: r1 waits for r0's 6 steps, r2 for 12; TTFT counts the wait, got {narrow.ttft_steps}"
    )
    assert narrow.worst_ttft == 13 and narrow.total_steps == 18


def test_ttft_is_measured_from_arrival():
    idle = sim(((5, prompt(10, 1), 3),), 512)
    assert idle.ttft_steps == {"r0": 1}, (
        f"an idle engine answers in the arrival step itself: TTFT 1 step (counted from the arrival, that step "
        f"included), got {idle.ttft_steps}"
    )
    assert idle.total_steps == 8 and idle.step_tokens[:5] == [0] * 5, (
        f"the 5 idle steps before the arrival are time too: 5 + 3 = 8 steps, got {idle.total_steps} "
        f"({idle.step_tokens})"
    )
    queued = sim(((0, prompt(8, 2), 6), (2, prompt(8, 3), 2)), 512, 0, 1).ttft_steps
    assert queued["r1"] == 5, (
        f"r1 arrives at step 2, is admitted at step 6 (when r0 is done) and answers there: 6 - 2 + 1 = 5 "
        f"steps from *arrival* (1 from admission, 7 from step 0), got {queued['r1']}"
    )


def test_grid_search_respects_the_slo():
    slo = 100
    fastest = min(
        ((b, t) for b in GRID[0] for t in GRID[1]), key=lambda c: sim(PREFILL_HEAVY, *c).total_steps
    )
    assert sim(PREFILL_HEAVY, *fastest).max_step_tokens > slo  # the throughput-optimal config breaks the SLO
    got = lab.grid_search(list(PREFILL_HEAVY), *GRID, spike_slo=slo)
    legal = [(b, t) for b in GRID[0] for t in GRID[1] if sim(PREFILL_HEAVY, b, t).max_step_tokens <= slo]
    want = min(legal, key=lambda c: (sim(PREFILL_HEAVY, *c).total_steps, sim(PREFILL_HEAVY, *c).worst_ttft))
    assert sim(PREFILL_HEAVY, *got).max_step_tokens <= slo, (
        f"grid_search returned {got}, whose biggest step is {sim(PREFILL_HEAVY, *got).max_step_tokens} > {slo}: "
        f"the SLO is a filter, never a penalty to trade against steps"
    )
    assert got == want, f"among the configs within the SLO {want} takes the fewest steps, got {got}"
    tie = lab.grid_search(list(CHAT), *GRID, spike_slo=80)
    assert tie == (512, 32), (
        f"on the chat workload every legal config takes 24 steps; the tie goes to the lower worst TTFT: "
        f"(512, 32) with 2 steps against 4 at budget 40, got {tie}"
    )


def test_unsatisfiable_slo_is_loud():
    with pytest.raises(ValueError, match="40"):
        lab.grid_search(list(CHAT), *GRID, spike_slo=8)
    with pytest.raises(ValueError):
        lab.grid_search(list(PREFILL_HEAVY), [512], [0], spike_slo=100)


def test_calibrate_recovers_the_step_cost():
    noise = [2e-5, -2e-5, -2e-5, 2e-5]  # sums to zero against both columns' means
    cost = lab.calibrate([(t, 0.003 + 1e-5 * t + e) for t, e in zip((1, 2047, 1, 2047), noise)])
    assert cost.fixed_s == pytest.approx(0.003) and cost.per_token_s == pytest.approx(1e-5), (
        f"fit seconds = fixed + per_token * tokens (with an intercept), got {cost}"
    )
    exact = lab.calibrate([(10, 1.0 + 10 * 0.5), (30, 1.0 + 30 * 0.5)])
    assert exact.fixed_s == pytest.approx(1.0) and exact.per_token_s == pytest.approx(0.5)
    with pytest.raises(ValueError):
        lab.calibrate([(64, 0.004), (64, 0.005)])


def test_ttft_seconds_sums_the_steps_from_arrival():
    cost = lab.StepCost(fixed_s=1.0, per_token_s=0.1)
    work = ((1, prompt(10, 1), 2), (1, prompt(20, 2), 2))
    m = sim(work, 16)  # step 0 idle; step 1: r0's 10 + r1's first 6; step 2: r0 decode + r1's last 14
    assert m.step_tokens == [0, 16, 15, 1]
    got = lab.ttft_seconds(list(work), m, cost)
    assert got == {"r0": pytest.approx(2.6), "r1": pytest.approx(5.1)}, (
        f"r0 answers in step 1 (1 + 1.6 s); r1 in step 2 (2.6 + 2.5 s); the idle step 0 precedes both "
        f"arrivals and is not theirs, got {got}"
    )


def test_pareto_front_keeps_only_the_unbeaten():
    P = lab.Point
    pts = [
        P((1, 1), 100.0, 0.010, 1.0),
        P((2, 1), 200.0, 0.020, 1.0),
        P((3, 1), 200.0, 0.030, 1.0),  # same throughput as (2, 1), slower steps: beaten
        P((4, 1), 150.0, 0.020, 1.0),  # same worst step as (2, 1), less throughput: beaten
        P((5, 1), 300.0, 0.040, 1.0),
        P((6, 1), 300.0, 0.040, 2.0),  # identical on both axes to (5, 1): neither beats the other
    ]
    front = lab.pareto_front(pts)
    assert [p.config for p in front] == [(1, 1), (2, 1), (5, 1), (6, 1)], (
        f"keep a point unless another is at least as good on both axes and better on one; ties on one axis "
        f"still lose, identical points both stay; sort by throughput; got {[p.config for p in front]}"
    )


def test_sweep_makes_a_front_with_a_trade():
    points = lab.sweep(list(PREFILL_HEAVY), [64, 512], [1, 4], lab.StepCost(0.003, 1e-5))
    assert [p.config for p in points] == [(64, 1), (64, 4), (512, 1), (512, 4)], (
        "one point per config, in grid order"
    )
    front = lab.pareto_front(points)
    assert {p.config for p in front} == {(64, 4), (512, 1), (512, 4)}, (
        f"more budget or more sequences buy throughput with longer steps; only (64, 1), slower and no "
        f"shorter-stepped than (64, 4), drops out; got "
        f"{[(p.config, round(p.throughput), p.worst_step_s) for p in points]}"
    )


def test_bad_arrivals_refused():
    for bad in ([], [(-1, "x", 2)], [(0, "x", 0)]):
        with pytest.raises(ValueError):
            lab.simulate(bad, 64)
