"""Lab 08-03: the (α, c, k) model, checked against closed forms, edge cases and two simulations."""

import numpy as np
import pytest

from course.runtime import lab_module
from mini_vllm.spec_decode import acceptance_rate, rejection_sample

lab = lab_module(__file__)   # solution.py by default; LAB_IMPL=starter grades starter.py


def test_expected_tokens_formula():
    for alpha in (0.1, 0.5, 0.7, 0.95):
        for k in (1, 3, 5, 9):
            want = (1 - alpha ** (k + 1)) / (1 - alpha)
            got = lab.expected_tokens_per_verify(alpha, k)
            assert got == pytest.approx(want, rel=1e-12), f"E(α={alpha}, k={k}) = 1 + α + … + α^k = {want:.6f}, got {got}"
    assert lab.expected_tokens_per_verify(0.0, 5) == 1.0, "α = 0: only the target's own token"
    assert lab.expected_tokens_per_verify(1.0, 5) == 6.0, "α = 1: every draft plus the bonus, k + 1 (no 0/0)"
    assert lab.expected_tokens_per_verify(0.7, 0) == 1.0, "k = 0 is plain decoding"
    assert lab.expected_tokens_per_verify(0.7, 5) == pytest.approx(2.941, abs=5e-4)
    assert lab.expected_tokens_per_verify(0.2, 5) == pytest.approx(1.250, abs=5e-4)


def test_expected_tokens_is_exact_next_to_one():
    got = lab.expected_tokens_per_verify(1 - 1e-12, 5)
    assert got == pytest.approx(6.0, abs=1e-9), (
        f"α = 1 − 1e-12 must give ≈ 6, got {got}: the closed form (1 − α^(k+1)) / (1 − α) cancels catastrophically "
        f"next to 1; sum the series instead"
    )


def test_expected_tokens_matches_simulation():
    rng = np.random.default_rng(0)
    for alpha, k in ((0.7, 5), (0.3, 2), (0.9, 8), (0.0, 3), (1.0, 4)):
        sim = lab.simulate_tokens_per_verify(alpha, k, 200_000, rng)
        want = lab.expected_tokens_per_verify(alpha, k)
        assert abs(sim - want) / want < 0.01, (
            f"α={alpha}, k={k}: 200,000 simulated cycles give {sim:.4f} tokens per cycle, the formula {want:.4f}: "
            f"a cycle stops at the first rejection and always adds one target token"
        )


def test_formula_matches_a_simulation_through_mini_vllms_rejection_sampler():
    # real distributions: a uniform drafter over 10 tokens and a target with overlap 0.7, verified by
    # the same rejection sampler the engine uses, k drafts per request, one request per cycle
    p = np.array([0.30, 0.20, 0.10, 0.10, 0.10, 0.05, 0.05, 0.05, 0.05, 0.0])
    q = np.full(10, 0.1)
    alpha, k, cycles = acceptance_rate(p, q), 4, 3000
    rng = np.random.default_rng(1)
    drafts = rng.choice(10, size=cycles * k, p=q)
    with np.errstate(divide="ignore"):
        logits = np.tile(np.log(p), (cycles * k, 1))
    out = rejection_sample(drafts, [k] * cycles, np.tile(q, (cycles * k, 1)), logits, np.zeros(cycles, int),
                           np.zeros(cycles, bool), rng=rng)
    measured = (out != -1).sum(axis=1).mean()
    want = lab.expected_tokens_per_verify(alpha, k)
    assert abs(measured - want) / want < 0.04, (
        f"mini_vllm's rejection sampler emits {measured:.3f} tokens per cycle at α = {alpha:.2f}, k = {k}; "
        f"your formula says {want:.3f}"
    )


def test_free_drafter_always_wins():
    for alpha in (0.0, 0.3, 0.9):
        for k in (0, 1, 5):
            assert lab.speedup(alpha, k, 0.0) == pytest.approx(lab.expected_tokens_per_verify(alpha, k)), (
                "c = 0: the cycle costs exactly one target run, so speedup = E[tokens]"
            )
            assert lab.speedup(alpha, k, 0.0) >= 1.0, "a free drafter can never make decoding slower"
    assert lab.optimal_k(0.5, 0.0, k_max=7) == 7, "with free drafts every extra draft helps: the bound k_max decides"
    assert lab.optimal_k(0.5, 0.0, k_max=3) == 3


def test_spec_decode_can_lose():
    s = lab.speedup(0.2, 5, 0.5)
    assert s == pytest.approx(0.357, abs=5e-4) and s < 1, f"α=0.2, c=0.5, k=5: 1.25 tokens for 3.5 runs = 0.357×, got {s}"
    assert lab.optimal_k(0.2, 0.5) == 0, "when every k loses, the best choice is k = 0: turn speculation off"


def test_eagle_like_numbers():
    s = lab.speedup(0.7, 5, 0.05)
    assert s == pytest.approx(2.353, abs=5e-4), f"α=0.7, c=0.05, k=5: 2.941 / 1.25 = 2.353×, got {s}"
    assert lab.optimal_k(0.75, 0.05) == 7, "α=0.75, c=0.05: k=7 is best (k=6 is a hair behind)"
    assert lab.optimal_k(0.5, 0.05) == 3


def test_optimal_k_grows_with_alpha_and_shrinks_with_cost():
    alphas = [0.2, 0.4, 0.6, 0.8, 0.9]
    ks = [lab.optimal_k(a, 0.05) for a in alphas]
    assert ks == sorted(ks) and ks[0] < ks[-1], f"better drafts deserve more of them: optimal k over α {alphas} = {ks}"
    costs = [0.0, 0.02, 0.05, 0.1, 0.3, 1.0]
    ks = [lab.optimal_k(0.8, c, k_max=20) for c in costs]
    assert ks == sorted(ks, reverse=True) and ks[0] > ks[-1], f"dearer drafts deserve fewer: optimal k over c {costs} = {ks}"
    assert ks[-1] == 0, "c = 1 (a drafter as slow as the target): off"


def test_diminishing_returns_in_k():
    alpha = 0.7
    gains = [lab.expected_tokens_per_verify(alpha, k) - lab.expected_tokens_per_verify(alpha, k - 1) for k in range(1, 9)]
    for i, gain in enumerate(gains, start=1):
        assert gain == pytest.approx(alpha**i), f"the i-th draft adds α^i tokens: draft {i} adds {gain}, want {alpha ** i}"
    assert lab.expected_tokens_per_verify(alpha, 200) == pytest.approx(1 / (1 - alpha)), "the ceiling is 1 / (1 − α)"


def test_optimal_k_ties_go_to_the_smaller_k():
    # α = c = 0.5 (exact in binary): k = 0 gives 1 / 1 = 1 and k = 1 gives 1.5 / 1.5 = 1, a tie
    assert lab.speedup(0.5, 1, 0.5) == 1.0 == lab.speedup(0.5, 0, 0.5)
    assert lab.optimal_k(0.5, 0.5) == 0, "a tie buys nothing for the extra work: keep the smaller k"
    assert lab.optimal_k(1.0, 0.0, k_max=0) == 0
    # α = 1/4, c = α² / (1 + α − α²) = 1/19 makes k = 1 and k = 2 tie exactly (both 19/16), but floating point
    # computes k = 2 one ulp higher
    c = 0.0625 / 1.1875
    assert lab.speedup(0.25, 2, c) > lab.speedup(0.25, 1, c) == pytest.approx(lab.speedup(0.25, 2, c), rel=1e-15)
    assert lab.optimal_k(0.25, c) == 1, (
        "k = 1 and k = 2 tie at α = 1/4, c = 1/19 (rounding puts k = 2 one ulp ahead): replace the best only when "
        "the new speedup beats it by more than rounding, e.g. value > best * (1 + 1e-12)"
    )


def test_the_kth_draft_pays_exactly_when_alpha_to_the_k_beats_c_times_the_previous_speedup():
    # speedup(k) > speedup(k - 1)  <=>  alpha**k > c * speedup(k - 1): the figure's title, on a grid.
    for alpha in (0.3, 0.5, 0.7, 0.8, 0.9):
        for c in (0.05, 0.1, 0.3, 0.5):
            for k in range(1, 7):
                prev, cur = lab.speedup(alpha, k - 1, c), lab.speedup(alpha, k, c)
                if abs(alpha**k - c * prev) < 1e-9:
                    continue  # the boundary itself: equal speedups, either answer is rounding
                assert (cur > prev) == (alpha**k > c * prev), (
                    f"alpha={alpha}, c={c}: the draft at k={k} adds alpha^k = {alpha**k:.4f} expected tokens and "
                    f"costs c x speedup(k-1) = {c * prev:.4f}; speedup went {prev:.4f} -> {cur:.4f}"
                )


def test_reading_a_log_back_into_alpha():
    alpha = lab.alpha_from_tokens_per_verify(3.8, 5)
    assert alpha == pytest.approx(0.8126, abs=5e-4), (
        f"a mean acceptance length of 2.8 at k = 5 is 3.8 tokens per cycle, which needs α ≈ 0.81 (α = 0.75 gives only "
        f"3.29); got {alpha}"
    )
    assert lab.expected_tokens_per_verify(alpha, 5) == pytest.approx(3.8, abs=1e-9)
    assert lab.alpha_from_tokens_per_verify(1.0, 5) == pytest.approx(0.0, abs=1e-9)
    assert lab.alpha_from_tokens_per_verify(6.0, 5) == pytest.approx(1.0, abs=1e-9)
    for k in (1, 3, 8):
        assert lab.alpha_from_tokens_per_verify(lab.expected_tokens_per_verify(0.6, k), k) == pytest.approx(0.6, abs=1e-9)


def test_every_promised_error():
    with pytest.raises(ValueError):
        lab.expected_tokens_per_verify(1.2, 3)
    with pytest.raises(ValueError):
        lab.expected_tokens_per_verify(-0.1, 3)
    with pytest.raises(ValueError):
        lab.expected_tokens_per_verify(0.5, -1)
    with pytest.raises(ValueError):
        lab.speedup(0.5, 3, -0.1)
    with pytest.raises(ValueError):
        lab.speedup(0.5, 3, float("nan"))  # NaN fails every comparison: test `not c >= 0`, not `c < 0`
    with pytest.raises(ValueError):
        lab.optimal_k(0.5, float("nan"))
    with pytest.raises(ValueError):
        lab.optimal_k(0.5, 0.1, k_max=-1)
    with pytest.raises(ValueError):
        lab.simulate_tokens_per_verify(0.5, 3, 0, np.random.default_rng(0))
    with pytest.raises(ValueError):
        lab.alpha_from_tokens_per_verify(6.5, 5)
    with pytest.raises(ValueError):
        lab.alpha_from_tokens_per_verify(0.5, 5)
