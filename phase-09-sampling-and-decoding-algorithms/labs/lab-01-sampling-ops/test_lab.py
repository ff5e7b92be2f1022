"""Lab 09-01: each sampling stage alone, their order, the edge cases, and agreement with mini_vllm."""

import numpy as np
import pytest

from course.runtime import lab_module
from mini_vllm import Sampler, SamplingParams

lab = lab_module(__file__)  # solution.py by default; LAB_IMPL=starter grades starter.py

DYADIC = np.log(np.array([[0.125, 0.5, 0.125, 0.25]]))  # probabilities whose partial sums are exact


def kept(x):
    return np.isfinite(x).tolist()


def test_temperature_divides_random_rows_and_leaves_greedy_rows():
    x = np.array([[2.0, -4.0], [2.0, -4.0], [2.0, -4.0]])
    out = lab.apply_temperature(x, np.array([0.5, 2.0, 0.0]))
    np.testing.assert_array_equal(
        out, [[4.0, -8.0], [1.0, -2.0], [2.0, -4.0]], "T=0 rows must stay as they are"
    )
    assert np.isfinite(out).all(), "a greedy row (T=0) must not be divided by zero"
    np.testing.assert_array_equal(x, [[2.0, -4.0]] * 3, "the input must not be edited")


def test_top_k_keeps_k_and_every_tie_at_the_cut():
    x = np.array([[0.1, 2.0, 1.0, 3.0], [3.0, 1.0, 1.0, 1.0]])
    assert kept(lab.apply_top_k(x, np.array([2, 2]))) == [
        [False, True, False, True],
        [True, True, True, True],
    ], "row 1: k=2 over [3, 1, 1, 1] keeps all four - vLLM masks only logits *below* the k-th largest"
    for k in (0, -1, 4, 9):
        assert kept(lab.apply_top_k(x, np.array([k, k]))) == [[True] * 4] * 2, f"top_k={k} means off"


def test_top_p_keeps_the_crossing_token_and_stops_at_an_exact_hit():
    assert kept(lab.apply_top_p(DYADIC, np.array([0.75]))) == [[False, True, False, True]], (
        "0.5 + 0.25 reaches p=0.75 exactly: keep those two and nothing more"
    )
    assert kept(lab.apply_top_p(DYADIC, np.array([0.76]))) == [[True, True, False, True]], (
        "p=0.76 is crossed by the third token: it stays, and of the tied 0.125s the lowest id goes first"
    )
    assert kept(lab.apply_top_p(DYADIC, np.array([0.1]))) == [[False, True, False, False]], (
        "at least one survives"
    )
    assert kept(lab.apply_top_p(DYADIC, np.array([1.0]))) == [[True] * 4], "p=1 means off"


def test_top_p_counts_a_full_size_vocabulary_in_float64():
    # a Llama-3-size vocabulary: the cumulative sum runs over 128,256 probabilities, and a float32 running sum
    # drifts by ~1e-5 by the tail, enough to move the cut at p = 0.99 by several tokens
    rng = np.random.default_rng(0)
    logits = rng.standard_normal((1, 128_256)) * 2
    probs = np.exp(logits - logits.max())
    probs /= probs.sum()
    cum = np.cumsum(np.sort(probs[0])[::-1])  # float64, most probable first
    want = int((cum < 0.99).sum()) + 1
    got = int(np.isfinite(lab.apply_top_p(logits, np.array([0.99]))).sum())
    assert got == want, (
        f"top_p=0.99 over 128,256 tokens kept {got}, the float64 prefix that reaches 0.99 holds {want}: "
        f"accumulate the sorted probabilities in float64 (the logits are float64), not float32"
    )


def test_min_p_is_relative_to_the_top_probability():
    x = np.log(np.array([[0.5, 0.3, 0.15, 0.05]] * 3))
    got = kept(lab.apply_min_p(x, np.array([0.5, 0.0, 1.0])))
    assert got[0] == [True, True, False, False], "min_p 0.5 at top 0.5: the threshold is 0.25"
    assert got[1] == [True] * 4, "min_p 0 means off"
    assert got[2] == [True, False, False, False], "min_p 1 keeps the top token only"


def test_penalties_values_and_order():
    x = np.array([[2.0, -2.0, 1.0, 1.0, 1.0]])
    out = lab.apply_penalties(x, [[0]], [[1, 2, 2]], np.array([0.5]), np.array([0.25]), np.array([2.0]))
    want = [1.0, -4.75, -0.5, 1.0, 1.0]
    assert out[0].tolist() == want, (
        f"want {want}: repetition 2 halves the positive prompt logit and doubles the negative output one, "
        "then frequency x count and presence once for output ids only"
    )
    out = lab.apply_penalties(x, [[3]], [[]], np.array([1.0]), np.array([1.0]), np.array([1.0]))
    assert out[0].tolist() == x[0].tolist(), "presence and frequency read the output, never the prompt"


@pytest.mark.parametrize("knob", ["presence", "frequency", "repetition"])
def test_each_penalty_alone(knob):
    x = np.array([[1.0, -1.0, 0.0]])
    vals = {"presence": [0.0], "frequency": [0.0], "repetition": [1.0]}
    vals[knob] = [1.5]
    out = lab.apply_penalties(
        x, [[]], [[0, 1, 1, 2]], *(np.array(vals[k]) for k in ("presence", "frequency", "repetition"))
    )
    want = {
        "presence": [-0.5, -2.5, -1.5],
        "frequency": [-0.5, -4.0, -1.5],
        "repetition": [1 / 1.5, -1.5, 0.0],
    }
    np.testing.assert_allclose(out[0], want[knob], err_msg=f"{knob} penalty 1.5 alone")


def test_extreme_logits_stay_finite():
    x = np.array([[-800.0, -801.0, -900.0], [1e4, 0.0, -1e4]])
    assert kept(lab.apply_top_p(x, np.array([0.9, 0.9]))) == [[True, True, False], [True, False, False]], (
        "subtract the row max before exp: logits far below zero are not all-zero probabilities"
    )
    assert kept(lab.apply_min_p(x, np.array([0.2, 0.2]))) == [[True, True, False], [True, False, False]]
    assert lab.sample(x, [SamplingParams(seed=0)] * 2, [None, None]) in ([0, 0], [1, 0])


def _broken_stage():
    """The first stage that is wrong on its own (small known cases), or None: an order failure is
    only the order's fault when every stage it chains is right by itself."""
    x = np.log([[0.5, 0.3, 0.2]])
    checks = {
        "apply_temperature": lambda: np.allclose(lab.apply_temperature(x, np.array([2.0])), x / 2),
        "apply_penalties": lambda: lab.apply_penalties(
            np.array([[1.0, 0.0]]), [[0]], [[]], np.zeros(1), np.zeros(1), np.array([2.0])
        )[0, 0] == 0.5,
        "apply_min_p": lambda: kept(lab.apply_min_p(x, np.array([0.5]))) == [[True, True, False]],
        "apply_top_k": lambda: kept(lab.apply_top_k(x, np.array([2]))) == [[True, True, False]],
        "apply_top_p": lambda: kept(lab.apply_top_p(x, np.array([0.6]))) == [[True, True, False]]
        and kept(lab.apply_top_p(x, np.array([0.5]))) == [[True, False, False]],
    }
    for name, check in checks.items():
        try:
            if not check():
                return name
        except Exception:  # noqa: BLE001 - a stage that raises is a broken stage
            return name
    return None


def _order_message(order_claim):
    broken = _broken_stage()
    if broken:
        return f"{broken} is wrong on its own (its own test says how): fix it first; the order may be fine"
    return order_claim


def test_pipeline_order_is_vllms():
    # logit bias before repetition: (1 + 1) / 2 = 1, not 1/2 + 1
    sp = SamplingParams(temperature=0, logit_bias={0: 1.0}, repetition_penalty=2.0)
    assert lab.process(np.array([[1.0, 0.0]]), [sp], [[0]], [[]])[0, 0] == 1.0, _order_message(
        "logit bias comes before penalties"
    )
    # temperature before min-p: T=10 flattens [.5,.3,.2] so min_p=.5 keeps all three
    sp = SamplingParams(temperature=10.0, min_p=0.5)
    assert kept(lab.process(np.log([[0.5, 0.3, 0.2]]), [sp], [[]], [[]])) == [[True] * 3], _order_message(
        "temperature before min-p"
    )
    # min-p before top-p: min_p .75 leaves {0,1} at [.5,.5]; top_p .5 then keeps token 0 only
    sp = SamplingParams(min_p=0.75, top_p=0.5)
    row = np.log([[0.25, 0.25, 0.125, 0.125, 0.125, 0.125]])
    assert kept(lab.process(row, [sp], [[]], [[]])) == [[True] + [False] * 5], _order_message("min-p before top-p")
    # top-k before top-p: k=2 leaves [.5,.3] -> [.625,.375]; top_p .6 keeps token 0 only
    sp = SamplingParams(top_k=2, top_p=0.6)
    assert kept(lab.process(np.log([[0.5, 0.3, 0.2]]), [sp], [[]], [[]])) == [[True, False, False]], (
        _order_message("top-k before top-p (top-p first would keep tokens 0 and 1)")
    )


def test_greedy_rows_stop_after_the_penalties():
    x = np.array([[3.0, 2.9, 0.0], [3.0, 2.9, 0.0]])
    params = [
        SamplingParams(temperature=0, presence_penalty=0.5, min_p=1.0, top_k=1),
        SamplingParams(temperature=0),
    ]
    assert lab.sample(x, params, [None, None], [[0], []], [[], []]) == [1, 0], (
        "a greedy row's argmax sees penalties but not min-p or top-k"
    )
    g = np.random.default_rng(0)
    state = g.bit_generator.state
    lab.sample(x, params, [g, g])
    assert g.bit_generator.state == state, "greedy rows must not consume randomness"


def test_min_tokens_masks_stop_ids_and_eos_unless_ignore_eos():
    x = np.zeros((3, 4))
    params = [
        SamplingParams(temperature=0, min_tokens=2, stop_token_ids=[3]),
        SamplingParams(temperature=0, min_tokens=2, stop_token_ids=[3], ignore_eos=True),
        SamplingParams(temperature=0, min_tokens=2, stop_token_ids=[3]),
    ]
    out = lab.process(x, params, [[], [], [0, 0]], [[], [], []], eos_token_id=1)
    assert kept(out) == [[True, False, True, False], [True, True, True, False], [True] * 4], (
        "before min_tokens outputs mask the stop ids and EOS; ignore_eos=True leaves EOS alone; "
        "from min_tokens outputs on nothing is masked"
    )


def test_every_parameter_agrees_with_mini_vllm():
    rng = np.random.default_rng(0)
    vocab = 24
    for trial in range(40):
        params, outs, prompts = [], [], []
        for _ in range(4):
            params.append(
                SamplingParams(
                    temperature=float(rng.choice([0.0, 0.5, 1.0, 1.7])),
                    top_k=int(rng.choice([0, 1, 3, 10])),
                    top_p=float(rng.choice([1.0, 0.9, 0.5])),
                    min_p=float(rng.choice([0.0, 0.05, 0.3])),
                    presence_penalty=float(rng.choice([0.0, 0.7])),
                    frequency_penalty=float(rng.choice([0.0, -0.4])),
                    repetition_penalty=float(rng.choice([1.0, 1.3, 0.8])),
                    logit_bias={int(rng.integers(vocab)): 2.0} if rng.random() < 0.3 else None,
                    bad_words_token_ids=[[int(rng.integers(vocab))]] if rng.random() < 0.3 else [],
                    min_tokens=int(rng.choice([0, 2])),
                    stop_token_ids=[5],
                    max_tokens=4,
                    allowed_token_ids=range(0, vocab, 2) if rng.random() < 0.2 else None,
                )
            )
            outs.append(rng.integers(0, vocab, int(rng.integers(0, 4))).tolist())
            prompts.append(rng.integers(0, vocab, 3).tolist())
        x = rng.normal(0, 2, (4, vocab))
        want = Sampler(eos_token_id=1).sample_batch(
            x, params, [np.random.default_rng(trial + i) for i in range(4)], outs, prompts
        )
        got = lab.sample(x, params, [np.random.default_rng(trial + i) for i in range(4)], outs, prompts, 1)
        assert got == want, f"trial {trial}: your pipeline drew {got}, mini_vllm's Sampler {want} ({params})"


def test_a_row_without_a_generator_draws_from_its_seed():
    x = np.zeros((1, 64))  # flat: the token is floor(64 u), so every seed pins one token
    for seed in (0, 3, 7, 11):
        sp = SamplingParams(temperature=1.0, seed=seed)
        want = Sampler().sample_batch(x, [sp], [np.random.default_rng(seed)])
        got = [lab.sample(x, [sp], [None])[0] for _ in range(3)]
        assert got == want * 3, (
            f"seed {seed} with no generator drew {got}; np.random.default_rng({seed}) gives {want[0]} every "
            "time: a row whose generator is None draws from a fresh default_rng(params.seed), not an unseeded one"
        )


class FixedDraw(np.random.Generator):
    """A generator whose uniform draw the test chooses."""

    def __init__(self, u):
        super().__init__(np.random.PCG64(0))
        self.u = u

    def random(self, *args, **kwargs):
        return self.u


@pytest.mark.parametrize(("u", "want"), [(0.0, 0), (0.25, 2), (0.4999999, 2), (0.5, 3), (0.75, 4)])
def test_a_draw_exactly_on_a_cumulative_probability_picks_the_next_token(u, want):
    # cumulative probabilities 0.25, 0.25, 0.5, 0.75, 1 exactly (token 1 is banned): u = 0.25 is
    # past token 0 and can never pick the zero-probability token 1
    x = np.array([[0.0, -np.inf, 0.0, 0.0, 0.0]])
    got = lab.sample(x, [SamplingParams(temperature=1.0)], [FixedDraw(u)])
    assert got == [want], (
        f"draw u = {u}: got token {got}, want [{want}]: the token is the first whose cumulative "
        "probability is strictly above u (count the cumulative probabilities <= u, not < u)"
    )
