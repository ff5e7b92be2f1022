"""Lab 15-02 reference: when does splitting prefill from decode pay?

Five functions price the trade: the KV freight of one prompt, the wire time for it, the worst
inter-token latency (ITL) a decode stream sees when prefill chunks share its steps, the TTFT a
disaggregated request pays for the transfer, and the decision. ``main`` prints the worked numbers
and ``plot`` draws the guide's figure. The KV-per-token formula is Phase 00 lab 02's, reused.
Grade with: LAB_IMPL=starter pytest phase-15-disaggregated-serving/labs/lab-02-disagg-economics -q
"""

from __future__ import annotations

import sys
from pathlib import Path

from course.runtime import use_lab

_KV = use_lab("phase-00/lab-02-kv-memory-calculator")  # kv_bytes_per_token, ModelShape, LLAMA_3_8B, ...
kv_bytes_per_token, ModelShape = _KV.kv_bytes_per_token, _KV.ModelShape
LLAMA_3_8B, LLAMA_3_70B = _KV.LLAMA_3_8B, _KV.LLAMA_3_70B
QWEN2_5_0_5B = ModelShape(
    "Qwen2.5-0.5B", 24, 2, 64, 0.49e9
)  # config.json: 24 layers, 2 KV heads, head_dim 64
MLA_BYTES_PER_TOKEN = 61 * (512 + 64) * 2  # DeepSeek-V3: 61 layers x (latent 512 + rope key 64) x bf16

HERE = Path(__file__).resolve().parent
FIGURE = HERE.parents[1] / "figures" / "disagg_economics.png"
KiB, MiB = 1 << 10, 1 << 20

# The decision's thresholds: ours, stated, and the tests pin both sides of each.
MAX_TTFT_PENALTY = 0.10  # the transfer may add at most 10 % to a request's prefill time
MIN_ITL_GAIN = 2.0  # and the colocated worst ITL must be at least 2x the clean decode step


def model_kv_bytes_per_token(m: ModelShape) -> int:
    return kv_bytes_per_token(m.num_layers, m.num_kv_heads, m.head_dim, m.dtype_bytes)


# ---- yours ---------------------------------------------------------------------------------------


def kv_payload_bytes(prompt_tokens: int, kv_bytes_per_token: int) -> int:
    """Bytes of KV a prompt of ``prompt_tokens`` ships from P to D (every layer, K and V)."""
    if prompt_tokens < 0 or kv_bytes_per_token <= 0:
        raise ValueError(
            f"need prompt_tokens >= 0 and kv_bytes_per_token > 0, got {prompt_tokens}, {kv_bytes_per_token}"
        )
    return prompt_tokens * kv_bytes_per_token


def transfer_seconds(payload_bytes: int, link_gbps: float) -> float:
    """Wire time of ``payload_bytes`` on a link quoted in gigabits per second (1 Gb/s = 1e9 bit/s)."""
    if link_gbps <= 0:
        raise ValueError(f"link_gbps must be > 0, got {link_gbps}")
    return payload_bytes * 8 / (link_gbps * 1e9)


def colocated_itl_worst(decode_step_s: float, chunk_s: float) -> float:
    """Worst inter-token latency of a decode stream whose step also carries a prefill chunk."""
    return decode_step_s + chunk_s


def disagg_ttft_penalty(transfer_s: float, prefill_s: float) -> float:
    """Extra TTFT of a disaggregated request as a fraction of its prefill time."""
    if prefill_s <= 0:
        raise ValueError(f"prefill_s must be > 0, got {prefill_s}")
    return transfer_s / prefill_s


def disagg_wins(
    transfer_s: float,
    prefill_s: float,
    decode_step_s: float,
    chunk_s: float,
    max_ttft_penalty: float = MAX_TTFT_PENALTY,
    min_itl_gain: float = MIN_ITL_GAIN,
) -> bool:
    """Split when the transfer is cheap (penalty <= max_ttft_penalty) AND interference is real
    (colocated worst ITL / clean decode step >= min_itl_gain). Both bounds are inclusive."""
    penalty = disagg_ttft_penalty(transfer_s, prefill_s)
    gain = colocated_itl_worst(decode_step_s, chunk_s) / decode_step_s
    return penalty <= max_ttft_penalty and gain >= min_itl_gain


# ---- provided: the worked numbers and the figure -------------------------------------------------


def prefill_seconds(n_params: float, tokens: int, sustained_flops: float) -> float:
    """Compute-bound prefill: 2 FLOPs per parameter per token at a sustained FLOP rate."""
    return 2 * n_params * tokens / sustained_flops


def main() -> None:
    per_tok = model_kv_bytes_per_token(LLAMA_3_8B)
    payload = kv_payload_bytes(2048, per_tok)
    print(
        f"Llama-3-8B: {per_tok:,} B/token ({per_tok // KiB} KiB); 2,048 tokens = {payload:,} B = {payload // MiB} MiB"
    )
    prefill = 0.205
    print(f"prefill 205 ms = 2 x 8e9 x 2048 FLOPs at {2 * 8e9 * 2048 / prefill / 1e12:.0f} TFLOP/s sustained")
    print("link      transfer   TTFT penalty")
    for gbps in (10, 25, 100, 200, 400):
        t = transfer_seconds(payload, gbps)
        print(f"{gbps:>4} Gb/s {t * 1e3:>8.1f} ms {disagg_ttft_penalty(t, prefill):>10.1%}")
    worst = colocated_itl_worst(0.010, 0.025)
    print(
        f"ITL worst: colocated 10 ms + 25 ms chunk = {worst * 1e3:.0f} ms vs 10 ms split ({worst / 0.010:.1f}x)"
    )
    for name, (gbps, chunk) in {
        "fast link, interference": (200, 0.025),
        "10 GbE, interference": (10, 0.025),
        "fast link, no interference": (200, 0.002),
    }.items():
        print(f"  {name:<27}: split = {disagg_wins(transfer_seconds(payload, gbps), prefill, 0.010, chunk)}")
    for m in (LLAMA_3_70B, QWEN2_5_0_5B):
        b = model_kv_bytes_per_token(m)
        print(f"{m.name}: {b:,} B/token = {b / KiB:g} KiB ({b / per_tok:g}x the 8B)")
    print(f"DeepSeek-V3 MLA: {MLA_BYTES_PER_TOKEN:,} B/token = {MLA_BYTES_PER_TOKEN / KiB:.1f} KiB")
    q = model_kv_bytes_per_token(QWEN2_5_0_5B)
    print(
        f"Qwen2.5-0.5B, 2,031 tokens: {-(-2031 // 16)} blocks of 16; {2031 * q / MiB:.1f} MiB "
        f"(whole blocks: {127 * 16 * q / MiB:.1f} MiB); 32 MiB would need {32 * MiB / 2031 / KiB:.1f} KiB/token"
    )


def plot(path: Path = FIGURE) -> None:
    """Two stacked panels: the TTFT toll per link against prefill, and the ITL benefit per chunk."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams.update({"font.size": 12})
    fig, (a, b) = plt.subplots(2, 1, figsize=(6.4, 8.4), dpi=100)
    per_tok = model_kv_bytes_per_token(LLAMA_3_8B)
    tokens = [256 * k for k in range(1, 33)]
    a.plot(
        tokens,
        [1e3 * prefill_seconds(8e9, n, 160e12) for n in tokens],
        "k-",
        lw=3,
        label="prefill (160 TFLOP/s)",
    )
    for gbps, style in ((10, "r--"), (25, "m--"), (100, "b-."), (200, "g:"), (400, "c:")):
        a.plot(
            tokens,
            [1e3 * transfer_seconds(kv_payload_bytes(n, per_tok), gbps) for n in tokens],
            style,
            lw=2,
            label=f"KV transfer, {gbps} Gb/s",
        )
    a.set(xlabel="prompt tokens (Llama-3-8B)", ylabel="milliseconds", title="TTFT toll: transfer vs prefill")
    a.legend(fontsize=10)
    chunks = list(range(0, 61, 5))
    b.plot(
        chunks,
        [1e3 * colocated_itl_worst(0.010, c / 1e3) for c in chunks],
        "r-",
        lw=3,
        label="colocated worst ITL",
    )
    b.plot(chunks, [10] * len(chunks), "g-", lw=3, label="disaggregated worst ITL")
    b.axhline(10 * MIN_ITL_GAIN, color="grey", ls=":", label=f"{MIN_ITL_GAIN:g}x the clean step")
    b.set(
        xlabel="prefill chunk sharing the step (ms)",
        ylabel="milliseconds",
        title="ITL benefit: 10 ms decode step",
    )
    b.legend(fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    print(f"wrote {path.relative_to(HERE.parents[2])}")


if __name__ == "__main__":
    main()
    if "--plot" in sys.argv:
        plot()
