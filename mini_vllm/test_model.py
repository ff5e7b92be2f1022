import numpy as np
import pytest

from mini_vllm import ToyModel


def test_logits_shape_and_batch_independence():
    model = ToyModel()
    logits = model.forward(np.array([104, 105, 7]), np.array([0, 1, 2]))
    assert logits.shape == (3, 257)
    single = model.forward(np.array([105]), np.array([1]))
    np.testing.assert_array_equal(
        logits[1], single[0], err_msg="a row must not depend on the rest of the batch"
    )


def test_pure_function_of_seed_token_position():
    a, b, c = ToyModel(seed=0), ToyModel(seed=0), ToyModel(seed=1)
    toks, pos = np.array([1, 2, 3]), np.array([5, 6, 7])
    np.testing.assert_array_equal(a.forward(toks, pos), b.forward(toks, pos))
    assert not np.array_equal(a.forward(toks, pos), c.forward(toks, pos)), "the seed must matter"
    assert not np.array_equal(
        a.forward(np.array([1]), np.array([0])), a.forward(np.array([1]), np.array([1]))
    ), "the position must matter"


def test_eos_is_reachable_but_rare_under_greedy():
    model = ToyModel()
    toks = np.repeat(np.arange(257), 64)
    pos = np.tile(np.arange(64), 257)
    frac = float((model.forward(toks, pos).argmax(axis=1) == 256).mean())
    assert 0.001 < frac < 0.05, (
        f"EOS should be the argmax for a small share of (token, position) pairs, got {frac}"
    )


def test_empty_batch():
    assert ToyModel().forward(np.array([], dtype=np.int64), np.array([], dtype=np.int64)).shape == (0, 257)


@pytest.mark.parametrize(
    "tokens, positions",
    [([1, 2], [0]), ([[1]], [[0]]), ([257], [0]), ([-1], [0]), ([1], [-1]), ([1.0], [0])],
)
def test_forward_rejects_bad_batches(tokens, positions):
    with pytest.raises((ValueError, TypeError)):
        ToyModel().forward(np.array(tokens), np.array(positions))
