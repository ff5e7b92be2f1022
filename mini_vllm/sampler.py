"""Pick the next token for every row of a batch of logits.

Mirrors ``vllm/v1/sample/sampler.py`` (``Sampler``) plus the top-k/top-p masking of
``vllm/v1/sample/ops/topk_topp_sampler.py`` (``apply_top_k_top_p``), in numpy, one batch per
engine step. The order is upstream's: temperature → top-k → top-p → softmax → one draw per row
from that row's own generator. Left out: logprobs, penalties, min-p, logits processors, and the
exponential-race trick upstream uses to draw on the GPU without a sync (here each row draws one
uniform number ``u`` from its generator and takes the first token whose cumulative probability
exceeds ``u``: exactly what ``Generator.choice(p=...)`` does, so the tokens are the same).

The arithmetic, row by row (``V`` = vocab size)::

    x      = logits / temperature          # overflow (|x| past 1.8e308) → (logits - max) / temperature
    top-k  : kth = k-th largest x (partial selection); keep x >= kth       # ties at kth are kept
    e      = exp(x - max x) on the survivors, 0 elsewhere  # the one exponential, shared below
    top-p  : rank the survivors by e (stable: ties → lowest id), keep the shortest prefix whose
             cumulative probability reaches p (the crossing token included; an exact hit stops there)
    draw   : cdf = cumsum(e_kept / sum e_kept) in id order, normalised; token = first id with cdf > u

When top-k leaves exactly k tokens (the usual case) every step after the selection works on those
k columns only; a normaliser is still summed over the whole row (zeros included), so each
probability is bit-for-bit the one a full-row softmax gives. Greedy rows (temperature below
``SAMPLING_EPS``) take the argmax, lowest index on ties, and touch no generator.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .sampling_params import SamplingParams


def softmax(logits: np.ndarray) -> np.ndarray:
    """Numerically stable softmax along the last axis: subtract the max so exp never overflows."""
    shifted = logits - np.max(logits, axis=-1, keepdims=True)
    exp = np.exp(shifted)
    return exp / exp.sum(axis=-1, keepdims=True)


def _check_logits(logits: object) -> np.ndarray:
    arr = np.asarray(logits)
    if arr.ndim != 2 or arr.shape[1] == 0:
        raise ValueError(f"logits must be a non-empty (batch, vocab) array, got shape {arr.shape}")
    if not np.issubdtype(arr.dtype, np.floating) and not np.issubdtype(arr.dtype, np.integer):
        raise TypeError(f"logits must be numeric, got dtype {arr.dtype}")
    arr = arr.astype(np.float64)
    row_max = arr.max(axis=1)
    if np.isnan(row_max).any() or not np.isfinite(row_max).all():
        raise ValueError("logits must not contain NaN or +inf, and no row may be all −inf")
    return arr


def _top_p_mask(probs: np.ndarray, p: np.ndarray) -> np.ndarray:
    """``probs`` (R, C): each row's candidate probabilities, candidates in ascending id order.

    True where a candidate survives top-p ``p`` (R,): rank by probability (stable, so equal
    probabilities rank lowest id first) and keep up to the first rank whose cumulative sum
    reaches ``p``. Upstream drops the low tail whose mass is ``<= 1 - p``: the same set.
    """
    order = np.argsort(-probs, axis=1, kind="stable")
    cum = np.cumsum(np.take_along_axis(probs, order, axis=1), axis=1)
    num_keep = np.minimum((cum < p[:, None]).sum(axis=1) + 1, probs.shape[1])
    ranks = np.empty_like(order)
    np.put_along_axis(ranks, order, np.broadcast_to(np.arange(probs.shape[1]), order.shape), axis=1)
    return ranks < num_keep[:, None]


def _row_sums(values: np.ndarray, ids: np.ndarray, vocab: int) -> np.ndarray:
    """Sum of each row of ``values`` scattered at ``ids`` into a zero row of width ``vocab``:
    numpy's pairwise sum over the full row, so the result matches a full-row softmax bit for bit."""
    full = np.zeros((values.shape[0], vocab))
    np.put_along_axis(full, ids, values, axis=1)
    return full.sum(axis=1)


def apply_top_k_top_p(x: np.ndarray, k: np.ndarray, p: np.ndarray) -> np.ndarray:
    """Filter each row of ``x`` (B, V) by its ``k`` (<= 0 or >= V: off) and ``p`` (1.0: off).

    Returns ``e`` (B, V): ``exp(x - row max)`` for the tokens that survive, 0 for the rest; the
    sampling distribution is ``e / e.sum(axis=1)``. Top-k keeps every token tied with the k-th
    largest (upstream masks ``x < kth``, so ties survive). The whole-row form: the sampler takes
    it for rows without top-k, or with ties at the cut.
    """
    vocab = x.shape[1]
    keep = np.ones(x.shape, dtype=bool)
    for i in np.flatnonzero((k > 0) & (k < vocab)):
        keep[i] = x[i] >= np.partition(x[i], vocab - k[i])[vocab - k[i]]
    row_max = x.max(axis=1, keepdims=True)
    e = np.where(keep, np.exp(np.where(keep, x, row_max) - row_max), 0.0)
    rows = np.flatnonzero(p < 1.0)
    if rows.size:
        probs = e[rows] / e[rows].sum(axis=1, keepdims=True)
        e[rows] = np.where(_top_p_mask(probs, p[rows]), e[rows], 0.0)
    return e


class Sampler:
    """Greedy below ``SAMPLING_EPS``, else temperature → top-k → top-p → one seeded draw per row."""

    def sample(
        self,
        logits: np.ndarray,
        params: SamplingParams,
        generator: np.random.Generator | None = None,
    ) -> int:
        """One token id for a 1-D row of logits (a batch of one; see ``sample_batch``)."""
        arr = np.asarray(logits)
        if arr.ndim != 1:
            raise ValueError(f"logits must be a non-empty 1-D array, got shape {arr.shape}")
        return self.sample_batch(arr[None, :], [params], [generator])[0]

    def sample_batch(
        self,
        logits: np.ndarray,
        params: Sequence[SamplingParams],
        generators: Sequence[np.random.Generator | None],
    ) -> list[int]:
        """One token per row of ``logits`` (B, V); row ``i`` uses ``params[i]`` and ``generators[i]``.

        A generator is the request's own RNG (the engine keeps one per request so runs are
        reproducible); ``None`` means a fresh ``np.random.default_rng(params[i].seed)``.
        """
        for sp in params:
            if not isinstance(sp, SamplingParams):
                raise TypeError(f"params must be SamplingParams, got {type(sp).__name__}")
        for g in generators:
            if g is not None and not isinstance(g, np.random.Generator):
                raise TypeError(f"generator must be a numpy Generator, got {type(g).__name__}")
        arr = _check_logits(logits)
        if not len(params) == len(generators) == arr.shape[0]:
            raise ValueError(
                f"{arr.shape[0]} rows of logits but {len(params)} params and {len(generators)} generators"
            )
        out = np.argmax(arr, axis=1)  # greedy rows keep this: lowest index wins ties
        rows = [i for i, sp in enumerate(params) if not sp.is_greedy]
        if len(rows) == len(params):
            return self._random_sample(arr, list(params), list(generators)).tolist()
        if rows:
            out[rows] = self._random_sample(
                arr[rows], [params[i] for i in rows], [generators[i] for i in rows]
            )
        return out.tolist()

    @staticmethod
    def _random_sample(
        logits: np.ndarray,
        params: list[SamplingParams],
        generators: list[np.random.Generator | None],
    ) -> np.ndarray:
        num_rows, vocab = logits.shape
        # one uniform number per row, drawn in row order (rows may share a generator)
        u = np.array(
            [
                (g if g is not None else np.random.default_rng(sp.seed)).random()
                for g, sp in zip(generators, params)
            ]
        )
        temperature = np.array([sp.temperature for sp in params])
        k = np.array([sp.top_k for sp in params])
        p = np.array([sp.top_p for sp in params])
        with np.errstate(over="ignore"):
            x = logits / temperature[:, None]
            row_max = logits.max(axis=1) / temperature  # = x.max(axis=1): division keeps the order
            overflow = ~np.isfinite(row_max)
            if overflow.any():  # e.g. 1e308 / 1e-5: shift by the max first, then scale
                sub = logits[overflow]
                x[overflow] = (sub - sub.max(axis=1, keepdims=True)) / temperature[overflow, None]
                row_max[overflow] = 0.0
        tokens = np.empty(num_rows, dtype=np.int64)
        done = np.zeros(num_rows, dtype=bool)

        # Rows whose top-k leaves exactly k tokens: work on those k columns only.
        topk = (k > 0) & (k < vocab)
        for kk in np.unique(k[topk]):
            rows = np.flatnonzero(k == kk)
            sub = x if rows.size == num_rows else x[rows]
            kth = np.partition(sub, vocab - kk, axis=1)[:, vocab - kk]  # partial selection
            mask = sub >= kth[:, None]
            exact = mask.sum(axis=1) == kk  # ties at the cut keep more: whole-row path below
            if not exact.any():
                continue
            rows, mask = rows[exact], mask[exact]
            ids = np.nonzero(mask)[1].reshape(-1, kk)  # ascending ids per row
            e = np.exp(x[rows[:, None], ids] - row_max[rows, None])
            total = _row_sums(e, ids, vocab)
            topp = p[rows] < 1.0
            if topp.any():
                e[topp] = np.where(_top_p_mask(e[topp] / total[topp, None], p[rows][topp]), e[topp], 0.0)
                total[topp] = _row_sums(e[topp], ids[topp], vocab)
            cdf = np.cumsum(e / total[:, None], axis=1)  # zeros elsewhere add nothing to a cumsum
            cdf /= cdf[:, -1:]
            tokens[rows] = ids[np.arange(rows.size), (cdf <= u[rows, None]).sum(axis=1)]
            done[rows] = True

        rest = np.flatnonzero(~done)
        if rest.size:
            e = apply_top_k_top_p(x[rest], k[rest], p[rest])
            cdf = np.cumsum(e / e.sum(axis=1, keepdims=True), axis=1)
            cdf /= cdf[:, -1:]
            tokens[rest] = (cdf <= u[rest, None]).sum(axis=1)
        return tokens
