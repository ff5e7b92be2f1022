import numpy as np
import pytest

from mini_vllm import Sampler, SamplingParams
from mini_vllm.sampler import apply_top_k, apply_top_p, softmax


def test_greedy_is_argmax_lowest_index_on_ties_and_ignores_knobs():
    logits = np.array([1.0, 3.0, 3.0, 0.0])
    params = SamplingParams(temperature=0, top_k=1, top_p=0.1, seed=123)
    assert Sampler().sample(logits, params) == 1, "argmax must pick the lowest index among ties"
    rng = np.random.default_rng(0)
    state = rng.bit_generator.state
    Sampler().sample(logits, params, rng)
    assert rng.bit_generator.state == state, "greedy sampling must not consume randomness"


def test_softmax_is_stable():
    p = softmax(np.array([1000.0, 1000.0, -np.inf]))
    np.testing.assert_allclose(p, [0.5, 0.5, 0.0])


def test_top_k_masks_all_but_k_and_is_disabled_out_of_range():
    logits = np.array([0.1, 2.0, 1.0, 3.0])
    out = apply_top_k(logits, 2)
    assert np.isfinite(out).tolist() == [False, True, False, True]
    for k in (0, -3, 4, 10):
        np.testing.assert_array_equal(apply_top_k(logits, k), logits)


def test_top_p_keeps_the_crossing_token():
    probs = np.array([0.4, 0.4, 0.2])
    out = apply_top_p(np.log(probs), 0.5)
    assert np.isfinite(out).tolist() == [True, True, False], "p=0.5 over [.4,.4,.2] keeps two tokens"
    out = apply_top_p(np.log(probs), 0.3)
    assert np.isfinite(out).tolist() == [True, False, False]


def test_seeded_sampling_is_reproducible_and_generator_advances():
    logits = np.zeros(50)
    params = SamplingParams(temperature=1.0, seed=7)
    s = Sampler()
    assert s.sample(logits, params) == s.sample(logits, params), "same seed, same draw"
    rng = np.random.default_rng(7)
    draws = [s.sample(logits, params, rng) for _ in range(20)]
    assert len(set(draws)) > 1, "a per-request generator must advance between draws"
    assert draws[0] == s.sample(logits, params), (
        "the first draw of default_rng(seed) equals the seedless-generator path"
    )


def test_pipeline_order_temperature_top_k_top_p():
    # After top-k=2 only tokens 0 and 1 survive; top-p then keeps the larger one only.
    logits = np.log(np.array([0.5, 0.3, 0.2]))
    params = SamplingParams(temperature=1.0, top_k=2, top_p=0.5, seed=0)
    assert {Sampler().sample(logits, params, np.random.default_rng(i)) for i in range(30)} == {0}


def test_low_temperature_concentrates_mass():
    logits = np.array([1.0, 0.0, -1.0])
    hot = [
        Sampler().sample(logits, SamplingParams(temperature=5.0), np.random.default_rng(i))
        for i in range(200)
    ]
    cold = [
        Sampler().sample(logits, SamplingParams(temperature=0.1), np.random.default_rng(i))
        for i in range(200)
    ]
    assert cold.count(0) > hot.count(0)


@pytest.mark.parametrize(
    "logits",
    [
        np.array([]),
        np.zeros((2, 3)),
        np.array([np.nan, 1.0]),
        np.array([-np.inf, -np.inf]),
        np.array([np.inf, 0.0]),
    ],
)
def test_sampler_rejects_bad_logits(logits):
    with pytest.raises(ValueError):
        Sampler().sample(logits, SamplingParams())
