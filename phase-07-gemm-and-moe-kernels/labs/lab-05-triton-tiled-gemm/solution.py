"""Lab 07-05 — a tiled, pipelined GEMM in Triton (reference solution).

``C = A @ B`` with ``A: (M, K)``, ``B: (K, N)``, any strides (so ``B`` may be ``W.T``, the way a
linear layer stores its weight). One Triton *program* computes one ``BLOCK_M × BLOCK_N`` tile of
``C``: it walks ``K`` in steps of ``BLOCK_K``, loading an ``A`` tile and a ``B`` tile per step and
accumulating ``tl.dot`` into a float32 accumulator that lives in registers for the whole loop;
the tile is written once, in ``C``'s dtype. Loads and the store are masked, so ragged shapes work
(lab 02's ``min()`` clipping).

Three knobs make it fast on a GPU:

* the tile sizes: lab 02's reuse arithmetic (a 128 × 128 tile reuses each loaded element 128 times);
* ``GROUP_M``: programs are numbered so that consecutive ones sweep a group of ``GROUP_M`` tile
  rows column by column, instead of one whole row after another; programs running at the same
  time then share A and B panels in the L2 cache (``program_tile`` is the same formula in Python);
* ``num_stages``: a launch option; the compiler pipelines the K loop, fetching the next
  ``num_stages - 1`` tiles while the tensor cores work on the current one.

On CPU the kernel runs in Triton's interpreter (``TRITON_INTERPRET=1``): exact, slow, tiny shapes only.
"""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():               # no GPU: run the kernel in Triton's CPU interpreter
    os.environ.setdefault("TRITON_INTERPRET", "1")

import triton  # noqa: E402  (imported after TRITON_INTERPRET is decided)
import triton.language as tl  # noqa: E402

# GPU launch configurations tried by bench.py (BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, num_warps, num_stages).
# Staging buffers per config ≈ (BLOCK_M + BLOCK_N) · BLOCK_K · 2 bytes (bf16) · num_stages: 128 KiB for the
# first, 144 KiB for the 3rd and 4th (A100/H100-class SMs), 96 KiB for the 2nd, 5th and 6th, which also
# fit the 99 KB a block may use on an Ada GPU such as the L4.
GPU_CONFIGS = [
    (128, 128, 64, 8, 4, 4),
    (128, 64, 64, 8, 4, 4),
    (128, 256, 64, 8, 8, 3),
    (256, 128, 64, 8, 8, 3),
    (64, 128, 64, 8, 4, 4),
    (64, 64, 64, 8, 4, 6),
]


# --------------------------------------------------------------------------- the lab, part 1
def program_tile(pid: int, num_pid_m: int, num_pid_n: int, group_m: int) -> tuple[int, int]:
    """Which tile (row ``pid_m``, column ``pid_n``) program ``pid`` computes under grouped ordering.

    Programs come in groups of ``group_m`` tile rows × all ``num_pid_n`` columns. Inside a group
    they go down the rows first, then move one column right; the last group may have fewer rows.
    With ``group_m = 1`` this is plain row-major order.
    """
    band = group_m * num_pid_n                      # programs per band of group_m tile rows
    band_id, local = divmod(pid, band)              # which band, and the position inside it
    top = band_id * group_m                         # the band's first tile row
    height = min(group_m, num_pid_m - top)          # the last band can be short
    col = local // height                           # columns advance every `height` programs
    return top + (local - col * height), col


@triton.jit
def _grouped_tile(pid, num_pid_m, num_pid_n, GROUP_M: tl.constexpr):
    """The kernel-side twin of ``program_tile`` (same arithmetic, Triton integer ops)."""
    band = GROUP_M * num_pid_n
    band_id = pid // band
    local = pid - band_id * band
    top = band_id * GROUP_M
    height = tl.minimum(num_pid_m - top, GROUP_M)
    col = local // height
    return top + (local - col * height), col


@triton.jit
def matmul_kernel(
    A, B, C, M, N, K,
    stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
):
    tile_m, tile_n = _grouped_tile(tl.program_id(0), tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N), GROUP_M)
    # int64 offsets: rows * stride_am alone passes 2**31 on real activations and weights
    rows = (tile_m * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)   # this tile's rows of A and C
    cols = (tile_n * BLOCK_N + tl.arange(0, BLOCK_N)).to(tl.int64)   # this tile's columns of B and C
    row_ok = rows < M
    col_ok = cols < N

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)     # registers, for the whole K walk
    for k0 in range(0, K, BLOCK_K):                          # ceil(K / BLOCK_K) steps; the last may be partial
        ks = (k0 + tl.arange(0, BLOCK_K)).to(tl.int64)
        k_ok = ks < K
        a_tile = tl.load(A + rows[:, None] * stride_am + ks[None, :] * stride_ak,
                         mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        b_tile = tl.load(B + ks[:, None] * stride_bk + cols[None, :] * stride_bn,
                         mask=k_ok[:, None] & col_ok[None, :], other=0.0)
        acc = tl.dot(a_tile, b_tile, acc)                    # fp32 accumulation whatever the input dtype

    tl.store(C + rows[:, None] * stride_cm + cols[None, :] * stride_cn,
             acc.to(C.dtype.element_ty), mask=row_ok[:, None] & col_ok[None, :])


# --------------------------------------------------------------------------- provided: launcher and models
def matmul(a: torch.Tensor, b: torch.Tensor, block_m: int = 16, block_n: int = 16, block_k: int = 16,
           group_m: int = 2, num_warps: int = 4, num_stages: int = 2, out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """Launch ``matmul_kernel`` on a 1-D grid of ``cdiv(M, block_m) · cdiv(N, block_n)`` programs.

    The defaults are interpreter-sized; on a GPU pass a row of ``GPU_CONFIGS``. Block sizes must
    be powers of two and at least 16 (``tl.dot``'s minimum).
    """
    M, K = a.shape
    K2, N = b.shape
    if K != K2:
        raise ValueError(f"inner dimensions differ: a is {tuple(a.shape)}, b is {tuple(b.shape)}")
    c = torch.empty((M, N), dtype=out_dtype or a.dtype, device=a.device)
    grid = (triton.cdiv(M, block_m) * triton.cdiv(N, block_n),)
    matmul_kernel[grid](
        a, b, c, M, N, K,
        a.stride(0), a.stride(1), b.stride(0), b.stride(1), c.stride(0), c.stride(1),
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, GROUP_M=group_m,
        num_warps=num_warps, num_stages=num_stages,
    )
    return c


def gemm_flops(M: int, N: int, K: int) -> int:
    """A GEMM does one multiply and one add per (m, n, k): ``2·M·N·K`` FLOPs."""
    return 2 * M * N * K


def panels_in_wave(M: int, N: int, block_m: int, block_n: int, group_m: int, wave: int) -> tuple[int, int]:
    """Distinct A panels (tile rows) and B panels (tile columns) read by the first ``wave``
    programs, i.e. the working set the L2 cache must hold while those programs run together."""
    num_pid_m, num_pid_n = triton.cdiv(M, block_m), triton.cdiv(N, block_n)
    tiles = [program_tile(p, num_pid_m, num_pid_n, group_m) for p in range(min(wave, num_pid_m * num_pid_n))]
    return len({m for m, _ in tiles}), len({n for _, n in tiles})


# --------------------------------------------------------------------------- what you should see
def main() -> None:
    order = [program_tile(p, 3, 4, 2) for p in range(12)]
    print("program order on a 3 x 4 grid of tiles, GROUP_M=2:")
    print("  " + " ".join(f"{m}{n}" for m, n in order) + "   (pid_m pid_n per program)")
    print("  row-major (GROUP_M=1): " + " ".join(f"{m}{n}" for m, n in (program_tile(p, 3, 4, 1) for p in range(12))))
    g = torch.Generator().manual_seed(0)
    for (M, K, N) in [(32, 32, 32), (37, 19, 23)]:
        a, b = torch.randn(M, K, generator=g), torch.randn(K, N, generator=g)
        c = matmul(a, b)
        print(f"{M}x{K} @ {K}x{N} (16x16x16 tiles, {triton.cdiv(M, 16) * triton.cdiv(N, 16)} programs):"
              f" matches torch.matmul: {bool(torch.allclose(c, a @ b, atol=1e-4))}")
    w = torch.randn(24, 32, generator=g)
    x = torch.randn(16, 32, generator=g)
    print(f"x @ W.T with W (24, 32) passed as a strided view: matches: {bool(torch.allclose(matmul(x, w.T), x @ w.T, atol=1e-4))}")
    print("L2 working set of one wave of 132 programs (H100 SXM has 132 SMs), 4096^3, 128x128 tiles:")
    for gm in (1, 8):
        pa, pb = panels_in_wave(4096, 4096, 128, 128, gm, 132)
        print(f"  GROUP_M={gm}: {pa} A panels + {pb} B panels = {pa + pb} panels of 128 x 4096 bf16 (1 MiB each)")


if __name__ == "__main__":
    main()
