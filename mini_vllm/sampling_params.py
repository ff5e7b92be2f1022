"""Per-request sampling knobs, validated once at construction.

Mirrors ``vllm/sampling_params.py`` (``SamplingParams``) and keeps only the knobs the mini
engine implements: ``max_tokens``, ``temperature``, ``top_k``, ``top_p``, ``seed``,
``ignore_eos`` and ``stop_token_ids``. Left out: ``n``/``best_of``, penalties, ``min_p``,
``min_tokens``, logprobs, stop strings, structured output, logits processors.

Differences from upstream, on purpose:

* the object is frozen — params are checked once and can never drift afterwards;
* ``top_k <= 0`` (not only ``0``/``-1``) means "disabled";
* ``max_tokens`` is required to be an int ``>= 1`` (upstream allows ``None`` = "until max_model_len").
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field

# Below this temperature sampling is greedy (same constant as upstream's _SAMPLING_EPS).
SAMPLING_EPS = 1e-5


def _is_int(x: object) -> bool:
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


@dataclass(frozen=True)
class SamplingParams:
    """How to pick the next token for one request, and when to stop."""

    max_tokens: int = 16
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None
    ignore_eos: bool = False
    stop_token_ids: tuple[int, ...] = field(default=())

    def __post_init__(self) -> None:
        if not _is_int(self.max_tokens):
            raise TypeError(f"max_tokens must be an int, got {self.max_tokens!r}")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1, got {self.max_tokens}")
        if isinstance(self.temperature, bool) or not isinstance(self.temperature, numbers.Real):
            raise TypeError(f"temperature must be a float, got {self.temperature!r}")
        if not math.isfinite(self.temperature) or self.temperature < 0:
            raise ValueError(f"temperature must be a finite number >= 0, got {self.temperature}")
        if not _is_int(self.top_k):
            raise TypeError(f"top_k must be an int (<= 0 disables it), got {self.top_k!r}")
        if isinstance(self.top_p, bool) or not isinstance(self.top_p, numbers.Real):
            raise TypeError(f"top_p must be a float, got {self.top_p!r}")
        if not (0.0 < self.top_p <= 1.0):  # also rejects NaN
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.seed is not None and not _is_int(self.seed):
            raise TypeError(f"seed must be an int or None, got {self.seed!r}")
        if self.seed is not None and self.seed < 0:
            raise ValueError(f"seed must be >= 0 (numpy generators need it), got {self.seed}")
        if not isinstance(self.ignore_eos, bool):
            raise TypeError(f"ignore_eos must be a bool, got {self.ignore_eos!r}")
        if isinstance(self.stop_token_ids, (str, bytes)) or not hasattr(self.stop_token_ids, "__iter__"):
            raise TypeError(f"stop_token_ids must be a sequence of ints, got {self.stop_token_ids!r}")
        stops = tuple(self.stop_token_ids)
        for tok in stops:
            if not _is_int(tok) or tok < 0:
                raise ValueError(f"stop_token_ids must hold non-negative ints, got {tok!r}")
        object.__setattr__(self, "stop_token_ids", tuple(int(t) for t in stops))
        object.__setattr__(self, "max_tokens", int(self.max_tokens))
        object.__setattr__(self, "top_k", int(self.top_k))
        if self.seed is not None:
            object.__setattr__(self, "seed", int(self.seed))
        object.__setattr__(self, "temperature", float(self.temperature))
        object.__setattr__(self, "top_p", float(self.top_p))

    @property
    def is_greedy(self) -> bool:
        """True when the sampler takes the argmax (temperature below ``SAMPLING_EPS``)."""
        return self.temperature < SAMPLING_EPS
