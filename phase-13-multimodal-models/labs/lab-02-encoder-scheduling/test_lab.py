"""Lab 13-02 spec: the encoder rule for one chunk, and the step table it produces for several requests."""

import random

import pytest

from course.runtime import lab_module
from mini_vllm.multimodal import (
    EncoderCacheManager,
    MultiModalFeature,
    PlaceholderRange,
    try_schedule_encoder_inputs,
)
from mini_vllm.testing.mm_traces import MMArrival

lab = lab_module(__file__)   # solution.py by default; LAB_IMPL=starter grades starter.py

# text [0, 40) | image 0 [40, 140) | text [140, 160) | image 1 [160, 260) | text [260, 300)
TWO = [PlaceholderRange(40, 100), PlaceholderRange(160, 100)]


def test_pure_text_chunk_is_unconstrained():
    got = lab.plan_chunk(0, 30, TWO, set(), 0)
    assert got == (30, []), f"a chunk that touches no image is Phase 03's chunk, whatever the encoder budget: {got}"
    got = lab.plan_chunk(140, 20, TWO, set(), 0)
    assert got == (20, []), f"the text between two images needs no encoder either: {got}"
    assert lab.plan_chunk(260, 40, TWO, set(), 0) == (40, []), "the tail after the last image is plain text"


def test_image_starting_exactly_at_the_chunk_end_is_not_entered():
    got = lab.plan_chunk(0, 40, TWO, set(), 0)
    assert got == (40, []), f"chunk [0, 40) ends where image 0 starts: nothing to encode, nothing to cut ({got})"
    got = lab.plan_chunk(0, 40, TWO, set(), 100)
    assert got == (40, []), f"even with budget to spare, an image the chunk does not enter is not encoded yet ({got})"
    got = lab.plan_chunk(0, 41, TWO, set(), 0)
    assert got == (40, []), f"one position further and the image must be paid for: with no budget, cut to 40 ({got})"


def test_entering_an_image_schedules_its_encoder():
    got = lab.plan_chunk(0, 80, TWO, set(), 100)
    assert got == (80, [0]), (
        f"the chunk covers 40 of image 0's 100 positions, yet the whole image is encoded now: want (80, [0]), got {got}"
    )
    got = lab.plan_chunk(100, 20, TWO, set(), 100)
    assert got == (20, [0]), f"starting mid-image without a cached output re-encodes the image: {got}"


def test_unaffordable_image_truncates_the_chunk():
    got = lab.plan_chunk(0, 80, TWO, set(), 99)
    assert got == (40, []), f"budget 99 < 100: the chunk stops at image 0's doorstep (offset 40), no encode: {got}"
    got = lab.plan_chunk(20, 100, TWO, set(), 0)
    assert got == (20, []), f"from 20 computed the doorstep at 40 is 20 tokens away, not 40: {got}"
    got = lab.plan_chunk(60, 10, TWO, set(), 0)
    assert got == (0, []), f"already past the offset (a prefix-cache hit) with no output: 0 tokens, never negative: {got}"


def test_cached_image_costs_nothing():
    got = lab.plan_chunk(0, 300, TWO, {0, 1}, 0)
    assert got == (300, []), f"both outputs in the encoder cache: the whole prompt runs with zero budget: {got}"
    got = lab.plan_chunk(0, 300, TWO, {0}, 100)
    assert got == (300, [1]), f"image 0 is a hit, so the 100 of budget pays for image 1: {got}"


def test_continuation_mid_placeholder_needs_no_new_encode():
    got = lab.plan_chunk(80, 40, TWO, {0}, 0)
    assert got == (40, []), f"continuing inside image 0 reads its cached output: no budget needed ({got})"
    got = lab.plan_chunk(140, 20, TWO, set(), 0)
    assert got == (20, []), f"image 0 ends exactly at 140 = num_computed: it is in the KV cache, skip it ({got})"


def test_budget_splits_across_two_images():
    got = lab.plan_chunk(0, 300, TWO, set(), 150)
    assert got == (160, [0]), f"budget 150 pays for image 0 only; the chunk stops at image 1's doorstep (160): {got}"
    got = lab.plan_chunk(0, 300, TWO, set(), 200)
    assert got == (300, [0, 1]), f"budget exactly 200 = 100 + 100: one-step prefill with two encodes ({got})"
    got = lab.plan_chunk(0, 300, TWO, set(), 199)
    assert got == (160, [0]), f"one short of 200: image 1 waits ({got})"


def test_stops_at_the_first_unaffordable_image():
    small_after_big = [PlaceholderRange(10, 50), PlaceholderRange(70, 5)]
    got = lab.plan_chunk(0, 100, small_after_big, set(), 20)
    assert got == (10, []), (
        f"image 0 (50) does not fit budget 20; the chunk ends at 10 and the small image behind it is not looked at: {got}"
    )


def test_progress_is_always_possible():
    at_zero = [PlaceholderRange(0, 30)]
    assert lab.plan_chunk(0, 50, at_zero, set(), 0) == (0, []), "image at 0, zero budget: a 0-token chunk this step"
    computed, encodes, steps = 0, [], 0
    for _ in range(50):
        steps += 1
        n, enc = lab.plan_chunk(computed, min(16, 50 - computed), at_zero, {0} if encodes else set(), 30)
        encodes += enc
        computed += n
        if computed == 50:
            break
    else:
        pytest.fail(f"a 50-token prompt with an image at 0 did not finish in 50 steps (computed {computed})")
    assert (steps, encodes) == (4, [0]), f"budget resets each step: 16+16+16+2 tokens, one encode; got {steps} steps, {encodes}"


@pytest.mark.parametrize(
    "args,match",
    [
        ((-1, 10, TWO, set(), 0), "must be >= 0"),
        ((0, -1, TWO, set(), 0), "must be >= 0"),
        ((0, 10, TWO, set(), -5), "must be >= 0"),
        ((0, 10, [PlaceholderRange(50, 10), PlaceholderRange(10, 10)], set(), 0), "ordered and disjoint"),
        ((0, 10, [PlaceholderRange(10, 10), PlaceholderRange(15, 10)], set(), 0), "ordered and disjoint"),
    ],
)
def test_bad_input_is_refused(args, match):
    with pytest.raises(ValueError, match=match):
        lab.plan_chunk(*args)


@pytest.mark.parametrize(
    "args",
    [(-1, 0, TWO, set(), 0), (0, 0, TWO, set(), -5), (0, 0, [PlaceholderRange(10, 10), PlaceholderRange(15, 10)], set(), 0)],
    ids=["negative-computed", "negative-budget", "overlap"],
)
def test_an_empty_chunk_is_still_checked(args):
    try:
        got = lab.plan_chunk(*args)
    except ValueError:
        return
    pytest.fail(f"plan_chunk{args} returned {got}: num_new=0 does not make bad input valid; validate before the "
                "early return for an empty chunk")


def test_agrees_with_mini_vllm():
    rng = random.Random(1302)
    for case in range(400):
        ranges, pos = [], rng.randint(0, 10)
        for _ in range(rng.randint(0, 3)):
            ranges.append(PlaceholderRange(pos, rng.randint(1, 40)))
            pos += ranges[-1].length + rng.randint(0, 15)
        cached = {i for i in range(len(ranges)) if rng.random() < 0.3}
        computed, new, budget = rng.randint(0, 120), rng.randint(0, 80), rng.randint(0, 90)
        cache = EncoderCacheManager(10**6)
        for i in cached:
            cache.allocate("earlier", f"i{i}", ranges[i].length)
        feats = [MultiModalFeature(f"i{i}", r) for i, r in enumerate(ranges)]
        want = try_schedule_encoder_inputs("r", computed, new, feats, budget, cache)
        got = lab.plan_chunk(computed, new, ranges, cached, budget)
        assert got == (want.num_new_tokens, want.encoder_inputs), (
            f"case {case}: plan_chunk({computed}, {new}, {ranges}, {cached}, {budget}) = {got}, "
            f"mini_vllm.multimodal says {(want.num_new_tokens, want.encoder_inputs)}"
        )


def test_three_request_step_table():
    table = lab.doorstep_table(lab.three_requests(), 256, 100, plan=lab.plan_chunk)
    assert table == [{"A": (130, (0,)), "B": (10, ()), "C": (94, ())}, {"B": (90, (0,))}], (
        "step 0: A encodes imgA (80 of 100), B stops at its doorstep (20 left < 80), C hits imgA; step 1: B's image"
        f" — got {table}"
    )
    table = lab.doorstep_table(lab.three_requests(), 256, 160, plan=lab.plan_chunk)
    assert table == [{"A": (130, (0,)), "B": (100, (0,)), "C": (26, ())}, {"C": (68, ())}], (
        f"budget 160 pays for both images; the token budget (256 = 130 + 100 + 26) then binds C: {table}"
    )


def random_arrivals(rng):
    arrivals, base = [], 1000
    for k in range(rng.randint(1, 3)):
        n, feats, pos = rng.randint(20, 140), [], rng.randint(0, 20)
        picks = rng.sample(range(3), 2)  # one request never holds the same image twice
        while pos + 48 < n and len(feats) < 2:
            length = rng.choice([8, 20, 48])
            feats.append(MultiModalFeature(f"img{picks[len(feats)]}_{length}", PlaceholderRange(pos, length)))
            pos += length + rng.randint(0, 30)
        arrivals.append(MMArrival(f"r{k}", tuple(range(base, base + n)), tuple(feats)))
        base += n
    return arrivals


@pytest.mark.upstream
def test_step_tables_match_the_real_scheduler():
    from mini_vllm.testing.mm_traces import run_real

    want = [s.scheduled for s in run_real(lab.three_requests(), 256, 100, 10_000, enable_prefix_caching=True)]
    assert lab.doorstep_table(lab.three_requests(), 256, 100, plan=lab.plan_chunk) == want
    rng = random.Random(13)
    for case in range(12):
        arrivals = random_arrivals(rng)
        tb, eb = rng.choice([16, 40, 100]), rng.choice([48, 60, 100])
        want = [s.scheduled for s in run_real(arrivals, tb, eb, 10_000)]
        got = lab.doorstep_table(arrivals, tb, eb, plan=lab.plan_chunk)
        assert got == want, f"case {case} (token budget {tb}, encoder budget {eb}) {arrivals}: real {want}, yours {got}"
