"""The sampler's processing stages (Phase 09): each knob alone, the order between them, the
errors, and batch invariance with every knob on. ``test_sampler.py`` holds the draw itself."""

import numpy as np
import pytest

from mini_vllm import Sampler, SamplingParams
from mini_vllm.sampler import (
    Logprobs,
    apply_min_p,
    apply_penalties,
    apply_top_k_top_p,
    log_softmax,
    token_counts,
)


def processed(row, sp, outputs=(), prompt=(), sampler=None):
    x = np.array([row], dtype=np.float64)
    return (sampler or Sampler()).apply_logits_processors(x, [sp], [list(outputs)], [list(prompt)])[0]


def draws(row, sp, n=60, outputs=()):
    return {
        Sampler().sample_batch(np.array([row]), [sp], [np.random.default_rng(i)], [list(outputs)])[0]
        for i in range(n)
    }


def test_allowed_token_ids_ban_every_other_id():
    out = processed([1.0, 2.0, 3.0, 4.0], SamplingParams(allowed_token_ids=[0, 2]))
    assert np.isneginf(out).tolist() == [False, True, False, True]


def test_bad_words_ban_the_last_id_only_after_their_prefix():
    sp = SamplingParams(bad_words_token_ids=[[3], [1, 2]])
    assert np.isneginf(processed([0.0] * 4, sp)).tolist() == [False, False, False, True]
    assert np.isneginf(processed([0.0] * 4, sp, outputs=[0, 1])).tolist() == [False, False, True, True]
    assert not np.isneginf(processed([0.0] * 4, sp, outputs=[1, 0]))[2], "prefix must end the output"
    assert not np.isneginf(processed([0.0] * 4, sp, prompt=[1]))[2], "only the output counts, not the prompt"


def test_min_tokens_hides_stop_ids_and_eos_until_reached():
    sp = SamplingParams(min_tokens=2, stop_token_ids=[1], max_tokens=4)
    s = Sampler(eos_token_id=3)
    assert np.isneginf(processed([0.0] * 4, sp, outputs=[0], sampler=s)).tolist() == [
        False,
        True,
        False,
        True,
    ]
    assert not np.isneginf(processed([0.0] * 4, sp, outputs=[0, 0], sampler=s)).any()
    keep_eos = SamplingParams(min_tokens=2, stop_token_ids=[1], ignore_eos=True)
    assert np.isneginf(processed([0.0] * 4, keep_eos, sampler=s)).tolist() == [False, True, False, False]


def test_logit_bias_adds_per_id_and_steers_greedy():
    out = processed([0.0, 1.0, 2.0], SamplingParams(logit_bias={0: 5.0, 2: -1.0}))
    np.testing.assert_array_equal(out, [5.0, 1.0, 1.0])
    assert (
        Sampler().sample(np.array([0.0, 1.0, 2.0]), SamplingParams(temperature=0, logit_bias={0: 5.0})) == 0
    )


def test_penalties_follow_the_openai_and_ctrl_definitions():
    row = np.array([[2.0, -2.0, 1.0, 1.0, 1.0]])
    rep = apply_penalties(
        row.copy(),
        token_counts([[0]], 5) > 0,
        token_counts([[1]], 5),
        np.zeros(1),
        np.zeros(1),
        np.array([2.0]),
    )
    np.testing.assert_array_equal(rep, [[1.0, -4.0, 1.0, 1.0, 1.0]])  # divide a positive, multiply a negative
    fp = apply_penalties(
        row.copy(),
        np.zeros((1, 5), bool),
        token_counts([[2, 2, 3]], 5),
        np.array([1.0]),
        np.array([0.5]),
        np.ones(1),
    )
    np.testing.assert_array_equal(fp, [[2.0, -2.0, -1.0, -0.5, 1.0]])  # 1 - 2*0.5 - 1; 1 - 0.5 - 1


def test_logit_bias_comes_before_the_repetition_penalty():
    # 1 + bias 1 = 2, then / 2 = 1.0. Penalty first would give 0.5 + 1 = 1.5.
    out = processed([1.0, 0.0], SamplingParams(logit_bias={0: 1.0}, repetition_penalty=2.0), outputs=[0])
    assert out[0] == 1.0


def test_min_p_is_relative_to_the_top_probability():
    x = np.log(np.array([[0.5, 0.3, 0.15, 0.05]]))
    assert np.isneginf(apply_min_p(x.copy(), np.array([0.5]))).tolist() == [[False, False, True, True]]
    assert not np.isneginf(apply_min_p(x.copy(), np.array([0.0]))).any()
    assert np.isneginf(apply_min_p(x.copy(), np.array([1.0]))).tolist() == [[False, True, True, True]]


def test_min_p_runs_after_temperature_and_before_top_p():
    # T=10 flattens [.5,.3,.2]; min_p=.5 then keeps all three (before T it would drop token 2).
    assert draws(np.log([0.5, 0.3, 0.2]), SamplingParams(temperature=10.0, min_p=0.5), n=80) == {0, 1, 2}
    # min_p .75 keeps {0,1} at [.5,.5]; top_p .5 then stops at the exact hit: token 0 only.
    # Top-p first would keep {0,1} (cumulative .25 + .25 reaches .5).
    row = np.log([0.25, 0.25, 0.125, 0.125, 0.125, 0.125])
    assert draws(row, SamplingParams(min_p=0.75, top_p=0.5)) == {0}


def test_greedy_rows_see_penalties_but_not_min_p_or_temperature():
    row = np.array([3.0, 2.9, 0.0])
    assert Sampler().sample_batch(
        row[None], [SamplingParams(temperature=0, presence_penalty=0.5)], [None], [[0]]
    ) == [1]
    assert Sampler().sample(row, SamplingParams(temperature=0, min_p=1.0)) == 0


def test_logprobs_are_raw_with_the_sampled_token_first():
    row = np.log(np.array([0.5, 0.25, 0.125, 0.125]))
    sp = SamplingParams(temperature=0, logprobs=2, logit_bias={3: 10.0})
    out = Sampler().forward(row[None], [sp, SamplingParams()][:1], [None])
    lp = out.logprobs[0]
    assert out.sampled_token_ids == [3]
    assert lp.token_ids == (3, 0, 1), "sampled first, then the two most likely of the raw logits"
    np.testing.assert_allclose(lp.logprobs, np.log([0.125, 0.5, 0.25]))
    assert lp.rank == 4, "0.125 is tied for last: the tie takes the worst rank"
    assert Sampler().forward(row[None], [SamplingParams()], [None]).logprobs == [None]
    assert isinstance(lp, Logprobs)
    np.testing.assert_allclose(log_softmax(np.array([[0.0, -np.inf]])), [[0.0, -np.inf]])


class Halve:
    def __init__(self, invariant):
        self.invariant, self.calls = invariant, []

    def apply(self, logits):
        self.calls.append(logits.copy())
        return logits / 2

    def is_argmax_invariant(self):
        return self.invariant


def test_custom_processors_run_where_their_kind_says():
    before, after = Halve(False), Halve(True)
    s = Sampler(logits_processors=[before, after])
    s.sample_batch(
        np.array([[4.0, 0.0], [4.0, 0.0]]),
        [SamplingParams(temperature=0), SamplingParams(temperature=2.0)],
        [None, None],
    )
    np.testing.assert_array_equal(before.calls[0], [[4.0, 0.0], [4.0, 0.0]])
    # random rows only, after the first processor's halving and then temperature 2
    np.testing.assert_array_equal(after.calls[0], [[1.0, 0.0]])


@pytest.mark.parametrize("seed", range(3))
def test_a_seeded_row_does_not_depend_on_its_companions(seed):
    rng = np.random.default_rng(seed)
    vocab = 30
    mine = SamplingParams(
        temperature=0.8,
        top_k=10,
        top_p=0.9,
        min_p=0.05,
        presence_penalty=0.5,
        frequency_penalty=0.2,
        repetition_penalty=1.2,
        logit_bias={3: 2.0},
        seed=seed,
    )
    row, hist = rng.normal(size=vocab), rng.integers(0, vocab, 6).tolist()
    alone = [
        Sampler().sample_batch(row[None], [mine], [g], [hist])[0]
        for g in [np.random.default_rng(seed)]
        for _ in range(5)
    ]
    others = [SamplingParams(temperature=t, top_k=k) for t, k in [(0, 0), (1.5, 3), (0.7, 0)]]
    g = np.random.default_rng(seed)
    batched = []
    for step in range(5):
        batch = np.vstack([rng.normal(size=(3, vocab)), row])
        gens = [None, np.random.default_rng(step), np.random.default_rng(99), g]
        batched.append(Sampler().sample_batch(batch, [*others, mine], gens, [[], [1], [2, 2], hist])[3])
    assert batched == alone


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(min_p=-0.1),
        dict(min_p=1.5),
        dict(min_p=float("nan")),
        dict(presence_penalty=2.5),
        dict(frequency_penalty=-3.0),
        dict(repetition_penalty=0.0),
        dict(repetition_penalty=float("inf")),
        dict(min_tokens=-1),
        dict(min_tokens=20, max_tokens=10),
        dict(logprobs=-1),
        dict(logit_bias={-1: 1.0}),
        dict(logit_bias={1: float("nan")}),
        dict(allowed_token_ids=[]),
        dict(allowed_token_ids=[-2]),
        dict(bad_words_token_ids=[[]]),
        dict(bad_words_token_ids=[[1, -1]]),
    ],
)
def test_new_knobs_reject_bad_values(kwargs):
    with pytest.raises(ValueError):
        SamplingParams(**kwargs)


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(min_p="0.1"),
        dict(repetition_penalty=True),
        dict(min_tokens=1.0),
        dict(logprobs=1.5),
        dict(logit_bias=[1]),
        dict(allowed_token_ids="ab"),
        dict(bad_words_token_ids=["ab"]),
    ],
)
def test_new_knobs_reject_bad_types(kwargs):
    with pytest.raises(TypeError):
        SamplingParams(**kwargs)


def test_logit_bias_is_stored_hashable_sorted_and_clamped():
    sp = SamplingParams(logit_bias={5: 1.0, 2: -1, 7: 1e4, 8: -250.0})
    assert sp.logit_bias == ((2, -1.0), (5, 1.0), (7, 100.0), (8, -100.0)), "biases clamp to [-100, 100]"
    hash(sp)


def test_sampler_errors_name_the_problem():
    row = np.zeros((1, 4))
    with pytest.raises(ValueError, match="every token is banned"):
        Sampler().sample_batch(
            row, [SamplingParams(allowed_token_ids=[1], bad_words_token_ids=[[1]])], [None]
        )
    with pytest.raises(ValueError, match="outside the vocab"):
        Sampler().sample_batch(row, [SamplingParams(logit_bias={9: 1.0})], [None])
    with pytest.raises(ValueError, match="rows"):
        Sampler().sample_batch(row, [SamplingParams()], [None], [[], []])
    with pytest.raises(ValueError, match="token ids in"):
        Sampler().sample_batch(row, [SamplingParams()], [None], [[7]])
    with pytest.raises(ValueError, match="eos_token_id"):
        Sampler(eos_token_id=-1)
    with pytest.raises(TypeError, match="logits processor"):
        Sampler(logits_processors=[object()])


def test_top_k_on_rows_mostly_masked_selects_among_the_finite_logits():
    x = np.full((2, 4000), -np.inf)
    x[0, [5, 9, 700, 3000]] = [1.0, 3.0, 2.0, 0.5]
    x[1, [1, 2]] = [0.0, 1.0]
    e = apply_top_k_top_p(x, np.array([2, 3]), np.ones(2))
    assert np.flatnonzero(e[0]).tolist() == [9, 700], "k=2 among four finite logits keeps the two largest"
    assert np.flatnonzero(e[1]).tolist() == [1, 2], "k=3 with two finite logits cuts nothing"
    sp = [SamplingParams(top_k=2, seed=0), SamplingParams(top_k=3, seed=0)]
    for _ in range(5):
        got = Sampler().sample_batch(x, sp, [None, None])
        assert got[0] in (9, 700) and got[1] in (1, 2)
