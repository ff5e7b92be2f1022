"""Lab 09-03: beam search on a garden path, EOS handling, the length penalty, and exhaustive width."""

import itertools
import math

import numpy as np
import pytest

from course.runtime import lab_module

lab = lab_module(__file__)  # solution.py by default; LAB_IMPL=starter grades starter.py

EOS = 0


@pytest.fixture
def garden():
    return lab.bigram_model(lab.GARDEN_PATH, 6)


def random_model(seed, vocab=4):
    rng = np.random.default_rng(seed)
    table = {}
    for prev in range(vocab):
        p = rng.dirichlet(np.ones(vocab) * 0.7)
        table[prev] = {t: float(x) for t, x in enumerate(p) if x > 0}
    return lab.bigram_model(table, vocab)


def test_score_follows_vllm():
    assert lab.beam_score([5, 6, 2], -3.0, eos_token_id=2) == -1.5, "a final EOS is not counted: -3 / 2"
    assert lab.beam_score([5, 6, 7], -3.0, eos_token_id=2) == -1.0, "the prompt tokens are counted: -3 / 3"
    assert lab.beam_score([5, 6, 2], -3.0, 2, length_penalty=0.0) == -3.0, (
        "length_penalty 0 ranks by raw logprob"
    )
    assert lab.beam_score([5, 6, 7, 8], -4.0, 2, length_penalty=2.0) == -0.25, "-4 / 4**2"


def test_greedy_takes_the_garden_path(garden):
    g = lab.greedy(garden, [1], 4, EOS)
    assert list(g.tokens) == [1, 2, 4, 0], (
        "greedy takes 'a' (0.6), then 4 (0.35, lowest id of a tie), then EOS"
    )
    assert math.isclose(math.exp(g.cum_logprob), 0.6 * 0.35), "greedy's sequence has probability 0.21"


def test_beam_escapes_the_trap(garden):
    best = lab.beam_search(garden, [1], 2, 4, EOS)[0]
    assert list(best.tokens) == [1, 3, 0], (
        f"width 2 must find 'b' then EOS (p = 0.36 > greedy's 0.21), got {list(best.tokens)}"
    )
    assert math.isclose(best.cum_logprob, math.log(0.36))


def test_beam_width_one_is_greedy(garden):
    assert lab.beam_search(garden, [1], 1, 4, EOS)[0] == lab.greedy(garden, [1], 4, EOS)
    for seed in range(6):
        model = random_model(seed)
        beam = lab.beam_search(model, [1], 1, 5, EOS, ignore_eos=True)[0]
        g = lab.greedy(model, [1], 5, eos_token_id=-1)  # greedy that never stops early
        assert beam.tokens == g.tokens, f"model {seed}: one live beam must follow the argmax path"


def test_wider_beams_never_score_worse(garden):
    scores = [
        lab.beam_score(b.tokens, b.cum_logprob, EOS)
        for b in (lab.beam_search(garden, [1], w, 4, EOS)[0] for w in (1, 2, 3, 4))
    ]
    assert scores == sorted(scores), f"on the garden path widths 1..4 score {scores}"


def exhaustive(model, prompt, max_tokens, length_penalty):
    """Every sequence beam search could return: ended by EOS at any step, or max_tokens long."""
    best = -math.inf
    for n in range(1, max_tokens + 1):
        for tail in itertools.product(range(4), repeat=n):
            if EOS in tail[:-1] or (n < max_tokens and tail[-1] != EOS):
                continue
            tokens, cum = list(prompt), 0.0
            for t in tail:
                cum += float(model(tokens)[t])
                tokens.append(t)
            if np.isfinite(cum):
                best = max(best, lab.beam_score(tokens, cum, EOS, length_penalty))
    return best


@pytest.mark.parametrize("length_penalty", [0.0, 1.0, 2.0])
def test_full_width_beam_is_exhaustive(length_penalty):
    for seed in range(3):
        model = random_model(seed)
        best = lab.beam_search(model, [1], 64, 3, EOS, length_penalty)[0]
        got = lab.beam_score(best.tokens, best.cum_logprob, EOS, length_penalty)
        assert math.isclose(got, exhaustive(model, [1], 3, length_penalty)), (
            f"model {seed}, length_penalty {length_penalty}: a beam as wide as the tree must find the best sequence"
        )


def test_eos_finishes_a_beam(garden):
    out = lab.beam_search(garden, [1], 4, 4, EOS)
    assert all(b.tokens[-1] == EOS for b in out), "every hypothesis here ends in EOS within 3 tokens"
    assert all(EOS not in b.tokens[1:-1] for b in out), "a finished beam is never extended past its EOS"
    assert [1, 2, 0] in [list(b.tokens) for b in out], (
        "an EOS candidate is kept even when it was not the best"
    )
    never = lab.beam_search(garden, [1], 2, 4, EOS, ignore_eos=True)
    assert all(len(b.tokens) == 5 for b in never), "with ignore_eos every beam runs to max_tokens"


def test_length_penalty_changes_the_winner():
    # one path: EOS at once (p .3); the other: three likely tokens then EOS (p .5 * .8 * .8 * .8 = .256)
    table = {
        1: {0: 0.3, 2: 0.5, 3: 0.2},
        2: {4: 0.8, 0: 0.2},
        4: {5: 0.8, 0: 0.2},
        5: {0: 0.8, 5: 0.2},
        3: {0: 1.0},
        0: {0: 1.0},
    }
    model = lab.bigram_model(table, 6)
    raw = lab.beam_search(model, [1], 2, 5, EOS, length_penalty=0.0)[0]
    norm = lab.beam_search(model, [1], 2, 5, EOS, length_penalty=1.0)[0]
    assert list(raw.tokens) == [1, 0], "ranked by raw probability the short answer wins (.3 > .256)"
    assert list(norm.tokens) == [1, 2, 4, 5, 0], (
        "divided by length (log .3 / 1 < log .256 / 4), the long confident answer wins"
    )


def test_equal_scores_keep_the_earlier_candidate_first():
    uniform = lab.bigram_model({t: {u: 0.25 for u in range(4)} for t in range(4)}, 4)
    got = [b.tokens for b in lab.beam_search(uniform, [1], 2, 1, eos_token_id=99)]
    assert got == [(1, 0), (1, 1)], (
        f"four equal candidates gave {got}: rank with a stable sort (sorted(..., reverse=True), as vLLM), "
        "so on a tie the candidate proposed first (the lower id) stays first, in every step and the final ranking"
    )


def test_bad_arguments_are_refused(garden):
    for width, steps in ((0, 4), (2, 0)):
        with pytest.raises(ValueError, match="beam_width and max_tokens"):
            lab.beam_search(garden, [1], width, steps, EOS)
    with pytest.raises(ValueError, match="prompt"):
        lab.beam_search(garden, [], 2, 4, EOS)


def test_each_beam_proposes_twice_the_width():
    # EOS is the most likely first token (.5); "2" (.45) leads surely to "3" then EOS.
    model = lab.bigram_model({1: {0: 0.5, 2: 0.45, 3: 0.05}, 2: {3: 1.0}, 3: {0: 1.0}, 0: {0: 1.0}}, 4)
    best = lab.beam_search(model, [1], 1, 4, EOS)[0]
    assert list(best.tokens) == [1, 2, 3, 0], (
        "with width 1 each beam proposes 2 candidates: EOS is set aside as finished and '2' lives on; "
        f"ranked by length-normalised score [1, 2, 3, 0] wins, got {list(best.tokens)}"
    )


def test_a_finished_beam_never_takes_a_live_slot():
    # EOS first (.6) outscores "2" (.3) in step 1 (log .6 = -.51 > log .3 / 2 = -.60), but "2" leads
    # surely to "3" then EOS: [1, 2, 3, 0] scores log .3 / 3 = -.40 and wins in the end.
    model = lab.bigram_model({1: {0: 0.6, 2: 0.3, 3: 0.1}, 2: {3: 1.0}, 3: {0: 1.0}, 0: {0: 1.0}}, 4)
    got = [list(b.tokens) for b in lab.beam_search(model, [1], 1, 4, EOS)]
    assert got == [[1, 2, 3, 0]], (
        f"width 1 returned {got}: set the EOS candidates aside first, then keep the beam_width best of the "
        "others; a finished [1, 0] that outscores every live candidate must not use up the one live slot"
    )


@pytest.mark.upstream
def test_score_matches_vllm_get_beam_search_score():
    from vllm.entrypoints.generate.beam_search.utils import get_beam_search_score

    rng = np.random.default_rng(0)
    for _ in range(20):
        tokens = rng.integers(0, 5, int(rng.integers(1, 8))).tolist()
        cum, lp = float(-rng.random() * 10), float(rng.choice([0.0, 0.5, 1.0, 2.0]))
        if tokens == [EOS]:
            continue  # a bare EOS has length 0: both divide by zero
        want = get_beam_search_score(tokens, cum, EOS, lp)
        assert math.isclose(lab.beam_score(tokens, cum, EOS, lp), want), (
            f"{tokens}, {cum}, {lp}: vLLM gives {want}"
        )
