import numpy as np
import pytest

from mini_vllm import Sampler, SamplingParams
from mini_vllm.sampler import apply_top_k_top_p, softmax


def baseline_sample(logits: np.ndarray, params: SamplingParams, generator: np.random.Generator) -> int:
    """The per-row sampler mini shipped before it was batched: the reference the batched one is
    held to below."""
    logits = np.asarray(logits, dtype=np.float64)
    if params.is_greedy:
        return int(np.argmax(logits))

    def softmax(x: np.ndarray) -> np.ndarray:
        e = np.exp(x - np.max(x))
        return e / e.sum()

    x = logits / params.temperature
    k = params.top_k
    if 0 < k < x.shape[-1]:
        kth = np.partition(x, -k)[-k]
        x = np.where(x >= kth, x, -np.inf)
    if params.top_p < 1.0:
        probs = softmax(x)
        order = np.argsort(-probs, kind="stable")
        cum = np.cumsum(probs[order])
        num_keep = min(int(np.searchsorted(cum, params.top_p)) + 1, len(cum))
        out = np.full_like(x, -np.inf)
        keep = order[:num_keep]
        out[keep] = x[keep]
        x = out
    probs = softmax(x)
    return int(generator.choice(len(probs), p=probs))


def kept(logits, k=0, p=1.0):
    """Which tokens survive top-k/top-p (a mask), for one row."""
    x = np.array([logits], dtype=np.float64)
    e = apply_top_k_top_p(x, np.array([k]), np.array([p]))
    return (e[0] > 0).tolist()


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
    logits = [0.1, 2.0, 1.0, 3.0]
    assert kept(logits, k=2) == [False, True, False, True]
    assert kept(logits, k=1) == [False, False, False, True]
    for k in (0, -3, 4, 10):
        assert kept(logits, k=k) == [True] * 4, f"top_k={k} is disabled"


def test_top_k_keeps_every_token_tied_at_the_cut():
    """Upstream masks ``x < kth`` (vllm/v1/sample/ops/topk_topp_sampler.py), so every logit equal
    to the k-th largest survives: k=2 over [3, 1, 1, 1, 0] keeps four tokens, not two."""
    assert kept([3.0, 1.0, 1.0, 1.0, 0.0], k=2) == [True, True, True, True, False]
    assert kept([3.0, 1.0, 1.0, 1.0, 0.0], k=2, p=0.999) == [True, True, True, True, False]


def test_top_p_keeps_the_crossing_token():
    probs = np.log([0.4, 0.4, 0.2])
    assert kept(probs, p=0.5) == [True, True, False], "p=0.5 over [.4,.4,.2] keeps two tokens"
    assert kept(probs, p=0.3) == [True, False, False]
    assert kept(probs, p=0.9) == [True, True, True]


@pytest.mark.parametrize("k", [0, 3, 4])
def test_top_p_stops_at_an_exact_hit(k):
    """Dyadic probabilities make the cumulative sums exact: at p = 0.75 over [.5, .25, .125,
    .125] the top two reach p exactly and nothing more is kept (upstream drops the tail whose
    mass is <= 1 - p)."""
    logits = np.log([0.125, 0.5, 0.125, 0.25])
    assert kept(logits, k=k, p=0.75) == [False, True, False, True]
    assert kept(logits, k=k, p=0.5) == [False, True, False, False]
    assert kept(logits, k=k, p=0.875) == [True, True, False, True], "ties in probability: lowest id first"


def test_temperature_is_applied_before_the_filters():
    # T=10 flattens [.5, .3, .2] to ~[.35, .33, .32]: top-p 0.5 then keeps two tokens. Applying
    # the temperature after top-p would have kept token 0 alone.
    logits = np.log(np.array([0.5, 0.3, 0.2]))
    params = SamplingParams(temperature=10.0, top_p=0.5)
    draws = {Sampler().sample(logits, params, np.random.default_rng(i)) for i in range(40)}
    assert draws == {0, 1}, f"temperature must scale the logits before top-k/top-p, got tokens {draws}"


def test_huge_logits_at_the_smallest_temperature_are_stable():
    logits = np.array([1e308, -1e308, 1e308, 0.0])
    params = SamplingParams(temperature=1e-5, seed=0)
    draws = {Sampler().sample(logits, params, np.random.default_rng(i)) for i in range(20)}
    assert draws == {0, 2}, "the two tied maxima share the mass; no overflow, no NaN"
    assert Sampler().sample(np.array([-1e308, -1e308 + 1e292]), params) == 1


@pytest.mark.parametrize("seed", range(4))
def test_same_tokens_as_the_unbatched_baseline(seed):
    """The batched sampler draws exactly the tokens of the per-row sampler it replaced."""
    rng = np.random.default_rng(seed)
    rows, params = [], []
    for _ in range(60):
        vocab = int(rng.integers(2, 300))
        row = rng.normal(0, rng.choice([0.1, 1.0, 8.0]), vocab)
        if rng.random() < 0.3:
            row = np.round(row)  # ties everywhere, at the top-k cut too
        if rng.random() < 0.2:
            row[rng.random(vocab) < 0.3] = -np.inf
            row[0] = 0.0
        rows.append(row)
        params.append(
            SamplingParams(
                temperature=float(rng.choice([1e-6, 0.3, 1.0, 2.5])),
                top_k=int(rng.choice([0, 1, 2, 5, 50, 400])),
                top_p=float(rng.choice([1.0, 0.9, 0.5, 0.75, 0.01])),
            )
        )
    for i, (row, sp) in enumerate(zip(rows, params)):
        want = baseline_sample(row, sp, np.random.default_rng(1000 * seed + i))
        got = Sampler().sample(row, sp, np.random.default_rng(1000 * seed + i))
        assert got == want, f"row {i} ({sp}): batched sampler drew {got}, the baseline {want}"
    # and as one batch (rows cut or repeated to a common width), each row with its own generator
    batch = np.stack([np.resize(r, 64) for r in rows])
    gens_a = [np.random.default_rng(i) for i in range(len(rows))]
    gens_b = [np.random.default_rng(i) for i in range(len(rows))]
    want = [baseline_sample(r, sp, g) for r, sp, g in zip(batch, params, gens_a)]
    assert Sampler().sample_batch(batch, params, gens_b) == want, "batched rows must not influence each other"


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


class FixedDraw(np.random.Generator):
    """A generator whose uniform draw is chosen by the test (the sampler draws one per row)."""

    def __init__(self, u):
        super().__init__(np.random.PCG64(0))
        self.u = u

    def random(self, *args, **kwargs):
        return self.u


@pytest.mark.parametrize(
    ("knobs", "logits"),
    [
        ({}, [0.0, 0.0, 0.0, 0.0]),  # whole-row path: cumulative 0.25, 0.5, 0.75, 1 exactly
        ({"top_k": 4}, [0.0, 0.0, 0.0, 0.0, -30.0, -30.0]),  # the top-k fast path, same four
        ({"top_p": 0.75}, [0.0, 0.0, 0.0, 0.0, -30.0, -30.0]),  # top-p: keeps four, renormalised
        ({"temperature": 0.5, "min_p": 0.5}, [1.0, 1.0, 1.0, 1.0, 0.0, 0.0]),
    ],
)
@pytest.mark.parametrize(("u", "want"), [(0.0, 0), (0.25, 1), (0.5, 2), (0.75, 3), (0.7499999, 2)])
def test_a_draw_landing_exactly_on_a_cumulative_probability_picks_the_next_token(knobs, logits, u, want):
    # the draw picks the first token whose cumulative probability is strictly above u: u = 0.5 on
    # [0.25, 0.5, 0.75, 1] is token 2, never token 1 (a `<` where `<=` belongs picks the one before)
    params = SamplingParams(**{"temperature": 1.0, **knobs})
    got = Sampler().sample_batch(np.array([logits]), [params], [FixedDraw(u)])
    assert list(got) == [want], (
        f"draw u = {u} with {knobs}: got token {got[0]}, want {want}: count the cumulative "
        "probabilities <= u (a draw on a boundary belongs to the next token)"
    )
    batch = Sampler().sample_batch(
        np.array([logits, logits]), [params, SamplingParams(temperature=1.0)], [FixedDraw(u), FixedDraw(u)]
    )
    assert batch[0] == want, "the same draw in a batch of two must pick the same token"


def test_logit_bias_duplicate_token_keeps_the_last_bias():
    got = SamplingParams(logit_bias=[(5, 1.0), (5, -3.0)]).logit_bias
    assert got == ((5, -3.0),), (
        f"logit_bias given token 5 twice (1.0 then -3.0) resolved to {got}: the later entry wins, "
        "as a JSON object or dict with a repeated key does"
    )
