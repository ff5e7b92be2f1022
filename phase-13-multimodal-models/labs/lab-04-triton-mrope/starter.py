"""Lab 13-04 — multimodal rotary embedding (M-RoPE) in Triton (your file).

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


# --------------------------------------------------------------------------- provided: the section check
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


# --------------------------------------------------------------------------- the lab: numpy reference
def mrope_cos_sin(positions: np.ndarray, cos_sin_cache: np.ndarray, mrope_section) -> tuple[np.ndarray, np.ndarray]:
    """Per-token ``cos`` and ``sin``, each ``(num_tokens, rotary_dim // 2)``.

    ``positions`` is ``(3, T)`` (t, h, w) or ``(T,)`` (text: one stream for all frequencies).
    Frequency ``i`` reads the row of the stream its section names: t for ``i < s_t``, h for
    ``i < s_t + s_h``, w after."""
    raise NotImplementedError(
        "call check_section(mrope_section, rotary_dim) first (rotary_dim = cache width); broadcast (T,) positions to "
        "(3, T); for each frequency i pick its stream (0, 1 or 2); cos[t, i] = cache[pos[stream_i, t], i] and "
        "sin[t, i] = cache[pos[stream_i, t], rotary_dim // 2 + i]"
    )


def mrope_reference(positions, q, k, cos_sin_cache, head_size: int, rotary_dim: int, mrope_section):
    """float64 numpy M-RoPE: returns rotated copies of ``q (T, nq·head_size)`` and ``k (T, nk·head_size)``."""
    raise NotImplementedError(
        "get cos, sin from mrope_cos_sin (as float64); view each tensor as (T, heads, head_size); with h = rotary_dim // 2, "
        "x1 = x[..., :h], x2 = x[..., h:rotary_dim]: x1 <- x1·cos - x2·sin, x2 <- x2·cos + x1·sin (neox halves); "
        "features past rotary_dim are copied unchanged"
    )


# --------------------------------------------------------------------------- the lab: the kernel
@triton.jit
def _mrope_kernel(
    Q, K, POS, CACHE,
    stride_q, stride_k, stride_pos_stream, stride_pos_tok, stride_cache,
    NUM_Q_HEADS: tl.constexpr, NUM_K_HEADS: tl.constexpr, HEAD_SIZE: tl.constexpr, HALF: tl.constexpr,
    SEC_T: tl.constexpr, SEC_H: tl.constexpr,
    PAD_Q_HEADS: tl.constexpr, PAD_K_HEADS: tl.constexpr, PAD_HALF: tl.constexpr,
):
    # TODO: write the kernel body. One program per token; a plan, one step per line:
    #   1. tok = program_id(0) as int64 (tok * stride_q passes 2**31 on big batches); i = arange(PAD_HALF), i < HALF.
    #   2. Load the token's three positions: POS + s * stride_pos_stream + tok * stride_pos_tok for s = 0, 1, 2.
    #   3. Per frequency i pick t (i < SEC_T), h (i < SEC_T + SEC_H) or w; keep it int64.
    #   4. cos = CACHE[pos * stride_cache + i], sin = CACHE[pos * stride_cache + HALF + i] (masked), in float32.
    #   5. q: a (PAD_Q_HEADS, PAD_HALF) tile of offsets tok * stride_q + head * HEAD_SIZE + i, masked on both;
    #      x1 at the offsets, x2 at offsets + HALF; store x1·cos - x2·sin and x2·cos + x1·sin in q's dtype.
    #   6. The same for k with NUM_K_HEADS, PAD_K_HEADS and stride_k.
    tl.static_assert(False, "_mrope_kernel is not written yet: see the TODO in starter.py")


def mrope_forward(positions, q, k, cos_sin_cache, head_size: int, rotary_dim: int, mrope_section):
    """Rotate ``q (T, nq·head_size)`` and ``k (T, nk·head_size)`` in place; returns ``(q, k)``.

    ``positions``: int64, ``(3, T)`` or ``(T,)``. ``cos_sin_cache``: ``(max_positions, rotary_dim)``.
    ``q`` and ``k`` may have any row stride (slices of a fused qkv) but unit column stride.
    Raises ``ValueError`` for a section that does not sum to ``rotary_dim // 2``, an odd or
    too-large ``rotary_dim``, widths that are not whole heads, mismatched token counts, a cache of
    the wrong width or a non-unit column stride; ``TypeError`` for positions that are not int64."""
    raise NotImplementedError(
        "validate (the docstring lists every error; test_every_promised_error has the messages), return at once for "
        "0 tokens, then launch _mrope_kernel[(T,)] with q.stride(0), k.stride(0), the positions' strides (stream "
        "stride 0 for (T,) positions), cache.stride(0), the head counts, head_size, rotary_dim // 2, the first two "
        "sections and next_power_of_2 paddings"
    )


# --------------------------------------------------------------------------- the lab: the byte model
def mrope_bytes(num_tokens: int, num_q_heads: int, num_kv_heads: int, rotary_dim: int, elem_bytes: int = 2) -> int:
    """Bytes the fused kernel must move: read and write the rotary part of every q and k head,
    three int64 positions per token, and one cos and one sin half-row per token from the cache."""
    raise NotImplementedError(
        "2 · T · (nq + nkv) · rotary_dim · elem (read + write) + 3 · 8 · T (positions) + T · rotary_dim · elem (cache)"
    )


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
