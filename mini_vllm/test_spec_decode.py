"""mini_vllm.spec_decode: the n-gram drafter and the rejection sampler.

Unit tests pin upstream's rules one at a time (match length, tie-break, truncation, skips, the
greedy and random verify paths, the bonus token); properties check the two promises of
speculative decoding (greedy output unchanged, acceptance = Σ min(p, q)); the ``upstream`` tests
run the real ``NgramProposer`` and ``rejection_sample`` on the same inputs.
"""

from __future__ import annotations

import importlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mini_vllm.spec_decode import (
    PLACEHOLDER_TOKEN_ID,
    NgramProposer,
    acceptance_rate,
    find_longest_matched_ngram,
    find_longest_matched_ngram_by_scan,
    parse_output,
    rejection_sample,
    residual,
)

P = PLACEHOLDER_TOKEN_ID


def draft(tokens, k=3, lo=2, hi=4, max_model_len=64):
    return find_longest_matched_ngram(np.array(tokens), lo, hi, max_model_len, k).tolist()


# ------------------------------------------------------------------ NgramProposer: the match rule


def test_ngram_copies_what_followed_the_match():
    assert draft([1, 2, 3, 4, 5, 9, 9, 1, 2, 3]) == [4, 5, 9]


def test_ngram_match_may_overlap_the_suffix_and_is_cut_at_the_end():
    # [7, 8, 7] ends the sequence and occurs at 0; only 2 tokens follow it before the end
    assert draft([7, 8, 7, 8, 7]) == [8, 7]


def test_ngram_prefers_the_longest_match_over_a_later_shorter_one():
    # the 3-gram [1, 2, 3] matches at 0; the 2-gram [2, 3] also matches later at 5 (followed by 8)
    assert draft([1, 2, 3, 7, 0, 2, 3, 8, 1, 2, 3], lo=2, hi=3) == [7, 0, 2]
    assert draft([1, 2, 3, 7, 0, 2, 3, 8, 1, 2, 3], lo=2, hi=2) == [7, 0, 2], "ties: the earliest occurrence"


def test_ngram_tie_break_is_the_earliest_occurrence_not_the_latest():
    tokens = [5, 6, 1, 5, 6, 2, 5, 6]  # [5, 6] occurs at 0 (→ 1) and at 3 (→ 2)
    assert draft(tokens, k=1, lo=2, hi=2) == [1]


def test_ngram_caps_the_match_length_at_prompt_lookup_max():
    tokens = [1, 2, 3, 4, 9, 2, 3, 4, 8, 1, 2, 3, 4]
    assert draft(tokens, k=2, lo=1, hi=4) == [9, 2], "4-gram [1,2,3,4] at 0"
    assert draft(tokens, k=2, lo=1, hi=3) == [9, 2], "3-gram [2,3,4]: earliest at 1, followed by 9"


def test_ngram_no_match_below_prompt_lookup_min():
    assert draft([1, 2, 3, 4, 5, 6, 1, 2, 9], lo=2, hi=4) == []
    assert draft([1, 2, 3, 4, 5, 6, 1, 2, 9], lo=1, hi=4) == [], "9 never occurred before"
    assert draft([3], lo=1, hi=1) == [], "a single token has nothing before it"
    assert draft([4, 4], lo=1, hi=1) == [4]


def test_ngram_never_drafts_past_max_model_len():
    tokens = [1, 2, 3, 4, 5, 6, 1, 2]
    assert draft(tokens, k=4, max_model_len=10) == [3, 4]
    assert draft(tokens, k=4, max_model_len=8) == []


def test_ngram_k_varies():
    tokens = [1, 2, 3, 4, 5, 6, 1, 2]
    assert [draft(tokens, k=k) for k in (1, 2, 5)] == [[3], [3, 4], [3, 4, 5, 6, 1]]


def test_propose_skips_requests_that_sampled_nothing_or_are_full():
    proposer = NgramProposer(num_speculative_tokens=2, prompt_lookup_min=1, prompt_lookup_max=2, max_model_len=6)
    tokens = np.array([[1, 2, 1, 0, 0, 0], [1, 2, 1, 0, 0, 0], [1, 2, 1, 2, 1, 2]])
    got = proposer.propose([[1], [], [2]], np.array([3, 3, 6]), tokens)
    assert got == [[2, 1], [], []]


def test_ngram_config_defaults_and_errors():
    assert (NgramProposer(3).min_n, NgramProposer(3).max_n) == (5, 5)
    assert (NgramProposer(3, prompt_lookup_max=4).min_n, NgramProposer(3, prompt_lookup_min=2).max_n) == (4, 2)
    with pytest.raises(ValueError, match="prompt_lookup_min=4 must be <= prompt_lookup_max=2"):
        NgramProposer(3, 4, 2)
    with pytest.raises(ValueError, match="num_speculative_tokens must be >= 1"):
        NgramProposer(0, 1, 2)
    with pytest.raises(TypeError, match="prompt_lookup_min must be an int"):
        NgramProposer(3, 1.5, 2)
    with pytest.raises(ValueError, match="prompt_lookup_min=4 must be <= prompt_lookup_max=3"):
        NgramProposer(3, 4, 3)  # min one above max: the boundary of the order check
    with pytest.raises(TypeError, match="num_speculative_tokens must be an int"):
        NgramProposer(True, 1, 2)  # bool is an int subclass: refuse it explicitly
    proposer = NgramProposer(3, 1, 2, max_model_len=8)
    with pytest.raises(ValueError, match="one row of token_ids_cpu"):
        proposer.propose([[1], [1]], np.array([2]), np.zeros((2, 8), dtype=np.int32))
    with pytest.raises(ValueError, match="exceeds its row"):
        proposer.propose([[1]], np.array([9]), np.zeros((1, 8), dtype=np.int32))


# ------------------------------------------------------------------ rejection_sample


def one_hot_logits(tokens, vocab=16, high=10.0):
    logits = np.full((len(tokens), vocab), -high)
    logits[np.arange(len(tokens)), tokens] = high
    return logits


def greedy(draft_ids, counts, target_ids, bonus):
    return rejection_sample(
        np.array(draft_ids), counts, None, one_hot_logits(target_ids), np.array(bonus),
        np.ones(len(counts), dtype=bool), rng=np.random.default_rng(0),
    )


def test_greedy_accepts_the_matching_prefix_then_corrects():
    out = greedy([3, 5, 7, 1, 2], [3, 2], [3, 5, 9, 1, 2], [11, 13])
    assert out.tolist() == [[3, 5, 9, P], [1, 2, 13, P]], "rows are max_spec_len + 1 wide, padded with the placeholder"
    assert parse_output(out, vocab_size=32) == [[3, 5, 9], [1, 2, 13]]


def test_greedy_first_draft_wrong_emits_one_token_and_no_bonus():
    out = greedy([4, 5], [2], [3, 5], [7])
    assert out.tolist() == [[3, P, P]], "a mismatch at position 0 ends the row even if position 1 would match"


def test_request_without_drafts_emits_only_its_bonus_token():
    out = greedy([1, 2], [0, 2, 0], [1, 2], [5, 6, 7])
    assert out.tolist() == [[5, P, P], [1, 2, 6], [7, P, P]]


def test_random_path_identical_distributions_always_accept():
    rng = np.random.default_rng(0)
    p = rng.dirichlet(np.ones(6), size=50)
    drafts = np.array([rng.choice(6, p=row) for row in p])
    out = rejection_sample(drafts, [1] * 50, p, np.log(p), np.full(50, 9), np.zeros(50, bool), rng=rng)
    assert (out[:, 0] == drafts).all() and (out[:, 1] == 9).all()


def test_random_path_disjoint_distributions_never_accept():
    p = np.array([0.5, 0.5, 0.0, 0.0])
    q = np.array([0.0, 0.0, 0.5, 0.5])
    with np.errstate(divide="ignore"):
        logits = np.log(np.tile(p, (40, 1)))
    out = rejection_sample(np.full(40, 2), [1] * 40, np.tile(q, (40, 1)), logits, np.full(40, 3),
                           np.zeros(40, bool), rng=np.random.default_rng(1))
    assert set(out[:, 0].tolist()) <= {0, 1} and (out[:, 1] == P).all()


def test_random_path_accepts_exactly_when_ratio_reaches_the_uniform():
    p, q = np.array([0.2, 0.8]), np.array([0.4, 0.6])  # p/q at token 0 is exactly 0.5
    args = (np.array([0]), [1], q[None], np.log(p)[None], np.array([1]), np.zeros(1, bool))
    noise = np.ones((1, 2))
    assert rejection_sample(*args, uniform_probs=np.array([0.5]), exponentials=noise).tolist() == [[0, 1]], "p/q == u accepts"
    assert rejection_sample(*args, uniform_probs=np.array([0.5000001]), exponentials=noise).tolist() == [[1, P]]


def test_zero_draft_probability_rejects_instead_of_dividing_by_zero():
    p, q = np.array([0.5, 0.5]), np.array([0.0, 1.0])
    out = rejection_sample(np.array([0]), [1], q[None], np.log(p)[None], np.array([1]), np.zeros(1, bool),
                           uniform_probs=np.array([0.0]), exponentials=np.ones((1, 2)))
    assert out.tolist() == [[0, P]], "q(x) = 0 rejects; the recovered token comes from max(p - q, 0) = [0.5, 0]"


def test_no_draft_probs_means_one_hot_q():
    p = np.array([0.1, 0.6, 0.3])
    out = rejection_sample(np.array([1, 1]), [1, 1], None, np.log(np.tile(p, (2, 1))), np.array([2, 2]),
                           np.zeros(2, bool), uniform_probs=np.array([0.6, 0.61]), exponentials=np.ones((2, 3)))
    assert out[0].tolist() == [1, 2], "n-gram drafts: accept when p(x) >= u"
    assert out[1, 0] != 1 and out[1, 1] == P, "the recovered token never repeats the rejected draft"


def test_residual_and_acceptance_rate():
    p, q = np.array([0.5, 0.3, 0.2]), np.array([0.2, 0.3, 0.5])
    assert residual(p, q).tolist() == pytest.approx([0.3, 0.0, 0.0])
    assert acceptance_rate(p, q) == pytest.approx(0.7)
    assert acceptance_rate(p, p) == pytest.approx(1.0)


def test_mixed_batch_takes_each_requests_own_path():
    # request 0 greedy (draft 1, argmax 0: rejected, emits 0); request 1 random, n-gram q (one-hot), u = 0 accepts
    logits = np.log(np.array([[0.6, 0.3, 0.1], [0.6, 0.3, 0.1]]))
    out = rejection_sample(np.array([1, 1]), [1, 1], None, logits, np.array([2, 2]), np.array([True, False]),
                           uniform_probs=np.zeros(2), exponentials=np.ones((2, 3)))
    assert out.tolist() == [[0, P], [1, 2]], "is_greedy is per request: a mixed batch verifies each row on its own path"


def test_recovered_token_is_the_exponential_race():
    # q puts everything on the draft 2; p = [0.4, 0.4, 0.2]; u = 0.5 > 0.2 rejects; residual [0.4, 0.4, 0]
    q = np.array([[0.0, 0.0, 1.0]])
    logits = np.log(np.array([[0.4, 0.4, 0.2]]))
    out = rejection_sample(np.array([2]), [1], q, logits, np.array([1]), np.array([False]),
                           uniform_probs=np.array([0.5]), exponentials=np.array([[1.0, 0.25, 1.0]]))
    assert out.tolist() == [[1, P]], "recovered = argmax(residual / E): 0.4 / 0.25 beats 0.4 / 1 (divide, not multiply)"


def test_random_path_survives_huge_logits():
    # p = softmax([1000, 999]) = [0.731, 0.269]: a softmax without the max shift overflows to inf / inf = NaN
    out = rejection_sample(np.array([0]), [1], None, np.array([[1000.0, 999.0]]), np.array([1]), np.array([False]),
                           uniform_probs=np.array([0.7]), exponentials=np.ones((1, 2)))
    assert out.tolist() == [[0, 1]], "p(0) = 0.731 >= u = 0.7 accepts: subtract the row max before exp"


def test_parse_output_drops_placeholders_and_out_of_vocab_ids():
    rows = np.array([[3, 7, P], [P, P, P], [4, 1, 2]])
    assert parse_output(rows, vocab_size=5) == [[3], [], [4, 1, 2]], (
        "keep ids that are not the placeholder and lie below vocab_size, as upstream's parse_output does"
    )


def test_rejection_sample_errors():
    ok = dict(draft_token_ids=np.array([1]), num_draft_tokens=[1], draft_probs=None,
              target_logits=np.zeros((1, 4)), bonus_token_ids=np.array([0]), is_greedy=np.ones(1, bool))
    rng = np.random.default_rng(0)
    with pytest.raises(ValueError, match="sum to len"):
        rejection_sample(**{**ok, "num_draft_tokens": [2]}, rng=rng)
    with pytest.raises(ValueError, match="target_logits must be"):
        rejection_sample(**{**ok, "target_logits": np.zeros((2, 4))}, rng=rng)
    with pytest.raises(ValueError, match="draft token ids must lie"):
        rejection_sample(**{**ok, "draft_token_ids": np.array([4])}, rng=rng)
    with pytest.raises(ValueError, match="draft_probs must have the shape"):
        rejection_sample(**{**ok, "draft_probs": np.ones((1, 3))}, rng=rng)
    with pytest.raises(ValueError, match="one entry per request"):
        rejection_sample(**{**ok, "bonus_token_ids": np.array([0, 1])}, rng=rng)
    with pytest.raises(ValueError, match="pass rng"):
        rejection_sample(**ok)


# ------------------------------------------------------------------ properties


def target_logits_fn(vocab: int, seed: int):
    """A deterministic toy target: logits depend on the last two tokens (a trigram table)."""
    table = np.random.default_rng(seed).normal(size=(vocab, vocab, vocab))
    return lambda ctx: table[ctx[-2] if len(ctx) > 1 else 0, ctx[-1]]


def generate(prompt, num_tokens, logits_fn, proposer=None, max_steps=200):
    """Greedy generation; with a proposer, each step verifies its drafts in one rejection_sample call."""
    tokens, steps = list(prompt), 0
    while len(tokens) - len(prompt) < num_tokens:
        steps += 1
        assert steps <= max_steps, "generation made no progress: a step must emit at least one token"
        drafts = []
        if proposer is not None:
            drafts = proposer.propose([[tokens[-1]]], np.array([len(tokens)]), np.array([tokens]))[0]
        rows = [logits_fn(tokens + drafts[:i]) for i in range(len(drafts))]
        bonus = int(np.argmax(logits_fn(tokens + drafts)))
        out = rejection_sample(np.array(drafts, dtype=np.int64), [len(drafts)],
                               None, np.array(rows).reshape(len(drafts), -1) if rows else np.zeros((0, 1)),
                               np.array([bonus]), np.ones(1, bool), rng=np.random.default_rng(0))
        tokens += parse_output(out, vocab_size=10**9)[0]
    return tokens[len(prompt):][:num_tokens], steps


@settings(max_examples=20, deadline=None, derandomize=True)
@given(
    prompt=st.lists(st.integers(0, 3), min_size=2, max_size=12),
    k=st.integers(1, 5), lo=st.integers(1, 3), extra=st.integers(0, 2), seed=st.integers(0, 3),
)
def test_greedy_output_identical_with_and_without_speculation(prompt, k, lo, extra, seed):
    logits_fn = target_logits_fn(4, seed)
    base, base_steps = generate(prompt, 24, logits_fn)
    spec, spec_steps = generate(prompt, 24, logits_fn, NgramProposer(k, lo, lo + extra, max_model_len=256))
    assert spec == base
    assert spec_steps <= base_steps


def test_speculation_saves_steps_on_repetitive_text():
    logits_fn = target_logits_fn(4, 0)
    base, base_steps = generate([0, 1], 40, logits_fn)
    spec, spec_steps = generate([0, 1], 40, logits_fn, NgramProposer(4, 1, 3, max_model_len=256))
    assert spec == base and base_steps == 40
    assert spec_steps < 20, f"a trigram target falls into a cycle the n-gram drafter predicts; got {spec_steps} steps"


@settings(max_examples=8, deadline=None, derandomize=True)
@given(vocab=st.integers(2, 6), seed=st.integers(0, 10_000), concentration=st.sampled_from([0.3, 1.0, 5.0]))
def test_acceptance_is_the_overlap_and_output_is_the_target(vocab, seed, concentration):
    rng = np.random.default_rng(seed)
    p, q = rng.dirichlet(np.full(vocab, concentration), size=2)
    q = np.maximum(q, 1e-3) / np.maximum(q, 1e-3).sum()
    n = 2000
    drafts = rng.choice(vocab, size=n, p=q)
    with np.errstate(divide="ignore"):
        logits = np.tile(np.log(p), (n, 1))
    out = rejection_sample(drafts, [1] * n, np.tile(q, (n, 1)), logits, np.full(n, vocab), np.zeros(n, bool), rng=rng)
    accepted = out[:, 1] == vocab  # the bonus slot is filled only when the draft was accepted
    alpha = acceptance_rate(p, q)
    sigma = np.sqrt(alpha * (1 - alpha) / n) + 1e-9
    assert abs(accepted.mean() - alpha) < 5 * sigma + 1e-3
    hist = np.bincount(out[:, 0], minlength=vocab) / n
    assert np.abs(hist - p).max() < 5 * np.sqrt(0.25 / n), "rejection sampling must return exactly the target distribution"


# ------------------------------------------------------------------ differential: the real classes


@pytest.fixture(scope="module")
def real():
    return importlib.import_module("mini_vllm.testing.real_spec_decode")


@pytest.mark.upstream
@pytest.mark.slow  # upstream's numba kernel compiles on its first call: about 7 s on one idle core
@pytest.mark.filterwarnings("ignore::numba.core.errors.NumbaPendingDeprecationWarning")
def test_ngram_proposer_matches_vllm(real):
    rng = np.random.default_rng(0)
    for k, lo, hi in ((3, 2, 4), (5, 1, 3), (2, 3, 3)):
        theirs = real.make_ngram_proposer(k, lo, hi, max_model_len=40)
        ours = NgramProposer(k, lo, hi, max_model_len=40)
        for _ in range(60):
            tokens = rng.integers(0, rng.integers(2, 5), size=(4, 40)).astype(np.int32)
            counts = rng.integers(1, 41, size=4).astype(np.int32)
            sampled = [[1], [1], [], [1]]
            assert ours.propose(sampled, counts, tokens) == theirs.propose(sampled, counts, tokens), (k, lo, hi, counts, tokens)


# Each case runs vLLM's Triton kernels under the interpreter (about 0.4 s); the mixed batch with draft
# probabilities exercises both paths and stays in the default run, the rest are marked slow.
SLOW = pytest.mark.slow


@pytest.mark.upstream
@pytest.mark.parametrize(("temperatures", "with_draft_probs"), [
    ([0.0, 0.7, 0.0, 1.3, 1.0, 0.0], True),
    pytest.param([0.0, 0.7, 0.0, 1.3, 1.0, 0.0], False, marks=SLOW),
    pytest.param([0.0] * 6, True, marks=SLOW),
    pytest.param([0.0] * 6, False, marks=SLOW),
    pytest.param([1.0] * 6, True, marks=SLOW),
    pytest.param([1.0] * 6, False, marks=SLOW),
])
def test_rejection_sample_matches_vllm(real, temperatures, with_draft_probs):
    rng = np.random.default_rng(7)
    counts, vocab = [3, 0, 2, 4, 1, 3], 8
    n, batch = sum(counts), len(counts)
    drafts = rng.integers(0, vocab, n)
    drafts[:2] = np.argmax(rng.normal(size=(2, vocab)), axis=1)
    logits = rng.normal(size=(n, vocab)) * 2
    logits[0, drafts[0]] += 8  # make a few greedy drafts right, so accept, reject and bonus all occur
    logits[1, drafts[1]] += 8
    scale = np.repeat([t if t > 0 else 1.0 for t in temperatures], counts)[:, None]
    logits = logits / scale
    probs = rng.dirichlet(np.ones(vocab), size=n) if with_draft_probs else None
    bonus = rng.integers(0, vocab, batch)
    theirs = real.rejection_sample(drafts, counts, probs, logits, bonus, temperatures, seed=3)
    uniforms, noise = real.torch_randomness(3, n, batch, vocab)
    ours = rejection_sample(drafts, counts, probs, logits, bonus, np.array(temperatures) == 0,
                            uniform_probs=uniforms, exponentials=noise)
    assert ours.tolist() == theirs.tolist()


@pytest.mark.parametrize("seed", range(4))
def test_one_pass_search_drafts_what_the_per_n_scan_drafts(seed):
    """Random and repetitive sequences, every prefix: the one-pass search must draft exactly what
    one sliding-window scan per n drafts."""
    rng = np.random.default_rng(seed)
    period = rng.integers(0, 4, int(rng.integers(2, 9)))
    sequences = [
        rng.integers(0, 3 + 5 * seed, 60),  # random, from a small vocabulary so n-grams repeat
        np.resize(period, 70),  # periodic
        np.concatenate([np.resize(period, 30), rng.integers(0, 4, 10), np.resize(period, 30)]),
    ]
    for tokens in sequences:
        for total in range(0, len(tokens) + 1):
            for lo, hi, k, max_len in ((1, 1, 3, 200), (2, 5, 4, 200), (3, 4, 2, total + 1), (1, 7, 5, 200)):
                args = (tokens[:total], lo, hi, max_len, k)
                got = find_longest_matched_ngram(*args).tolist()
                want = find_longest_matched_ngram_by_scan(*args).tolist()
                assert got == want, f"{tokens[:total].tolist()} n in [{lo}, {hi}] k={k}: drafted {got}, want {want}"
