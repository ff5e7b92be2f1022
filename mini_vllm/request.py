"""A request's state inside the engine: token ids, the two counters, status, finish reason.

Mirrors ``vllm/v1/request.py`` (``Request``, ``RequestStatus``) and the stop check of
``vllm/v1/core/sched/utils.py`` (``check_stop``, here ``Request.maybe_finish``). The whole
scheduler is built on two numbers::

    num_tokens           = len(prompt) + len(outputs)     # what the request has
    num_computed_tokens  = tokens whose KV is in the cache # what the engine has done

Each step the scheduler hands out tokens so ``num_computed_tokens`` catches up with
``num_tokens``; prefill is "far behind", decode is "one behind".

Images (Phase 13): ``mm_features``, one ``MultiModalFeature`` per image in prompt order (its
identifier and placeholder range); ``has_encoder_inputs`` says whether there are any.

``lora_request`` names the request's adapter (``mini_vllm.lora.LoRARequest``, None for the base
model); the scheduler reads it for the ``max_loras`` rule. It, the images and ``cache_salt`` (a
non-empty string or None: requests with different salts never share a cached prefix) are the
extra keys of the block hashes (``mini_vllm.block_pool.generate_block_hash_extra_keys``).

Speculative decoding adds a third number: ``spec_token_ids``, the drafts proposed after the
last step, and ``num_tokens_with_spec = num_tokens + len(spec_token_ids)``, the target the
scheduler makes ``num_computed_tokens`` chase, so drafts ride the same gap as everything else.

A pooling request carries ``pooling_params`` and runs its prompt only (``max_tokens`` 1, no token
sampled); a ``token_embed`` one skips reading the prefix cache (it needs every prompt row).
Left out: the multimodal data itself (only what the scheduler reads), structured output, async
output placeholders, streaming sessions, events/stats, priority. ``RequestStatus`` keeps only
the members mini uses, in upstream's order, so ``is_finished`` is still ``status > PREEMPTED``.
``is_finished`` is a property here (a method upstream), so ``if req.is_finished:`` is never a
silently-true bound method.
"""

from __future__ import annotations

import enum
import numbers
from collections.abc import Callable, Iterator, Sequence
from typing import Any, overload

from .lora import LoRARequest
from .multimodal import MultiModalFeature
from .sampling_params import SamplingParams

EOS_TOKEN_ID = 256  # ByteTokenizer's EOS


def is_token_id(x: object) -> bool:
    """A non-negative integer (Python or numpy), but not a bool."""
    if type(x) is int:  # fast path: the ABC check below is slow
        return x >= 0
    return isinstance(x, numbers.Integral) and not isinstance(x, bool) and int(x) >= 0


class RequestStatus(enum.IntEnum):
    """Lifecycle states, in upstream order: anything after PREEMPTED is finished."""

    WAITING = enum.auto()
    WAITING_FOR_REMOTE_KVS = enum.auto()  # blocks allocated, a KV connector is still loading them
    RUNNING = enum.auto()
    PREEMPTED = enum.auto()
    FINISHED_STOPPED = enum.auto()
    FINISHED_LENGTH_CAPPED = enum.auto()
    FINISHED_ABORTED = enum.auto()

    def __str__(self) -> str:
        return self.name

    @staticmethod
    def is_finished(status: RequestStatus) -> bool:
        return status > RequestStatus.PREEMPTED

    @staticmethod
    def get_finished_reason(status: RequestStatus) -> str | None:
        return _FINISHED_REASON.get(status)


_FINISHED_REASON = {
    RequestStatus.FINISHED_STOPPED: "stop",
    RequestStatus.FINISHED_LENGTH_CAPPED: "length",
    RequestStatus.FINISHED_ABORTED: "abort",
}


class ConstantList(Sequence[int]):
    """Read-only view of a list (upstream: ``vllm/v1/utils.py`` ``ConstantList``).

    Compares equal to a list with the same items; every mutator raises, so nobody can append
    behind the request's back and desynchronise ``num_tokens`` from the block hashes.
    """

    __slots__ = ("_x",)

    def __init__(self, x: list[int]) -> None:
        self._x = x

    @overload
    def __getitem__(self, i: int) -> int: ...
    @overload
    def __getitem__(self, i: slice) -> list[int]: ...
    def __getitem__(self, i: Any) -> Any:
        return self._x[i]

    def __len__(self) -> int:
        return len(self._x)

    def __iter__(self) -> Iterator[int]:
        return iter(self._x)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, ConstantList):
            return self._x == other._x
        if isinstance(other, (list, tuple)):
            return self._x == list(other)
        return NotImplemented

    def __repr__(self) -> str:
        return repr(self._x)

    def _readonly(self, *args: Any, **kwargs: Any) -> None:
        raise TypeError("this token list is read-only; use Request.append_output_token_ids()")

    append = extend = insert = remove = pop = clear = __setitem__ = __delitem__ = _readonly  # type: ignore[assignment]
    __hash__ = None  # type: ignore[assignment]


class Request:
    """One generation request: prompt, outputs, counters, status and (optional) block hashes."""

    def __init__(
        self,
        request_id: str,
        prompt_token_ids: Sequence[int],
        sampling_params: SamplingParams | None = None,
        eos_token_id: int | None = EOS_TOKEN_ID,
        block_hasher: Callable[[Request], list[bytes]] | None = None,
        arrival_time: float = 0.0,
        mm_features: Sequence[MultiModalFeature] = (),
        lora_request: LoRARequest | None = None,
        cache_salt: str | None = None,
        pooling_params: Any = None,
    ) -> None:
        check_cache_salt(cache_salt)
        if lora_request is not None and not isinstance(lora_request, LoRARequest):
            raise TypeError(f"lora_request must be a LoRARequest or None, got {type(lora_request).__name__}")
        if not isinstance(request_id, str) or not request_id:
            raise ValueError(f"request_id must be a non-empty str, got {request_id!r}")
        if isinstance(prompt_token_ids, (str, bytes)):
            raise TypeError("prompt_token_ids must be a sequence of int token ids, not text")
        prompt = list(prompt_token_ids)
        if not prompt:
            raise ValueError("the prompt must contain at least one token")
        for tok in prompt:
            if not is_token_id(tok):
                raise ValueError(f"prompt token ids must be non-negative ints, got {tok!r}")
        prompt = [tok if type(tok) is int else int(tok) for tok in prompt]
        if sampling_params is None:
            sampling_params = SamplingParams()
        if not isinstance(sampling_params, SamplingParams):
            raise TypeError(f"sampling_params must be a SamplingParams, got {type(sampling_params).__name__}")

        self.request_id = request_id
        self.sampling_params = sampling_params
        self.pooling_params = pooling_params  # a resolved PoolingParams: the prompt is pooled, not continued
        # upstream PoolingParams.skip_reading_prefix_cache: per-token pooling needs every row computed
        self.skip_reading_prefix_cache = getattr(pooling_params, "task", None) == "token_embed"
        self.mm_features = _check_mm_features(mm_features, len(prompt))
        self.max_tokens = 1 if pooling_params is not None else sampling_params.max_tokens
        self.eos_token_id = eos_token_id
        self.arrival_time = arrival_time
        self.lora_request = lora_request
        self.generator_seed: Any = sampling_params.seed  # seeds the runner's generator (the engine may override)
        self.cache_salt = cache_salt
        self.status = RequestStatus.WAITING
        self.stop_reason: int | None = None  # the stop token that finished it, if any

        self.prompt_token_ids = prompt
        self.num_prompt_tokens = len(prompt)
        self._output_token_ids: list[int] = []
        self._all_token_ids: list[int] = prompt.copy()
        self.output_token_ids = ConstantList(self._output_token_ids)
        self.all_token_ids = ConstantList(self._all_token_ids)

        self.num_computed_tokens = 0
        self.num_preemptions = 0
        self.spec_token_ids: list[int] = []  # drafts to verify next step (speculative decoding)
        self.is_prefill_chunk = False  # the last step was a mid-prefill chunk (set by the scheduler)

        # Chained hashes of the full blocks, extended as tokens arrive (upstream: block_hasher).
        self.block_hashes: list[bytes] = []
        self.block_hasher = block_hasher
        self.update_block_hashes()

    @property
    def has_encoder_inputs(self) -> bool:
        return bool(self.mm_features)

    # -- counters ---------------------------------------------------------------------------
    @property
    def num_tokens(self) -> int:
        return len(self._all_token_ids)

    @property
    def num_tokens_with_spec(self) -> int:
        """``num_tokens`` plus the drafts waiting to be verified."""
        return len(self._all_token_ids) + len(self.spec_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self._output_token_ids)

    @property
    def is_finished(self) -> bool:
        return self.status > RequestStatus.PREEMPTED

    def get_finished_reason(self) -> str | None:
        """``"stop"``, ``"length"``, ``"abort"`` once finished, else ``None``."""
        return _FINISHED_REASON.get(self.status)

    # -- tokens -----------------------------------------------------------------------------
    def append_output_token_ids(self, token_ids: int | Sequence[int]) -> None:
        """Append sampled token(s) and hash any block they complete."""
        if type(token_ids) is int and token_ids >= 0:  # the decode hot path: one sampled token
            self._output_token_ids.append(token_ids)
            self._all_token_ids.append(token_ids)
            self.update_block_hashes()
            return
        if isinstance(token_ids, numbers.Integral):
            new = [token_ids]
        else:
            new = list(token_ids)
        for tok in new:
            if not is_token_id(tok):
                raise ValueError(f"output token ids must be non-negative ints, got {tok!r}")
        new = [int(tok) for tok in new]
        self._output_token_ids.extend(new)
        self._all_token_ids.extend(new)
        self.update_block_hashes()

    def set_block_hasher(self, block_hasher: Callable[[Request], list[bytes]]) -> None:
        """Attach a hasher (the KV cache manager does this for requests built without one)."""
        self.block_hasher = block_hasher
        self.block_hashes.clear()
        self.update_block_hashes()

    def update_block_hashes(self) -> None:
        """Hash every block that became full since the last call (cheap when none did)."""
        hasher = self.block_hasher
        if hasher is None:
            return
        block_size = getattr(hasher, "block_size", None)
        if block_size is not None and len(self._all_token_ids) < (len(self.block_hashes) + 1) * block_size:
            return  # no block completed since the last call
        self.block_hashes.extend(hasher(self))

    # -- stopping ---------------------------------------------------------------------------
    def maybe_finish(self, max_model_len: int | None = None) -> bool:
        """Check the last output token; set a FINISHED_* status and return True if it stops.

        Order as upstream ``check_stop``: EOS (unless ``ignore_eos``), then stop tokens, then the
        length caps ``num_output_tokens >= max_tokens`` / ``num_tokens >= max_model_len``.
        An EOS that lands exactly on the cap therefore reports ``"stop"``.
        """
        # runs once per request per step: the properties (is_finished, num_*_tokens) are inlined
        if self.status > RequestStatus.PREEMPTED:
            return True
        outputs = self._output_token_ids
        if not outputs:
            return False
        last = outputs[-1]
        params = self.sampling_params
        if not params.ignore_eos and last == self.eos_token_id:
            self.status = RequestStatus.FINISHED_STOPPED
            return True
        if last in params.stop_token_ids:
            self.status = RequestStatus.FINISHED_STOPPED
            self.stop_reason = last
            return True
        if len(outputs) >= self.max_tokens or (
            max_model_len is not None and len(self._all_token_ids) >= max_model_len
        ):
            self.status = RequestStatus.FINISHED_LENGTH_CAPPED
            return True
        return False

    def __repr__(self) -> str:
        return (
            f"Request({self.request_id!r}, status={self.status.name}, "
            f"num_computed_tokens={self.num_computed_tokens}, num_tokens={self.num_tokens})"
        )


def check_cache_salt(cache_salt: object) -> None:
    """None, or a non-empty str (the OpenAI server's rule and message; ``LLM`` ignores an empty salt)."""
    if cache_salt is not None and (not isinstance(cache_salt, str) or not cache_salt):
        raise ValueError(f"Parameter 'cache_salt' must be a non-empty string if provided, got {cache_salt!r}")


def _check_mm_features(features: Sequence[MultiModalFeature], num_prompt_tokens: int) -> tuple[MultiModalFeature, ...]:
    """Images in prompt order, disjoint, inside the prompt (a bad request is refused before anything runs)."""
    out = tuple(features)
    end = 0
    for f in out:
        if not isinstance(f, MultiModalFeature):
            raise TypeError(f"mm_features must be MultiModalFeature objects, got {type(f).__name__}")
        if f.mm_position.offset < end:
            raise ValueError(f"mm_features must be in prompt order and disjoint: {f.identifier!r} starts at "
                             f"{f.mm_position.offset}, before the previous image ends ({end})")
        end = f.mm_position.end
        if end > num_prompt_tokens:
            raise ValueError(f"image {f.identifier!r} covers [{f.mm_position.offset}, {end}), past the "
                             f"{num_prompt_tokens}-token prompt")
    return out
