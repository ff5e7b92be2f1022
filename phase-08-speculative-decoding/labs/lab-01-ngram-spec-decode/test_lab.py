"""Lab 08-01: the n-gram drafter agrees with vLLM's rule, the verifier is lossless, and the counts are honest."""

import numpy as np
import pytest

from course.runtime import lab_module
from mini_vllm.spec_decode import find_longest_matched_ngram, rejection_sample

lab = lab_module(__file__)   # solution.py by default; LAB_IMPL=starter grades starter.py

BUDGET = 2_000  # target calls any test may make: a loop that stops advancing fails instead of hanging


class Budgeted:
    """Wraps a target and fails once it has been called more than ``BUDGET`` times."""

    def __init__(self, target):
        self.target, self.calls = target, 0

    def __call__(self, context):
        self.calls += 1
        if self.calls > BUDGET:
            raise AssertionError(
                f"more than {BUDGET} target calls: does every cycle of run_speculative emit at least one token "
                f"(the correction/bonus), and does the loop stop once num_tokens are generated?"
            )
        return self.target(list(context))


def periodic(period=7, noise_every=0):
    return Budgeted(lab.periodic_target(period, noise_every))


PROMPT = [0, 1, 2, 3, 4, 5, 6]


def adversarial_target():
    """Always answers something other than what the n-gram rule would guess: every draft is rejected."""
    def target(context):
        guess = find_longest_matched_ngram(np.array(context), 1, 3, 10**6, 1)
        return int(guess[0]) + 1 if len(guess) else len(context) % 3
    return Budgeted(target)


# ------------------------------------------------------------------ the drafter


@pytest.mark.parametrize(
    "context, k, min_n, max_n, expected, why",
    [
        ([1, 2, 3, 4, 5, 9, 9, 1, 2, 3], 3, 2, 4, [4, 5, 9], "copy the k tokens that followed the earlier [1, 2, 3]"),
        ([7, 8, 7, 8, 7], 3, 2, 4, [8, 7], "the match may overlap the tail; fewer than k tokens follow it"),
        ([5, 6, 1, 5, 6, 2, 5, 6], 1, 2, 2, [1], "two earlier [5, 6]: vLLM takes the earliest, not the latest"),
        ([1, 2, 3, 7, 0, 2, 3, 8, 1, 2, 3], 3, 2, 3, [7, 0, 2], "the longest n wins over a later, shorter match"),
        ([1, 2, 3, 4, 9, 2, 3, 4, 8, 1, 2, 3, 4], 2, 1, 3, [9, 2], "n is capped at max_n: [2, 3, 4] earliest at 1"),
        ([1, 2, 3, 4, 5, 6, 1, 2, 9], 3, 1, 4, [], "the last token never occurred before: no draft"),
        ([4, 4], 2, 1, 1, [4], "smallest case: [4] at 0 is followed by 4"),
        ([3], 2, 1, 1, [], "a single token has nothing before it"),
        ([1, 2, 1, 2], 2, 3, 3, [], "no 3-gram repeats, and min_n forbids shorter ones"),
    ],
)
def test_ngram_propose_follows_vllms_rule(context, k, min_n, max_n, expected, why):
    got = lab.ngram_propose(list(context), k, min_n, max_n)
    assert list(got) == expected, f"ngram_propose({context}, k={k}, min_n={min_n}, max_n={max_n}) = {got}, want {expected}: {why}"


def test_ngram_propose_agrees_with_mini_vllm():
    rng = np.random.default_rng(0)
    for trial in range(300):
        vocab = int(rng.integers(2, 5))
        context = rng.integers(0, vocab, size=int(rng.integers(1, 30))).tolist()
        k, min_n = int(rng.integers(1, 6)), int(rng.integers(1, 4))
        max_n = min_n + int(rng.integers(0, 3))
        want = find_longest_matched_ngram(np.array(context), min_n, max_n, 10**6, k).tolist()
        got = list(lab.ngram_propose(context, k, min_n, max_n))
        assert got == want, (
            f"trial {trial}: ngram_propose({context}, k={k}, min_n={min_n}, max_n={max_n}) = {got}, but "
            f"mini_vllm.spec_decode (vLLM's rule) drafts {want}: longest n first, earliest occurrence, "
            f"an occurrence must end before the last token"
        )


def test_ngram_propose_rejects_bad_arguments():
    for kwargs in ({"k": 0}, {"k": 2, "min_n": 0}, {"k": 2, "min_n": 3, "max_n": 2}):
        with pytest.raises(ValueError):
            lab.ngram_propose([1, 2, 1], **{"min_n": 1, "max_n": 2, **kwargs})


# ------------------------------------------------------------------ the verifier


def test_verify_all_accepted_earns_a_bonus_token():
    target = periodic()
    context = PROMPT + [0, 1]
    emitted, accepted = lab.verify_greedy(context, [2, 3, 4], target)
    assert (emitted, accepted) == ([2, 3, 4, 5], 3), (
        f"all 3 proposals match, so the cycle emits them plus the target's bonus token: got {emitted}, {accepted}"
    )


def test_verify_first_mismatch_stops_and_corrects():
    target = periodic()
    context = PROMPT + [0, 1]
    assert lab.verify_greedy(context, [2, 9, 4], target) == ([2, 3], 1), "accept 2, replace 9 with the target's 3, stop"
    assert lab.verify_greedy(context, [9, 3, 4], target) == ([2], 0), "a wrong first guess still yields one token"
    assert lab.verify_greedy(context, [], target) == ([2], 0), "no proposal: the cycle is one plain decode step"


def test_verify_checks_against_the_growing_context():
    # the target's answer depends on the context length, so comparing every proposal with
    # target(context) (the original context) gets position 1 wrong
    target = Budgeted(lambda ctx: len(ctx))
    assert lab.verify_greedy([5, 5], [2, 3, 4], target) == ([2, 3, 4, 5], 3), (
        "proposal i must be compared with target(context + accepted[:i]), not with target(context)"
    )


def test_verify_agrees_with_the_rejection_samplers_greedy_path():
    rng = np.random.default_rng(1)
    vocab = 6
    for _ in range(100):
        table = rng.integers(0, vocab, size=(vocab, vocab))
        target = Budgeted(lambda ctx, table=table: int(table[ctx[-2], ctx[-1]]))
        context = rng.integers(0, vocab, size=4).tolist()
        proposed = rng.integers(0, vocab, size=int(rng.integers(0, 5))).tolist()
        # make the first guesses right half the time
        for i in range(len(proposed)):
            if rng.random() < 0.6:
                proposed[i] = target(context + proposed[:i])
        logits = np.full((len(proposed), vocab), -5.0)
        for i in range(len(proposed)):
            logits[i, target(context + proposed[:i])] = 5.0
        bonus = target(context + proposed)
        row = rejection_sample(np.array(proposed, dtype=np.int64), [len(proposed)], None,
                               logits.reshape(len(proposed), vocab), np.array([bonus]), np.ones(1, bool),
                               rng=np.random.default_rng(0))[0]
        want = [int(t) for t in row if t >= 0]
        emitted, accepted = lab.verify_greedy(context, proposed, target)
        assert emitted == want and accepted == len(want) - 1, (
            f"context {context}, proposals {proposed}: verify_greedy gave {emitted}, mini_vllm's rejection sampler "
            f"(vLLM's greedy path) emits {want}"
        )


# ------------------------------------------------------------------ the loop


@pytest.mark.parametrize("k", [1, 3, 8])
@pytest.mark.parametrize("make_target", [periodic, lambda: periodic(7, 11), lambda: periodic(5, 4), adversarial_target])
def test_output_is_identical_to_the_baseline(make_target, k):
    baseline = lab.run_baseline(PROMPT, make_target(), 50)
    tokens, stats = lab.run_speculative(PROMPT, make_target(), 50, k=k)
    assert len(tokens) == 50, f"run_speculative must return exactly num_tokens=50 tokens (trim the last cycle), got {len(tokens)}"
    assert tokens == baseline, f"k={k}: speculative output differs from plain greedy decoding at index " \
        f"{next(i for i, (a, b) in enumerate(zip(tokens, baseline)) if a != b)}"


def test_periodic_text_takes_few_runs():
    tokens, stats = lab.run_speculative(PROMPT, periodic(), 64, k=4)
    assert stats.runs <= 16, f"a 7-periodic text is fully guessable: 64 tokens at up to 5 per run, got {stats.runs} runs"
    assert stats.accepted == stats.proposed > 0, f"every guess on a clean period is right: {stats}"
    per_run = (stats.accepted + stats.runs) / stats.runs
    assert per_run > 4, f"tokens per run should approach k + 1 = 5, got {per_run:.2f}: is the bonus token appended?"
    assert stats.accepted + stats.runs >= 64, f"each run emits accepted + 1 tokens; the counts must cover the 64 tokens: {stats}"


def test_k_caps_the_tokens_per_run():
    for k in (1, 2, 6):
        _, stats = lab.run_speculative(PROMPT, periodic(), 60, k=k)
        assert stats.proposed <= k * stats.runs and stats.accepted <= k * stats.runs, f"k={k}: at most k drafts per run: {stats}"
        assert stats.runs >= -(-60 // (k + 1)), f"k={k}: no run can emit more than k + 1 tokens, got {stats.runs} runs for 60"


def test_fresh_text_gets_no_speedup():
    tokens, stats = lab.run_speculative(PROMPT, Budgeted(lab.fresh_target()), 40, k=4)
    assert stats.runs == 40 and stats.accepted == 0, f"nothing repeats: one run per token, like the baseline; got {stats}"


def test_wrong_guesses_cost_runs_not_correctness():
    _, stats = lab.run_speculative(PROMPT, adversarial_target(), 40, k=4)
    assert stats.proposed > 0 and stats.accepted == 0, f"the adversarial target rejects every draft: {stats}"
    assert stats.runs == 40, f"worst case is baseline speed (one token per run), never a stall: got {stats.runs} runs"


@pytest.mark.parametrize(
    "min_n, max_n, runs, proposed",
    [(1, 3, 16, 44), (1, 6, 15, 40), (2, 2, 19, 36), (3, 5, 21, 28), (8, 9, 34, 12)],
)
def test_min_and_max_n_are_passed_to_the_drafter(min_n, max_n, runs, proposed):
    # 40 tokens of a 7-periodic text with a fresh token every 11th position, k = 4
    _, stats = lab.run_speculative(PROMPT, periodic(7, 11), 40, k=4, min_n=min_n, max_n=max_n)
    assert (stats.runs, stats.proposed) == (runs, proposed), (
        f"min_n={min_n}, max_n={max_n}: want {runs} runs and {proposed} proposed drafts, got {stats}: "
        f"pass k, min_n and max_n through to ngram_propose"
    )


def test_zero_tokens_and_bad_arguments():
    assert lab.run_speculative(PROMPT, periodic(), 0) == ([], lab.SpecStats(0, 0, 0))
    assert lab.run_baseline(PROMPT, periodic(), 0) == []
    with pytest.raises(ValueError):
        lab.run_speculative([], periodic(), 5)
    with pytest.raises(ValueError):
        lab.run_speculative(PROMPT, periodic(), -1)
    with pytest.raises(ValueError):
        lab.run_baseline([], periodic(), 5)
