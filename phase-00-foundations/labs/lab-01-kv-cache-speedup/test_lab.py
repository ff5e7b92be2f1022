import pytest

from course.runtime import lab_module

lab = lab_module(__file__)   # solution.py by default; LAB_IMPL=starter grades starter.py


PROMPT = [11, 22, 33, 44, 55]  # P = 5


class RecordingMeter(lab.KVWork):
    """A work meter that also remembers which positions were computed, in order."""

    def __init__(self):
        super().__init__()
        self.positions = []

    def compute_kv(self, tok, pos):
        self.positions.append(pos)
        return super().compute_kv(tok, pos)


def test_both_produce_identical_tokens():
    for prompt, n_new in [(PROMPT, 10), ([7], 25), (list(range(40)), 17)]:
        a, _ = lab.generate_no_cache(prompt, n_new)
        b, _ = lab.generate_with_cache(prompt, n_new)
        assert len(a) == len(prompt) + n_new, (
            f"generate_no_cache must return prompt + {n_new} new tokens "
            f"({len(prompt) + n_new} in all), got {len(a)}"
        )
        assert a[: len(prompt)] == prompt, "the returned sequence must start with the prompt, unchanged"
        assert b == a, (
            f"cached and uncached generation disagree for P={len(prompt)}, n_new={n_new}: "
            f"a cache may change how much is recomputed, never which tokens come out. "
            f"Pass the FULL token list to next_token in both versions.\n  no cache: {a}\n  cached:   {b}"
        )


def test_every_token_is_predicted_from_the_full_context():
    # Agreement between the two generators is not enough: both could make the same mistake.
    # Check each generated token against next_token() of everything before it.
    for fn in (lab.generate_no_cache, lab.generate_with_cache):
        toks, _ = fn(PROMPT, 6)
        for k in range(len(PROMPT), len(toks)):
            want = lab.next_token(toks[:k])
            assert toks[k] == want, (
                f"{fn.__name__}: token at position {k} should be next_token(all {k} tokens before it) = {want}, "
                f"got {toks[k]}. The model sees the WHOLE sequence every step; the cache only saves "
                f"recomputing K/V, it never shortens what next_token is given"
            )


def test_no_cache_is_quadratic():
    _, work = lab.generate_no_cache(PROMPT, 10)
    assert work == 95, (
        f"no-cache work for P=5, n_new=10 should be 5+6+...+14 = 95, got {work}: before each new "
        f"token, compute K/V for every token currently in the sequence (step i sees P+i tokens)"
    )
    for p, n in [(1, 1), (3, 7), (12, 30)]:
        _, work = lab.generate_no_cache(list(range(p)), n)
        expected = sum(range(p, p + n))
        assert work == expected, (
            f"no-cache work for P={p}, n_new={n} should be sum(P .. P+n_new-1) = {expected}, got {work}"
        )


def test_cached_is_linear():
    _, work = lab.generate_with_cache(PROMPT, 10)
    assert work == 14, (
        f"cached work for P=5, n_new=10 should be 5 (prefill) + 9 x 1 (decode) = 14, got {work}: "
        f"compute K/V only for tokens not yet in the cache. The 10th new token is returned but "
        f"nothing reads its K/V yet, so it is never computed (that is what 15 would mean)"
    )
    for p, n in [(1, 1), (3, 7), (12, 30), (5, 1000)]:
        meter = RecordingMeter()
        _, work = lab.generate_with_cache(list(range(p)), n, meter)
        assert work == p + n - 1, f"cached work for P={p}, n_new={n} should be P + n_new - 1 = {p + n - 1}, got {work}"
        assert meter.positions == list(range(p + n - 1)), (
            "with a cache every position 0, 1, 2, ... is computed exactly once, in order; "
            f"got positions {meter.positions[:20]}{'...' if len(meter.positions) > 20 else ''}"
        )


def test_work_ratio_grows_with_length():
    ratios = []
    for n in (10, 100, 1000):
        _, slow = lab.generate_no_cache(PROMPT, n)
        _, fast = lab.generate_with_cache(PROMPT, n)
        ratios.append(slow / fast)
    assert ratios[0] < ratios[1] < ratios[2], f"the no-cache/cached work ratio must grow with n_new, got {ratios}"
    assert ratios[2] > 100, (
        f"at n_new=1000 the cache should save more than 100x (about n/2 = 500x), got {ratios[2]:.1f}x"
    )


def test_zero_new_tokens_costs_nothing_and_bad_input_is_rejected():
    for fn in (lab.generate_no_cache, lab.generate_with_cache):
        toks, work = fn(PROMPT, 0)
        assert toks == PROMPT and work == 0, (
            f"{fn.__name__}(prompt, 0) should return the prompt unchanged with zero work, got {toks}, {work}"
        )
        with pytest.raises(ValueError):
            fn(PROMPT, -1)
        with pytest.raises(ValueError):
            fn([], 3)
        # n_new = 0 is no excuse to skip validation: check first, then take the free path.
        try:
            got = fn([], 0)
        except ValueError:
            pass
        else:
            pytest.fail(
                f"{fn.__name__}([], 0) returned {got} instead of raising ValueError: an empty prompt is "
                f"rejected whatever n_new is; call _check before any n_new == 0 shortcut"
            )
