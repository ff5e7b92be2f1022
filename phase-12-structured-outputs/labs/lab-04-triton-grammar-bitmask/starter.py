"""Lab 12-04 starter: the grammar bitmask kernel. Unpack 32 bits per int32 word, ban tokens with -inf.

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

import triton  # noqa: E402, F401  (imported after TRITON_INTERPRET is decided)
import triton.language as tl  # noqa: E402, F401


def unpack_bitmask(bitmask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """``[rows, ceil(V/32)]`` int32 words -> ``[rows, vocab_size]`` bool, True where the token is allowed."""
    raise NotImplementedError(
        "shift every word right by 0..31 (a [rows, words, 32] tensor), keep the lowest bit with & 1, flatten "
        "the last two dimensions (token 32*w + j) and cut to vocab_size; bit 31 is the sign bit, so test bits "
        "with (word >> j) & 1, never with word & (1 << j) > 0"
    )


# Write your kernel here: @triton.jit def _apply_bitmask_kernel(...), one program per (bitmask row, vocab block).


def apply_token_bitmask(
    logits: torch.Tensor, bitmask: torch.Tensor, logits_indices: torch.Tensor, block_size: int = 1024
) -> None:
    """In place: ``logits[logits_indices[k], t] = -inf`` wherever bit ``t`` of ``bitmask[k]`` is 0, ``t < V``."""
    raise NotImplementedError(
        "check dtypes (TypeError) and shapes / indices (ValueError) first; then launch a grid of "
        "(bitmask rows, cdiv(V, block_size)) programs. Each loads its logits row index (cast it to int64), "
        "computes its token ids, loads word token // 32 of its bitmask row (through both bitmask strides), "
        "and stores -inf through both logits strides where the bit is 0 and token < V"
    )
