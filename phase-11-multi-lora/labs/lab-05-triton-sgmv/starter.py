"""Lab 11-05 — SGMV shrink and expand in Triton: every adapter's rows in one launch (starter).

vLLM's GPU path for multi-LoRA (``_lora_shrink`` / ``_lora_expand``) at lab scale. A batch of
``T`` token rows, each tagged with the slot of its adapter (−1: base, no adapter); adapters live
in stacked slot buffers ``lora_a (S, R, H_in)`` and ``lora_b (S, H_out, R)``.

1. ``sgmv_metadata`` groups the rows by slot, as ``LoRAKernelMeta.prepare_tensors`` does: the
   row ids sorted by slot (stable), the slots present (increasing, −1 first when base rows are
   present, padded with −1 to ``S + 1`` entries so the launch grid never changes), how many rows
   each has and where each group starts in the sorted order.
2. ``lora_shrink_kernel``: program ``(pid_mn, g)`` takes group ``g``'s rows
   ``pid_m·BLOCK_M …`` (gathered through the sorted ids, never copied) times ``BLOCK_N`` columns
   of that slot's ``Aᵀ``: ``s[row] = scale · x[row] @ A[slot]ᵀ``. Group −1 (base rows, and unused
   entries) exits at once, and so does a tile past its group's row count.
3. ``lora_expand_kernel``: the same grid over ``s @ B[slot]ᵀ``, added to the output rows
   (``add_inputs``) or stored over them. Base rows of the output are never touched.
"""

from __future__ import annotations

import os
from typing import NamedTuple

import torch

if not torch.cuda.is_available():               # no GPU: run the kernels in Triton's CPU interpreter
    os.environ.setdefault("TRITON_INTERPRET", "1")

import triton  # noqa: E402  (imported after TRITON_INTERPRET is decided)
import triton.language as tl  # noqa: E402

# GPU tiles bench.py tries, (BLOCK_M, BLOCK_N, BLOCK_K, num_warps) for shrink and for expand.
GPU_SHRINK_CONFIGS = [(32, 16, 256, 4), (64, 16, 128, 4), (16, 16, 512, 4), (32, 32, 256, 8)]
GPU_EXPAND_CONFIGS = [(64, 128, 16, 4), (32, 256, 16, 4), (64, 64, 16, 4), (128, 128, 16, 8)]


class SGMVMeta(NamedTuple):
    """Rows grouped by slot (vLLM's ``LoRAKernelMeta``). All int32, on the rows' device."""

    sorted_token_ids: torch.Tensor     # (T,)   row ids, stably sorted by slot
    slot_ids: torch.Tensor             # (S+1,) slots present, increasing; −1 pads (and marks the base group)
    num_tokens_per_slot: torch.Tensor  # (S+1,) rows in each group (0 for padding)
    slot_start: torch.Tensor           # (S+2,) start of each group in sorted_token_ids; [0] = 0


# --------------------------------------------------------------------------- the lab, part 1
def sgmv_metadata(token_slots: torch.Tensor, max_loras: int) -> SGMVMeta:
    """Group the rows of a batch by the slot their adapter occupies.

    ``token_slots`` (T,) holds a slot in ``0 .. max_loras - 1`` per row, or −1 for a base row.
    Returns ``SGMVMeta``: ``sorted_token_ids`` = ``argsort(token_slots, stable)``;
    ``slot_ids`` = the distinct values in increasing order (so −1 first when present), then −1 up
    to ``max_loras + 1`` entries; ``num_tokens_per_slot`` = each one's row count, 0 past them;
    ``slot_start`` = ``[0, cumsum(counts)...]``, 0-padded to ``max_loras + 2``.
    Raises ``ValueError`` for a slot outside ``-1 .. max_loras - 1`` or a ``token_slots`` that is
    not one-dimensional.
    """
    raise NotImplementedError(
        "sgmv_metadata: validate (1-D, every slot in -1..max_loras-1, else ValueError); "
        "sorted_token_ids = torch.sort(slots, stable=True).indices; torch.unique(slots, sorted=True, "
        "return_counts=True) gives slot_ids and counts; pad slot_ids with -1 to max_loras + 1, counts with 0; "
        "slot_start = [0, cumsum(counts)], 0-padded to max_loras + 2; every tensor int32"
    )


# --------------------------------------------------------------------------- the lab, part 2
@triton.jit
def lora_shrink_kernel(
    X, A, S, SortedIds, SlotIds, NumTokens, SlotStart,
    N, K, scale,
    stride_xm, stride_xk, stride_as, stride_an, stride_ak, stride_sm, stride_sn,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    # TODO: program (pid_mn, g) computes BLOCK_M rows of group g times BLOCK_N columns of the rank.
    #   1. slot = SlotIds[g]. Slot -1 (the base rows, and the unused padding entries) adds nothing: return
    #      before touching any weight. Split pid_mn into (pid_m, pid_n) with cdiv(N, BLOCK_N) columns tiles.
    #   2. count = NumTokens[g]; a tile that starts at or past count has no rows: return.
    #   3. The tile's rows are SortedIds[SlotStart[g] + pid_m * BLOCK_M + arange(BLOCK_M)], masked past count.
    #      Use them (as int64) to gather rows of X through stride_xm / stride_xk; never copy X.
    #   4. The slot's A starts at A + slot * stride_as, computed in int64 (a slot buffer passes 2**31
    #      elements). Walk K in BLOCK_K steps (mask the tail): tl.dot(x tile (M, K), Aᵀ tile (K, N)) in fp32.
    #   5. Multiply by scale; store to S[row, col] through stride_sm / stride_sn, masking rows and columns.
    tl.static_assert(False, "lora_shrink_kernel is not written yet: see the TODO in starter.py")


# --------------------------------------------------------------------------- the lab, part 3
@triton.jit
def lora_expand_kernel(
    S, B, Out, SortedIds, SlotIds, NumTokens, SlotStart,
    N, K,
    stride_sm, stride_sk, stride_bs, stride_bn, stride_bk, stride_om, stride_on,
    ADD_INPUTS: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    # TODO: the same grid and the same steps 1-3 as lora_shrink_kernel, over S (T, K = rank) and the
    #   slot's B (N = out, K = rank) at B + slot * stride_bs (int64):
    #   4. acc (fp32) = S rows @ Bᵀ tile, walking K (the rank, usually one step, masked past K). Cast the
    #      S tile to B's element type before tl.dot, as vLLM does for an fp32 buffer with fp16 weights.
    #   5. With ADD_INPUTS, add the output rows' current values (in fp32); store to Out[row, col] through
    #      stride_om / stride_on (Out may be a column slice), masked. Never write a row of another group.
    tl.static_assert(False, "lora_expand_kernel is not written yet: see the TODO in starter.py")


# --------------------------------------------------------------------------- provided: launchers
def _check(lora: torch.Tensor, name: str) -> torch.Tensor:
    if lora.ndim == 4 and lora.shape[1] == 1:                # vLLM's (slots, 1, ., .) layout
        lora = lora[:, 0]
    if lora.ndim != 3:
        raise ValueError(f"{name} must be (slots, ., .) or (slots, 1, ., .), got shape {tuple(lora.shape)}")
    return lora


def lora_shrink(x: torch.Tensor, lora_a: torch.Tensor, meta: SGMVMeta, scale: float,
                out: torch.Tensor | None = None, block_m: int = 16, block_n: int = 16, block_k: int = 16,
                num_warps: int = 4) -> torch.Tensor:
    """``out[r] = scale · x[r] @ lora_a[slot(r)]ᵀ`` for every adapter row; base rows of ``out``
    are zero (a fresh float32 ``(T, R)`` buffer when ``out`` is None; a given ``out`` is zeroed
    first, as vLLM's shrink does). One launch: grid ``(cdiv(T, block_m) · cdiv(R, block_n), S + 1)``.
    """
    lora_a = _check(lora_a, "lora_a")
    T, K = x.shape
    N = lora_a.shape[1]
    if lora_a.shape[2] != K:
        raise ValueError(f"x has {K} features but lora_a is {tuple(lora_a.shape)} (slots, rank, in)")
    if out is None:
        out = torch.zeros((T, N), dtype=torch.float32, device=x.device)
    else:
        out.zero_()
    if T == 0:
        return out
    grid = (triton.cdiv(T, block_m) * triton.cdiv(N, block_n), meta.slot_ids.numel())
    lora_shrink_kernel[grid](
        x, lora_a, out, meta.sorted_token_ids, meta.slot_ids, meta.num_tokens_per_slot, meta.slot_start,
        N, K, float(scale),
        x.stride(0), x.stride(1), lora_a.stride(0), lora_a.stride(1), lora_a.stride(2), out.stride(0), out.stride(1),
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, num_warps=num_warps,
    )
    return out


def lora_expand(s: torch.Tensor, lora_b: torch.Tensor, meta: SGMVMeta, out: torch.Tensor,
                add_inputs: bool = True, block_m: int = 16, block_n: int = 16, block_k: int = 16,
                num_warps: int = 4) -> torch.Tensor:
    """``out[r] (+)= s[r] @ lora_b[slot(r)]ᵀ`` for every adapter row (added when ``add_inputs``,
    stored over the old values otherwise); base rows of ``out`` are left exactly as they were.
    ``out`` may be any strided view (a column slice of a fused q/k/v output, say)."""
    lora_b = _check(lora_b, "lora_b")
    T, K = s.shape
    N = lora_b.shape[1]
    if lora_b.shape[2] != K:
        raise ValueError(f"s has rank {K} but lora_b is {tuple(lora_b.shape)} (slots, out, rank)")
    if out.shape != (T, N):
        raise ValueError(f"out must be ({T}, {N}), got {tuple(out.shape)}")
    if T == 0:
        return out
    grid = (triton.cdiv(T, block_m) * triton.cdiv(N, block_n), meta.slot_ids.numel())
    lora_expand_kernel[grid](
        s, lora_b, out, meta.sorted_token_ids, meta.slot_ids, meta.num_tokens_per_slot, meta.slot_start,
        N, K,
        s.stride(0), s.stride(1), lora_b.stride(0), lora_b.stride(1), lora_b.stride(2), out.stride(0), out.stride(1),
        ADD_INPUTS=add_inputs, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, num_warps=num_warps,
    )
    return out


def add_lora(y: torch.Tensor, x: torch.Tensor, lora_a: torch.Tensor, lora_b: torch.Tensor,
             token_slots: torch.Tensor, scale: float, block_m: int = 16) -> torch.Tensor:
    """``y[r] += scale · (x[r] @ A[slot]ᵀ) @ B[slot]ᵀ`` for adapter rows, in two launches
    (vLLM's ``add_lora_linear`` for one slice): metadata, shrink into a float32 buffer, expand."""
    meta = sgmv_metadata(token_slots, _check(lora_a, "lora_a").shape[0])
    s = lora_shrink(x, lora_a, meta, scale, block_m=block_m)
    return lora_expand(s, lora_b, meta, y, add_inputs=True, block_m=block_m)


def main() -> None:
    """The worked example of the README: metadata for 8 rows over 3 slots, and the result checked."""
    slots = torch.tensor([-1, 0, 1, 0, -1, 2, 2, 1])
    meta = sgmv_metadata(slots, 4)
    print("token_slots         ", slots.tolist())
    print("sorted_token_ids    ", meta.sorted_token_ids.tolist())
    print("slot_ids            ", meta.slot_ids.tolist())
    print("num_tokens_per_slot ", meta.num_tokens_per_slot.tolist())
    print("slot_start          ", meta.slot_start.tolist())
    g = torch.Generator().manual_seed(0)
    S, R, H = 4, 8, 32
    x = torch.randn(8, H, generator=g)
    a, b = torch.randn(S, R, H, generator=g), torch.randn(S, H, R, generator=g)
    y0 = torch.randn(8, H, generator=g)
    y = add_lora(y0.clone(), x, a, b, slots, 0.5)
    want = y0.clone()
    for r, s in enumerate(slots.tolist()):
        if s >= 0:
            want[r] += 0.5 * (x[r] @ a[s].T) @ b[s].T
    err = (y - want).abs().max().item()
    print(f"max |error| vs a per-row loop: {'< 1e-4' if err < 1e-4 else f'{err:.2e}'}; "
          f"base rows unchanged: {bool(torch.equal(y[slots < 0], y0[slots < 0]))}")


if __name__ == "__main__":
    main()
