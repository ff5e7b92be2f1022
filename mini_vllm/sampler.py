"""Pick the next token for every row of a batch of logits.

Mirrors ``vllm/v1/sample/sampler.py`` (``Sampler``), the ops under ``vllm/v1/sample/ops/``
(``apply_bad_words``, ``apply_all_penalties``, ``apply_top_k_top_p``) and the built-in logits
processors of ``vllm/v1/sample/logits_processor/builtin.py`` (min-tokens, logit bias, min-p), in
numpy, one batch per engine step, stage by stage in upstream's order: raw logprobs, allowed ids,
bad words, min-tokens, logit bias, custom processors, penalties, greedy argmax, temperature,
min-p, argmax-invariant processors, top-k and top-p, one draw per row from the row's own
generator. README.md ("How the sampler picks a token") spells out each stage and the draw.

A stage whose knob no row uses is skipped, so a batch that uses none of them gets bit-for-bit the
tokens of the sampler before penalties existed. Deliberate difference: each row draws one uniform
number and takes the first token whose cumulative probability exceeds it (what
``Generator.choice(p=...)`` does); upstream divides by exponential noise and takes the argmax (the
exponential race, no GPU sync): the same distribution, not the same tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from .sampling_params import SamplingParams


class LogitsProcessor(Protocol):
    """The hook (upstream: ``vllm/v1/sample/logits_processor/interface.py``): edit a batch of
    logits (B, V) and return it. ``is_argmax_invariant`` says whether it can change a greedy
    row's argmax; if it cannot, the sampler applies it to the random rows only, after temperature."""

    def apply(self, logits: np.ndarray) -> np.ndarray: ...

    def is_argmax_invariant(self) -> bool: ...


@dataclass(frozen=True)
class Logprobs:
    """One row's logprobs: the sampled token first, then the ``n`` most likely (``logprobs=n``),
    each from the raw logits (before any penalty or temperature, upstream's default
    ``raw_logprobs`` mode). ``rank`` is the sampled token's 1-based rank (ties share the worst)."""

    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    rank: int


@dataclass(frozen=True)
class SamplerOutput:
    """What ``Sampler.forward`` returns: one token per row, and that row's logprobs (or None)."""

    sampled_token_ids: list[int]
    logprobs: list[Logprobs | None]


def softmax(logits: np.ndarray) -> np.ndarray:
    """Numerically stable softmax along the last axis: subtract the max so exp never overflows."""
    shifted = logits - np.max(logits, axis=-1, keepdims=True)
    exp = np.exp(shifted)
    return exp / exp.sum(axis=-1, keepdims=True)


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """Stable log-softmax along the last axis (upstream: ``Sampler.compute_logprobs``)."""
    shifted = logits - np.max(logits, axis=-1, keepdims=True)
    with np.errstate(divide="ignore"):
        return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def apply_allowed_token_ids(logits: np.ndarray, allowed: Sequence[Sequence[int] | None]) -> np.ndarray:
    """In place: for each row with an allowed list, every other id -> -inf (upstream fills the
    batch's ``allowed_token_ids_mask`` the same way)."""
    for i, ids in enumerate(allowed):
        if ids is not None:
            banned = np.ones(logits.shape[1], dtype=bool)
            banned[list(ids)] = False
            logits[i, banned] = -np.inf
    return logits


def apply_bad_words(
    logits: np.ndarray, bad_words: dict[int, Sequence[Sequence[int]]], past_tokens: Sequence[Sequence[int]]
) -> np.ndarray:
    """In place: a bad word ``w`` bans its last id in row ``i`` when the row's output so far ends
    with ``w[:-1]`` (a one-token word is banned always). Only the output counts, not the prompt,
    as upstream's ``apply_bad_words``."""
    for i, words in bad_words.items():
        past = list(past_tokens[i])
        for word in words:
            prefix = list(word[:-1])
            if len(prefix) <= len(past) and (not prefix or past[len(past) - len(prefix) :] == prefix):
                logits[i, word[-1]] = -np.inf
    return logits


def apply_min_tokens(
    logits: np.ndarray, rows: Sequence[int], stop_ids: Sequence[Sequence[int]]
) -> np.ndarray:
    """In place: rows that have not yet produced ``min_tokens`` outputs cannot stop:
    their stop ids (EOS included unless ``ignore_eos``) -> -inf (upstream: ``MinTokensLogitsProcessor``)."""
    for i, ids in zip(rows, stop_ids):
        logits[i, list(ids)] = -np.inf
    return logits


def apply_logit_bias(logits: np.ndarray, biases: dict[int, Sequence[tuple[int, float]]]) -> np.ndarray:
    """In place: ``logits[row, id] += bias`` (upstream: ``LogitBiasLogitsProcessor``)."""
    for i, pairs in biases.items():
        ids = [t for t, _ in pairs]
        logits[i, ids] += np.array([b for _, b in pairs])
    return logits


def token_counts(token_ids: Sequence[Sequence[int]], vocab: int) -> np.ndarray:
    """(B, V) int counts of each id in each row's list (upstream: ``get_token_bin_counts_and_mask``)."""
    counts = np.zeros((len(token_ids), vocab), dtype=np.int64)
    for i, ids in enumerate(token_ids):
        if len(ids):
            np.add.at(counts[i], np.asarray(ids, dtype=np.int64), 1)
    return counts


def apply_penalties(
    logits: np.ndarray,
    prompt_mask: np.ndarray,
    output_counts: np.ndarray,
    presence: np.ndarray,
    frequency: np.ndarray,
    repetition: np.ndarray,
) -> np.ndarray:
    """In place, upstream's order (``apply_all_penalties``):

    1. repetition ``r`` on every id seen in the prompt or the output: a positive logit is
       multiplied by ``1/r``, a zero or negative one by ``r`` (so ``r > 1`` always pushes down);
    2. frequency ``f``: ``logit -= f * count in the output``;
    3. presence ``p``: ``logit -= p`` once for any id in the output.
    """
    seen = prompt_mask | (output_counts > 0)
    r = np.where(seen, repetition[:, None], 1.0)
    logits *= np.where(logits > 0, 1.0 / r, r)
    logits -= frequency[:, None] * output_counts
    logits -= presence[:, None] * (output_counts > 0)
    return logits


def apply_min_p(x: np.ndarray, min_p: np.ndarray) -> np.ndarray:
    """In place: with probabilities ``softmax(x)``, every id whose probability is below
    ``min_p * max probability`` -> -inf (upstream: ``MinPLogitsProcessor``, after temperature).
    The most likely id always survives; ``min_p = 0`` masks nothing."""
    probs = softmax(x)
    x[probs < min_p[:, None] * probs.max(axis=1, keepdims=True)] = -np.inf
    return x


def gather_logprobs(logprobs: np.ndarray, num: int, token_id: int) -> Logprobs:
    """One row: the sampled token's logprob and rank, then the ``num`` largest (ties: lowest id)."""
    order = np.argsort(-logprobs, kind="stable")[:num]
    rank = int((logprobs >= logprobs[token_id]).sum())
    ids = (int(token_id), *(int(t) for t in order))
    return Logprobs(ids, tuple(float(logprobs[t]) for t in ids), rank)


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


def _kth_largest(x: np.ndarray, k: int, masked: np.ndarray | None = None) -> np.ndarray:
    """The k-th largest value of each row of ``x`` (R, V). Rows holding ``-inf`` (masked by a ban
    or min-p) select among their finite entries, which must number at least ``k``: a partial
    selection over thousands of equal ``-inf`` values degrades badly. ``masked``: which rows hold
    ``-inf``, when the caller already knows."""
    vocab = x.shape[1]
    dense = ~(x.min(axis=1) == -np.inf if masked is None else masked)
    out = np.empty(x.shape[0])
    if dense.all():
        return np.partition(x, vocab - k, axis=1)[:, vocab - k]
    if dense.any():
        out[dense] = np.partition(x[dense], vocab - k, axis=1)[:, vocab - k]
    for i in np.flatnonzero(~dense):
        f = x[i][np.isfinite(x[i])]
        out[i] = np.partition(f, f.size - k)[f.size - k]
    return out


def apply_top_k_top_p(x: np.ndarray, k: np.ndarray, p: np.ndarray) -> np.ndarray:
    """Filter each row of ``x`` (B, V) by its ``k`` (<= 0 or >= V: off) and ``p`` (1.0: off).

    Returns ``e`` (B, V): ``exp(x - row max)`` for the tokens that survive, 0 for the rest; the
    sampling distribution is ``e / e.sum(axis=1)``. Top-k keeps every token tied with the k-th
    largest (upstream masks ``x < kth``, so ties survive). The whole-row form: the sampler takes
    it for rows without top-k, or with ties at the cut.
    """
    keep = np.ones(x.shape, dtype=bool)
    n_finite = np.isfinite(x).sum(axis=1)
    for i in np.flatnonzero((k > 0) & (k < n_finite)):  # k >= the finite count: nothing to cut
        keep[i] = x[i] >= _kth_largest(x[i : i + 1], int(k[i]))[0]
    row_max = x.max(axis=1, keepdims=True)
    e = np.where(keep, np.exp(np.where(keep, x, row_max) - row_max), 0.0)
    rows = np.flatnonzero(p < 1.0)
    if rows.size:
        probs = e[rows] / e[rows].sum(axis=1, keepdims=True)
        e[rows] = np.where(_top_p_mask(probs, p[rows]), e[rows], 0.0)
    return e


class Sampler:
    """The batched pipeline of the module docstring: processors, penalties, greedy or
    temperature -> min-p -> top-k -> top-p -> one seeded draw per row.

    ``eos_token_id`` joins each row's stop ids for min-tokens (unless the row sets
    ``ignore_eos``), as upstream's ``all_stop_token_ids``. ``logits_processors``: custom hooks,
    applied after the built-ins of their kind.
    """

    def __init__(
        self, eos_token_id: int | None = None, logits_processors: Sequence[LogitsProcessor] = ()
    ) -> None:
        if eos_token_id is not None and (
            isinstance(eos_token_id, bool) or not isinstance(eos_token_id, int) or eos_token_id < 0
        ):
            raise ValueError(f"eos_token_id must be a non-negative int or None, got {eos_token_id!r}")
        for proc in logits_processors:
            if not callable(getattr(proc, "apply", None)) or not callable(
                getattr(proc, "is_argmax_invariant", None)
            ):
                raise TypeError(f"a logits processor needs apply() and is_argmax_invariant(), got {proc!r}")
        self.eos_token_id = eos_token_id
        self.logits_processors = tuple(logits_processors)

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
        output_token_ids: Sequence[Sequence[int]] | None = None,
        prompt_token_ids: Sequence[Sequence[int]] | None = None,
    ) -> list[int]:
        """One token per row of ``logits`` (B, V); row ``i`` uses ``params[i]`` and ``generators[i]``.

        A generator is the request's own RNG (the engine keeps one per request so runs are
        reproducible); ``None`` means a fresh ``np.random.default_rng(params[i].seed)``.
        ``output_token_ids`` / ``prompt_token_ids``: each row's history, which penalties, bad
        words and min-tokens read (None: empty).
        """
        return self.forward(logits, params, generators, output_token_ids, prompt_token_ids).sampled_token_ids

    def forward(
        self,
        logits: np.ndarray,
        params: Sequence[SamplingParams],
        generators: Sequence[np.random.Generator | None],
        output_token_ids: Sequence[Sequence[int]] | None = None,
        prompt_token_ids: Sequence[Sequence[int]] | None = None,
    ) -> SamplerOutput:
        """``sample_batch`` plus each row's logprobs (upstream: ``Sampler.forward``)."""
        for sp in params:
            if not isinstance(sp, SamplingParams):
                raise TypeError(f"params must be SamplingParams, got {type(sp).__name__}")
        for g in generators:
            if g is not None and not isinstance(g, np.random.Generator):
                raise TypeError(f"generator must be a numpy Generator, got {type(g).__name__}")
        arr = _check_logits(logits)
        num_rows, vocab = arr.shape
        if not len(params) == len(generators) == num_rows:
            raise ValueError(
                f"{num_rows} rows of logits but {len(params)} params and {len(generators)} generators"
            )
        outputs = self._history(output_token_ids, num_rows, vocab, "output_token_ids")
        prompts = self._history(prompt_token_ids, num_rows, vocab, "prompt_token_ids")
        params = list(params)
        raw = log_softmax(arr) if any(sp.logprobs is not None for sp in params) else None
        arr = self.apply_logits_processors(arr, params, outputs, prompts)

        out = np.argmax(arr, axis=1)  # greedy rows keep this: lowest index wins ties
        rows = [i for i, sp in enumerate(params) if not sp.is_greedy]
        if len(rows) == num_rows:
            out = self._random_sample(arr, params, list(generators))
        elif rows:
            out[rows] = self._random_sample(
                arr[rows], [params[i] for i in rows], [generators[i] for i in rows]
            )
        tokens = out.tolist()
        logprobs = [
            None if sp.logprobs is None else gather_logprobs(raw[i], sp.logprobs, tokens[i])
            for i, sp in enumerate(params)
        ]
        return SamplerOutput(tokens, logprobs)

    @staticmethod
    def _history(
        token_ids: Sequence[Sequence[int]] | None, num_rows: int, vocab: int, name: str
    ) -> list[list[int]]:
        if token_ids is None:
            return [[] for _ in range(num_rows)]
        rows = [list(ids) for ids in token_ids]
        if len(rows) != num_rows:
            raise ValueError(f"{name} has {len(rows)} rows for {num_rows} rows of logits")
        for ids in rows:
            for t in ids:
                if isinstance(t, bool) or not isinstance(t, (int, np.integer)) or not 0 <= t < vocab:
                    raise ValueError(f"{name} must hold token ids in [0, {vocab}), got {t!r}")
        return rows

    def apply_logits_processors(
        self,
        logits: np.ndarray,
        params: list[SamplingParams],
        outputs: list[list[int]],
        prompts: list[list[int]],
    ) -> np.ndarray:
        """Every stage before the greedy/random split, in upstream's order; edits ``logits``
        (float64, which ``forward`` already copied) in place and returns it."""
        vocab = logits.shape[1]
        checked: set[int] = set()
        for i, sp in enumerate(params):
            if id(sp) in checked:  # a request's draft rows share its params object: check it once
                continue
            checked.add(id(sp))
            ids = [*(sp.allowed_token_ids or ()), *(t for t, _ in sp.logit_bias or ())]
            ids += [t for w in sp.bad_words_token_ids for t in w]
            if sp.min_tokens:
                ids += self._stop_ids(sp)
            bad = [t for t in ids if t >= vocab]
            if bad:
                raise ValueError(
                    f"row {i}: token id {bad[0]} in its sampling params is outside the vocab ({vocab})"
                )
        banned = bool(self.logits_processors) or any(
            sp.allowed_token_ids is not None or sp.bad_words_token_ids or sp.min_tokens for sp in params
        )
        if any(sp.allowed_token_ids is not None for sp in params):
            apply_allowed_token_ids(logits, [sp.allowed_token_ids for sp in params])
        bad_words = {i: sp.bad_words_token_ids for i, sp in enumerate(params) if sp.bad_words_token_ids}
        if bad_words:
            apply_bad_words(logits, bad_words, outputs)
        min_tok = [i for i, sp in enumerate(params) if len(outputs[i]) < sp.min_tokens]
        if min_tok:
            apply_min_tokens(logits, min_tok, [self._stop_ids(params[i]) for i in min_tok])
        biases = {i: sp.logit_bias for i, sp in enumerate(params) if sp.logit_bias}
        if biases:
            apply_logit_bias(logits, biases)
        for proc in self.logits_processors:
            if not proc.is_argmax_invariant():
                logits = np.asarray(proc.apply(logits), dtype=np.float64)
        if any(sp.presence_penalty or sp.frequency_penalty or sp.repetition_penalty != 1.0 for sp in params):
            apply_penalties(
                logits,
                token_counts(prompts, vocab) > 0,
                token_counts(outputs, vocab),
                np.array([sp.presence_penalty for sp in params]),
                np.array([sp.frequency_penalty for sp in params]),
                np.array([sp.repetition_penalty for sp in params]),
            )
        if banned:
            dead = np.flatnonzero(np.isneginf(logits.max(axis=1)))
            if dead.size:
                raise ValueError(f"row {dead[0]}: every token is banned (allowed ids, bad words, min-tokens)")
        if self.logits_processors and (np.isnan(logits).any() or np.isposinf(logits).any()):
            raise ValueError("a logits processor produced NaN or +inf")
        return logits

    def _stop_ids(self, sp: SamplingParams) -> list[int]:
        eos = [] if sp.ignore_eos or self.eos_token_id is None else [self.eos_token_id]
        return [*eos, *sp.stop_token_ids]

    def _random_sample(
        self,
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
        min_p = np.array([sp.min_p for sp in params])
        if (min_p > 0).any():
            apply_min_p(x, min_p)
        for proc in self.logits_processors:
            if proc.is_argmax_invariant():
                x = np.asarray(proc.apply(x), dtype=np.float64)
                row_max = x.max(axis=1)
        tokens = np.empty(num_rows, dtype=np.int64)
        done = np.zeros(num_rows, dtype=bool)

        # Rows whose top-k leaves exactly k tokens: work on those k columns only. A row with no
        # more than k finite logits (bans, min-p) has nothing to cut: top-k is off for it.
        masked = x.min(axis=1) == -np.inf  # a reduction: cheaper than an isneginf mask
        if masked.any():
            k = np.where(masked & (np.isfinite(x).sum(axis=1) <= k), 0, k)
        topk = (k > 0) & (k < vocab)
        for kk in np.unique(k[topk]):
            rows = np.flatnonzero(k == kk)
            sub = x if rows.size == num_rows else x[rows]
            kth = _kth_largest(sub, int(kk), masked[rows])  # partial selection
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
