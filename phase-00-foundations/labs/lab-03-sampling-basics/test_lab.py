import itertools

import numpy as np

import mini_vllm
from course.runtime import lab_module

lab = lab_module(__file__)   # solution.py by default; LAB_IMPL=starter grades starter.py


# Six distinct logits; index 2 is the argmax.
LOGITS = np.array([1.0, -0.5, 3.0, 0.25, 2.0, -2.0])


def _finite(x):
    return np.flatnonzero(np.isfinite(x)).tolist()


def test_softmax_is_a_distribution_and_is_stable():
    p = lab.softmax(LOGITS)
    assert p.shape == LOGITS.shape, f"softmax must return one probability per logit, got shape {p.shape}"
    assert np.all(p >= 0) and np.isclose(p.sum(), 1.0), f"probabilities must be >= 0 and sum to 1, got {p} (sum {p.sum()})"
    assert np.argsort(p).tolist() == np.argsort(LOGITS).tolist(), "softmax must preserve the order of the logits"
    big = lab.softmax(np.array([1000.0, 999.0, 998.0]))
    assert np.all(np.isfinite(big)), (
        f"softmax([1000, 999, 998]) overflowed to {big}: subtract max(logits) before exp (exp(1000) is inf)"
    )
    assert np.allclose(big, lab.softmax(np.array([2.0, 1.0, 0.0]))), "softmax must be unchanged by adding a constant to every logit"
    masked = lab.softmax(np.array([0.0, -np.inf, 0.0]))
    assert np.allclose(masked, [0.5, 0.0, 0.5]), f"a -inf logit must get probability exactly 0, got {masked}"



def test_softmax_of_scores_all_below_minus_700():
    # exp(-800) underflows to 0.0 in float64: without the max shift every term is 0 and 0/0 is NaN.
    low = lab.softmax(np.array([-800.0, -801.0, -802.0]))
    assert np.all(np.isfinite(low)), (
        f"softmax([-800, -801, -802]) gave {low}: exp(-800) underflows to 0, so always subtract "
        f"max(logits) first (not only when the logits are large)"
    )
    assert np.allclose(low, lab.softmax(np.array([2.0, 1.0, 0.0]))), (
        f"softmax([-800, -801, -802]) must equal softmax([2, 1, 0]), got {low}"
    )
    wide = lab.softmax(np.array([0.0, -1500.0, -1e300]))
    assert wide.tolist() == [1.0, 0.0, 0.0], f"softmax([0, -1500, -1e300]) must be exactly [1, 0, 0], got {wide}"

def test_greedy_is_argmax_and_ignores_every_other_knob(monkeypatch):
    def no_rng(*args, **kwargs):
        raise AssertionError("greedy sampling (temperature 0) must not create a random generator: return argmax directly")

    monkeypatch.setattr(np.random, "default_rng", no_rng)
    for top_k in (0, 1, 3, 100):
        for top_p in (1.0, 0.5, 0.01):
            for seed in (None, 0, 12345):
                tok = lab.sample(LOGITS, temperature=0.0, top_k=top_k, top_p=top_p, seed=seed)
                assert tok == 2, (
                    f"temperature=0 must return argmax(logits) = 2 whatever top_k/top_p/seed say; got {tok} "
                    f"for top_k={top_k}, top_p={top_p}, seed={seed}"
                )
                assert isinstance(tok, int), f"sample must return a plain Python int, got {type(tok).__name__}"
    tie = lab.sample(np.array([0.0, 5.0, 5.0, 1.0]), temperature=0.0)
    assert tie == 1, f"on a tie, greedy picks the lowest index (np.argmax does), got {tie}"
    tiny = lab.sample(LOGITS, temperature=1e-6, top_p=0.5, seed=3)
    assert tiny == 2, (
        f"temperature 1e-6 is below SAMPLING_EPS (1e-5), so it is greedy too: argmax = 2, got {tiny}. "
        f"Test `temperature < SAMPLING_EPS`, not `temperature == 0` (dividing by 1e-6 is not a sampler)"
    )


def test_top_k_keeps_exactly_k():
    for k, expect in [(1, [2]), (3, [0, 2, 4]), (5, [0, 1, 2, 3, 4])]:
        out = lab.apply_top_k(LOGITS, k)
        assert _finite(out) == expect, f"top_k={k} should keep indices {expect} (the {k} largest), kept {_finite(out)}"
        assert np.all(out[expect] == LOGITS[expect]), "kept logits must keep their values"
        assert np.all(np.isneginf(np.delete(out, expect))), "dropped logits must become -inf (not 0: 0 is a perfectly likely logit)"
    for k in (0, -1, 6, 50):
        out = lab.apply_top_k(LOGITS, k)
        assert np.array_equal(out, LOGITS), f"top_k={k} is disabled (k <= 0 or k >= vocab) and must change nothing, got {out}"



def test_top_k_keeps_every_logit_tied_with_the_kth():
    # vLLM masks `logits < kth` (vllm/v1/sample/ops/topk_topp_sampler.py, apply_top_k_top_p_pytorch
    # and apply_top_k_only): a logit tied with the k-th largest survives, so k=2 here keeps three.
    tied = np.array([1.0, 3.0, 2.0, 0.0, 2.0])
    kept = _finite(lab.apply_top_k(tied, 2))
    assert kept == [1, 2, 4], (
        f"top_k=2 over {tied.tolist()}: the 2nd largest is 2.0 and both tokens holding it must survive "
        f"(keep every logit >= the k-th largest, as vLLM does), kept {kept}"
    )
    kept = _finite(lab.apply_top_k(np.zeros(4), 1))
    assert kept == [0, 1, 2, 3], f"top_k=1 over four equal logits keeps all four (all tie with the max), kept {kept}"

def test_top_p_keeps_the_smallest_sufficient_nucleus():
    # Probabilities 0.5, 0.3, 0.15, 0.05 at indices 3, 0, 2, 1: running sums 0.5, 0.8, 0.95, 1.0.
    # Each p below sits strictly between two running sums. On an exact boundary (p = 0.8) the
    # float cumsum could land at 0.7999999 or 0.8000001 and either answer would be "right", so
    # the test stays off the boundaries on purpose.
    logits = np.log(np.array([0.3, 0.05, 0.15, 0.5]))
    for p, expect in [(0.3, [3]), (0.6, [0, 3]), (0.85, [0, 2, 3]), (0.99, [0, 1, 2, 3])]:
        kept = _finite(lab.apply_top_p(logits, p))
        assert kept == expect, (
            f"top_p={p} should keep {expect}: the most likely tokens until the running sum reaches p, "
            f"INCLUDING the token that crosses it; kept {kept}"
        )
    out = lab.apply_top_p(logits, 0.6)
    assert np.allclose(out[[0, 3]], logits[[0, 3]]), "kept logits must keep their values"
    assert np.array_equal(lab.apply_top_p(logits, 1.0), logits), "top_p=1.0 is disabled and must change nothing"
    half = _finite(lab.apply_top_p(np.log(np.array([0.4, 0.4, 0.2])), 0.5))
    assert half == [0, 1], f"p=0.5 over [0.4, 0.4, 0.2]: 0.4 < 0.5, so the second 0.4 is needed too; kept {half}"



def test_top_p_stops_at_the_token_that_reaches_p_exactly():
    # Logits log 2 and 0 give exp() values 1 and 0.5 exactly, so these probabilities are exact
    # dyadic numbers: [0.25, 0.5, 0.25] has running sums 0.5, 0.75, 1.0 with no rounding at all.
    # vLLM masks tokens whose ascending cumulative sum is <= 1 - p: when the running sum hits p
    # exactly, the token that reaches p is the last one kept.
    ln2 = float(np.log(2.0))
    one = _finite(lab.apply_top_p(np.array([0.0, ln2, 0.0]), 0.5))
    assert one == [1], (
        f"probabilities [0.25, 0.5, 0.25] with top_p=0.5: token 1 alone already reaches p, so keep only it "
        f"(stop at the first running sum >= p, not > p); kept {one}"
    )
    two = _finite(lab.apply_top_p(np.array([0.0, ln2, 0.0, 0.0, ln2, 0.0]), 0.5))
    assert two == [1, 4], (
        f"probabilities [.125, .25, .125, .125, .25, .125] with top_p=0.5: tokens 1 and 4 sum to exactly 0.5, "
        f"so keep exactly those two; kept {two}"
    )
    probs = lab.sampling_probs(np.array([0.0, ln2, 0.0, 0.0, ln2, 0.0]), 1.0, top_p=0.5)
    assert probs.tolist() == [0.0, 0.5, 0.0, 0.0, 0.5, 0.0], f"the renormalised nucleus must be [0, .5, 0, 0, .5, 0], got {probs}"

def test_temperature_sharpens_or_flattens():
    maxima = [lab.sampling_probs(LOGITS, t).max() for t in (0.25, 0.5, 1.0, 2.0, 4.0)]
    assert all(a > b for a, b in itertools.pairwise(maxima)), (
        f"the top token's probability must fall as temperature rises (divide logits BY T), got {maxima}"
    )
    for t in (0.5, 2.0):
        got = lab.sampling_probs(LOGITS, t)
        want = np.exp(LOGITS / t) / np.exp(LOGITS / t).sum()
        assert np.allclose(got, want), f"at T={t} with no top-k/top-p the probs must be softmax(logits / T), got {got}"
    greedy = lab.sampling_probs(LOGITS, 0.0)
    assert greedy.tolist() == [0, 0, 1, 0, 0, 0], f"T=0 is greedy: the distribution is one-hot on the argmax, got {greedy}"
    both = lab.sampling_probs(LOGITS, 1.0, top_k=3, top_p=0.7)
    assert np.flatnonzero(both > 0).tolist() == [2, 4] and np.isclose(both.sum(), 1.0), (
        f"top_k=3 then top_p=0.7 should leave tokens 2 and 4 (renormalised); got probs {both}"
    )


def test_seeded_sampling_is_reproducible():
    for seed in range(5):
        a = lab.sample(LOGITS, temperature=1.0, seed=seed)
        b = lab.sample(LOGITS, temperature=1.0, seed=seed)
        assert a == b, f"same logits + same seed must give the same token, got {a} then {b} for seed {seed}"
    draws = {lab.sample(LOGITS, temperature=2.0, seed=s) for s in range(40)}
    assert len(draws) >= 3, f"different seeds at T=2 should pick several different tokens, got only {draws}"
    for _ in range(3):
        tok = lab.sample(LOGITS, temperature=1.0, top_k=2, seed=None)
        assert tok in (2, 4), f"with top_k=2 only tokens 2 and 4 can ever be drawn, got {tok}"


CONFIGS = [  # (temperature, top_k, top_p, seed): 15 configurations
    (0.0, 0, 1.0, 0), (0.0, 5, 0.5, 7), (1.0, 0, 1.0, 0), (1.0, 0, 1.0, 1), (0.7, 0, 1.0, 3),
    (1.5, 0, 1.0, 4), (1.0, 50, 1.0, 5), (1.0, 5, 1.0, 6), (1.0, 0, 0.9, 7), (1.0, 0, 0.5, 8),
    (0.8, 40, 0.95, 9), (2.0, 10, 0.8, 10), (1.2, 3, 0.99, 11), (0.3, 0, 0.7, 12), (1.0, 256, 0.9, 13),
]


def test_agrees_with_mini_vllm_sampler():
    assert len(CONFIGS) == 15
    engine_sampler = mini_vllm.Sampler()
    model = mini_vllm.ToyModel(seed=0)
    rows = model.forward(np.array([104, 105, 32, 256 - 1]), np.array([0, 1, 2, 3]))  # 4 rows x 257 logits
    for temperature, top_k, top_p, seed in CONFIGS:
        params = mini_vllm.SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, seed=seed)
        for r, logits in enumerate(rows):
            want = engine_sampler.sample(logits, params)
            got = lab.sample(logits, temperature=temperature, top_k=top_k, top_p=top_p, seed=seed)
            assert got == want, (
                f"disagrees with mini_vllm.Sampler on row {r} for temperature={temperature}, top_k={top_k}, "
                f"top_p={top_p}, seed={seed}: lab drew {got}, engine drew {want}. Check the order "
                f"(temperature -> top-k -> top-p -> softmax), that top-p keeps the crossing token, and that "
                f"the draw is np.random.default_rng(seed).choice(vocab, p=probs)"
            )



def test_ties_in_the_nucleus_keep_the_lowest_indices():
    # Many tokens share a probability (logits 0..3 only), and the vocabulary is large enough (64)
    # that numpy's default argsort is not stable. When the cut falls inside a run of equal
    # probabilities, the stable order (ties in index order) decides which of them are kept.
    logits = np.random.default_rng(3).integers(0, 4, 64).astype(float)
    probs = np.exp(logits - logits.max())
    probs /= probs.sum()
    order = sorted(range(len(logits)), key=lambda i: (-probs[i], i))  # most likely first, ties by index
    cum = np.cumsum(probs[order])
    for p in (0.1, 0.23, 0.37, 0.5, 0.61, 0.77, 0.9):
        if np.min(np.abs(cum - p)) < 1e-9:
            continue  # stay off exact float boundaries
        want = sorted(order[: int(np.searchsorted(cum, p)) + 1])
        kept = _finite(lab.apply_top_p(logits, p))
        assert kept == want, (
            f"top_p={p} over 64 tokens with tied probabilities kept {kept}, expected {want}: sort with a "
            f"STABLE argsort of -probs (kind='stable') so equal probabilities keep index order"
        )


def test_greedy_rule_is_the_same_in_sampling_probs_and_sample():
    # One rule, two places: below SAMPLING_EPS both the distribution and the draw are greedy.
    tied = np.array([1.0, 3.0, 3.0, 0.0])
    for t in (0.0, 1e-6, lab.SAMPLING_EPS / 2):
        probs = lab.sampling_probs(tied, t)
        assert probs.tolist() == [0.0, 1.0, 0.0, 0.0], (
            f"sampling_probs at temperature {t} (below SAMPLING_EPS) must be one-hot on the lowest-index argmax "
            f"[0, 1, 0, 0], got {probs.tolist()}: use the same greedy test (temperature < SAMPLING_EPS) as sample()"
        )
        tok = lab.sample(tied, temperature=t, seed=0)
        assert tok == 1, f"sample at temperature {t} must be greedy (the lowest-index argmax, 1), got {tok}"


def test_temperature_exactly_sampling_eps_still_samples():
    # The boundary is strict, as upstream's `temperature < _SAMPLING_EPS` (vllm/v1/sample/sampler.py:292):
    # at exactly 1e-5 the draw is random. Two tied maxima then split the probability evenly.
    tied = np.array([1.0, 3.0, 3.0, 0.0])
    t = lab.SAMPLING_EPS
    probs = lab.sampling_probs(tied, t)
    assert np.allclose(probs, [0.0, 0.5, 0.5, 0.0]), (
        f"sampling_probs at temperature == SAMPLING_EPS ({t}) must sample, not go greedy: the two tied "
        f"maxima get 0.5 each, got {probs.tolist()}. Greedy is `temperature < SAMPLING_EPS`, strictly"
    )
    picks = {lab.sample(tied, temperature=t, seed=s) for s in range(20)}
    assert picks == {1, 2}, (
        f"sample at temperature == SAMPLING_EPS ({t}) over two tied maxima must draw both over seeds 0..19, "
        f"picked {sorted(picks)}: only temperature < SAMPLING_EPS is greedy"
    )


def test_an_unseeded_draw_uses_a_fresh_generator(monkeypatch):
    # seed=None means "no seed": np.random.default_rng(None) draws fresh entropy, so unseeded requests
    # explore. Defaulting the seed to a constant would make every unseeded request draw the same token.
    seen = []
    real = np.random.default_rng

    def spy(seed=None):
        seen.append(seed)
        return real(seed)

    monkeypatch.setattr(np.random, "default_rng", spy)
    lab.sample(LOGITS, temperature=1.0, seed=None)
    lab.sample(LOGITS, temperature=1.0, seed=123)
    assert seen == [None, 123], (
        f"sample must build np.random.default_rng(seed) with the seed it was given; calls saw seeds {seen} "
        f"for seed=None then seed=123 (a missing seed must stay None, not become a constant)"
    )
