"""Lab 08-03 starter: the (α, c, k) economy of speculative decoding.

α is the per-position acceptance rate (lab 02's overlap Σ min(p, q)), c the cost of one draft
step relative to one target step, k the number of drafts per cycle (vLLM's
``num_speculative_tokens``). A cycle costs ``k·c`` for drafting plus about 1 for the verify pass,
and emits ``1 + α + α² + … + α^k`` tokens on average (draft i survives only if all before it did;
the +1 is the target's own token). ``main`` prints the tables in the README and draws
``speedup.png``.

Write ``expected_tokens_per_verify``, ``speedup``, ``optimal_k``, ``simulate_tokens_per_verify`` and
``alpha_from_tokens_per_verify``; ``_check``, ``plot`` and ``main`` are provided.
Grade with: LAB_IMPL=starter pytest phase-08-speculative-decoding/labs/lab-03-speedup-model -q
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent


def _check(alpha: float, k: int | None = None, c: float | None = None) -> None:
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha is a probability, got {alpha}")
    if k is not None and (isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 0):
        raise ValueError(f"k must be an int >= 0, got {k!r}")
    if c is not None and not c >= 0.0:
        raise ValueError(f"the draft cost c must be >= 0, got {c}")


def expected_tokens_per_verify(alpha: float, k: int) -> float:
    """E[tokens per cycle] = 1 + α + … + α^k = (1 − α^(k+1)) / (1 − α); k + 1 at α = 1.

    Summed term by term, so α within 1e-12 of 1 still gives k + 1 to full precision (the closed
    form cancels catastrophically there). ``ValueError`` for α outside [0, 1] or k < 0.
    """
    raise NotImplementedError(
        'expected_tokens_per_verify: _check(alpha, k), then return the sum of alpha**i for i = 0..k (term '
        'by term, so alpha = 1 gives k + 1 and alpha next to 1 stays exact)'
    )


def speedup(alpha: float, k: int, c: float) -> float:
    """Tokens per unit of target time, relative to plain decoding: E[tokens] / (k·c + 1)."""
    raise NotImplementedError(
        'speedup: _check(alpha, k, c); return expected_tokens_per_verify(alpha, k) / (k * c + 1)'
    )


def optimal_k(alpha: float, c: float, k_max: int = 16) -> int:
    """The k in 0..k_max with the highest speedup; 0 means "turn speculation off".

    Ties go to the smaller k (less work for the same result). ``k_max`` is needed because a free
    drafter (c = 0) gains from every extra draft, forever.
    """
    raise NotImplementedError(
        'optimal_k: _check(alpha, k_max, c); scan k = 0..k_max and keep the k with the highest speedup, '
        'replacing the best only when better by more than rounding, value > best * (1 + 1e-12) (ties keep '
        'the smaller k)'
    )


def simulate_tokens_per_verify(alpha: float, k: int, num_cycles: int, rng: np.random.Generator) -> float:
    """Mean tokens per cycle over ``num_cycles`` simulated cycles with i.i.d. acceptances.

    Each cycle accepts drafts one by one, each with probability α, stopping at the first rejection
    or after k, then adds the target's token. Vectorised (no Python loop over cycles).
    """
    raise NotImplementedError(
        "simulate_tokens_per_verify: validate (num_cycles >= 1); draw a (num_cycles, k) array of uniforms "
        "< alpha, count each row's leading run of True (np.cumprod helps), add 1, return the mean"
    )


def alpha_from_tokens_per_verify(tokens: float, k: int) -> float:
    """Invert ``expected_tokens_per_verify``: the α that yields ``tokens`` per cycle at this k.

    This is how to read vLLM's "mean acceptance length" (tokens − 1) back into a per-position rate.
    ``ValueError`` unless 1 <= tokens <= k + 1.
    """
    raise NotImplementedError(
        'alpha_from_tokens_per_verify: ValueError unless 1 <= tokens <= k + 1; bisect alpha in [0, 1] until '
        'expected_tokens_per_verify(alpha, k) == tokens (it increases with alpha)'
    )


def plot(path: Path) -> None:
    """Speedup against k for four α at c = 0.05 (solid) and c = 0.3 (dashed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ks = np.arange(0, 13)
    fig, ax = plt.subplots(figsize=(6.4, 3.4), dpi=100)
    for alpha, color in zip((0.3, 0.5, 0.7, 0.9), ("tab:red", "tab:orange", "tab:green", "tab:blue")):
        ax.plot(ks, [speedup(alpha, int(k), 0.05) for k in ks], color=color, marker="o", markersize=3,
                label=f"α = {alpha}, c = 0.05")
        ax.plot(ks, [speedup(alpha, int(k), 0.3) for k in ks], color=color, linestyle="--", linewidth=1)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xlabel("k (num_speculative_tokens)")
    ax.set_ylabel("speedup over plain decoding")
    ax.set_title("The k-th draft pays while α^k > c·speedup(k − 1) (dashed: c = 0.3)")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, metadata={"Software": None})
    plt.close(fig)


def main() -> None:
    print("speedup(alpha, k, c = 0.05)")
    ks = (1, 2, 3, 4, 5, 6, 8)
    print("alpha  " + "".join(f"   k={k}" for k in ks) + "   best k  ceiling 1/(1-a)")
    for alpha in (0.3, 0.5, 0.7, 0.8, 0.9):
        row = "".join(f"{speedup(alpha, k, 0.05):7.2f}" for k in ks)
        print(f"{alpha:5.2f}  {row}   {optimal_k(alpha, 0.05):6d}  {1 / (1 - alpha):9.2f}")
    print()
    for alpha, k, c in ((0.7, 5, 0.05), (0.2, 5, 0.5), (0.75, 5, 0.05), (0.5, 1, 0.5)):
        print(f"alpha={alpha:<4} k={k} c={c:<4}: E[tokens]={expected_tokens_per_verify(alpha, k):.3f}  "
              f"cost={k * c + 1:.2f}  speedup={speedup(alpha, k, c):.3f}  optimal_k={optimal_k(alpha, c)}")
    tokens = 2.8 + 1  # 2.8 accepted drafts per cycle at k = 5, plus the target's own token
    alpha = alpha_from_tokens_per_verify(tokens, 5)
    print(f"2.8 accepted drafts per cycle at k=5 -> {tokens} tokens/cycle (vLLM's 'mean acceptance length'); "
          f"2.8/5 = {2.8 / 5:.0%} (its 'draft acceptance rate')")
    print(f"  -> per-position alpha = {alpha:.3f} (alpha = 0.75 gives {expected_tokens_per_verify(0.75, 5):.2f}); "
          f"predicted speedup at c=0.05: {speedup(alpha, 5, 0.05):.2f}")
    sim = simulate_tokens_per_verify(0.7, 5, 200_000, np.random.default_rng(0))
    print(f"simulated tokens/cycle at alpha=0.7, k=5: {sim:.3f} (formula {expected_tokens_per_verify(0.7, 5):.3f})")
    plot(HERE / "speedup.png")
    print("wrote speedup.png")


if __name__ == "__main__":
    main()
