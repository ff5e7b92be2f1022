"""Lab 12-04 reference: the grammar bitmask kernel. Unpack 32 bits per int32 word, ban tokens with -inf.

A grammar's allowed-token set travels to the GPU packed: row ``k`` of ``bitmask`` holds
``ceil(V / 32)`` int32 words, and bit ``j`` of word ``w`` is 1 when token ``32 * w + j`` is
allowed. Bit 31 is the int32 sign bit, so a word whose top token is allowed is negative (``-1``
allows all 32). Only the requests that have a grammar get a row: ``logits_indices[k]`` says which
row of ``logits`` bitmask row ``k`` applies to; every other logits row is left alone (vLLM's
model-runner-v2 layout, and with one row per draft position under speculative decoding).

* ``unpack_bitmask(bitmask, vocab_size)``: the bool matrix ``[rows, vocab_size]`` (True = allowed),
  in plain torch: the definition the kernel must agree with.
* ``apply_token_bitmask(logits, bitmask, logits_indices, block_size=1024)``: in place, every token
  whose bit is 0 gets ``-inf`` in row ``logits_indices[k]``; allowed logits are not touched (not
  even rewritten). Bits for tokens ``>= vocab_size`` (the tail of the last word, or whole words of
  a mask allocated for a larger padded vocabulary) are ignored. Takes every stride of both
  tensors, so a column slice, a transposed view or a row-strided bitmask works, and computes row
  offsets in int64. Raises ``TypeError`` for a bitmask that is not int32 or logits that are not
  floating point, and ``ValueError`` for wrong ranks, a bitmask narrower than the vocabulary, a
  row count that differs from ``len(logits_indices)`` or an index outside the logits.

``bench.py`` compares the kernel with vLLM's ``_apply_grammar_bitmask_kernel`` on a GPU.
"""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():               # no GPU: run the kernel in Triton's CPU interpreter
    os.environ.setdefault("TRITON_INTERPRET", "1")

import triton  # noqa: E402  (imported after TRITON_INTERPRET is decided)
import triton.language as tl  # noqa: E402


def unpack_bitmask(bitmask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """``[rows, ceil(V/32)]`` int32 words -> ``[rows, vocab_size]`` bool, True where the token is allowed."""
    shifts = torch.arange(32, dtype=torch.int32, device=bitmask.device)
    bits = (bitmask.to(torch.int32).unsqueeze(-1) >> shifts) & 1  # arithmetic shift, then one bit: sign-safe
    return bits.reshape(bitmask.shape[0], -1)[:, :vocab_size].bool()


@triton.jit
def _apply_bitmask_kernel(
    logits_ptr, stride_lr, stride_lc,
    indices_ptr,
    bitmask_ptr, stride_br, stride_bw,
    vocab_size,
    BLOCK: tl.constexpr,
):
    k = tl.program_id(0)                                   # which bitmask row
    row = tl.load(indices_ptr + k).to(tl.int64)            # which logits row it applies to
    tokens = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    in_vocab = tokens < vocab_size
    words = tl.load(bitmask_ptr + k.to(tl.int64) * stride_br + (tokens // 32) * stride_bw, mask=in_vocab, other=-1)
    banned = ((words >> (tokens % 32)) & 1) == 0
    tl.store(logits_ptr + row * stride_lr + tokens * stride_lc, float("-inf"), mask=in_vocab & banned)


def apply_token_bitmask(
    logits: torch.Tensor, bitmask: torch.Tensor, logits_indices: torch.Tensor, block_size: int = 1024
) -> None:
    """In place: ``logits[logits_indices[k], t] = -inf`` wherever bit ``t`` of ``bitmask[k]`` is 0, ``t < V``."""
    if not logits.is_floating_point():
        raise TypeError(f"logits must be floating point, got {logits.dtype}")
    if bitmask.dtype != torch.int32:
        raise TypeError(f"bitmask must be int32 (32 tokens per word), got {bitmask.dtype}")
    if logits.dim() != 2 or bitmask.dim() != 2 or logits_indices.dim() != 1:
        raise ValueError(f"need logits [rows, V], bitmask [n, words], logits_indices [n]; got {tuple(logits.shape)}, "
                         f"{tuple(bitmask.shape)}, {tuple(logits_indices.shape)}")
    rows, vocab_size = logits.shape
    n, num_words = bitmask.shape
    if num_words * 32 < vocab_size:
        raise ValueError(f"the bitmask covers {num_words * 32} tokens but the logits have {vocab_size}: allocate "
                         f"ceil(V / 32) = {triton.cdiv(vocab_size, 32)} words per row for the padded vocabulary")
    if logits_indices.numel() != n:
        raise ValueError(f"{n} bitmask rows but {logits_indices.numel()} logits indices: one index per bitmask row")
    if n == 0:
        return
    if int(logits_indices.min()) < 0 or int(logits_indices.max()) >= rows:
        raise ValueError(f"logits_indices must lie in [0, {rows}), got {logits_indices.tolist()}")
    grid = (n, triton.cdiv(vocab_size, block_size))
    _apply_bitmask_kernel[grid](
        logits, logits.stride(0), logits.stride(1),
        logits_indices,
        bitmask, bitmask.stride(0), bitmask.stride(1),
        vocab_size,
        BLOCK=block_size,
    )
