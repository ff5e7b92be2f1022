import numpy as np
import pytest

from course.runtime import lab_module

lab = lab_module(__file__)   # solution.py by default; LAB_IMPL=starter grades starter.py


OPS = [lambda x: x * 2, lambda x: x + 3, lambda x: (x - 3) * 5]  # composition: multiply by 10


@pytest.fixture(autouse=True)
def fresh_counter():
    lab.LaunchCounter.n = 0  # set directly, so an unwritten reset() fails one test, not all of them
    yield
    lab.LaunchCounter.n = 0


def test_eager_pays_one_launch_per_op():
    x = np.ones(4)
    out = lab.run_eager(OPS, x)
    assert np.all(out == 10.0), f"run_eager must apply every op in order (1 -> 10), got {out}"
    assert lab.LaunchCounter.n == 3, f"one eager call of 3 ops costs 3 launches, got {lab.LaunchCounter.n}"
    lab.run_eager(OPS, x)
    assert lab.LaunchCounter.n == 6, (
        f"eager pays again on every call: 2 calls x 3 ops = 6, got {lab.LaunchCounter.n}"
    )
    with pytest.raises(ValueError):
        lab.LaunchCounter.bump(-1)


def test_capture_then_replay_is_one_launch():
    runner = lab.GraphRunner(OPS)
    runner(np.ones(4))
    assert lab.LaunchCounter.n == 3, (
        f"the first call captures: it launches every op once (3), got {lab.LaunchCounter.n}"
    )
    assert runner.num_captured == 1, f"one shape seen means one graph cached, got {runner.num_captured}"
    runner(np.ones(4))
    runner(np.ones(4))
    assert lab.LaunchCounter.n == 5, (
        f"each replay is exactly ONE launch, so capture + 2 replays = 3 + 1 + 1 = 5, got "
        f"{lab.LaunchCounter.n}: do not bump per op on replay"
    )


def test_replay_output_matches_eager():
    rng = np.random.default_rng(0)
    runner = lab.GraphRunner(OPS)
    runner(rng.standard_normal((2, 3)))
    for _ in range(3):
        x = rng.standard_normal((2, 3))
        np.testing.assert_allclose(
            runner(x), lab.run_eager(OPS, x),
            err_msg="a replay must return exactly what eager returns for the same input",
        )


def test_static_buffer_reflects_new_input():
    runner = lab.GraphRunner(OPS)
    first = runner(np.full(4, 1.0))
    assert np.all(first == 10.0), f"capture with 1.0 must return 10.0, got {first}"
    buf = runner.graphs[(4,)].static_input
    out = runner(np.full(4, 5.0))
    assert np.all(out == 50.0), (
        f"replay with 5.0 must return 50.0, got {out}: the recorded graph reads the buffer it was "
        f"captured with, so copy the new input INTO it (np.copyto), do not rebind the attribute"
    )
    assert runner.graphs[(4,)].static_input is buf and np.all(buf == 5.0), (
        "the entry must keep the SAME static buffer, now holding the new input"
    )


def test_new_shape_triggers_recapture():
    runner = lab.GraphRunner(OPS)
    runner(np.ones(4))
    runner(np.ones(8))
    assert lab.LaunchCounter.n == 6, (
        f"shape (8,) after (4,) is a new key and pays a full capture: 3 + 3 = 6, got {lab.LaunchCounter.n}"
    )
    assert set(runner.graphs) == {(4,), (8,)}, (
        f"both graphs must stay in the dict (one per shape), got keys {sorted(runner.graphs)}"
    )
    out = runner(np.full(4, 2.0))
    assert lab.LaunchCounter.n == 7 and np.all(out == 20.0), (
        f"the (4,) graph still replays (1 launch, 2 -> 20): launches {lab.LaunchCounter.n}, out {out}"
    )


def test_graphs_win_when_overhead_dominates():
    x = np.ones(16)
    for _ in range(100):
        lab.run_eager(OPS, x)
    eager = lab.LaunchCounter.n
    lab.LaunchCounter.reset()
    assert lab.LaunchCounter.n == 0, f"reset() must set the count back to 0, got {lab.LaunchCounter.n}"
    runner = lab.GraphRunner(OPS)
    for _ in range(100):
        runner(x)
    graph = lab.LaunchCounter.n
    assert (eager, graph) == (300, 102), (
        f"100 calls of a 3-op model: eager 100 x 3 = 300, graphs 3 (capture) + 99 (replays) = 102; "
        f"got eager {eager}, graph {graph}"
    )


def test_refused_bump_leaves_the_count_alone():
    lab.LaunchCounter.n = 5
    for bad in (-1, True, 1.5):
        with pytest.raises(ValueError):
            lab.LaunchCounter.bump(bad)
        assert lab.LaunchCounter.n == 5, (
            f"bump({bad!r}) was refused but the count moved to {lab.LaunchCounter.n}: validate k BEFORE adding it"
        )
    lab.LaunchCounter.bump(2)
    assert lab.LaunchCounter.n == 7, f"after the refusals, bump(2) must take 5 to 7, got {lab.LaunchCounter.n}"


class _OpFailed(Exception):
    """Raised by a test op mid-capture (not a RuntimeError, so NotImplementedError cannot pass for it)."""


def test_failed_capture_leaves_no_graph():
    state = {"fail": True}

    def flaky(x):
        if state["fail"]:
            raise _OpFailed("op 2 failed while recording")
        return x + 3

    runner = lab.GraphRunner([OPS[0], flaky, OPS[2]])
    with pytest.raises(_OpFailed):
        runner(np.ones(4))
    assert runner.num_captured == 0 and (4,) not in runner.graphs, (
        "a capture that raised must not leave a graph behind: store the GraphEntry only after every op ran"
    )
    state["fail"] = False
    before = lab.LaunchCounter.n
    out = runner(np.full(4, 5.0))
    assert np.all(out == 50.0) and lab.LaunchCounter.n - before == 3, (
        f"after a failed capture the next call must capture afresh (3 launches, 5 -> 50), as if the failure never "
        f"happened; got {lab.LaunchCounter.n - before} launches and {out}"
    )
    assert runner.num_captured == 1


def test_capture_copies_the_callers_array():
    x = np.ones(4)
    runner = lab.GraphRunner(OPS)
    runner(x)
    assert runner.graphs[(4,)].static_input is not x, (
        "the static buffer must be the runner's own copy (x.copy()), not the caller's array"
    )
    runner(np.full(4, 5.0))
    assert np.all(x == 1.0), (
        f"a replay overwrote the array the caller passed to the capture call, now {x}: capture into a copy, "
        f"so later copies into the static buffer never touch memory the caller owns"
    )


def test_same_batch_size_other_width_is_another_graph():
    runner = lab.GraphRunner(OPS)
    runner(np.ones((4, 1)))
    out = runner(np.full((4, 3), 2.0))
    assert runner.num_captured == 2 and lab.LaunchCounter.n == 6, (
        f"(4, 3) after (4, 1) is a new shape: the key is the whole shape, not the batch size, so it captures "
        f"(3 + 3 = 6 launches, 2 graphs); got {lab.LaunchCounter.n} launches, {runner.num_captured} graphs"
    )
    assert out.shape == (4, 3) and np.all(out == 20.0), f"(4, 3) of 2.0 must give 20.0 everywhere, got {out}"
