"""KV connectors: move a prompt's KV from a prefill engine to a decode engine through storage.

Mirrors ``vllm/distributed/kv_transfer/kv_connector/v1/base.py`` (``KVConnectorBase_V1``,
``KVConnectorRole``, ``KVConnectorMetadata``; both roles' methods under upstream's names),
``kv_connector/factory.py`` (``KVConnectorFactory.create_connector``) and
``kv_connector/v1/example_connector.py`` (``ExampleConnector``: ``ReqMeta.make_meta``,
``align_to_block_size``, one folder per prompt named by the md5 of its int64 token bytes, one
safetensors file per layer holding ``kv[:, slots]`` as ``(2, tokens, heads*head_size)``). The files
are byte-compatible with upstream's, read and written here with numpy alone.

The KV cache is mini's layout: per layer ``(2, num_blocks, block_size, num_kv_heads, head_size)``.
Differences, each deliberate: a load uses the key the match used (upstream re-derives it from the
whole prompt and misses the folder when the producer's prompt is a multiple of the block size); a
prompt with no full block stores nothing; a missing or corrupt file is found before any token is
promised and the request is recomputed with a logged reason (upstream's ``kv_load_failure_policy``
is ``"recompute"`` or ``"fail"``); a load that fails later reports its blocks through
``get_block_ids_with_load_errors``; ``load_async=True`` (extra config) returns ``(n, True)`` so the
scheduler parks the request in ``WAITING_FOR_REMOTE_KVS`` and the blocks are filled only when
``get_finished`` reports it, ``load_delay_steps`` calls later. Left out: MLA and Triton layouts,
handshakes, HMA, stats, events, multimodal keys beyond the ``mm_hashes`` suffix, other connectors.
"""

from __future__ import annotations

import enum
import hashlib
import json
import logging
import os
import struct
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .config import KVTransferConfig

logger = logging.getLogger(__name__)

_DTYPES = {"F16": np.float16, "F32": np.float32, "F64": np.float64}
_NAMES = {np.dtype(v): k for k, v in _DTYPES.items()}


class KVConnectorRole(enum.Enum):
    SCHEDULER = 0  # lives in the scheduler: decides what is matched, stored, loaded
    WORKER = 1  # lives next to the KV tensors: moves the bytes


class KVFileError(Exception):
    """A KV file that cannot be used: missing, truncated, or of the wrong shape or dtype."""


def align_to_block_size(num_tokens: int, block_size: int) -> int:
    """Upstream's rule: the full blocks before the last token, ``(n - 1) // bs * bs`` (>= 0 here)."""
    return max(0, (num_tokens - 1) // block_size * block_size)


def write_safetensors(path: str, array: np.ndarray, name: str = "kv_cache") -> None:
    """One tensor in the safetensors format, written to a temp name and renamed into place."""
    array = np.ascontiguousarray(array)
    if array.dtype not in _NAMES:
        raise TypeError(f"cannot store dtype {array.dtype}; use one of {sorted(_DTYPES)}")
    header = {
        name: {"dtype": _NAMES[array.dtype], "shape": list(array.shape), "data_offsets": [0, array.nbytes]}
    }
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw + array.astype(array.dtype.newbyteorder("<")).tobytes())
    os.replace(tmp, path)  # a reader never sees half a file


def read_safetensors(path: str, name: str = "kv_cache") -> np.ndarray:
    """The tensor ``name`` of a safetensors file; ``KVFileError`` says why a file is unusable."""
    try:
        with open(path, "rb") as f:
            blob = f.read()
    except OSError as e:
        raise KVFileError(f"cannot read {path}: {e.strerror or e}") from None
    try:
        (n,) = struct.unpack("<Q", blob[:8])
        meta = json.loads(blob[8 : 8 + n])[name]
        dtype, shape, (lo, hi) = np.dtype(_DTYPES[meta["dtype"]]), tuple(meta["shape"]), meta["data_offsets"]
    except (struct.error, ValueError, KeyError, TypeError) as e:
        raise KVFileError(f"{path}: unreadable header ({type(e).__name__})") from None
    data = blob[8 + n + lo : 8 + n + hi]
    if hi - lo != int(np.prod(shape)) * dtype.itemsize or len(data) != hi - lo:
        raise KVFileError(f"{path}: {len(data)} data bytes for shape {shape} {dtype} (truncated?)")
    return np.frombuffer(data, dtype=dtype.newbyteorder("<")).astype(dtype).reshape(shape)


@dataclass
class ReqMeta:
    """One request's transfer this step (upstream's ``ReqMeta`` plus the request id)."""

    req_id: str
    token_ids: np.ndarray  # the key tokens: a whole number of blocks
    slot_mapping: np.ndarray  # slot = block_id * block_size + offset, one per key token
    is_store: bool
    mm_hashes: list[str]

    @staticmethod
    def make_meta(
        req_id: str,
        token_ids: Sequence[int],
        block_ids: Sequence[int],
        block_size: int,
        is_store: bool,
        mm_hashes: Sequence[str] = (),
        num_tokens: int | None = None,
    ) -> ReqMeta:
        """``num_tokens`` (default: the aligned length) tokens and their slots in ``block_ids``."""
        n = align_to_block_size(len(token_ids), block_size) if num_tokens is None else num_tokens
        blocks = np.asarray(block_ids, dtype=np.int64)
        slots = (blocks[:, None] * block_size + np.arange(block_size, dtype=np.int64)).reshape(-1)[:n]
        if len(slots) < n:
            raise ValueError(f"{n} tokens need {-(-n // block_size)} blocks, got {len(blocks)}")
        return ReqMeta(req_id, np.asarray(token_ids[:n], dtype=np.int64), slots, is_store, list(mm_hashes))


@dataclass
class KVConnectorMetadata:
    """What the scheduler side hands the worker side each step (in ``SchedulerOutput``)."""

    requests: list[ReqMeta] = field(default_factory=list)


class KVConnectorBase_V1:
    """Both roles' hooks, as upstream names them; a subclass implements the ones its role uses."""

    def __init__(
        self, config: KVTransferConfig, role: KVConnectorRole, block_size: int, layer_names: Sequence[str]
    ) -> None:
        self.config, self.role, self.block_size = config, role, block_size
        self.layer_names = list(layer_names)
        self._metadata: KVConnectorMetadata | None = None

    # worker side ---------------------------------------------------------------------------------
    def bind_connector_metadata(self, metadata: KVConnectorMetadata) -> None:
        self._metadata = metadata

    def clear_connector_metadata(self) -> None:
        self._metadata = None

    def _get_connector_metadata(self) -> KVConnectorMetadata:
        if self._metadata is None:
            raise RuntimeError("no connector metadata bound: call bind_connector_metadata() first")
        return self._metadata

    def register_kv_caches(self, kv_caches: Mapping[str, np.ndarray]) -> None:
        raise NotImplementedError

    def start_load_kv(self, **kwargs: Any) -> None:
        raise NotImplementedError

    def wait_for_layer_load(self, layer_name: str) -> None:
        raise NotImplementedError

    def save_kv_layer(self, layer_name: str, kv_layer: np.ndarray, attn_metadata: Any = None) -> None:
        raise NotImplementedError

    def wait_for_save(self) -> None:
        raise NotImplementedError

    def get_finished(self, finished_req_ids: Iterable[str]) -> tuple[set[str] | None, set[str] | None]:
        """(finished sending, finished receiving) request ids; ``None`` for nothing."""
        return None, None

    def get_block_ids_with_load_errors(self) -> set[int]:
        return set()

    # scheduler side ------------------------------------------------------------------------------
    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int) -> tuple[int | None, bool]:
        raise NotImplementedError

    def update_state_after_alloc(self, request: Any, block_ids: Any, num_external_tokens: int) -> None:
        raise NotImplementedError

    def build_connector_meta(self, scheduler_output: Any) -> KVConnectorMetadata:
        raise NotImplementedError

    def request_finished(self, request: Any, block_ids: Sequence[int]) -> tuple[bool, dict[str, Any] | None]:
        """(free the blocks later?, params for the other engine). Saves here are synchronous."""
        return False, None


def _block_ids(blocks: Any) -> list[int]:
    """Block ids from a list of ints, of blocks with ``block_id``, or a ``KVCacheBlocks``-like."""
    if hasattr(blocks, "get_block_ids"):
        blocks = blocks.get_block_ids()[0]
    return [b if isinstance(b, (int, np.integer)) else b.block_id for b in blocks]


class ExampleConnector(KVConnectorBase_V1):
    """Shared storage: the producer writes each prompt's full blocks; a consumer reads them back."""

    def __init__(
        self, config: KVTransferConfig, role: KVConnectorRole, block_size: int, layer_names: Sequence[str]
    ) -> None:
        super().__init__(config, role, block_size, layer_names)
        extra = config.kv_connector_extra_config
        self.storage_path = str(extra.get("shared_storage_path", "/tmp"))
        self.load_async = bool(extra.get("load_async", False))
        self.load_delay_steps = int(extra.get("load_delay_steps", 1 if self.load_async else 0))
        self._need_load: dict[
            str, tuple[list[int], list[int], int, list[str]]
        ] = {}  # id -> tokens, blocks, n, mm
        self.fallbacks: list[tuple[str, str]] = []  # (request id, reason) for each recompute
        # stores planned but not yet due: id -> [tokens, blocks so far, n, mm, tokens computed by then]
        self._pending_store: dict[str, list[Any]] = {}
        self.kv_caches: dict[str, np.ndarray] = {}
        self._pending: list[list[Any]] = []  # async loads in flight: [steps left, ReqMeta]
        self._load_errors: set[int] = set()
        self.bytes_saved = self.bytes_loaded = 0

    # keys and files ------------------------------------------------------------------------------
    def _foldername(self, token_ids: Sequence[int], mm_hashes: Sequence[str] = ()) -> str:
        data = np.asarray(token_ids, dtype=np.int64).tobytes()
        if mm_hashes:
            data += "-".join(mm_hashes).encode()
        return os.path.join(self.storage_path, hashlib.md5(data, usedforsecurity=False).hexdigest())

    def _filename(self, layer_name: str, token_ids: Sequence[int], mm_hashes: Sequence[str] = ()) -> str:
        return os.path.join(self._foldername(token_ids, mm_hashes), f"{layer_name}.safetensors")

    def _check_files(self, token_ids: Sequence[int], mm_hashes: Sequence[str]) -> str | None:
        """Why the stored KV for ``token_ids`` cannot be used, or ``None`` when every layer is there."""
        for layer in self.layer_names:
            try:
                shape = read_safetensors(self._filename(layer, token_ids, mm_hashes)).shape
            except KVFileError as e:
                return str(e)
            if len(shape) != 3 or shape[:2] != (2, len(token_ids)):
                return f"layer {layer}: stored shape {shape}, expected (2, {len(token_ids)}, heads*head_size)"
        return None

    # scheduler side ------------------------------------------------------------------------------
    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int) -> tuple[int, bool]:
        prompt = list(request.prompt_token_ids)
        n = align_to_block_size(len(prompt) - 1, self.block_size)  # the prompt is P's prompt + 1 token
        mm = [f.identifier for f in getattr(request, "mm_features", ())]
        if n <= num_computed_tokens or not os.path.isdir(self._foldername(prompt[:n], mm)):
            return 0, False
        reason = self._check_files(prompt[:n], mm)
        if reason is not None:
            logger.warning(
                "request %s: stored KV unusable, recomputing %d tokens: %s", request.request_id, n, reason
            )
            self.fallbacks.append((request.request_id, reason))
            return 0, False
        logger.info("request %s: external KV hit, %d tokens", request.request_id, n)
        return n - num_computed_tokens, self.load_async

    def update_state_after_alloc(self, request: Any, block_ids: Any, num_external_tokens: int) -> None:
        if num_external_tokens > 0:
            n = align_to_block_size(len(request.prompt_token_ids) - 1, self.block_size)
            mm = [f.identifier for f in getattr(request, "mm_features", ())]
            self._need_load[request.request_id] = (
                list(request.prompt_token_ids[:n]),
                _block_ids(block_ids),
                n,
                mm,
            )

    def build_connector_meta(self, scheduler_output: Any) -> KVConnectorMetadata:
        """Loads for every request allocated since the last call; stores for new prompts not on disk.

        A prompt's store is due in the step that computes its last stored token: at once for a
        prompt scheduled whole, at its last needed chunk under chunked prefill (upstream's example
        plans every store at admission, with the blocks allocated by then).
        """
        meta = KVConnectorMetadata()
        for rid, (tokens, blocks, n, mm) in self._need_load.items():
            meta.requests.append(
                ReqMeta.make_meta(rid, tokens, blocks, self.block_size, False, mm, num_tokens=n)
            )
        scheduled = getattr(scheduler_output, "num_scheduled_tokens", None)  # None: whole prompts
        new_block_ids = getattr(scheduler_output, "req_to_new_block_ids", {})
        for rid in getattr(scheduler_output, "preempted_req_ids", ()):
            self._pending_store.pop(rid, None)  # its blocks are gone: it will not be stored
        for rid in getattr(scheduler_output, "finished_req_ids", ()):
            self._pending_store.pop(rid, None)
        for rid, pending in self._pending_store.items():  # a chunked prompt's later chunks
            pending[1].extend(new_block_ids.get(rid, ()))
            pending[4] += scheduled.get(rid, 0) if scheduled is not None else 0
        for req in scheduler_output.scheduled_new_reqs:
            if req.request_id in self._need_load:
                continue
            tokens = list(req.prompt_token_ids)
            mm = [f.identifier for f in getattr(req, "mm_features", ())]
            n = align_to_block_size(len(tokens), self.block_size)
            if n > 0 and not os.path.isdir(self._foldername(tokens[:n], mm)):
                done = (
                    n
                    if scheduled is None
                    else getattr(req, "num_computed_tokens", 0) + scheduled[req.request_id]
                )
                blocks = list(new_block_ids[req.request_id])
                self._pending_store[req.request_id] = [tokens, blocks, n, mm, done]
        for rid, (tokens, blocks, n, mm, done) in list(self._pending_store.items()):
            if done >= n:  # the forward of this step computes the last stored token: save after it
                meta.requests.append(ReqMeta.make_meta(rid, tokens, blocks, self.block_size, True, mm))
                del self._pending_store[rid]
        self._need_load.clear()
        return meta

    # worker side ---------------------------------------------------------------------------------
    def register_kv_caches(self, kv_caches: Mapping[str, np.ndarray]) -> None:
        for name, kv in kv_caches.items():
            if kv.ndim != 5 or kv.shape[0] != 2 or kv.shape[2] != self.block_size:
                raise ValueError(
                    f"layer {name}: KV cache shape {kv.shape}, expected (2, num_blocks, {self.block_size}, "
                    "num_kv_heads, head_size)"
                )
        self.kv_caches = dict(kv_caches)

    def save_kv_layer(self, layer_name: str, kv_layer: np.ndarray, attn_metadata: Any = None) -> None:
        for req in self._get_connector_metadata().requests:
            if req.is_store:
                rows = kv_layer.reshape(2, -1, kv_layer.shape[3] * kv_layer.shape[4])[:, req.slot_mapping]
                os.makedirs(self._foldername(req.token_ids, req.mm_hashes), exist_ok=True)
                write_safetensors(self._filename(layer_name, req.token_ids, req.mm_hashes), rows)
                self.bytes_saved += rows.nbytes

    def wait_for_save(self) -> None:
        return  # save_kv_layer wrote synchronously

    def start_load_kv(self, **kwargs: Any) -> None:
        for req in self._get_connector_metadata().requests:
            if not req.is_store:
                if self.load_async:
                    self._pending.append([self.load_delay_steps, req])
                else:
                    self._load(req)

    def wait_for_layer_load(self, layer_name: str) -> None:
        return  # start_load_kv loads every layer at once

    def _load(self, req: ReqMeta) -> bool:
        """Read every layer first, then write; a bad file changes nothing and reports the blocks."""
        rows = {}
        for layer, kv in self.kv_caches.items():
            try:
                rows[layer] = read_safetensors(self._filename(layer, req.token_ids, req.mm_hashes))
            except KVFileError as e:
                rows, reason = None, str(e)
                break
            if rows[layer].shape != (2, len(req.slot_mapping), kv.shape[3] * kv.shape[4]):
                rows, reason = None, f"layer {layer}: stored shape {rows[layer].shape} does not fit the cache"
                break
        if rows is None:
            logger.warning("request %s: KV load failed, blocks to recompute: %s", req.req_id, reason)
            self._load_errors |= {int(s) // self.block_size for s in req.slot_mapping}
            self.fallbacks.append((req.req_id, reason))
            return False
        for layer, kv in self.kv_caches.items():
            kv.reshape(2, -1, kv.shape[3] * kv.shape[4])[:, req.slot_mapping] = rows[layer]
            self.bytes_loaded += rows[layer].nbytes
        return True

    def get_finished(self, finished_req_ids: Iterable[str] = ()) -> tuple[set[str] | None, set[str] | None]:
        """One call per step: async loads whose delay ran out land now and are reported received."""
        done, still = set(), []
        for entry in self._pending:
            if entry[0] <= 0:
                self._load(entry[1])
                done.add(entry[1].req_id)
            else:
                entry[0] -= 1
                still.append(entry)
        self._pending = still
        return None, done or None

    def get_block_ids_with_load_errors(self) -> set[int]:
        errors, self._load_errors = self._load_errors, set()
        return errors


def kv_layer_names(num_layers: int) -> list[str]:
    """The attention layers' names, as upstream's ``Attention`` modules are prefixed (one file each)."""
    return [f"model.layers.{i}.self_attn.attn" for i in range(num_layers)]


class KVConnectorFactory:
    """Connector name → class, as upstream's factory registers them."""

    _registry: dict[str, type[KVConnectorBase_V1]] = {"ExampleConnector": ExampleConnector}

    @classmethod
    def register_connector(cls, name: str, connector_cls: type[KVConnectorBase_V1]) -> None:
        if name in cls._registry:
            raise ValueError(f"connector {name!r} is already registered")
        cls._registry[name] = connector_cls

    @classmethod
    def create_connector(
        cls, config: KVTransferConfig, role: KVConnectorRole, block_size: int, layer_names: Sequence[str]
    ) -> KVConnectorBase_V1:
        if config.kv_connector not in cls._registry:
            raise ValueError(
                f"unknown kv_connector {config.kv_connector!r}; registered: {sorted(cls._registry)}"
            )
        return cls._registry[config.kv_connector](config, role, block_size, layer_names)
