"""Lab 07-06 — grouped MoE in Triton: align tokens to the block size, one launch per GEMM (reference).

The idea behind vLLM's ``fused_moe_kernel`` and ``moe_align_block_size``, at lab scale. For
``T`` tokens routed top-``k`` over ``E`` experts, with stacked expert weights
``w1 (E, d, f)`` and ``w2 (E, f, d)`` (lab 01's experts, stacked):

1. ``moe_align`` sorts the ``T·k`` flat assignments by expert and pads each expert's run up to
   a multiple of ``block_m`` with the invalid id ``T·k``. Every block of ``block_m`` sorted rows
   then belongs to exactly one expert, recorded in ``expert_ids`` (one entry per block).
2. ``grouped_gemm_kernel``, ONE launch for all experts: program ``(pid_m, pid_n)`` reads its
   block's row ids and expert, gathers token rows ``id // top_k`` of A, multiplies by that
   expert's weight tile and scatters the result to rows ``id`` of C; padding rows are masked.
   Blocks past ``num_tokens_post_padded`` exit at once: the grid is sized for the worst case so
   the host never has to wait for the GPU to learn how many blocks there are.
3. ``grouped_moe_forward``: align, GEMM 1 (``x @ w1[e]``, ``top_k = k``), ReLU, GEMM 2
   (``h @ w2[e]``, ``top_k = 1``, each row multiplied by its gate weight), then a sum over each
   token's k rows. Two GEMM launches whatever ``E`` is.
"""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():               # no GPU: run the kernel in Triton's CPU interpreter
    os.environ.setdefault("TRITON_INTERPRET", "1")

import triton  # noqa: E402  (imported after TRITON_INTERPRET is decided)
import triton.language as tl  # noqa: E402

# GPU tile sizes tried by bench.py for the grouped GEMM: (BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages).
GPU_CONFIGS = [(64, 128, 64, 4, 3), (128, 128, 64, 8, 3), (16, 128, 128, 4, 4), (32, 128, 64, 4, 4)]


# --------------------------------------------------------------------------- the lab, part 1
def moe_align(topk_ids: torch.Tensor, num_experts: int, block_m: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Sort the flat assignments by expert and pad each expert's run to a multiple of ``block_m``.

    Returns, like vLLM's ``moe_align_block_size``:

    * ``sorted_token_ids`` int32, length ``T·k + E·(block_m - 1)`` (the worst case): expert 0's
      flat ids in increasing order, padded with ``T·k`` to a multiple of ``block_m``, then expert
      1's, ...; experts with no rows take no blocks; every slot past the end is ``T·k`` too;
    * ``expert_ids`` int32, one entry per block of that buffer: the expert owning the block
      (``-1`` for blocks past the end);
    * ``num_tokens_post_padded`` int32 tensor of shape ``(1,)``: how many sorted slots are in use.
    """
    flat = topk_ids.reshape(-1).to(torch.int64)
    n = flat.numel()
    counts = torch.bincount(flat, minlength=num_experts)
    padded = (counts + block_m - 1) // block_m * block_m
    starts = torch.cumsum(padded, 0) - padded
    capacity = n + num_experts * (block_m - 1)
    sorted_ids = torch.full((capacity,), n, dtype=torch.int32, device=topk_ids.device)
    order = torch.argsort(flat, stable=True)                          # flat ids grouped by expert
    rank = torch.arange(n, device=flat.device) - (torch.cumsum(counts, 0) - counts)[flat[order]]
    sorted_ids[starts[flat[order]] + rank] = order.to(torch.int32)
    expert_ids = torch.full((triton.cdiv(capacity, block_m),), -1, dtype=torch.int32, device=topk_ids.device)
    used = torch.repeat_interleave(torch.arange(num_experts, device=flat.device), padded // block_m)
    expert_ids[: used.numel()] = used.to(torch.int32)
    return sorted_ids, expert_ids, padded.sum().reshape(1).to(torch.int32)


# --------------------------------------------------------------------------- the lab, part 2
@triton.jit
def grouped_gemm_kernel(
    X, W, Out, RowIds, BlockExpert, NumUsed, Gate,
    N, K, num_valid,
    stride_xr, stride_xk, stride_we, stride_wk, stride_wn, stride_or, stride_on,
    TOP_K: tl.constexpr, APPLY_GATE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    blk = tl.program_id(0)                                   # which BLOCK_M slots of the sorted order
    if blk * BLOCK_M >= tl.load(NumUsed):                    # past the padded end (the grid is worst-case)
        return
    flat = tl.load(RowIds + blk * BLOCK_M + tl.arange(0, BLOCK_M))   # flat (token, slot) ids
    live = flat < num_valid                                  # padding slots hold num_valid
    src = flat // TOP_K                                      # the row of X each assignment reads
    expert = tl.load(BlockExpert + blk).to(tl.int64)         # one expert for the whole block
    w_base = W + expert * stride_we
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < N

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        k_ok = ks < K
        x_tile = tl.load(X + src[:, None] * stride_xr + ks[None, :] * stride_xk,     # gathered rows
                         mask=live[:, None] & k_ok[None, :], other=0.0)
        w_tile = tl.load(w_base + ks[:, None] * stride_wk + cols[None, :] * stride_wn,
                         mask=k_ok[:, None] & col_ok[None, :], other=0.0)
        acc = tl.dot(x_tile, w_tile, acc)

    if APPLY_GATE:                                           # each row times its gate weight, in fp32
        gate = tl.load(Gate + flat, mask=live, other=0.0).to(tl.float32)
        acc = acc * gate[:, None]
    tl.store(Out + flat[:, None] * stride_or + cols[None, :] * stride_on,              # scattered rows
             acc.to(Out.dtype.element_ty), mask=live[:, None] & col_ok[None, :])


# --------------------------------------------------------------------------- provided: launcher and forward
def invoke_grouped_gemm(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, sorted_ids: torch.Tensor,
                        expert_ids: torch.Tensor, num_post_padded: torch.Tensor, top_k: int,
                        topk_weights: torch.Tensor | None = None, block_m: int = 16, block_n: int = 16,
                        block_k: int = 16, num_warps: int = 4, num_stages: int = 2,
                        num_valid: int | None = None) -> None:
    """One launch of ``grouped_gemm_kernel``: ``c[i] = a[i // top_k] @ b[expert of i]`` (× weight)
    for every valid flat id ``i < num_valid`` (default ``c.shape[0]``, the pad id ``moe_align``
    uses). The grid covers the worst-case number of blocks."""
    N, K = b.shape[2], b.shape[1]
    num_valid = c.shape[0] if num_valid is None else num_valid
    grid = (triton.cdiv(sorted_ids.numel(), block_m), triton.cdiv(N, block_n))
    w = topk_weights.reshape(-1) if topk_weights is not None else c    # any pointer when unused
    grouped_gemm_kernel[grid](
        a, b, c, sorted_ids, expert_ids, num_post_padded, w,
        N, K, num_valid,
        a.stride(0), a.stride(1), b.stride(0), b.stride(1), b.stride(2), c.stride(0), c.stride(1),
        TOP_K=top_k, APPLY_GATE=topk_weights is not None,
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, num_warps=num_warps, num_stages=num_stages,
    )


def grouped_moe_forward(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, topk_ids: torch.Tensor,
                        topk_weights: torch.Tensor, block_m: int = 16, block_n: int = 16, block_k: int = 16,
                        num_warps: int = 4, num_stages: int = 2) -> torch.Tensor:
    """The whole MoE forward with two grouped-GEMM launches: align, ``x @ w1``, ReLU, ``@ w2`` × gate
    weight, and the sum of each token's k rows (vLLM's ``moe_sum``).

    The two intermediate buffers get one spare row past the ``T·k`` real ones, the row the pad id
    ``T·k`` points at. A correct kernel never touches it; a kernel that forgets to mask padding
    scribbles there (where a test can see it) instead of past the end of the buffer.
    """
    T, k = topk_ids.shape
    n = T * k
    d, f = w1.shape[1], w1.shape[2]
    sorted_ids, expert_ids, n_post = moe_align(topk_ids, w1.shape[0], block_m)
    cfg = dict(block_m=block_m, block_n=block_n, block_k=block_k, num_warps=num_warps, num_stages=num_stages)
    h = torch.empty((n + 1, f), dtype=x.dtype, device=x.device)
    invoke_grouped_gemm(x, w1, h, sorted_ids, expert_ids, n_post, top_k=k, num_valid=n, **cfg)
    h = torch.relu(h)
    y = torch.empty((n + 1, d), dtype=x.dtype, device=x.device)
    invoke_grouped_gemm(h, w2, y, sorted_ids, expert_ids, n_post, top_k=1,
                        topk_weights=topk_weights.to(torch.float32).contiguous(), num_valid=n, **cfg)
    return y[:n].view(T, k, d).sum(dim=1)


def stack_experts(experts, dtype=torch.float32, device="cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """Lab 01's list of ``(W1 (d, f), W2 (f, d))`` numpy pairs as two stacked tensors ``(E, d, f)``, ``(E, f, d)``."""
    w1 = torch.stack([torch.as_tensor(a) for a, _ in experts]).to(device=device, dtype=dtype)
    w2 = torch.stack([torch.as_tensor(b) for _, b in experts]).to(device=device, dtype=dtype)
    return w1.contiguous(), w2.contiguous()


def padding_waste(topk_ids: torch.Tensor, num_experts: int, block_m: int) -> tuple[int, int]:
    """(valid rows, padded rows in use) after aligning to ``block_m``: the price of block alignment."""
    _, _, n_post = moe_align(topk_ids, num_experts, block_m)
    return topk_ids.numel(), int(n_post.item())


# --------------------------------------------------------------------------- what you should see
def main() -> None:
    ids = torch.tensor([[2, 3, 4], [1, 2, 4], [1, 3, 4], [1, 2, 3]])
    s, e, n = moe_align(ids, 5, 4)
    print("vLLM's moe_align_block_size docstring example: topk_ids [[2,3,4],[1,2,4],[1,3,4],[1,2,3]], block 4")
    print(f"  sorted_token_ids[:{int(n)}] = {s[: int(n)].tolist()}")
    print(f"  expert_ids[:{int(n) // 4}]         = {e[: int(n) // 4].tolist()}   num_tokens_post_padded = {int(n)}")
    print(f"  (buffer sized for the worst case: {s.numel()} slots, {e.numel()} blocks)")

    from course.runtime import use_lab
    lab01 = use_lab("phase-07/lab-01-moe-routing")
    import numpy as np
    T, K, E, D, F = 8, 2, 4, 16, 32
    w_gate, experts = lab01.make_moe(num_experts=E, hidden=D, ffn=F, seed=0)
    x = np.random.default_rng(1).standard_normal((T, D))
    topk_ids, topk_w = lab01.route(x, w_gate, K)
    ref = lab01.moe_forward_reference(x, experts, topk_ids, topk_w)
    w1, w2 = stack_experts(experts)
    got = grouped_moe_forward(torch.tensor(x, dtype=torch.float32), w1, w2, torch.tensor(topk_ids), torch.tensor(topk_w))
    print(f"T={T}, top-{K}, E={E}, d={D}, f={F}: grouped kernel == lab 01 reference (fp32, 1e-4):"
          f" {bool(np.max(np.abs(got.double().numpy() - ref)) < 1e-4)}; GEMM launches: 2 (lab 01 made one call per expert)")
    print("padding the price of alignment (valid rows -> rows the GEMM computes):")
    for label, tokens, k, experts_n in (("decode, batch 8, Mixtral routing", 8, 2, 8),
                                        ("prefill, 512 tokens, Mixtral routing", 512, 2, 8),
                                        ("decode, batch 64, DeepSeek-V3 routing", 64, 8, 256)):
        g = torch.Generator().manual_seed(0)
        ids = torch.argsort(torch.rand(tokens, experts_n, generator=g), dim=1)[:, :k]
        cells = []
        for bm in (16, 64):
            v, p = padding_waste(ids, experts_n, bm)
            cells.append(f"block {bm}: {v} -> {p} ({1 - v / p:.0%} padding)")
        print(f"  {label:<38} " + "; ".join(cells))


if __name__ == "__main__":
    main()
