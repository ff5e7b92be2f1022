"""Pick one token from one row of logits.

Mirrors ``vllm/v1/sample/sampler.py`` (``Sampler``) plus the top-k/top-p helpers of
``vllm/v1/sample/ops/topk_topp_sampler.py``, one request at a time and in numpy. The order is
the upstream one: temperature → top-k → top-p → softmax → one draw. Left out: batching on the
GPU, logprobs, penalties, min-p, logits processors, the Gumbel/exponential trick upstream uses
to draw without a CPU sync (here ``Generator.choice`` draws from the probabilities directly).
"""

from __future__ import annotations

import numpy as np

from .sampling_params import SamplingParams


def softmax(logits: np.ndarray) -> np.ndarray:
    """Numerically stable softmax: subtract the max first so exp never overflows."""
    shifted = logits - np.max(logits)
    exp = np.exp(shifted)
    return exp / exp.sum()


def apply_top_k(logits: np.ndarray, k: int) -> np.ndarray:
    """Keep the ``k`` largest logits, set the rest to −inf. ``k <= 0`` or ``k >= vocab`` is a no-op."""
    if k <= 0 or k >= logits.shape[-1]:
        return logits
    kth = np.partition(logits, -k)[-k]  # O(vocab): the k-th largest value
    return np.where(logits >= kth, logits, -np.inf)


def apply_top_p(logits: np.ndarray, p: float) -> np.ndarray:
    """Keep the smallest set of tokens whose probability reaches ``p``, the crossing token included."""
    if p >= 1.0:
        return logits
    probs = softmax(logits)
    order = np.argsort(-probs, kind="stable")
    cum = np.cumsum(probs[order])
    num_keep = min(int(np.searchsorted(cum, p)) + 1, len(cum))  # +1 keeps the crossing token
    out = np.full_like(logits, -np.inf)
    keep = order[:num_keep]
    out[keep] = logits[keep]
    return out


class Sampler:
    """Greedy at temperature 0, else temperature → top-k → top-p → one seeded draw."""

    def sample(
        self,
        logits: np.ndarray,
        params: SamplingParams,
        generator: np.random.Generator | None = None,
    ) -> int:
        """Return one token id for a 1-D row of logits.

        ``generator`` is the request's own RNG (the engine keeps one per request so runs are
        reproducible); without one a fresh ``np.random.default_rng(params.seed)`` is used.
        """
        if not isinstance(params, SamplingParams):
            raise TypeError(f"params must be a SamplingParams, got {type(params).__name__}")
        logits = np.asarray(logits)
        if logits.ndim != 1 or logits.shape[0] == 0:
            raise ValueError(f"logits must be a non-empty 1-D array, got shape {logits.shape}")
        if not np.issubdtype(logits.dtype, np.floating) and not np.issubdtype(logits.dtype, np.integer):
            raise TypeError(f"logits must be numeric, got dtype {logits.dtype}")
        logits = logits.astype(np.float64)
        if np.isnan(logits).any() or not np.isfinite(logits.max()):
            raise ValueError("logits must not contain NaN or +inf, and must not be all −inf")
        if generator is not None and not isinstance(generator, np.random.Generator):
            raise TypeError(f"generator must be a numpy Generator, got {type(generator).__name__}")

        if params.is_greedy:
            return int(np.argmax(logits))  # lowest index wins ties; no RNG touched
        logits = logits / params.temperature
        logits = apply_top_k(logits, params.top_k)
        logits = apply_top_p(logits, params.top_p)
        probs = softmax(logits)
        rng = generator if generator is not None else np.random.default_rng(params.seed)
        return int(rng.choice(len(probs), p=probs))
