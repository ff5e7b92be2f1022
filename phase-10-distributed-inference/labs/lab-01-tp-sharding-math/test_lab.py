"""Lab 10-01 tests: column/row sharding reconstructs the dense product; the block needs one all-reduce."""

import numpy as np
import pytest

from course.runtime import lab_module

lab = lab_module(__file__)   # solution.py by default; LAB_IMPL=starter grades starter.py

RANKS = (1, 2, 4, 8)


def data(seed=0, tokens=5, hidden=16, inter=64):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((tokens, hidden)), rng.standard_normal((inter, hidden)), rng.standard_normal((hidden, inter))


def ints(seed, shape):
    return np.random.default_rng(seed).integers(-4, 5, shape).astype(np.float64)


def test_shard_is_equal_contiguous_and_in_rank_order():
    for n, ranks in [(64, 1), (64, 2), (64, 8), (12, 3), (8, 8)]:
        got = [lab.shard(n, ranks, r) for r in range(ranks)]
        covered = [i for s in got for i in range(n)[s]]
        assert covered == list(range(n)), f"shards of {n} over {ranks} ranks must tile 0..{n - 1} in rank order, got {got}"
        assert len({s.stop - s.start for s in got}) == 1, "every rank gets the same width"


def test_column_parallel_reconstructs_x_at_W_T():
    x, W1, _ = data()
    for n in RANKS:
        got = lab.column_parallel(x, W1, n)
        assert got.shape == (5, 64), f"column-parallel output is all-gathered back to [tokens, out]; got {got.shape}"
        np.testing.assert_allclose(got, x @ W1.T, rtol=1e-12, atol=1e-12,
                                   err_msg=f"num_ranks={n}: split W by its output rows (W[s]) and concatenate")


def test_row_parallel_reconstructs_x_at_W_T():
    _, _, W2 = data()
    h = np.random.default_rng(1).standard_normal((5, 64))
    for n in RANKS:
        got = lab.row_parallel(h, W2, n)
        assert got.shape == (5, 16), f"row-parallel partials are full-shaped [tokens, out]; got {got.shape}: sum them"
        np.testing.assert_allclose(got, h @ W2.T, rtol=1e-12, atol=1e-12,
                                   err_msg=f"num_ranks={n}: split W's input columns and x's columns alike, then sum")


def test_integer_inputs_reconstruct_exactly():
    x, W = ints(2, (3, 32)), ints(3, (48, 32))
    for n in RANKS:
        assert np.array_equal(lab.column_parallel(x, W, n), x @ W.T), "integer-valued floats leave no rounding to blame"
        assert np.array_equal(lab.row_parallel(x, W, n), x @ W.T), "integer-valued floats leave no rounding to blame"


def test_non_square_weights_use_the_right_axis():
    x, W = data(4, hidden=8)[0], np.random.default_rng(5).standard_normal((24, 8))  # out 24 != in 8
    assert lab.column_parallel(x, W, 8).shape == (5, 24), "column-parallel splits the 24 output rows, not the 8 inputs"
    assert lab.row_parallel(x, W, 8).shape == (5, 24), "row-parallel splits the 8 input columns; outputs stay 24"
    with pytest.raises(ValueError, match="split"):
        lab.column_parallel(x, W, 16)  # 24 rows do not split over 16
    with pytest.raises(ValueError, match="split"):
        lab.row_parallel(x, W, 3)  # 8 inputs do not split over 3


def test_mlp_tp_equals_dense_with_one_all_reduce():
    x, W1, W2 = data(6)
    dense = np.maximum(x @ W1.T, 0) @ W2.T
    for n in RANKS:
        res = lab.mlp_tp(x, W1, W2, n)
        np.testing.assert_allclose(res.output, dense, rtol=1e-12, atol=1e-11,
                                   err_msg=f"num_ranks={n}: column W1, ReLU per shard, row W2, one sum")
        want = 1 if n > 1 else 0
        assert res.num_all_reduces == want, (
            f"num_ranks={n}: the column → row pair needs exactly {want} all-reduce (one collective all ranks join, "
            f"not one per rank; none at TP=1), got {res.num_all_reduces}"
        )
        assert res.num_all_gathers == 0, "the intermediate activation stays sharded: no all-gather between the matmuls"


def test_rank_count_does_not_change_the_model():
    x, W1, W2 = data(7)
    outs = [lab.mlp_tp(x, W1, W2, n).output for n in RANKS]
    for n, out in zip(RANKS[1:], outs[1:]):
        np.testing.assert_allclose(out, outs[0], rtol=1e-12, atol=1e-11, err_msg=f"TP={n} must serve the TP=1 model")


def test_relu_must_see_the_whole_feature_not_a_partial_sum():
    # Negative pre-activations that would become positive partial sums if W1 were split on its input axis.
    x = np.array([[1.0, 1.0, -1.0, -1.0]])
    W1 = np.array([[3.0, 0.0, 4.0, 0.0], [0.0, -2.0, 0.0, -3.0]])  # pre-activation: [-1, 1]
    W2 = np.eye(2)
    res = lab.mlp_tp(x, W1, W2, 2)
    assert np.array_equal(res.output, [[0.0, 1.0]]), (
        f"got {res.output}: ReLU of partial sums is not ReLU of the sum; split W1 by output rows so each rank "
        "holds whole features"
    )


def test_extreme_magnitudes_stay_finite_and_close():
    x, W1, W2 = data(8)
    for scale in (1e-150, 1e100):
        res = lab.mlp_tp(x * scale, W1, W2, 4)
        dense = np.maximum((x * scale) @ W1.T, 0) @ W2.T
        assert np.all(np.isfinite(res.output)), f"scale {scale}: outputs must stay finite"
        np.testing.assert_allclose(res.output, dense, rtol=1e-10, atol=0, err_msg=f"scale {scale}")


def test_every_promised_error():
    x, W1, W2 = data()
    for bad in (0, -2, 2.0, True):
        with pytest.raises(ValueError, match="num_ranks"):
            lab.shard(64, bad, 0)
    for bad_rank in (4, -1):  # -1 would silently slice the last chunk's tail: slice(-16, 0) is empty
        with pytest.raises(ValueError, match="rank"):
            lab.shard(64, 4, bad_rank)
    with pytest.raises(ValueError, match="split"):
        lab.mlp_tp(x, W1, W2, 3)  # 64 intermediate features over 3 ranks: why TP sizes are powers of two
    with pytest.raises(ValueError, match="W2"):
        lab.mlp_tp(x, W1, W2[:, :32], 2)


def test_agrees_with_the_executor_sharding():
    from mini_vllm.executor import shard_range, tp_mlp_rank

    for n in (2, 4, 8):
        assert [lab.shard(64, n, r) for r in range(n)] == [shard_range(64, n, r) for r in range(n)], (
            "your shards must be the ones mini_vllm's workers keep (equal, contiguous, rank order)"
        )
    x, W1, W2 = data(9)
    engine = sum(tp_mlp_rank(x, W1, W2, r, 4, lambda p: p)[0] for r in range(4))
    np.testing.assert_allclose(lab.mlp_tp(x, W1, W2, 4).output, engine, rtol=1e-12, atol=1e-11)
