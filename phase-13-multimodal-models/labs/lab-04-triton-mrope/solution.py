"""Lab 13-04 — multimodal rotary embedding (M-RoPE) in Triton (reference solution).

A Qwen2-VL token has three positions, not one: time ``t``, height ``h`` and width ``w`` (a text
token has ``t == h == w``; an image patch shares ``t`` with its image and takes its row and column
as ``h`` and ``w``). M-RoPE splits the ``rotary_dim // 2`` rotation frequencies into three runs,
``mrope_section = [s_t, s_h, s_w]`` with ``s_t + s_h + s_w == rotary_dim // 2``: frequency ``i``
rotates by the ``t`` position when ``i < s_t``, by ``h`` when ``i < s_t + s_h``, else by ``w``.
The rotation itself is plain neox-style RoPE on the first ``rotary_dim`` features of every head::

    c, s = cos(pos_i · θ_i), sin(pos_i · θ_i)          i in [0, rotary_dim / 2)
    x1, x2 = x[i], x[i + rotary_dim / 2]
    x[i]                  <- x1 · c - x2 · s
    x[i + rotary_dim / 2] <- x2 · c + x1 · s           features past rotary_dim pass through

The cache holds ``cos | sin`` per position: ``cos_sin_cache[p] = [cos(p θ_0..) | sin(p θ_0..)]``,
shape ``(max_positions, rotary_dim)``, vLLM's ``RotaryEmbeddingBase.cos_sin_cache`` layout.

The kernel is one program per token. It loads the token's three positions, picks one per
frequency, gathers cos and sin straight from the cache (no ``(3, T, rotary_dim)`` intermediate),
and rotates every query head and every key head of the token in place. ``q`` and ``k`` may be
column slices of one fused ``qkv`` tensor: each carries its own row stride, and token offsets are
int64 (``token * row_stride`` and ``position * cache_stride`` both pass 2**31 on big inputs).
"""

from __future__ import annotations

import os

import numpy as np
import torch

if not torch.cuda.is_available():               # no GPU: run the kernel in Triton's CPU interpreter
    os.environ.setdefault("TRITON_INTERPRET", "1")

import triton
import triton.language as tl


# --------------------------------------------------------------------------- provided: the cache
def rope_cache(max_positions: int, rotary_dim: int, base: float = 10000.0) -> np.ndarray:
    """``(max_positions, rotary_dim)`` float32: ``[cos(p·θ) | sin(p·θ)]`` with ``θ_i = base^(-2i/rotary_dim)``."""
    inv_freq = 1.0 / base ** (np.arange(0, rotary_dim, 2, dtype=np.float64) / rotary_dim)
    angles = np.arange(max_positions, dtype=np.float64)[:, None] * inv_freq[None, :]
    return np.concatenate([np.cos(angles), np.sin(angles)], axis=1).astype(np.float32)


# --------------------------------------------------------------------------- the lab: numpy reference
def check_section(mrope_section, rotary_dim: int) -> tuple[int, int, int]:
    """``(s_t, s_h, s_w)`` as ints; ``ValueError`` unless three non-negative ints summing to ``rotary_dim // 2``."""
    sec = tuple(int(s) for s in mrope_section)
    if len(sec) != 3 or min(sec) < 0:
        raise ValueError(f"mrope_section must be three non-negative ints [t, h, w], got {list(mrope_section)}")
    if sum(sec) != rotary_dim // 2:
        raise ValueError(
            f"mrope_section {list(sec)} sums to {sum(sec)}, but rotary_dim {rotary_dim} has {rotary_dim // 2} frequencies"
        )
    return sec


def mrope_cos_sin(positions: np.ndarray, cos_sin_cache: np.ndarray, mrope_section) -> tuple[np.ndarray, np.ndarray]:
    """Per-token ``cos`` and ``sin``, each ``(num_tokens, rotary_dim // 2)``.

    ``positions`` is ``(3, T)`` (t, h, w) or ``(T,)`` (text: one stream for all frequencies).
    Frequency ``i`` reads the row of the stream its section names: t for ``i < s_t``, h for
    ``i < s_t + s_h``, w after."""
    cache = np.asarray(cos_sin_cache)
    half = cache.shape[1] // 2
    s_t, s_h, _ = check_section(mrope_section, cache.shape[1])
    pos = np.asarray(positions, dtype=np.int64)
    if pos.ndim == 1:
        pos = np.broadcast_to(pos, (3, pos.shape[0]))
    stream = np.where(np.arange(half) < s_t, 0, np.where(np.arange(half) < s_t + s_h, 1, 2))   # (half,)
    rows = pos[stream, :].T                                               # (T, half): the position each frequency uses
    freq = np.arange(half)[None, :]
    return cache[rows, freq], cache[rows, half + freq]


def mrope_reference(positions, q, k, cos_sin_cache, head_size: int, rotary_dim: int, mrope_section):
    """float64 numpy M-RoPE: returns rotated copies of ``q (T, nq·head_size)`` and ``k (T, nk·head_size)``."""
    cos, sin = (a.astype(np.float64) for a in mrope_cos_sin(positions, cos_sin_cache, mrope_section))
    half = rotary_dim // 2

    def rotate(x):
        x = np.array(x, dtype=np.float64)
        heads = x.reshape(x.shape[0], -1, head_size)                     # a view: edits land in x
        x1, x2 = heads[..., :half].copy(), heads[..., half:rotary_dim].copy()
        heads[..., :half] = x1 * cos[:, None, :] - x2 * sin[:, None, :]
        heads[..., half:rotary_dim] = x2 * cos[:, None, :] + x1 * sin[:, None, :]
        return x

    return rotate(q), rotate(k)


# --------------------------------------------------------------------------- the lab: the kernel
@triton.jit
def _mrope_kernel(
    Q, K, POS, CACHE,
    stride_q, stride_k, stride_pos_stream, stride_pos_tok, stride_cache,
    NUM_Q_HEADS: tl.constexpr, NUM_K_HEADS: tl.constexpr, HEAD_SIZE: tl.constexpr, HALF: tl.constexpr,
    SEC_T: tl.constexpr, SEC_H: tl.constexpr,
    PAD_Q_HEADS: tl.constexpr, PAD_K_HEADS: tl.constexpr, PAD_HALF: tl.constexpr,
):
    tok = tl.program_id(0).to(tl.int64)                      # int64: tok * stride_q passes 2**31 on big batches
    i = tl.arange(0, PAD_HALF)
    f_ok = i < HALF
    p_t = tl.load(POS + tok * stride_pos_tok).to(tl.int64)
    p_h = tl.load(POS + stride_pos_stream + tok * stride_pos_tok).to(tl.int64)
    p_w = tl.load(POS + 2 * stride_pos_stream + tok * stride_pos_tok).to(tl.int64)
    pos = tl.where(i < SEC_T, p_t, tl.where(i < SEC_T + SEC_H, p_h, p_w))
    row = CACHE + pos * stride_cache                         # int64 pointer offsets, one row per frequency
    cos = tl.load(row + i, mask=f_ok, other=0.0).to(tl.float32)[None, :]
    sin = tl.load(row + HALF + i, mask=f_ok, other=0.0).to(tl.float32)[None, :]

    hq = tl.arange(0, PAD_Q_HEADS)[:, None]
    q_off = tok * stride_q + hq * HEAD_SIZE + i[None, :]
    q_ok = (hq < NUM_Q_HEADS) & f_ok[None, :]
    q1 = tl.load(Q + q_off, mask=q_ok, other=0.0)
    q2 = tl.load(Q + q_off + HALF, mask=q_ok, other=0.0)
    a, b = q1.to(tl.float32), q2.to(tl.float32)
    tl.store(Q + q_off, (a * cos - b * sin).to(q1.dtype), mask=q_ok)
    tl.store(Q + q_off + HALF, (b * cos + a * sin).to(q1.dtype), mask=q_ok)

    hk = tl.arange(0, PAD_K_HEADS)[:, None]
    k_off = tok * stride_k + hk * HEAD_SIZE + i[None, :]
    k_ok = (hk < NUM_K_HEADS) & f_ok[None, :]
    k1 = tl.load(K + k_off, mask=k_ok, other=0.0)
    k2 = tl.load(K + k_off + HALF, mask=k_ok, other=0.0)
    a, b = k1.to(tl.float32), k2.to(tl.float32)
    tl.store(K + k_off, (a * cos - b * sin).to(k1.dtype), mask=k_ok)
    tl.store(K + k_off + HALF, (b * cos + a * sin).to(k1.dtype), mask=k_ok)


def mrope_forward(positions, q, k, cos_sin_cache, head_size: int, rotary_dim: int, mrope_section):
    """Rotate ``q (T, nq·head_size)`` and ``k (T, nk·head_size)`` in place; returns ``(q, k)``.

    ``positions``: int64, ``(3, T)`` or ``(T,)``. ``cos_sin_cache``: ``(max_positions, rotary_dim)``.
    ``q`` and ``k`` may have any row stride (slices of a fused qkv) but unit column stride.
    Raises ``ValueError`` for a section that does not sum to ``rotary_dim // 2``, an odd or
    too-large ``rotary_dim``, widths that are not whole heads, mismatched token counts, a cache of
    the wrong width or a non-unit column stride; ``TypeError`` for positions that are not int64."""
    sec_t, sec_h, _ = check_section(mrope_section, rotary_dim)
    if rotary_dim <= 0 or rotary_dim % 2 or rotary_dim > head_size:
        raise ValueError(f"rotary_dim must be even and in [2, head_size={head_size}], got {rotary_dim}")
    if positions.dtype != torch.int64:
        raise TypeError(f"positions must be int64 (positions times a row stride pass 2**31), got {positions.dtype}")
    if q.ndim != 2 or k.ndim != 2 or q.shape[1] % head_size or k.shape[1] % head_size:
        raise ValueError(f"q {tuple(q.shape)} and k {tuple(k.shape)} must be (tokens, heads * {head_size})")
    num_tokens = q.shape[0]
    if k.shape[0] != num_tokens or positions.shape[-1] != num_tokens or positions.ndim not in (1, 2) or (
        positions.ndim == 2 and positions.shape[0] != 3
    ):
        raise ValueError(
            f"token counts disagree: q {tuple(q.shape)}, k {tuple(k.shape)}, positions {tuple(positions.shape)} "
            "(positions is (3, T) or (T,))"
        )
    if cos_sin_cache.ndim != 2 or cos_sin_cache.shape[1] != rotary_dim or cos_sin_cache.stride(1) != 1:
        raise ValueError(f"cos_sin_cache must be (max_positions, rotary_dim={rotary_dim}) with unit column stride")
    if q.stride(1) != 1 or k.stride(1) != 1:
        raise ValueError(f"q and k need unit column stride (got {q.stride()} and {k.stride()}); any row stride is fine")
    if num_tokens == 0:
        return q, k
    nq, nk = q.shape[1] // head_size, k.shape[1] // head_size
    # (T,) positions: every stream reads the same row (stream stride 0), which is plain RoPE
    stride_stream = positions.stride(0) if positions.ndim == 2 else 0
    stride_tok = positions.stride(-1)
    _mrope_kernel[(num_tokens,)](
        q, k, positions, cos_sin_cache,
        q.stride(0), k.stride(0), stride_stream, stride_tok, cos_sin_cache.stride(0),
        nq, nk, head_size, rotary_dim // 2, sec_t, sec_h,
        triton.next_power_of_2(nq), triton.next_power_of_2(nk), triton.next_power_of_2(rotary_dim // 2),
    )
    return q, k


# --------------------------------------------------------------------------- the lab: the byte model
def mrope_bytes(num_tokens: int, num_q_heads: int, num_kv_heads: int, rotary_dim: int, elem_bytes: int = 2) -> int:
    """Bytes the fused kernel must move: read and write the rotary part of every q and k head,
    three int64 positions per token, and one cos and one sin half-row per token from the cache."""
    rotate = 2 * num_tokens * (num_q_heads + num_kv_heads) * rotary_dim * elem_bytes
    return rotate + 3 * 8 * num_tokens + num_tokens * rotary_dim * elem_bytes


def main() -> None:
    head_size, rotary_dim, section = 16, 12, [2, 2, 2]
    cache = torch.from_numpy(rope_cache(64, rotary_dim))
    # a 2-token text prefix, then a 2x2 image at t=2, then text again at t=4 (Qwen2-VL's position rule)
    positions = torch.tensor([[0, 1, 2, 2, 2, 2, 4], [0, 1, 2, 2, 3, 3, 4], [0, 1, 2, 3, 2, 3, 4]])
    g = torch.Generator().manual_seed(0)
    qkv = torch.randn(7, (4 + 2 + 2) * head_size, generator=g)
    q, k = qkv[:, : 4 * head_size], qkv[:, 4 * head_size : 6 * head_size]   # slices of a fused qkv
    want_q, want_k = mrope_reference(positions.numpy(), q.numpy(), k.numpy(), cache.numpy(), head_size, rotary_dim, section)
    mrope_forward(positions, q, k, cache, head_size, rotary_dim, section)
    err = max(np.abs(q.numpy() - want_q).max(), np.abs(k.numpy() - want_k).max())
    print(f"M-RoPE (Triton; the CPU interpreter when there is no GPU): 7 tokens, 4 q heads, 2 kv heads, head_size {head_size},")
    print(f"  rotary_dim {rotary_dim}, mrope_section {section}, q and k column slices of one qkv (row stride {qkv.stride(0)})")
    print(f"  max |kernel - float64 numpy reference| = {err:.1e}")
    print("  which position each of the 6 frequencies uses, token by token (t t h h w w):")
    for tok in range(7):
        used = [int(positions[s, tok]) for s in (0, 0, 1, 1, 2, 2)]
        print(f"    token {tok}: {used}")
    print("\nBytes one fused M-RoPE call moves (Qwen2-VL-7B: 28 q heads, 4 kv heads, rotary_dim 128, bf16)")
    print(f"{'tokens':>7} {'bytes':>12} {'floor on H100 SXM (us)':>23}")
    for t in (1, 256, 4096, 16384):
        b = mrope_bytes(t, 28, 4, 128)
        print(f"{t:>7} {b:>12,} {b / 3.35e12 * 1e6:>23.3f}")
    print("floor = bytes / 3.35 TB/s (H100 SXM datasheet HBM3 bandwidth): predicted, not measured")


if __name__ == "__main__":
    main()
