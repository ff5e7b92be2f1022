"""Speculative decoding: the n-gram drafter and the rejection sampler that verifies its drafts.

Mirrors ``vllm/v1/spec_decode/ngram_proposer.py`` (``NgramProposer``: the longest n-gram,
``prompt_lookup_min <= n <= prompt_lookup_max``, that ends the sequence and occurred earlier; its
earliest occurrence proposes the tokens that followed; no drafts past ``max_model_len``),
``vllm/v1/sample/rejection_sampler.py`` (``rejection_sample``, ``RejectionSampler.parse_output``:
drafts back to back per request; greedy path stops at the first draft unequal to the target
argmax; random path accepts ``x`` when ``p(x) / q(x) >= u``, else draws a recovered token from
``max(p - q, 0)`` by the exponential race ``argmax(residual / E)``; a bonus token when all pass;
``PLACEHOLDER_TOKEN_ID`` padding) and ``SpecDecodingStats`` (``vllm/v1/spec_decode/metrics.py``),
which the scheduler fills. The scheduler and the model runner drive it; Phase 08's guide tells the story.

Left out: numba threads and preallocated buffers, the Triton kernels (the loops are what each
program does), logits processors, penalties and top-k/top-p on the target rows (callers pass
logits already divided by the temperature), logprobs, the "synthetic" acceptance mode.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

PLACEHOLDER_TOKEN_ID = -1  # a rejected (or never reached) position in the output rows


# ----------------------------------------------------------------------------- the stats


@dataclass
class SpecDecodingStats:
    """One step's speculation counters (upstream: ``SpecDecodingStats``, same fields).

    A *draft* is one request's list of draft tokens verified this step; ``num_accepted_tokens``
    counts accepted drafts (the bonus or correction token is not one of them).
    """

    num_spec_tokens: int
    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    num_accepted_tokens_per_pos: list[int] = field(default_factory=list)

    @classmethod
    def new(cls, num_spec_tokens: int) -> SpecDecodingStats:
        return cls(num_spec_tokens=num_spec_tokens, num_accepted_tokens_per_pos=[0] * num_spec_tokens)

    def observe_draft(self, num_draft_tokens: int, num_accepted_tokens: int) -> None:
        self.num_drafts += 1
        self.num_draft_tokens += num_draft_tokens
        self.num_accepted_tokens += num_accepted_tokens
        for i in range(num_accepted_tokens):
            self.num_accepted_tokens_per_pos[i] += 1


# ----------------------------------------------------------------------------- the drafter


def find_longest_matched_ngram(
    tokens: np.ndarray, min_n: int, max_n: int, max_model_len: int, k: int
) -> np.ndarray:
    """Draft tokens for one sequence (``_find_longest_matched_ngram_and_propose_tokens`` upstream).

    The match: the largest ``n`` in ``[min_n, max_n]`` whose last-``n``-token suffix occurs
    earlier, ending before the last token; among those occurrences the *earliest* wins. The
    draft is what followed it: at most ``k`` tokens, at most ``max_model_len − len(tokens)``,
    and never past the end of the sequence. Empty when nothing matches.
    """
    tokens = np.asarray(tokens)
    return batch_find_longest_matched_ngram(
        tokens[None], np.array([len(tokens)]), min_n, max_n, max_model_len, k
    )[0]


def batch_find_longest_matched_ngram(
    token_ids: np.ndarray, num_tokens: np.ndarray, min_n: int, max_n: int, max_model_len: int, k: int
) -> list[np.ndarray]:
    """``find_longest_matched_ngram`` for every row at once: row ``i``'s first ``num_tokens[i]`` tokens.

    One pass for the whole batch instead of one sliding-window scan per ``n`` and per row (the
    drafter runs every step, so its numpy calls are paid per step, not per request). The candidate
    ends are the earlier positions holding the row's last token; each extends backwards while it
    still agrees with the suffix. A row's longest agreement (capped at ``max_n``) is the ``n`` that
    wins; its earliest end, the match.
    """
    num_tokens = np.asarray(num_tokens, dtype=np.int64)
    budget = np.minimum(k, max_model_len - num_tokens)  # drafts allowed per row
    drafts = [token_ids[i, :0] for i in range(len(num_tokens))]
    live = np.flatnonzero((num_tokens >= max(min_n, 2)) & (budget > 0))
    if not live.size:
        return drafts
    # max_n columns of -1 before position 0: walking back past a row's start never agrees
    pad = max_n
    width = pad + int(num_tokens[live].max())
    tokens = np.full((len(live), width), -1, dtype=np.int64)
    tokens[:, pad:] = token_ids[live, : width - pad]
    flat = tokens.ravel()  # flat indices: the walk back below is one gather for every row at once
    last_col = pad + num_tokens[live] - 1
    last = np.arange(len(live)) * width + last_col  # each row's last token
    same = (tokens == flat[last][:, None]) & (np.arange(width) < last_col[:, None])
    ends = np.flatnonzero(same)  # candidates, sorted by row then position
    if not ends.size:
        return drafts
    row = ends // width
    back = np.arange(max_n)
    agree = flat[ends[:, None] - back] == flat[last[row][:, None] - back]  # [candidates, max_n]
    length = np.where(agree.all(axis=1), max_n, agree.argmin(axis=1))  # up to the first disagreement
    # Per row: the longest agreement, then the earliest end, as the largest score (one per row).
    col = ends - row * width
    score = length * width + (width - 1 - col)
    first = np.flatnonzero(np.r_[True, row[1:] != row[:-1]])
    best = np.maximum.reduceat(score, first)
    win = np.flatnonzero(score == np.repeat(best, np.diff(np.r_[first, len(score)])))
    win = win[length[win] >= min_n]
    matched, starts = live[row[win]], col[win] - pad + 1  # starts: the position after each match
    for i, s, c in zip(matched.tolist(), starts.tolist(), budget[matched].tolist()):
        drafts[i] = token_ids[i, s : s + min(c, int(num_tokens[i]) - s)]  # never past the end
    return drafts


def find_longest_matched_ngram_by_scan(
    tokens: np.ndarray, min_n: int, max_n: int, max_model_len: int, k: int
) -> np.ndarray:
    """The same drafts by one sliding-window scan per ``n``, longest first (the slower first
    version, kept as the reference ``test_spec_decode.py`` holds the one-pass search to)."""
    tokens = np.asarray(tokens)
    total = len(tokens)
    k = min(k, max_model_len - total)
    if total < min_n or k <= 0:
        return tokens[:0]
    for n in range(min(max_n, total - 1), min_n - 1, -1):  # longest first
        suffix = tokens[total - n :]
        windows = np.lib.stride_tricks.sliding_window_view(tokens[: total - 1], n)
        hits = np.flatnonzero((windows == suffix).all(axis=1))
        if hits.size:
            start = int(hits[0]) + n
            return tokens[start : start + min(k, total - start)]
    return tokens[:0]


# ----------------------------------------------------------------------------- the proposer


class NgramProposer:
    """Prompt-lookup drafter: no model, only the request's own tokens."""

    def __init__(
        self,
        num_speculative_tokens: int,
        prompt_lookup_min: int | None = None,
        prompt_lookup_max: int | None = None,
        max_model_len: int = 2048,
    ) -> None:
        # upstream's SpeculativeConfig: neither given → 5 and 5; one given → the other copies it
        if prompt_lookup_min is None and prompt_lookup_max is None:
            prompt_lookup_min = prompt_lookup_max = 5
        elif prompt_lookup_min is None:
            prompt_lookup_min = prompt_lookup_max
        elif prompt_lookup_max is None:
            prompt_lookup_max = prompt_lookup_min
        for name, value in (
            ("num_speculative_tokens", num_speculative_tokens),
            ("prompt_lookup_min", prompt_lookup_min),
            ("prompt_lookup_max", prompt_lookup_max),
            ("max_model_len", max_model_len),
        ):
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
                raise TypeError(f"{name} must be an int, got {type(value).__name__}")
            if value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        if prompt_lookup_min > prompt_lookup_max:
            raise ValueError(f"prompt_lookup_min={prompt_lookup_min} must be <= prompt_lookup_max={prompt_lookup_max}")
        self.min_n = int(prompt_lookup_min)
        self.max_n = int(prompt_lookup_max)
        self.k = int(num_speculative_tokens)
        self.max_model_len = int(max_model_len)

    def propose(
        self,
        sampled_token_ids: Sequence[Sequence[int]],
        num_tokens_no_spec: np.ndarray,
        token_ids_cpu: np.ndarray,
    ) -> list[list[int]]:
        """One draft list per request (``NgramProposer.propose`` upstream).

        Row ``i`` of ``token_ids_cpu`` holds request ``i``'s tokens, of which the first
        ``num_tokens_no_spec[i]`` are real. A request that sampled nothing this step (still mid
        prefill) or has reached ``max_model_len`` gets ``[]``.
        """
        token_ids_cpu = np.asarray(token_ids_cpu)
        num_tokens_no_spec = np.asarray(num_tokens_no_spec)
        if token_ids_cpu.ndim != 2 or len(num_tokens_no_spec) != len(sampled_token_ids) or len(token_ids_cpu) < len(sampled_token_ids):
            raise ValueError(
                "propose needs one row of token_ids_cpu and one count in num_tokens_no_spec per request, got "
                f"{len(sampled_token_ids)} requests, counts {num_tokens_no_spec.shape}, tokens {token_ids_cpu.shape}"
            )
        n = len(sampled_token_ids)
        too_long = np.flatnonzero(num_tokens_no_spec > token_ids_cpu.shape[1])
        if too_long.size:
            i = int(too_long[0])
            raise ValueError(
                f"request {i}: num_tokens_no_spec={int(num_tokens_no_spec[i])} exceeds its row "
                f"({token_ids_cpu.shape[1]})"
            )
        sampled = np.array([len(s) > 0 for s in sampled_token_ids], dtype=bool)
        # a request that sampled nothing, or is full, gets no search (a count of 0 skips its row)
        counts = np.where(sampled & (num_tokens_no_spec < self.max_model_len), num_tokens_no_spec, 0)
        drafts = batch_find_longest_matched_ngram(
            token_ids_cpu[:n], counts, self.min_n, self.max_n, self.max_model_len, self.k
        )
        return [d.tolist() for d in drafts]


# ----------------------------------------------------------------------------- the verifier


def softmax_rows(logits: np.ndarray) -> np.ndarray:
    shifted = logits - logits.max(axis=-1, keepdims=True)
    e = np.exp(shifted)
    return e / e.sum(axis=-1, keepdims=True)


def residual(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """``max(p − q, 0)``, unnormalised: what is left of the target once the draft took its share."""
    return np.maximum(np.asarray(p, dtype=np.float64) - np.asarray(q, dtype=np.float64), 0.0)


def rejection_sample(
    draft_token_ids: np.ndarray,
    num_draft_tokens: Sequence[int],
    draft_probs: np.ndarray | None,
    target_logits: np.ndarray,
    bonus_token_ids: np.ndarray,
    is_greedy: np.ndarray,
    *,
    rng: np.random.Generator | None = None,
    uniform_probs: np.ndarray | None = None,
    exponentials: np.ndarray | None = None,
) -> np.ndarray:
    """Verify every request's drafts in one call; rows of ``max_spec_len + 1`` tokens.

    ``draft_token_ids`` [num_tokens] are all requests' drafts back to back, ``num_draft_tokens``
    [B] how many belong to each. ``target_logits`` [num_tokens, V] are the target's logits at
    each draft position, already divided by the temperature. ``draft_probs`` [num_tokens, V] is
    the drafter's distribution, or ``None`` for a drafter without one (n-gram): then ``q`` is
    one-hot on the draft. ``bonus_token_ids`` [B] is the token sampled after the last draft.
    ``is_greedy`` [B] picks the path per request.

    Randomness, as upstream: one uniform per draft token (``uniform_probs``) and one row of
    Exp(1) noise per request (``exponentials`` [B, V]) for the recovered token. Pass them to
    reproduce a run exactly, or pass ``rng`` to draw them.
    """
    draft_token_ids = np.asarray(draft_token_ids, dtype=np.int64)
    target_logits = np.asarray(target_logits, dtype=np.float64)
    bonus_token_ids = np.asarray(bonus_token_ids).reshape(-1)
    is_greedy = np.asarray(is_greedy, dtype=bool).reshape(-1)
    num_draft_tokens = [int(n) for n in num_draft_tokens]
    batch, num_tokens = len(num_draft_tokens), len(draft_token_ids)
    if target_logits.ndim != 2 or target_logits.shape[0] != num_tokens:
        raise ValueError(f"target_logits must be [num_tokens={num_tokens}, vocab], got {target_logits.shape}")
    vocab = target_logits.shape[1]
    if any(n < 0 for n in num_draft_tokens) or sum(num_draft_tokens) != num_tokens:
        raise ValueError(f"num_draft_tokens {num_draft_tokens} must be >= 0 and sum to len(draft_token_ids)={num_tokens}")
    if len(bonus_token_ids) != batch or len(is_greedy) != batch:
        raise ValueError(f"bonus_token_ids and is_greedy need one entry per request ({batch})")
    if num_tokens and (draft_token_ids.min() < 0 or draft_token_ids.max() >= vocab):
        raise ValueError(f"draft token ids must lie in [0, {vocab})")
    if draft_probs is None:
        q = np.zeros((num_tokens, vocab))
        q[np.arange(num_tokens), draft_token_ids] = 1.0  # a drafter without probabilities: one-hot
    else:
        q = np.asarray(draft_probs, dtype=np.float64)
        if q.shape != target_logits.shape:
            raise ValueError(f"draft_probs must have the shape of target_logits {target_logits.shape}, got {q.shape}")
    if uniform_probs is None or exponentials is None:
        if rng is None:
            raise ValueError("pass rng, or both uniform_probs and exponentials")
        uniform_probs = rng.random(num_tokens) if uniform_probs is None else uniform_probs
        exponentials = rng.exponential(size=(batch, vocab)) if exponentials is None else exponentials
    uniform_probs = np.asarray(uniform_probs, dtype=np.float64)
    exponentials = np.asarray(exponentials, dtype=np.float64)
    if uniform_probs.shape != (num_tokens,) or exponentials.shape != (batch, vocab):
        raise ValueError(f"uniform_probs must be [{num_tokens}] and exponentials [{batch}, {vocab}]")

    max_spec_len = max(num_draft_tokens, default=0)
    out = np.full((batch, max_spec_len + 1), PLACEHOLDER_TOKEN_ID, dtype=np.int32)
    counts = np.array(num_draft_tokens, dtype=np.int64)
    starts = np.cumsum(counts) - counts
    # The greedy path for every greedy request at once (a loop per draft token costs a step more
    # than the whole verification): the target's argmax at each position up to and including the
    # first draft that differs from it, then the bonus token where none differs.
    req = np.repeat(np.arange(batch), counts)  # each draft token's request
    position = np.arange(num_tokens) - starts[req]  # its place among that request's drafts
    argmax = target_logits.argmax(axis=-1)
    differ = np.r_[0, np.cumsum(draft_token_ids != argmax)]  # differ[t]: drafts before t that differ
    reached = is_greedy[req] & (differ[:-1] == differ[starts][req])  # every earlier draft was right
    out[req[reached], position[reached]] = argmax[reached]  # equal to the draft, or the correction
    swept = is_greedy & (differ[starts + counts] == differ[starts])
    out[swept, counts[swept]] = bonus_token_ids[swept]
    for r in np.flatnonzero(~is_greedy):  # the random path, request by request
        start, n = int(starts[r]), int(counts[r])
        rows = slice(start, start + n)
        drafts, logits = draft_token_ids[rows], target_logits[rows]
        rejected = False
        p = softmax_rows(logits)
        for pos in range(n):
            x = drafts[pos]
            qx, px = q[start + pos, x], p[pos, x]
            if qx > 0 and px / qx >= uniform_probs[start + pos]:
                out[r, pos] = x
                continue
            # recovered: a draw from max(p - q, 0) normalised, by the exponential race
            out[r, pos] = np.argmax(residual(p[pos], q[start + pos]) / exponentials[r])
            rejected = True
            break
        if not rejected:
            out[r, n] = bonus_token_ids[r]
    return out


def parse_output(output_token_ids: np.ndarray, vocab_size: int) -> list[list[int]]:
    """Drop the placeholders: the tokens each request really emits this step."""
    out = np.asarray(output_token_ids)
    keep = (out != PLACEHOLDER_TOKEN_ID) & (out < vocab_size)
    return [row[mask].tolist() for row, mask in zip(out, keep)]


def acceptance_rate(p: np.ndarray, q: np.ndarray) -> float:
    """Σ min(p, q): the probability a draft drawn from ``q`` survives verification against ``p``."""
    return float(np.minimum(np.asarray(p, dtype=np.float64), np.asarray(q, dtype=np.float64)).sum())
