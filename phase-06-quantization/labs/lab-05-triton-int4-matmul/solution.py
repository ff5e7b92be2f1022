"""Lab 06-05 — a fused int4 dequantize-and-multiply kernel in Triton (reference solution).

``y = x @ W.T`` where ``W`` (N, K) is stored the way lab-02 stores it:

    packed  uint8   (N, K // 2)          byte j of row n = (q[n, 2j] + 8) | (q[n, 2j+1] + 8) << 4
    scales  float16 (N, K // group)      W[n, k] = scales[n, k // group] * q[n, k]

The kernel never writes the dequantized W anywhere. Each program owns a (BLOCK_M x BLOCK_N) tile of
``y`` and walks K in steps of BLOCK_K. Per step it reads BLOCK_N x BLOCK_K/2 bytes of nibbles,
splits them in registers into the even-k values (low nibbles) and the odd-k values (high nibbles),
loads the matching even and odd columns of ``x``, and does two small dots:

    partial = x_even @ low.T + x_odd @ high.T            (integers times activations)
    acc    += partial * scale[n, k0 // group]            (BLOCK_K divides group: one scale per row per step)

The scale factors out of the dot product over one group, so it is applied once per row per step
instead of once per weight: the same trick as lab-01's per-channel scale, one level down.

Decode reads the whole weight matrix to produce a few rows of ``y``, so the kernel's speed is set
by bytes: ``weight_bytes`` counts them and ``predicted_speedup`` turns the counts into the roofline
ratio against fp16 weights.
"""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():               # no GPU: run the kernel in Triton's CPU interpreter
    os.environ.setdefault("TRITON_INTERPRET", "1")

import triton
import triton.language as tl


# --------------------------------------------------------------------------- the lab: the kernel
@triton.jit
def _int4_matmul_kernel(
    X, P, S, Y,
    M, N, K,
    stride_xm, stride_pn, stride_sn, stride_ym,
    GROUP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    offs_m = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)   # int64: offs_n * stride_pn passes 2**31
    offs_n = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)).to(tl.int64)   # on large weights (an lm_head)
    offs_j = tl.arange(0, BLOCK_K // 2)                 # packed byte index inside one K step
    m_ok = offs_m < M
    n_ok = offs_n < N
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        byte = tl.load(P + offs_n[:, None] * stride_pn + (k0 // 2 + offs_j)[None, :],
                       mask=n_ok[:, None], other=0x88)                   # 0x88 unpacks to (0, 0)
        x_even = tl.load(X + offs_m[:, None] * stride_xm + (k0 + 2 * offs_j)[None, :],
                         mask=m_ok[:, None], other=0.0)
        x_odd = tl.load(X + offs_m[:, None] * stride_xm + (k0 + 2 * offs_j + 1)[None, :],
                        mask=m_ok[:, None], other=0.0)
        low = ((byte & 0xF).to(tl.int32) - 8).to(x_even.dtype)          # q[n, k0 + 2j]
        high = ((byte >> 4).to(tl.int32) - 8).to(x_even.dtype)          # q[n, k0 + 2j + 1]
        partial = tl.dot(x_even, tl.trans(low)) + tl.dot(x_odd, tl.trans(high))
        scale = tl.load(S + offs_n * stride_sn + k0 // GROUP, mask=n_ok, other=0.0).to(tl.float32)
        acc += partial * scale[None, :]
    tl.store(Y + offs_m[:, None] * stride_ym + offs_n[None, :], acc.to(Y.dtype.element_ty),
             mask=m_ok[:, None] & n_ok[None, :])


# --------------------------------------------------------------------------- provided: the launcher
def int4_matmul(x: torch.Tensor, packed: torch.Tensor, scales: torch.Tensor, group_size: int,
                block_n: int = 64, block_k: int | None = None, num_warps: int = 4) -> torch.Tensor:
    """``y = x @ dequant(packed, scales).T`` for x (M, K), packed uint8 (N, K // 2), scales (N, K // group).

    Output has x's dtype, shape (M, N). ``block_k`` defaults to min(group_size, 128) and must divide
    ``group_size``; BLOCK_M is 16 (the smallest tile ``tl.dot`` accepts), rows past M are masked.
    """
    M, K = x.shape
    N = packed.shape[0]
    block_k = block_k or min(group_size, 128)
    if packed.dtype != torch.uint8 or packed.shape[1] * 2 != K:
        raise ValueError(f"packed must be uint8 of shape (N, K // 2) = (N, {K // 2}), got {packed.dtype} {tuple(packed.shape)}")
    if K % group_size or group_size % block_k or block_k % 32:
        raise ValueError(f"need group_size | K and block_k | group_size with block_k a multiple of 32; "
                         f"got K={K}, group_size={group_size}, block_k={block_k}")
    if scales.shape != (N, K // group_size):
        raise ValueError(f"scales must be (N, K // group_size) = ({N}, {K // group_size}), got {tuple(scales.shape)}")
    x, packed, scales = x.contiguous(), packed.contiguous(), scales.contiguous()
    y = torch.empty((M, N), dtype=x.dtype, device=x.device)
    block_m = 16
    grid = (triton.cdiv(M, block_m), triton.cdiv(N, block_n))
    _int4_matmul_kernel[grid](
        x, packed, scales, y, M, N, K,
        x.stride(0), packed.stride(0), scales.stride(0), y.stride(0),
        GROUP=group_size, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, num_warps=num_warps,
    )
    return y


# --------------------------------------------------------------------------- the lab: the byte model
def weight_bytes(n: int, k: int, fmt: str, group_size: int = 128) -> int:
    """Bytes of weight a (N, K) layer reads per forward pass.

    ``"fp16"``: 2 bytes per weight. ``"int4"``: half a byte per weight plus one fp16 scale per
    ``group_size`` weights of a row.
    """
    if fmt == "fp16":
        return 2 * n * k
    if fmt == "int4":
        return n * k // 2 + 2 * n * (k // group_size)
    raise ValueError(f"unknown format {fmt!r}: use 'fp16' or 'int4'")


def matmul_bytes(m: int, n: int, k: int, fmt: str, group_size: int = 128) -> int:
    """Every byte one ``y = x @ W.T`` must move: the weight, x (M, K) in fp16 and y (M, N) in fp16."""
    return weight_bytes(n, k, fmt, group_size) + 2 * m * k + 2 * m * n


def predicted_time(m: int, n: int, k: int, fmt: str, bandwidth: float, peak_flops: float,
                   group_size: int = 128) -> float:
    """Roofline time in seconds: the larger of bytes / bandwidth and 2·M·N·K / peak FLOP/s.

    Both formats do the same FLOPs (the int4 kernel multiplies fp16 values after unpacking).
    """
    return max(matmul_bytes(m, n, k, fmt, group_size) / bandwidth, 2 * m * n * k / peak_flops)


def predicted_speedup(m: int, n: int, k: int, bandwidth: float, peak_flops: float, group_size: int = 128) -> float:
    """fp16 time over int4 time under the roofline: ~3.9x while both are bandwidth-bound, ~1 once compute-bound."""
    return (predicted_time(m, n, k, "fp16", bandwidth, peak_flops, group_size)
            / predicted_time(m, n, k, "int4", bandwidth, peak_flops, group_size))


# --------------------------------------------------------------------------- provided: an example
def random_int4_weight(n: int, k: int, group_size: int, seed: int = 0, device: str = "cpu"):
    """Seeded (packed uint8 (N, K//2), scales float16 (N, K//group)) built like lab-02's output."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randint(-7, 8, (n, k), generator=g, dtype=torch.int16)
    u = (q + 8).to(torch.uint8)
    packed = u[:, 0::2] | (u[:, 1::2] << 4)
    scales = (torch.rand(n, k // group_size, generator=g) * 0.02 + 0.005).to(torch.float16)
    return packed.to(device), scales.to(device)


def main() -> None:
    import numpy as np

    from course.runtime import use_lab

    lab03 = use_lab("phase-06/lab-02-int4-groups-and-packing")
    W = np.random.default_rng(0).standard_normal((32, 64)).astype(np.float32)
    q, s = lab03.quantize_grouped(W, 32)
    packed = torch.from_numpy(lab03.pack_int4(q))
    x = torch.from_numpy(np.random.default_rng(1).standard_normal((3, 64)).astype(np.float32))
    y = int4_matmul(x, packed, torch.from_numpy(s), group_size=32, block_n=16, block_k=32)
    want = x.double().numpy() @ lab03.dequantize_grouped(q, s, 32).astype(np.float64).T
    print("Fused int4 matmul (Triton; the CPU interpreter when there is no GPU): x (3, 64) @ W.T,")
    print(f"  W (32, 64) packed to {tuple(packed.shape)} uint8 + {tuple(s.shape)} fp16 scales (group 32)")
    print(f"  agrees with lab-02's numpy dequantization: {bool(np.abs(y.double().numpy() - want).max() < 1e-4)}")
    print()
    bw, flops = 3.35e12, 989e12   # H100 SXM: HBM3 bandwidth, dense fp16 tensor-core peak (NVIDIA H100 datasheet)
    n, k = 4096, 4096
    print(f"Bytes one decode GEMM moves, {n} x {k}, group 128 (weight + x + y)")
    print(f"{'M':>4} {'fp16 B':>12} {'int4 B':>12} {'byte ratio':>11} {'predicted speedup on H100 SXM':>31}")
    for m in (1, 16, 64, 256):
        b16, b4 = matmul_bytes(m, n, k, "fp16"), matmul_bytes(m, n, k, "int4")
        print(f"{m:>4} {b16:>12,} {b4:>12,} {b16 / b4:>10.2f}x {predicted_speedup(m, n, k, bw, flops):>30.2f}x")
    print(f"weight bytes alone: fp16 / int4 = 2 / (0.5 + 2/128) = "
          f"{weight_bytes(n, k, 'fp16') / weight_bytes(n, k, 'int4'):.3f}")


if __name__ == "__main__":
    main()
