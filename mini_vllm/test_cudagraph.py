"""Tests for mini_vllm.cudagraph: launches are counted, never timed.

The seven behaviours the phase-05 mini-build asks for come first; the last three pin the
capture-ladder extension (padding to the next rung, eager above the top rung, bad input).
"""

import numpy as np
import pytest

from mini_vllm.cudagraph import (
    GraphRunner,
    LaunchCounter,
    PiecewiseGraphRunner,
    default_capture_sizes,
    run_eager,
    select_capture_size,
)

# Three ops whose composition multiplies by 10: 1 -> 10, 5 -> 50.
OPS = [lambda x: x * 2, lambda x: x + 3, lambda x: (x - 3) * 5]


@pytest.fixture(autouse=True)
def fresh_counter():
    LaunchCounter.reset()
    yield
    LaunchCounter.reset()


def test_eager_pays_one_launch_per_op_every_call():
    x = np.ones(4)
    for _ in range(3):
        run_eager(OPS, x)
    assert LaunchCounter.n == 9, f"3 eager calls of 3 ops must cost 9 launches, got {LaunchCounter.n}"


def test_capture_costs_len_ops_then_replay_costs_one():
    runner = GraphRunner(OPS)
    runner(np.ones(4))
    assert LaunchCounter.n == len(OPS), f"capture launches every op once (3), got {LaunchCounter.n}"
    runner(np.ones(4))
    assert LaunchCounter.n == len(OPS) + 1, f"a replay is exactly one launch: expected 4 in total, got {LaunchCounter.n}"
    assert runner.num_captured == 1, f"one shape seen, so one graph; got {runner.num_captured}"


def test_replay_output_matches_eager():
    rng = np.random.default_rng(0)
    runner = GraphRunner(OPS)
    runner(rng.standard_normal(8))  # capture
    x = rng.standard_normal(8)
    np.testing.assert_allclose(runner(x), run_eager(OPS, x), err_msg="a replay must compute what eager computes")


def test_static_buffer_copy_is_live():
    runner = GraphRunner(OPS)
    runner(np.full(4, 1.0))  # capture with 1 -> 10
    buf = runner.graphs[(4,)].static_input
    out = runner(np.full(4, 5.0))
    assert np.all(out == 50.0), f"replay with 5 must give 50 (copied into the static buffer), got {out}"
    assert runner.graphs[(4,)].static_input is buf, "the static buffer must be reused, never rebound"
    assert np.all(buf == 5.0), "np.copyto must write the new input into the captured buffer"


def test_new_shape_recaptures_and_keeps_both_entries():
    runner = GraphRunner(OPS)
    runner(np.ones(4))
    runner(np.ones(8))
    assert LaunchCounter.n == 2 * len(OPS), f"a new shape pays a full capture: expected 6, got {LaunchCounter.n}"
    assert set(runner.graphs) == {(4,), (8,)}, f"both graphs stay cached, got keys {sorted(runner.graphs)}"
    runner(np.ones(4))
    assert LaunchCounter.n == 7, "the old shape still replays with one launch"


def test_piecewise_output_matches_eager():
    rng = np.random.default_rng(1)
    ops = OPS + [np.tanh, lambda x: x - 1, np.abs]
    runner = PiecewiseGraphRunner(ops, is_capturable=lambda i: i not in (1, 3))
    for _ in range(3):
        x = rng.standard_normal(6)
        np.testing.assert_allclose(runner(x), run_eager(ops, x), err_msg="piecewise must equal eager")
    assert runner.num_graphs == 3, f"pieces [0] [2] [4,5] are capturable: 3 graphs, got {runner.num_graphs}"


def test_piecewise_three_op_split_has_two_graphs():
    runner = PiecewiseGraphRunner(OPS, is_capturable=lambda i: i != 1)
    assert runner.num_graphs == 2, f"3 ops cut at the middle one leave 2 graphs, got {runner.num_graphs}"
    runner(np.ones(3))  # capture: 3 launches
    LaunchCounter.reset()
    out = runner(np.full(3, 5.0))
    assert np.all(out == 50.0), f"replay through the pieces must still give 50, got {out}"
    assert LaunchCounter.n == 3, f"replay = graph + eager op + graph = 3 launches, got {LaunchCounter.n}"


def test_default_ladder_shape_and_rung_count():
    assert default_capture_sizes(64) == [1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64]
    ladder = default_capture_sizes(512)
    assert len(ladder) == 51, f"1,2,4 + 31 multiples of 8 + 17 multiples of 16 = 51 rungs, got {len(ladder)}"
    assert ladder[32:38] == [240, 248, 256, 272, 288, 304], "stride 8 below 256, stride 16 from 256"


def test_padding_shares_graphs_and_oversize_runs_eager():
    runner = GraphRunner(OPS, capture_sizes=[1, 2, 4, 8])
    for b in range(1, 9):
        out = runner(np.full((b, 2), 1.0))
        assert out.shape == (b, 2) and np.all(out == 10.0), f"batch {b}: padded rows must be sliced off"
    assert sorted(runner.graphs) == [(1, 2), (2, 2), (4, 2), (8, 2)], "batches 1..8 need only the 4 rungs"
    assert select_capture_size(5, [1, 2, 4, 8]) == 8 and select_capture_size(9, [1, 2, 4, 8]) is None
    LaunchCounter.reset()
    runner(np.ones((9, 2)))
    assert LaunchCounter.n == 3 and runner.num_captured == 4, "above the top rung: eager, no new graph"


def test_bad_input_is_rejected():
    with pytest.raises(ValueError):
        GraphRunner([])
    with pytest.raises(TypeError):
        run_eager([1, 2], np.ones(2))
    with pytest.raises(ValueError, match="at least one"):  # an empty model is refused, not run as a no-op
        run_eager([], np.ones(2))
    with pytest.raises(ValueError):
        LaunchCounter.bump(-1)
    with pytest.raises(ValueError):
        default_capture_sizes(0)
    with pytest.raises(ValueError):
        GraphRunner(OPS, capture_sizes=[])
