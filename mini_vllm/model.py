"""A deterministic toy language model: logits are a pure function of (seed, token, position).

Plays the part of the model runner + model in upstream (``vllm/v1/worker/gpu_model_runner.py``
and ``vllm/model_executor/models/``), reduced to the one contract the engine needs::

    forward(last_tokens: int[B], positions: int[B]) -> float64[B, vocab]   # next-token logits

Honest simplification: the toy model looks only at the last token and its position. It never
reads the KV cache, so the paged-KV bookkeeping of the engine is metadata only. That is what
makes the engine's equivalence tests exact: chunked prefill, prefix caching and preemption may
change *when* a position is computed, never the logits it gets.

The logits are a sum of three table lookups (no matmul), so a forward costs microseconds:
``token_table[token] + position_table[position % 64] + bias``. The bias nudges the model
towards lowercase letters and spaces (+2.0, so output is mostly readable) and gives EOS
``EOS_BIAS``: EOS stays reachable (some greedy continuations stop on their own, and sampling at
temperature 1 stops after ~100 tokens on average) without cutting most outputs short.
"""

from __future__ import annotations

import numpy as np

POSITION_PERIOD = 64  # positions repeat their contribution every 64 tokens
EOS_BIAS = 1.5  # EOS is the argmax for ~1.6% of (token, position) pairs; ~1% of sampled mass


class ToyModel:
    """Next-token logits from (last token, position); deterministic for a given ``seed``."""

    def __init__(self, vocab_size: int = 257, seed: int = 0) -> None:
        if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size < 2:
            raise ValueError(f"vocab_size must be an int >= 2, got {vocab_size!r}")
        if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
            raise ValueError(f"seed must be an int >= 0, got {seed!r}")
        self.vocab_size = vocab_size
        self.seed = seed
        self.eos_token_id = vocab_size - 1
        rng = np.random.default_rng(seed)
        self.token_table = rng.standard_normal((vocab_size, vocab_size)) * 2.0
        self.position_table = rng.standard_normal((POSITION_PERIOD, vocab_size))
        self.bias = np.zeros(vocab_size)
        readable = [c for c in b"abcdefghijklmnopqrstuvwxyz " if c < vocab_size]
        self.bias[readable] = 2.0
        self.bias[self.eos_token_id] = EOS_BIAS

    def forward(self, last_tokens: np.ndarray, positions: np.ndarray) -> np.ndarray:
        """Return logits of shape ``(len(last_tokens), vocab_size)`` for the next token."""
        tokens = np.asarray(last_tokens)
        pos = np.asarray(positions)
        if tokens.ndim != 1 or pos.ndim != 1 or tokens.shape != pos.shape:
            raise ValueError(
                f"last_tokens and positions must be 1-D and the same length, got {tokens.shape} and {pos.shape}"
            )
        if tokens.size == 0:
            return np.zeros((0, self.vocab_size))
        if not np.issubdtype(tokens.dtype, np.integer) or not np.issubdtype(pos.dtype, np.integer):
            raise TypeError("last_tokens and positions must be integer arrays")
        if tokens.min() < 0 or tokens.max() >= self.vocab_size:
            raise ValueError(f"token ids must lie in [0, {self.vocab_size})")
        if pos.min() < 0:
            raise ValueError("positions must be >= 0")
        return self.token_table[tokens] + self.position_table[pos % POSITION_PERIOD] + self.bias
