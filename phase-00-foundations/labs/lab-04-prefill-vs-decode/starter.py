"""Lab 00-04 — prefill vs decode on the roofline (starter: write the six one-line functions).

The model of one forward pass used throughout (the "weight-stream" roofline):

* bytes moved  = the weights, read once per step: ``n_params * dtype_bytes``
  (KV-cache and activation traffic ignored);
* FLOPs done   = about 2 per parameter per token (one multiply + one add):
  ``2 * n_params * num_tokens``;
* step time    = max(bytes / bandwidth, FLOPs / peak) — whichever resource runs out first.

Six one-line functions turn that model into the numbers every inference engineer carries
around: the ridge point, arithmetic intensity, the compute-bound test, the critical batch
size, the single-stream decode speed limit and batched decode throughput.
"""

from __future__ import annotations

# Datasheet figures (dense, no structured sparsity).
A100_PEAK_FLOPS = 312e12  # NVIDIA A100 datasheet: 312 TFLOP/s BF16/FP16 tensor core, dense
A100_BANDWIDTH = 2.0e12  # NVIDIA A100 80GB SXM datasheet: 2,039 GB/s HBM2e, rounded to 2.0 TB/s
H100_PEAK_FLOPS = 989e12  # NVIDIA H100 SXM datasheet: 1,979 TFLOP/s BF16 *with* sparsity -> ~989 dense
H100_BANDWIDTH = 3.35e12  # NVIDIA H100 SXM datasheet: 3.35 TB/s HBM3


# --------------------------------------------------------------------------- the lab
def ridge_point(peak_flops: float, mem_bandwidth: float) -> float:
    """FLOPs per byte at which a device's compute and memory limits meet (peak / bandwidth)."""
    raise NotImplementedError("ridge_point: return peak_flops / mem_bandwidth (FLOPs per byte)")


def arithmetic_intensity(n_params: float, num_tokens: int, dtype_bytes: float) -> float:
    """FLOPs per byte of one forward pass over ``num_tokens`` tokens.

    FLOPs = 2 * n_params * num_tokens; bytes = n_params * dtype_bytes (weights read once).
    The model size cancels: the result is 2 * num_tokens / dtype_bytes.
    """
    raise NotImplementedError(
        "arithmetic_intensity: FLOPs = 2 * n_params * num_tokens, bytes = n_params * dtype_bytes; return FLOPs / bytes"
    )


def is_compute_bound(intensity: float, ridge: float) -> bool:
    """True when the pass does at least ``ridge`` FLOPs per byte (right of the ridge)."""
    raise NotImplementedError("is_compute_bound: compare intensity with ridge (on the ridge counts as compute-bound)")


def critical_batch_size(peak_flops: float, mem_bandwidth: float, dtype_bytes: float) -> float:
    """Tokens per step at which a pass becomes compute-bound: solve 2 * B / dtype_bytes = ridge."""
    raise NotImplementedError(
        "critical_batch_size: solve 2 * B / dtype_bytes == ridge_point(peak_flops, mem_bandwidth) for B"
    )


def decode_tokens_per_second(n_params: float, dtype_bytes: float, mem_bandwidth: float) -> float:
    """Single-sequence decode speed limit: steps per second when each step reads every weight once."""
    raise NotImplementedError(
        "decode_tokens_per_second: each step reads n_params * dtype_bytes bytes; steps/s = bandwidth / that"
    )


def batched_decode_throughput(
    batch_size: int, n_params: float, dtype_bytes: float, mem_bandwidth: float, peak_flops: float
) -> float:
    """Total tokens per second when ``batch_size`` sequences share each decode step.

    Step time is max(weight bytes / bandwidth, 2 * n_params * batch_size / peak): flat while
    memory-bound, then growing once the batch crosses the ridge.
    """
    raise NotImplementedError(
        "batched_decode_throughput: step = max(weight bytes / bandwidth, 2 * n_params * batch_size / peak_flops); "
        "return batch_size / step"
    )


# --------------------------------------------------------------------------- what you should see
def _plot(path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    ridge = ridge_point(A100_PEAK_FLOPS, A100_BANDWIDTH)
    x = np.logspace(-1, 4, 200)
    roof = np.minimum(A100_PEAK_FLOPS, x * A100_BANDWIDTH) / 1e12
    fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=100)
    ax.loglog(x, roof, color="black", lw=2, label="A100 roofline")
    ax.axvline(ridge, color="gray", ls=":", lw=1)
    ax.text(ridge * 1.1, 2, f"ridge = {ridge:.0f} FLOP/B", color="gray")
    points = [("decode B=1", 1, "o", (6, -12)), ("decode B=8", 8, "o", (6, -12)),
              ("decode B=64", 64, "o", (6, -12)), ("decode B=156", 156, "o", (4, -14)),
              ("decode B=512", 512, "o", (-24, 8)), ("prefill 128", 128, "s", (-62, 2)),
              ("prefill 2048", 2048, "s", (-12, -14))]
    for label, tokens, marker, offset in points:
        i = arithmetic_intensity(8e9, tokens, 2)
        y = min(A100_PEAK_FLOPS, i * A100_BANDWIDTH) / 1e12
        color = "tab:blue" if marker == "o" else "tab:red"
        ax.plot(i, y, marker, color=color)
        ax.annotate(label, (i, y), textcoords="offset points", xytext=offset, fontsize=8, color=color)
    ax.set_xlabel("arithmetic intensity (FLOP per byte of weights)")
    ax.set_ylabel("attainable TFLOP/s")
    ax.set_ylim(0.1, 1000)
    ax.set_title("Llama-3-8B fp16 on an A100: decode vs prefill")
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, metadata={"Software": None})
    plt.close(fig)


def main() -> None:
    from pathlib import Path

    n, b = 8e9, 2  # Llama-3-8B in fp16/bf16: 16 GB of weights
    ridge = ridge_point(A100_PEAK_FLOPS, A100_BANDWIDTH)
    print("A100 (312 TFLOP/s dense fp16, 2.0 TB/s), Llama-3-8B fp16 (16 GB of weights)")
    print(f"  ridge point            : {ridge:.1f} FLOP/byte")
    print(f"  critical batch size    : {critical_batch_size(A100_PEAK_FLOPS, A100_BANDWIDTH, b):.0f} tokens/step")
    print(f"  decode speed limit     : {decode_tokens_per_second(n, b, A100_BANDWIDTH):.0f} tok/s per sequence"
          f" (one step = {n * b / A100_BANDWIDTH * 1e3:.0f} ms of weight reading)")
    print(f"  math time per token    : {2 * n / A100_PEAK_FLOPS * 1e3:.3f} ms"
          f" ({(n * b / A100_BANDWIDTH) / (2 * n / A100_PEAK_FLOPS):.0f}x less than the weight read)")
    print()
    print(f"{'tokens/step':>11} {'intensity':>10} {'regime':>14} {'util':>7} {'tokens/s':>10}")
    for t in (1, 8, 64, 155, 156, 512, 2048):
        i = arithmetic_intensity(n, t, b)
        regime = "compute-bound" if is_compute_bound(i, ridge) else "memory-bound"
        util = min(1.0, i / ridge)
        tput = batched_decode_throughput(t, n, b, A100_BANDWIDTH, A100_PEAK_FLOPS)
        print(f"{t:>11} {i:>10.0f} {regime:>14} {util:>7.1%} {tput:>10,.0f}")
    print()
    print("Other speed limits (single sequence, weights read once per step)")
    print(f"  8B  int4 (0.5 B/param) on A100: {decode_tokens_per_second(n, 0.5, A100_BANDWIDTH):.0f} tok/s")
    print(f"  70B fp16 on A100              : {decode_tokens_per_second(70e9, 2, A100_BANDWIDTH):.1f} tok/s")
    print(f"  8B  fp16 on H100 SXM          : {decode_tokens_per_second(n, b, H100_BANDWIDTH):.0f} tok/s"
          f" (ridge {ridge_point(H100_PEAK_FLOPS, H100_BANDWIDTH):.0f} FLOP/byte)")
    _plot(Path(__file__).with_name("roofline.png"))


if __name__ == "__main__":
    main()
