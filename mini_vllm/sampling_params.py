"""Per-request sampling knobs, validated once at construction (a frozen dataclass).

Mirrors ``vllm/sampling_params.py`` (``SamplingParams``, ``StructuredOutputsParams``,
``BeamSearchParams``) with the knobs mini implements: ``max_tokens``, ``temperature``,
``top_k``, ``top_p``, ``min_p``, ``seed``, ``ignore_eos``, ``stop_token_ids``, the penalties,
``logit_bias``, ``min_tokens``, ``allowed_token_ids``, ``bad_words_token_ids``, ``logprobs``,
``n`` (Phase 09) and ``structured_outputs`` (Phase 12: ``regex``, ``choice``, ``json_object``).

On purpose unlike upstream: frozen and hashable (``choice`` and ``logit_bias`` stored as tuples);
``top_k <= 0`` means off; ``max_tokens`` is an int >= 1 (no ``None``); a structured request may
not set ``ignore_eos`` or ``min_tokens`` (either could ban the only legal token); bad words are
token-id sequences, not strings; no ``logprobs=-1``; a non-int ``n`` is a ``TypeError``, and
``n > 1`` with greedy sampling is refused (n copies of one sample).

Left out: ``best_of``, stop strings, custom logits processors, and of structured outputs
``json`` (a schema), ``grammar`` (EBNF), ``structural_tag`` and the whitespace options.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field

# Below this temperature sampling is greedy (same constant as upstream's _SAMPLING_EPS).
SAMPLING_EPS = 1e-5
# Most samples one request may ask for (upstream's default VLLM_MAX_N_SEQUENCES).
MAX_N_SEQUENCES = 16384


def _is_int(x: object) -> bool:
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


@dataclass(frozen=True)
class StructuredOutputsParams:
    """One structured-output constraint: exactly one of ``regex``, ``choice``, ``json_object``.

    ``regex``: the whole output must match (``re.fullmatch``; the subset ``grammar.py`` supports).
    ``choice``: the output is one of these strings. ``json_object=True``: any JSON object, compact.
    """

    regex: str | None = None
    choice: tuple[str, ...] | None = None
    json_object: bool | None = None

    def __post_init__(self) -> None:
        count = sum(x is not None for x in (self.regex, self.choice, self.json_object))
        if count != 1:
            raise ValueError(
                f"give exactly one structured-output constraint (regex, choice or json_object), got {count}"
            )
        if self.regex is not None and not isinstance(self.regex, str):
            raise TypeError(f"regex must be a str, got {self.regex!r}")
        if self.choice is not None:
            if isinstance(self.choice, (str, bytes)) or not hasattr(self.choice, "__iter__"):
                raise TypeError(f"choice must be a list of strings, got {self.choice!r}")
            choice = tuple(self.choice)
            if not choice or not all(isinstance(c, str) and c for c in choice):
                raise ValueError(f"choice needs a non-empty list of non-empty strings, got {self.choice!r}")
            object.__setattr__(self, "choice", choice)
        if self.json_object is not None and self.json_object is not True:
            raise ValueError(f"json_object must be True when given, got {self.json_object!r}")

    @property
    def kind_and_spec(self) -> tuple[str, str | tuple[str, ...]]:
        """The grammar to compile: ``("regex", pattern)``, ``("choice", strings)`` or ``("json_object", "")``."""
        if self.regex is not None:
            return "regex", self.regex
        if self.choice is not None:
            return "choice", self.choice
        return "json_object", ""


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
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: tuple[tuple[int, float], ...] | None = None
    min_tokens: int = 0
    allowed_token_ids: tuple[int, ...] | None = None
    bad_words_token_ids: tuple[tuple[int, ...], ...] = field(default=())
    logprobs: int | None = None
    n: int = 1
    structured_outputs: StructuredOutputsParams | None = None

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
        self._check_sampler_knobs()
        self._check_n()
        self._check_structured_outputs()
        object.__setattr__(self, "max_tokens", int(self.max_tokens))
        object.__setattr__(self, "top_k", int(self.top_k))
        if self.seed is not None:
            object.__setattr__(self, "seed", int(self.seed))
        object.__setattr__(self, "temperature", float(self.temperature))
        object.__setattr__(self, "top_p", float(self.top_p))

    def _check_n(self) -> None:
        if not _is_int(self.n):
            raise TypeError(f"n must be an int, got {self.n!r}")
        if self.n < 1:
            raise ValueError(f"n must be at least 1, got {self.n}")
        if self.n > MAX_N_SEQUENCES:
            raise ValueError(f"n must be at most {MAX_N_SEQUENCES}, got {self.n}")
        if self.n > 1 and self.temperature < SAMPLING_EPS:
            raise ValueError(f"n must be 1 when using greedy sampling (temperature 0), got {self.n}")
        object.__setattr__(self, "n", int(self.n))

    def _check_structured_outputs(self) -> None:
        so = self.structured_outputs
        if so is None:
            return
        if not isinstance(so, StructuredOutputsParams):
            raise TypeError(f"structured_outputs must be a StructuredOutputsParams, got {type(so).__name__}")
        if self.ignore_eos:
            raise ValueError("structured outputs end at EOS: ignore_eos=True would run past the grammar's end")
        if self.min_tokens:
            raise ValueError("min_tokens cannot be combined with structured outputs (it may ban the only legal token)")

    def _check_sampler_knobs(self) -> None:
        for name, lo, hi in (
            ("min_p", 0.0, 1.0),
            ("presence_penalty", -2.0, 2.0),
            ("frequency_penalty", -2.0, 2.0),
        ):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, numbers.Real):
                raise TypeError(f"{name} must be a float, got {v!r}")
            if not (lo <= v <= hi):  # also rejects NaN
                raise ValueError(f"{name} must be in [{lo:g}, {hi:g}], got {v}")
            object.__setattr__(self, name, float(v))
        rp = self.repetition_penalty
        if isinstance(rp, bool) or not isinstance(rp, numbers.Real):
            raise TypeError(f"repetition_penalty must be a float, got {rp!r}")
        if not (math.isfinite(rp) and rp > 0):
            raise ValueError(f"repetition_penalty must be a finite number > 0, got {rp}")
        object.__setattr__(self, "repetition_penalty", float(rp))
        if not _is_int(self.min_tokens):
            raise TypeError(f"min_tokens must be an int, got {self.min_tokens!r}")
        if not (0 <= self.min_tokens <= self.max_tokens):
            raise ValueError(
                f"min_tokens must be in [0, max_tokens={self.max_tokens}], got {self.min_tokens}"
            )
        object.__setattr__(self, "min_tokens", int(self.min_tokens))
        if self.logprobs is not None:
            if not _is_int(self.logprobs):
                raise TypeError(f"logprobs must be an int or None, got {self.logprobs!r}")
            if self.logprobs < 0:
                raise ValueError(f"logprobs must be >= 0 (or None), got {self.logprobs}")
            object.__setattr__(self, "logprobs", int(self.logprobs))
        if self.logit_bias is not None:
            items = self.logit_bias.items() if isinstance(self.logit_bias, dict) else self.logit_bias
            pairs: dict[int, float] = {}
            for pair in items:
                if not isinstance(pair, tuple) or len(pair) != 2:
                    raise TypeError(f"logit_bias must map token ids to floats, got entry {pair!r}")
                tok, bias = pair
                if not _is_int(tok) or tok < 0:
                    raise ValueError(f"logit_bias keys must be non-negative token ids, got {tok!r}")
                if isinstance(bias, bool) or not isinstance(bias, numbers.Real) or not math.isfinite(bias):
                    raise ValueError(f"logit_bias values must be finite floats, got {bias!r} for token {tok}")
                pairs[int(tok)] = min(100.0, max(-100.0, float(bias)))  # upstream clamps (OpenAI's range)
            object.__setattr__(self, "logit_bias", tuple(sorted(pairs.items())) or None)
        if self.allowed_token_ids is not None:
            ids = self.allowed_token_ids
            if isinstance(ids, (str, bytes)) or not hasattr(ids, "__iter__"):
                raise TypeError(f"allowed_token_ids must be a sequence of ints, got {ids!r}")
            ids = tuple(ids)
            if not ids:
                raise ValueError("allowed_token_ids must not be empty (it would ban every token)")
            for tok in ids:
                if not _is_int(tok) or tok < 0:
                    raise ValueError(f"allowed_token_ids must hold non-negative ints, got {tok!r}")
            object.__setattr__(self, "allowed_token_ids", tuple(int(t) for t in ids))
        words = self.bad_words_token_ids
        if isinstance(words, (str, bytes)) or not hasattr(words, "__iter__"):
            raise TypeError(f"bad_words_token_ids must be a sequence of token-id sequences, got {words!r}")
        clean = []
        for word in words:
            if isinstance(word, (str, bytes)) or not hasattr(word, "__iter__"):
                raise TypeError(f"each bad word must be a sequence of token ids, got {word!r}")
            word = tuple(word)
            if not word or any(not _is_int(t) or t < 0 for t in word):
                raise ValueError(
                    f"each bad word must be a non-empty sequence of non-negative ints, got {word!r}"
                )
            clean.append(tuple(int(t) for t in word))
        object.__setattr__(self, "bad_words_token_ids", tuple(clean))

    @property
    def is_greedy(self) -> bool:
        """True when the sampler takes the argmax (temperature below ``SAMPLING_EPS``)."""
        return self.temperature < SAMPLING_EPS


@dataclass(frozen=True)
class BeamSearchParams:
    """The knobs of beam search (upstream: ``BeamSearchParams`` in ``vllm/sampling_params.py``).

    ``beam_width`` hypotheses live on each step; ``max_tokens`` steps at most; ``temperature``
    picks the one token each beam step samples (0: the argmax, upstream's default);
    ``length_penalty`` is the exponent of the length in the score (see ``beam_search.py``).
    Left out: ``include_stop_str_in_output`` (mini has no stop strings).
    """

    beam_width: int
    max_tokens: int
    ignore_eos: bool = False
    temperature: float = 0.0
    length_penalty: float = 1.0

    def __post_init__(self) -> None:
        for name in ("beam_width", "max_tokens"):
            v = getattr(self, name)
            if not _is_int(v):
                raise TypeError(f"{name} must be an int, got {v!r}")
            if v < 1:
                raise ValueError(f"{name} must be at least 1, got {v}")
            object.__setattr__(self, name, int(v))
        if not isinstance(self.ignore_eos, bool):
            raise TypeError(f"ignore_eos must be a bool, got {self.ignore_eos!r}")
        for name in ("temperature", "length_penalty"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, numbers.Real):
                raise TypeError(f"{name} must be a float, got {v!r}")
            if not math.isfinite(v):
                raise ValueError(f"{name} must be finite, got {v}")
            object.__setattr__(self, name, float(v))
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
