"""Lab 15-04 starter: gather a request's KV from every layer into one transfer buffer, and back.

A connector that ships KV over a wire wants it contiguous: one buffer ``(num_layers, 2, n, hidden)``
holding the request's ``n`` tokens, K then V, layer after layer, in token order. The paged cache
scatters those rows over many blocks of many separately allocated layers. ``gather_kv`` copies them
out in one kernel launch; ``scatter_kv`` writes a received buffer into the destination's slots.

Each layer is mini's layout ``(2, num_blocks, block_size, num_kv_heads, head_size)`` with any strides
as long as one token's ``heads x head_size`` values are contiguous (so a layer may be a view into a
bigger buffer). Layers are reached through a table of their ``data_ptr()``s (int64), all layers
sharing one set of strides. Offsets are computed in int64: ``slot x row stride`` overflows int32
on a large cache. One program per (layer, token), looping over the row in ``BLOCK`` chunks.
"""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():  # no GPU: run kernels in Triton's CPU interpreter
    os.environ.setdefault("TRITON_INTERPRET", "1")

import triton  # noqa: E402 (after TRITON_INTERPRET is decided)
import triton.language as tl  # noqa: E402

INT32_MAX = 2**31 - 1


@triton.jit
def cache_offset(slot, block_size, stride_block, stride_off):
    """Element offset of a slot's K row inside a layer (V is ``stride_kv`` further), in int64."""
    raise NotImplementedError(
        "cache_offset: (slot // block_size) * stride_block + (slot % block_size) * stride_off, with"
        " slot cast to int64 first"
    )


@triton.jit
def buffer_offset(layer, tok, num_tokens, hidden):
    """Element offset of (layer, K, token) in the ``(layers, 2, num_tokens, hidden)`` buffer, in int64."""
    raise NotImplementedError(
        "buffer_offset: (layer * 2 * num_tokens + tok) * hidden in int64 (program ids are int32)"
    )


@triton.jit
def kv_gather_kernel(
    layer_ptrs,
    buf_ptr,
    slots_ptr,
    num_tokens,
    hidden,
    stride_kv,
    stride_block,
    stride_off,
    block_size,
    BLOCK: tl.constexpr,
):
    raise NotImplementedError(
        "kv_gather_kernel: program (layer, tok): load the layer's base pointer from the table, find"
        " the slot's row with cache_offset and the buffer row with buffer_offset, then copy K (at "
        "the row) and V (stride_kv further) in masked BLOCK chunks to the buffer's K row and V row "
        "(num_tokens * hidden further)"
    )


@triton.jit
def kv_scatter_kernel(
    layer_ptrs,
    buf_ptr,
    slots_ptr,
    num_tokens,
    hidden,
    stride_kv,
    stride_block,
    stride_off,
    block_size,
    BLOCK: tl.constexpr,
):
    raise NotImplementedError("kv_scatter_kernel: the same addresses as the gather, copying buffer -> cache")


# ---- provided: checks and launch plumbing --------------------------------------------------------


def _layout(layers: list[torch.Tensor], slots: torch.Tensor) -> tuple[int, ...]:
    """(hidden, stride_kv, stride_block, stride_off, block_size), after checking every layer."""
    if not layers:
        raise ValueError("no layers")
    first = layers[0]
    if first.dim() != 5 or first.shape[0] != 2:
        raise ValueError(
            f"a layer must be (2, num_blocks, block_size, heads, head_size), got {tuple(first.shape)}"
        )
    _, num_blocks, block_size, heads, head_size = first.shape
    if first.stride(4) != 1 or first.stride(3) != head_size:
        raise ValueError("each token's heads x head_size values must be contiguous")
    for t in layers[1:]:
        if (
            t.shape != first.shape
            or t.stride() != first.stride()
            or t.dtype != first.dtype
            or t.device != first.device
        ):
            raise ValueError("every layer must share shape, strides, dtype and device")
    if slots.dtype != torch.int64:
        raise TypeError(f"slots must be int64, got {slots.dtype}")
    if len(slots) and (int(slots.min()) < 0 or int(slots.max()) >= num_blocks * block_size):
        raise ValueError(
            f"slots must lie in [0, {num_blocks * block_size}), got {slots.min()}..{slots.max()}"
        )
    return heads * head_size, first.stride(0), first.stride(1), first.stride(2), block_size


def layer_pointer_table(layers: list[torch.Tensor]) -> torch.Tensor:
    return torch.tensor([t.data_ptr() for t in layers], dtype=torch.int64, device=layers[0].device)


def gather_kv(layers: list[torch.Tensor], slots: torch.Tensor, block: int = 64) -> torch.Tensor:
    """``(num_layers, 2, len(slots), hidden)``: every layer's K and V rows of ``slots``, in order."""
    hidden, s_kv, s_blk, s_off, bs = _layout(layers, slots)
    buf = torch.empty(len(layers), 2, len(slots), hidden, dtype=layers[0].dtype, device=layers[0].device)
    if len(slots):
        grid = (len(layers), len(slots))
        kv_gather_kernel[grid](
            layer_pointer_table(layers), buf, slots, len(slots), hidden, s_kv, s_blk, s_off, bs, BLOCK=block
        )
    return buf


def scatter_kv(layers: list[torch.Tensor], slots: torch.Tensor, buf: torch.Tensor, block: int = 64) -> None:
    """Write ``buf`` (as ``gather_kv`` returns it) into ``slots`` of every layer, in place."""
    hidden, s_kv, s_blk, s_off, bs = _layout(layers, slots)
    want = (len(layers), 2, len(slots), hidden)
    if tuple(buf.shape) != want or not buf.is_contiguous() or buf.dtype != layers[0].dtype:
        raise ValueError(
            f"buffer must be a contiguous {layers[0].dtype} tensor of shape {want}, got {tuple(buf.shape)}"
        )
    if len(slots):
        grid = (len(layers), len(slots))
        kv_scatter_kernel[grid](
            layer_pointer_table(layers), buf, slots, len(slots), hidden, s_kv, s_blk, s_off, bs, BLOCK=block
        )


def gather_kv_torch(layers: list[torch.Tensor], slots: torch.Tensor) -> torch.Tensor:
    """The baseline: torch advanced indexing, one layer at a time, then a stack (a second copy)."""
    bs = layers[0].shape[2]
    b, o = slots // bs, slots % bs
    return torch.stack([t[:, b, o].reshape(2, len(slots), -1) for t in layers])


def needs_int64(num_slots: int, row_stride: int, stride_kv: int) -> bool:
    """Does the largest element offset a kernel forms (V half + last slot's row) overflow int32?"""
    return stride_kv + (num_slots - 1) * row_stride + row_stride > INT32_MAX


def main() -> None:
    torch.manual_seed(0)
    layers = [torch.randn(2, 12, 4, 2, 8) for _ in range(3)]
    slots = torch.tensor([17, 18, 19, 4, 5, 40], dtype=torch.int64)
    buf = gather_kv(layers, slots)
    print(f"buffer {tuple(buf.shape)}: 3 layers x (K, V) x 6 tokens x 16 values")
    print(f"equals torch indexing: {torch.equal(buf, gather_kv_torch(layers, slots))}")
    dst = [torch.zeros_like(t) for t in layers]
    scatter_kv(dst, torch.tensor([0, 1, 2, 3, 44, 45], dtype=torch.int64), buf)
    print(
        f"scatter into other slots, gather back: {torch.equal(gather_kv(dst, torch.tensor([0, 1, 2, 3, 44, 45])), buf)}"
    )
    # one layer of a 1M-slot cache whose rows hold 8 KV heads x 128 dims = 1,024 values
    print(
        f"1M slots x 1,024 values: largest offset {2 * 1_048_576 * 1024:,} > int32 max {INT32_MAX:,}: "
        f"int64 needed = {needs_int64(1_048_576, 1024, 1_048_576 * 1024)}"
    )


if __name__ == "__main__":
    main()
