"""Paged KV cache and paged attention in numpy: the per-layer tensors, the write, the read.

Mirrors the FlashAttention backend: vllm/v1/attention/backends/flash_attn.py:140 —
get_kv_cache_shape (one tensor per layer, ``(2, num_blocks, block_size, num_kv_heads,
head_size)``: keys at ``[0]``, values at ``[1]``), vllm/v1/attention/backends/flash_attn.py:223 —
FlashAttentionMetadata (the seven fields below), vllm/_custom_ops.py:2591 —
reshape_and_cache_flash (the cache write; slot ``-1`` is a padding token, skipped), and the
contract of ``flash_attn_varlen_func``: one flat batch, prefill chunks and decodes mixed, each
request reading its keys through its block table, causal inside a chunk (bottom-right aligned),
query head ``h`` reading KV head ``h // (num_heads // num_kv_heads)``. The slot rule is
vllm/v1/worker/block_table.py:141 — compute_slot_mapping: position ``p`` of a request lives at
``block_table[p // block_size] * block_size + p % block_size``.

Left out: cascade attention, sliding windows, ALiBi, soft-capping, FP8 KV, KV-sharing layers,
decode-only fast paths, CUDA graph padding. The kernel is a loop over requests with one softmax
per request, in float32 (upstream's kernels tile and keep an online softmax; the numbers agree to
rounding).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class KVCacheSpec:
    """What a model needs from the KV cache (vllm/v1/kv_cache_interface.py:188 — FullAttentionSpec)."""

    num_layers: int
    num_kv_heads: int
    head_size: int
    dtype: type = np.float32

    def page_size_bytes(self, block_size: int) -> int:
        """Bytes of one block across all layers: K and V, ``block_size`` tokens each."""
        return (
            2
            * block_size
            * self.num_kv_heads
            * self.head_size
            * np.dtype(self.dtype).itemsize
            * self.num_layers
        )


@dataclass
class AttentionMetadata:
    """One step's batch layout, shared by every attention layer (``FlashAttentionMetadata``).

    ``query_start_loc[r]:query_start_loc[r + 1]`` are request ``r``'s tokens in the flat batch;
    ``seq_lens[r]`` counts its tokens in the KV cache *including* this step's, so query ``i`` of
    request ``r`` sits at position ``seq_lens[r] - query_len_r + i``.
    """

    num_actual_tokens: int
    max_query_len: int
    query_start_loc: np.ndarray  # int32[B + 1]
    max_seq_len: int
    seq_lens: np.ndarray  # int32[B]
    block_table: np.ndarray  # int32[B, max_blocks_per_req]
    slot_mapping: np.ndarray  # int64[T]; -1 = padding, skipped

    @classmethod
    def build(cls, query_lens, seq_lens, block_table, block_size: int) -> AttentionMetadata:
        """The metadata of one step from per-request query lengths, KV lengths and block tables."""
        q = np.asarray(query_lens, dtype=np.int32)
        s = np.asarray(seq_lens, dtype=np.int32)
        table = np.asarray(block_table, dtype=np.int32)
        if q.ndim != 1 or s.shape != q.shape or table.ndim != 2 or table.shape[0] != q.shape[0]:
            raise ValueError(
                f"query_lens {q.shape}, seq_lens {s.shape} and block_table {table.shape} must describe the same B requests"
            )
        if (q < 0).any() or (s < q).any():
            raise ValueError(f"need 0 <= query_len <= seq_len per request, got query_lens={q}, seq_lens={s}")
        qsl = np.zeros(q.size + 1, dtype=np.int32)
        np.cumsum(q, out=qsl[1:])
        slots = compute_slot_mapping(table, qsl, s, block_size)
        return cls(
            num_actual_tokens=int(qsl[-1]),
            max_query_len=int(q.max(initial=0)),
            query_start_loc=qsl,
            max_seq_len=int(s.max(initial=0)),
            seq_lens=s,
            block_table=table,
            slot_mapping=slots,
        )


def kv_cache_shape(num_blocks: int, block_size: int, num_kv_heads: int, head_size: int) -> tuple[int, ...]:
    """``FlashAttentionBackend.get_kv_cache_shape``: K and V of every block, token-major."""
    return (2, num_blocks, block_size, num_kv_heads, head_size)


def allocate_kv_caches(
    num_layers, num_blocks, block_size, num_kv_heads, head_size, dtype=np.float32
) -> list[np.ndarray]:
    """One zeroed KV tensor per attention layer, each ``kv_cache_shape(...)``."""
    for name, value, low in (
        ("num_layers", num_layers, 0),
        ("num_blocks", num_blocks, 1),
        ("block_size", block_size, 1),
        ("num_kv_heads", num_kv_heads, 1),
        ("head_size", head_size, 1),
    ):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
            raise ValueError(f"{name} must be an int >= {low}, got {value!r}")
    shape = kv_cache_shape(num_blocks, block_size, num_kv_heads, head_size)
    return [np.zeros(shape, dtype=dtype) for _ in range(num_layers)]


def compute_slot_mapping(block_table, query_start_loc, seq_lens, block_size: int) -> np.ndarray:
    """The cache slot of every token this step: ``block_id * block_size + position % block_size``.

    Token ``i`` of request ``r`` is at position ``seq_lens[r] - query_len_r + i``; its block is
    entry ``position // block_size`` of the request's row in ``block_table``.
    """
    table = np.asarray(block_table)
    qsl = np.asarray(query_start_loc)
    s = np.asarray(seq_lens)
    slots = np.empty(int(qsl[-1]) if qsl.size else 0, dtype=np.int64)
    for r in range(s.size):
        start, end = int(qsl[r]), int(qsl[r + 1])
        positions = np.arange(int(s[r]) - (end - start), int(s[r]))
        index = positions // block_size
        if positions.size and index[-1] >= table.shape[1]:
            raise ValueError(
                f"request {r}: position {positions[-1]} needs block-table entry {index[-1]}, "
                f"the table has {table.shape[1]} columns"
            )
        slots[start:end] = table[r, index].astype(np.int64) * block_size + positions % block_size
    return slots


def _check_cache(kv_cache: np.ndarray) -> None:
    if not isinstance(kv_cache, np.ndarray) or kv_cache.ndim != 5 or kv_cache.shape[0] != 2:
        shape = getattr(kv_cache, "shape", type(kv_cache).__name__)
        raise ValueError(
            f"kv_cache must be (2, num_blocks, block_size, num_kv_heads, head_size), got {shape}"
        )


def reshape_and_cache(key, value, kv_cache, slot_mapping) -> None:
    """Write this step's keys and values ``[T, num_kv_heads, head_size]`` into their slots.

    ``slot_mapping[i]`` is the flat slot of token ``i``; ``-1`` skips it (a padding token). Only
    the first ``len(slot_mapping)`` tokens are written, as upstream's kernel counts tokens from the
    slot mapping. Every slot is checked before anything is written.
    """
    _check_cache(kv_cache)
    _, num_blocks, block_size, num_kv_heads, head_size = kv_cache.shape
    key, value = np.asarray(key), np.asarray(value)
    slots = np.asarray(slot_mapping)
    want = (num_kv_heads, head_size)
    if key.ndim != 3 or value.shape != key.shape or key.shape[1:] != want:
        raise ValueError(
            f"key and value must both be [T, {num_kv_heads}, {head_size}], got {key.shape} and {value.shape}"
        )
    if slots.ndim != 1 or not np.issubdtype(slots.dtype, np.integer) or slots.size > key.shape[0]:
        raise ValueError(
            f"slot_mapping must be 1-D integers, at most T={key.shape[0]} long, got {slots.dtype} {slots.shape}"
        )
    bad = (slots < -1) | (slots >= num_blocks * block_size)
    if bad.any():
        raise ValueError(
            f"slot {int(slots[bad][0])} is outside the cache's {num_blocks * block_size} slots (-1 = skip)"
        )
    keep = np.nonzero(slots >= 0)[0]
    blocks, offsets = slots[keep] // block_size, slots[keep] % block_size
    kv_cache[0, blocks, offsets] = key[keep]
    kv_cache[1, blocks, offsets] = value[keep]


def _check_metadata(query: np.ndarray, kv_cache: np.ndarray, md: AttentionMetadata) -> None:
    _check_cache(kv_cache)
    _, num_blocks, block_size, num_kv_heads, head_size = kv_cache.shape
    if query.ndim != 3 or query.shape[2] != head_size:
        raise ValueError(f"query must be [T, num_heads, {head_size}], got {query.shape}")
    if query.shape[1] % num_kv_heads:
        raise ValueError(
            f"num_heads {query.shape[1]} is not a multiple of num_kv_heads {num_kv_heads} (GQA groups)"
        )
    qsl, seq_lens, table = md.query_start_loc, md.seq_lens, md.block_table
    b = seq_lens.shape[0] if seq_lens.ndim == 1 else -1
    if b < 0 or qsl.shape != (b + 1,) or table.ndim != 2 or table.shape[0] != b:
        raise ValueError(
            f"query_start_loc {qsl.shape}, seq_lens {seq_lens.shape}, block_table {table.shape}: need [B+1], [B], [B, n]"
        )
    q_lens = np.diff(qsl)
    if b and (qsl[0] != 0 or (q_lens < 0).any()):
        raise ValueError(f"query_start_loc must start at 0 and never decrease, got {qsl}")
    if int(qsl[-1]) != md.num_actual_tokens or md.num_actual_tokens > query.shape[0]:
        raise ValueError(
            f"num_actual_tokens {md.num_actual_tokens} must equal query_start_loc[-1] {int(qsl[-1])} "
            f"and fit the {query.shape[0]} query rows"
        )
    if (seq_lens < q_lens).any():
        raise ValueError(f"seq_lens {seq_lens} must be >= each request's query length {q_lens}")
    blocks_needed = -(-seq_lens // block_size)
    if b and blocks_needed.max() > table.shape[1]:
        raise ValueError(
            f"a request of {seq_lens.max()} tokens needs {blocks_needed.max()} blocks; block_table has {table.shape[1]}"
        )
    for r in range(b):
        used = table[r, : blocks_needed[r]]
        if used.size and (used.min() < 0 or used.max() >= num_blocks):
            raise ValueError(f"request {r}: block ids {used} must lie in [0, {num_blocks})")


def paged_attention(query, kv_cache, attn_metadata: AttentionMetadata, scale: float) -> np.ndarray:
    """Causal GQA attention of a varlen batch over the paged cache: ``[T, Hq, D] -> [T, Hq, D]``.

    Request ``r``'s keys and values are gathered from its first ``ceil(seq_len / block_size)``
    blocks; its query ``i`` (position ``seq_len - query_len + i``) sees keys ``0..position``.
    Rows past ``num_actual_tokens`` (padding) come back as zeros.
    """
    query = np.asarray(query)
    md = attn_metadata
    _check_metadata(query, kv_cache, md)
    _, _, block_size, num_kv_heads, head_size = kv_cache.shape
    num_heads = query.shape[1]
    group = num_heads // num_kv_heads
    kv_head_of = np.arange(num_heads) // group  # query head h reads KV head h // group
    out = np.zeros(query.shape, dtype=np.float32)
    for r in range(md.seq_lens.shape[0]):
        start, end = int(md.query_start_loc[r]), int(md.query_start_loc[r + 1])
        seq_len, q_len = int(md.seq_lens[r]), end - start
        if q_len == 0:
            continue
        blocks = md.block_table[r, : -(-seq_len // block_size)]
        k = kv_cache[0, blocks].reshape(-1, num_kv_heads, head_size)[:seq_len][:, kv_head_of]  # [S, Hq, D]
        v = kv_cache[1, blocks].reshape(-1, num_kv_heads, head_size)[:seq_len][:, kv_head_of]
        q = query[start:end].astype(np.float32)
        scores = np.einsum("qhd,khd->hqk", q, k) * np.float32(scale)  # [Hq, q_len, S]
        q_pos = np.arange(seq_len - q_len, seq_len)
        visible = np.arange(seq_len)[None, :] <= q_pos[:, None]  # [q_len, S]
        scores = np.where(visible[None], scores, -np.inf)
        scores = scores - scores.max(axis=-1, keepdims=True)
        probs = np.exp(scores)
        probs /= probs.sum(axis=-1, keepdims=True)
        out[start:end] = np.einsum("hqk,khd->qhd", probs, v)
    return out
