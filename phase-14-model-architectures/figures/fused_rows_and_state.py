"""Draw fused_rows_and_state.svg: where Llama-3-8B's layer-0 tensors land, and KV versus Mamba state.

Top panel: the two fused parameters of a Llama-3-8B decoder layer, drawn to scale by rows, with
the checkpoint tensor that fills each block (``predict_rows`` of lab 03, which its tests check
against vLLM's own loader). Bottom panel: what one request holds for one layer as its sequence
grows: an attention layer's KV (Llama-3-8B: 8 KV heads x 128, K and V, bf16) grows by 4 KiB per
token; a Mamba2-2.7B mixer's SSM state (80 heads x 64 x 128, 4 bytes) is fixed.
Run: python phase-14-model-architectures/figures/fused_rows_and_state.py
"""

from __future__ import annotations

from pathlib import Path

from course.runtime import use_lab
from course.svgfig import BLUE, GREEN, GREY, INK, ORANGE, PURPLE, Svg

trace = use_lab("phase-14/lab-03-trace-weight-loading")

KV_PER_TOKEN = 2 * 8 * 128 * 2  # K and V, 8 kv heads, head_dim 128, bf16
MAMBA_STATE = 80 * 64 * 128 * 4  # heads x head_dim x dstate, 4-byte state
MAX_TOKENS = 2048


def main() -> None:
    rows = [r for r in trace.predict_rows(trace.LLAMA_3_8B) if r.checkpoint.startswith("model.layers.0.")]
    fused = {}
    for r in rows:
        if r.shard is not None:
            fused.setdefault(r.param.split(".")[-2], []).append(
                (r.checkpoint.split(".")[-2], r.start, r.stop)
            )
    for param, blocks in fused.items():
        print(f"{param}: " + ", ".join(f"{name} {a}:{b}" for name, a, b in blocks))
    cross = MAMBA_STATE // KV_PER_TOKEN
    print(
        f"KV per token per layer {KV_PER_TOKEN:,} B; Mamba state per layer {MAMBA_STATE:,} B; equal at {cross} tokens"
    )

    svg = Svg(
        560,
        520,
        "Fused rows and per-request memory",
        "Top: qkv_proj is 6144 rows (q 0-4096, k 4096-5120, v 5120-6144) and gate_up_proj 28672 rows "
        "(gate then up) in a Llama-3-8B layer. Bottom: one layer's KV for one request grows linearly with "
        "tokens and passes a Mamba2 layer's fixed state at 640 tokens.",
    )
    left, width = 20, 520
    svg.text(left, 26, "Llama-3-8B, layer 0: checkpoint tensors in fused rows", 15, bold=True)
    colours = {"q_proj": BLUE, "k_proj": ORANGE, "v_proj": GREEN, "gate_proj": PURPLE, "up_proj": BLUE}
    y = 48
    for param in ("qkv_proj", "gate_up_proj"):
        blocks = fused[param]
        total = blocks[-1][2]
        svg.text(left, y + 14, f"{param}.weight: {total:,} rows x 4096", 13, mono=True)
        y += 22
        for name, a, b in blocks:
            x0, w = left + width * a / total, width * (b - a) / total
            svg.rect(x0, y, w, 34, colours[name], INK, 0.8)
            svg.text(x0 + w / 2, y + 15, name, 13, "middle", "#ffffff", bold=True)
            svg.text(x0 + w / 2, y + 29, f"{a}:{b}", 12, "middle", "#ffffff")
        y += 56
    svg.text(left, y, "k and v are 4x narrower than q: 8 KV heads serve 32 query heads (GQA)", 12)

    top, h = 250, 200
    svg.text(left, top - 14, "One request, one layer: bytes held as the sequence grows", 15, bold=True)
    x0, x1, ymax = left + 50, left + width, 9e6
    svg.line(x0, top + h, x1, top + h)
    svg.line(x0, top, x0, top + h)
    for mb in (0, 2, 4, 6, 8):
        yy = top + h - h * mb * 1e6 / ymax
        svg.line(x0 - 4, yy, x0, yy)
        svg.text(x0 - 8, yy + 4, f"{mb} MB", 12, "end")
    for t in (0, 512, 1024, 1536, 2048):
        xx = x0 + (x1 - x0) * t / MAX_TOKENS
        svg.line(xx, top + h, xx, top + h + 4)
        svg.text(xx, top + h + 18, str(t), 12, "middle")
    svg.text((x0 + x1) / 2, top + h + 36, "tokens in the sequence", 12, "middle")

    def pt(tokens, nbytes):
        return x0 + (x1 - x0) * tokens / MAX_TOKENS, top + h - h * nbytes / ymax

    svg.polyline([pt(0, 0), pt(MAX_TOKENS, MAX_TOKENS * KV_PER_TOKEN)], ORANGE, 3)
    svg.polyline([pt(0, MAMBA_STATE), pt(MAX_TOKENS, MAMBA_STATE)], BLUE, 3)
    cx, cy = pt(cross, MAMBA_STATE)
    svg.line(cx, cy, cx, top + h, GREY, 1, dash=True)
    svg.circle(cx, cy, 4)
    svg.text(cx + 6, cy + 18, f"equal at {cross} tokens", 13)
    svg.text(x0 + 8, top + 16, "attention KV (Llama-3-8B layer): 4 KiB per token", 12, fill=ORANGE, bold=True)
    svg.text(x0 + 8, top + 34, "Mamba2 state (2.7B mixer): 2.6 MB, fixed", 12, fill=BLUE, bold=True)
    svg.write(Path(__file__).with_name("fused_rows_and_state.svg"))
    print("wrote fused_rows_and_state.svg")


if __name__ == "__main__":
    main()
