"""Poolers: a step's flat hidden states ``[T, H]`` → one embedding per request (or per token).

Mirrors ``vllm/model_executor/layers/pooler/``. A ``PoolingCursor`` says where each request's rows
lie in the flat batch (vllm/v1/pool/metadata.py:16 — PoolingCursor: first and last row, prompt
length, rows scheduled this step). The pooling methods of
vllm/model_executor/layers/pooler/seqwise/methods.py: ``CLSPool`` (:36, the first row),
``LastPool`` (:50, the last row: a causal decoder's last token has seen the whole prompt) and
``MeanPool`` (:60, the average of the request's own rows, summed in float32). CLS and MEAN refuse a
partial prefill: they need every row of the prompt in one step. The head,
vllm/model_executor/layers/pooler/seqwise/heads.py:33 — EmbeddingPoolerHead, then L2-normalises
each pooled vector when its request's ``use_activation`` is on
(vllm/model_executor/layers/pooler/activations.py:108 — PoolerNormalize, ``x / max(‖x‖, 1e-12)``):
pool first, normalise after. ``token_embed`` keeps every row
(vllm/model_executor/layers/pooler/tokwise/methods.py:35 — AllPool). ``DispatchPooler``
(vllm/model_executor/layers/pooler/special.py:25) picks the pooler by task.

A chunked ``token_embed`` request keeps its rows in its ``PoolingStates`` until its prompt is
done (vllm/v1/pool/metadata.py:39 — PoolingStates); unfinished requests pool to ``None``.
Left out: sentence-transformers projectors, Matryoshka ``dimensions``, classify heads, step
pooling, ``head_dtype``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from ..config import SEQ_POOLING_TYPES
from ..pooling_params import PoolingParams


@dataclass
class PoolingCursor:
    first_token_indices: np.ndarray  # [N] row of each request's first scheduled token
    last_token_indices: np.ndarray  # [N] row of its last scheduled token
    prompt_lens: np.ndarray  # [N]
    num_scheduled_tokens: np.ndarray  # [N]
    seq_lens: np.ndarray | None = None  # [N] tokens computed after this step (None: this step is all)

    def is_partial_prefill(self) -> bool:
        return bool(np.any(self.prompt_lens != self.num_scheduled_tokens))

    def is_finished(self) -> np.ndarray:
        """Per request: its whole prompt is computed once this step is done."""
        seq_lens = self.num_scheduled_tokens if self.seq_lens is None else self.seq_lens
        return self.prompt_lens == seq_lens


class PoolingStates:
    """One request's rows so far, for a ``token_embed`` prompt that arrives in chunks."""

    def __init__(self) -> None:
        self.hidden_states_cache: list[np.ndarray] = []

    def clean(self) -> None:
        self.hidden_states_cache.clear()


@dataclass
class PoolingMetadata:
    """The requests of one step that pool: their prompt lengths and their ``PoolingParams``."""

    prompt_lens: np.ndarray
    pooling_params: list[PoolingParams]
    pooling_cursor: PoolingCursor | None = None
    pooling_states: list[PoolingStates] | None = None  # per request (the runner's); None: whole prompts

    def build_pooling_cursor(
        self, num_scheduled_tokens: Sequence[int], seq_lens: Sequence[int] | None = None
    ) -> None:
        """Rows from the step's layout: request ``i`` holds rows ``cumsum[i] .. cumsum[i+1]-1``.

        ``seq_lens`` (tokens computed once the step is done) says which prompts finish this step;
        omitted, every prompt is taken as finishing (the step holds each one whole).
        """
        scheduled = np.asarray(num_scheduled_tokens, dtype=np.int64)
        if len(scheduled) != len(self.prompt_lens):
            raise ValueError(
                f"{len(scheduled)} scheduled requests but {len(self.prompt_lens)} prompt lengths"
            )
        cumsum = np.concatenate([[0], np.cumsum(scheduled)])
        self.pooling_cursor = PoolingCursor(
            first_token_indices=cumsum[:-1],
            last_token_indices=cumsum[1:] - 1,
            prompt_lens=np.asarray(self.prompt_lens, dtype=np.int64),
            num_scheduled_tokens=scheduled,
            seq_lens=None if seq_lens is None else np.asarray(seq_lens, dtype=np.int64),
        )

    def get_pooling_cursor(self) -> PoolingCursor:
        if self.pooling_cursor is None:
            raise RuntimeError("call build_pooling_cursor before pooling")
        return self.pooling_cursor


def cls_pool(hidden: np.ndarray, cursor: PoolingCursor) -> np.ndarray:
    if cursor.is_partial_prefill():
        raise ValueError("CLS pooling needs the whole prompt in one step (no chunked prefill)")
    return hidden[cursor.first_token_indices]


def last_pool(hidden: np.ndarray, cursor: PoolingCursor) -> np.ndarray:
    return hidden[cursor.last_token_indices]


def mean_pool(hidden: np.ndarray, cursor: PoolingCursor) -> np.ndarray:
    """Each request's own rows averaged: its sum in float32 over its prompt length."""
    if cursor.is_partial_prefill():
        raise ValueError("MEAN pooling needs the whole prompt in one step (no chunked prefill)")
    out = np.zeros((len(cursor.prompt_lens), hidden.shape[-1]), dtype=np.float32)
    for r, (first, last) in enumerate(zip(cursor.first_token_indices, cursor.last_token_indices)):
        out[r] = hidden[first : last + 1].astype(np.float32).sum(axis=0)
    return out / cursor.prompt_lens[:, None].astype(np.float32)


_METHODS = {"CLS": cls_pool, "LAST": last_pool, "MEAN": mean_pool}


def l2_normalize(x: np.ndarray) -> np.ndarray:
    """``torch.nn.functional.normalize(x, p=2, dim=-1)``: divide by ``max(‖x‖, 1e-12)``."""
    norm = np.sqrt(np.sum(np.square(x, dtype=np.float32), axis=-1, keepdims=True))
    return (x / np.maximum(norm, np.float32(1e-12))).astype(np.float32)


class EmbeddingPooler:
    """``embed``: pool each request's rows with ``pooling_type``, then normalise where asked."""

    def __init__(self, pooling_type: str = "LAST") -> None:
        if pooling_type not in SEQ_POOLING_TYPES:
            raise ValueError(f"unknown pooling type {pooling_type!r}; expected one of {SEQ_POOLING_TYPES}")
        self.pooling_type = pooling_type
        self.method = _METHODS[pooling_type]

    def get_supported_tasks(self) -> set[str]:
        return {"embed"}

    def __call__(self, hidden: np.ndarray, metadata: PoolingMetadata) -> list[np.ndarray]:
        pooled = self.method(hidden, metadata.get_pooling_cursor())
        return [
            l2_normalize(vec) if params.use_activation else vec.astype(np.float32)
            for vec, params in zip(pooled, metadata.pooling_params)
        ]


class TokenEmbeddingPooler:
    """``token_embed``: every row of each request (``AllPool``), each normalised where asked."""

    def get_supported_tasks(self) -> set[str]:
        return {"token_embed"}

    def __call__(self, hidden: np.ndarray, metadata: PoolingMetadata) -> list[np.ndarray | None]:
        cursor = metadata.get_pooling_cursor()
        rows: list[np.ndarray | None] = [
            hidden[a : b + 1] for a, b in zip(cursor.first_token_indices, cursor.last_token_indices)
        ]
        states = metadata.pooling_states
        if states is None:
            if cursor.is_partial_prefill():
                raise ValueError("token_embed over a partial prefill needs pooling_states to keep the rows")
        else:  # chunks wait in each request's cache; a finished prompt pools all of them (AllPool)
            for i, (state, finished) in enumerate(zip(states, cursor.is_finished())):
                state.hidden_states_cache.append(rows[i])
                rows[i] = np.concatenate(state.hidden_states_cache) if finished else None
                if finished:
                    state.clean()
        return [
            None if r is None else l2_normalize(r) if p.use_activation else r.astype(np.float32)
            for r, p in zip(rows, metadata.pooling_params)
        ]


class DispatchPooler:
    """One pooler per task; a step's requests all share one task here (upstream splits by task)."""

    def __init__(self, poolers_by_task: Mapping[str, EmbeddingPooler | TokenEmbeddingPooler]) -> None:
        for task, pooler in poolers_by_task.items():
            if task not in pooler.get_supported_tasks():
                raise ValueError(f"{type(pooler).__name__} does not support task {task!r}")
        self.poolers_by_task = dict(poolers_by_task)

    @classmethod
    def for_embedding(cls, pooling_type: str = "LAST") -> DispatchPooler:
        return cls({"token_embed": TokenEmbeddingPooler(), "embed": EmbeddingPooler(pooling_type)})

    def get_supported_tasks(self) -> set[str]:
        return set(self.poolers_by_task)

    def __call__(self, hidden: np.ndarray, metadata: PoolingMetadata) -> list[np.ndarray]:
        tasks = {p.task for p in metadata.pooling_params}
        if len(tasks) != 1 or None in tasks:
            raise ValueError(f"every request of a pooling step needs the same resolved task, got {tasks}")
        (task,) = tasks
        if task not in self.poolers_by_task:
            raise ValueError(f"unsupported pooling task {task!r}; supported: {sorted(self.poolers_by_task)}")
        return self.poolers_by_task[task](hidden, metadata)
