"""Draw roofline.svg: this CPU's roofline with the tiny model's decode step on it, and a GPU's, predicted.

FLOPs and bytes of one decode step are *counted* from the course checkpoint's config.json (weights
read once per step, plus the KV cache each request reads; activations ignored). The CPU's roof and
slope, and the time of each decode step, are *measured* on one thread by ``--measure`` (best of
several runs, numpy float32) and kept in roofline_cpu.json, so that the plain run (what
``course outputs`` calls) is the same bytes on every machine. The GPU panel is *predicted* from
datasheet peaks: time = max(FLOPs / peak, bytes / bandwidth); nobody here has measured it.
Run: python phase-18-performance-engineering/figures/roofline.py   (re-measure: add --measure)
"""

from __future__ import annotations

import json
import math
import os
import platform
import sys
import time
from pathlib import Path

HERE = Path(__file__).parent
CONFIG = HERE.parents[1] / "mini_vllm" / "checkpoints" / "course-llama" / "config.json"
MEASURED = HERE / "roofline_cpu.json"
BATCHES = [1, 8, 64, 256]
CONTEXT = 128  # tokens of KV each request reads per step
GPU = ("H100 SXM, bf16 dense (datasheet)", 989e12, 3.35e12, 2)  # name, FLOP/s, bytes/s, bytes per value
LLAMA_8B = {
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "vocab_size": 128256,
}


def linear_params(c: dict) -> int:
    """Parameters every decode token multiplies by: q,k,v,o + gate,up,down per layer, plus lm_head."""
    h, hd = c["hidden_size"], c.get("head_dim", c["hidden_size"] // c["num_attention_heads"])
    qkv_o = h * hd * (2 * c["num_attention_heads"] + 2 * c["num_key_value_heads"])
    mlp = 3 * h * c["intermediate_size"]
    return c["num_hidden_layers"] * (qkv_o + mlp) + h * c["vocab_size"]


def decode_step(c: dict, batch: int, context: int, bytes_per_value: int) -> tuple[float, float]:
    """(FLOPs, bytes) of one decode step: 2 FLOPs per weight per token; the weights once; each request's KV."""
    hd = c.get("head_dim", c["hidden_size"] // c["num_attention_heads"])
    attn_flops = 4 * batch * context * c["num_attention_heads"] * hd * c["num_hidden_layers"]
    kv_bytes = 2 * batch * context * c["num_key_value_heads"] * hd * c["num_hidden_layers"] * bytes_per_value
    return 2 * batch * linear_params(c) + attn_flops, linear_params(c) * bytes_per_value + kv_bytes


def measure(c: dict) -> dict:
    """Time this CPU on one thread: a large matmul (roof), a large copy (slope), the decode-step GEMMs."""
    import numpy as np

    def best(fn, reps: int) -> float:
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        return min(times)

    rng = np.random.default_rng(0)
    peak = 0.0
    for n in (512, 1024, 2048):  # the roof: the best large-matmul rate we can reach
        a, b = rng.standard_normal((n, n), np.float32), rng.standard_normal((n, n), np.float32)
        peak = max(peak, 2 * n**3 / best(lambda a=a, b=b: a @ b, 5))
    src = np.ones(256 * 2**20 // 4, np.float32)  # 256 MiB: far beyond any cache
    dst = np.empty_like(src)
    bandwidth = 2 * src.nbytes / best(lambda: np.copyto(dst, src), 10)
    h, hd, layers = c["hidden_size"], c["head_dim"], c["num_hidden_layers"]
    shapes = [
        (h, hd * (c["num_attention_heads"] + 2 * c["num_key_value_heads"])),
        (hd * c["num_attention_heads"], h),
        (h, 2 * c["intermediate_size"]),
        (c["intermediate_size"], h),
    ] * layers + [(h, c["vocab_size"])]
    weights = [rng.standard_normal(s, np.float32) for s in shapes]
    steps = {}
    for batch in BATCHES:
        x = [rng.standard_normal((batch, s[0]), np.float32) for s in shapes]
        steps[str(batch)] = best(lambda x=x: [xi @ w for xi, w in zip(x, weights)], 50)
    caches = {}
    for index in sorted(Path("/sys/devices/system/cpu/cpu0/cache").glob("index*")):
        level, kind = (index / "level").read_text().strip(), (index / "type").read_text().strip()
        if kind != "Instruction":
            caches[f"L{level}"] = (index / "size").read_text().strip()
    return {
        "cpu": platform.processor() or platform.machine(),
        "threads": 1,
        "numpy": np.__version__,
        "caches": caches,
        "matmul_flops_per_s": peak,
        "copy_bytes_per_s": bandwidth,
        "decode_gemm_seconds": steps,
        "note": "best of several runs on a shared 2-core machine; re-run with --measure on yours",
    }


def draw(cpu: dict, c: dict, path: Path) -> None:
    from course.svgfig import BLUE, GREY, INK, ORANGE, PURPLE, Svg

    width, left, pw, ph, gap, top = 560, 76, 460, 220, 96, 30
    svg = Svg(
        width,
        top + 2 * (ph + gap) + 10,
        "Roofline: this CPU measured, an H100 predicted",
        "Two stacked log-log panels of attainable FLOP/s against arithmetic intensity. Top: this CPU's measured "
        "one-thread roof and copy bandwidth, with the tiny model's decode step at batch 1 to 256 plotted at its "
        "measured speed. Bottom: an H100's predicted roofline with the tiny model and Llama-3-8B decode steps "
        "placed by formula; every decode point sits on the bandwidth slope, left of the ridge.",
    )
    xlo, xhi = -1, 3  # log10 FLOP/byte

    def panel(
        p: int, title: str, peak: float, bw: float, points: list[tuple[str, float, float, str, str]]
    ) -> None:
        y0 = top + p * (ph + gap) + 20
        yhi = math.ceil(math.log10(peak) + 0.3)
        ylo = yhi - 4
        fx = lambda ai: left + pw * (math.log10(ai) - xlo) / (xhi - xlo)  # noqa: E731
        fy = lambda f: y0 + ph - ph * (math.log10(f) - ylo) / (yhi - ylo)  # noqa: E731
        svg.text(left, y0 - 10, title, 17, bold=True)
        svg.rect(left, y0, pw, ph, "none", GREY)
        ridge = peak / bw
        start = max(10.0**xlo, 10.0**ylo / bw)  # the slope enters the panel here
        roof = [(fx(start), fy(bw * start)), (fx(ridge), fy(peak)), (fx(10**xhi), fy(peak))]
        svg.line(fx(ridge), fy(peak), fx(ridge), y0 + ph, GREY, 1, dash=True)
        svg.polyline(roof, INK, 2)
        svg.text(left + pw - 6, fy(peak) - 8, f"ridge {ridge:.0f} FLOP/B", 15, "end")
        for e in range(xlo, xhi + 1):
            svg.text(fx(10**e), y0 + ph + 18, f"1e{e}" if e else "1", 14, "middle")
        for e in range(ylo, yhi + 1):
            svg.text(left - 6, fy(10**e) + 5, f"1e{e}", 14, "end")
        for label, ai, flops, colour, where in points:
            svg.circle(fx(ai), fy(flops), 5, colour)
            dx, dy, anchor = {
                "above": (0, -11, "middle"),
                "below": (0, 22, "middle"),
                "left": (-9, -9, "end"),
                "right": (9, 19, "start"),
            }[where]
            svg.text(fx(ai) + dx, fy(flops) + dy, label, 15, anchor, fill=colour, bold=True)
        svg.text(left + pw / 2, y0 + ph + 38, "arithmetic intensity, FLOP/byte (log)", 15, "middle")
        svg.text(left + pw - 4, y0 + ph - 8, "FLOP/s (log) vs intensity", 14, "end", fill=GREY)

    pts = []
    for batch, where in zip(BATCHES, ("above", "below", "left", "right")):
        flops, nbytes = decode_step(c, batch, CONTEXT, 4)
        t = cpu["decode_gemm_seconds"][str(batch)]
        pts.append((f"B={batch}", flops / nbytes, flops / t, BLUE, where))
    panel(0, "This CPU, 1 thread, fp32 (measured)", cpu["matmul_flops_per_s"], cpu["copy_bytes_per_s"], pts)
    name, peak, bw, bpv = GPU
    gpts = []
    for model, tag, colour, batches, above in (
        (c, "tiny", ORANGE, (1, 256), "left"),
        (LLAMA_8B, "8B", PURPLE, (8, 64, 256), "right"),
    ):
        for batch in batches:
            flops, nbytes = decode_step(model, batch, CONTEXT, bpv)
            gpts.append(
                (f"{tag} B={batch}", flops / nbytes, flops / max(flops / peak, nbytes / bw), colour, above)
            )
    panel(1, "H100 SXM, bf16 (predicted, datasheet)", peak, bw, gpts)
    svg.write(path)


def main() -> None:
    c = json.loads(CONFIG.read_text())
    if "--measure" in sys.argv:
        os.environ.setdefault("OMP_NUM_THREADS", "1")
        MEASURED.write_text(json.dumps(measure(c), indent=2, sort_keys=True) + "\n")
        print(f"wrote {MEASURED.name}")
    cpu = json.loads(MEASURED.read_text())
    p = linear_params(c)
    print(
        f"tiny model (course-llama): {p:,} parameters in its GEMMs; decode step at {CONTEXT} tokens of context"
    )
    print("  FLOPs = 2 x batch x params + 4 x batch x context x heads x head_dim x layers")
    print(
        "  bytes = params x bytes/value + 2 x batch x context x kv_heads x head_dim x layers x bytes/value\n"
    )
    peak, bw = cpu["matmul_flops_per_s"], cpu["copy_bytes_per_s"]
    print(f"this CPU ({cpu['cpu']}, {cpu['threads']} thread, measured, {MEASURED.name}):")
    print(
        f"  matmul roof {peak / 1e9:.1f} GFLOP/s, copy bandwidth {bw / 1e9:.1f} GB/s, ridge {peak / bw:.1f} FLOP/byte"
    )
    print(f"  caches {cpu['caches']}; the float32 weights are {p * 4 / 2**20:.1f} MiB")
    print(" batch  FLOP/byte  step us  GFLOP/s  % of roof  DRAM-slope limit GFLOP/s")
    for batch in BATCHES:
        flops, nbytes = decode_step(c, batch, CONTEXT, 4)
        t = cpu["decode_gemm_seconds"][str(batch)]
        print(
            f" {batch:5} {flops / nbytes:10.1f} {t * 1e6:8.0f} {flops / t / 1e9:8.1f} {100 * flops / t / peak:9.0f}%"
            f" {min(peak, bw * flops / nbytes) / 1e9:13.1f}"
        )
    name, gpeak, gbw, bpv = GPU
    print(f"\n{name}: {gpeak / 1e12:.0f} TFLOP/s, {gbw / 1e12:.2f} TB/s, ridge {gpeak / gbw:.0f} FLOP/byte")
    print(
        f"  Llama-3-8B: {linear_params(LLAMA_8B) / 1e9:.2f} B parameters in its GEMMs,"
        f" {linear_params(LLAMA_8B) * bpv / 1e9:.1f} GB of bf16 weights read per step"
    )
    print(
        "  predicted step time = max(FLOPs / peak, bytes / bandwidth)  (no launch overhead, no measurement)"
    )
    print(" model  batch  FLOP/byte   predicted us   bound    predicted tokens/s")
    for label, model in (("tiny", c), ("8B", LLAMA_8B)):
        for batch in BATCHES:
            flops, nbytes = decode_step(model, batch, CONTEXT, bpv)
            t = max(flops / gpeak, nbytes / gbw)
            bound = "memory" if nbytes / gbw >= flops / gpeak else "compute"
            print(
                f" {label:5} {batch:6} {flops / nbytes:10.1f} {t * 1e6:14.2f}   {bound:7} {batch / t:16,.0f}"
            )
    draw(cpu, c, HERE / "roofline.svg")
    print("wrote roofline.svg")


if __name__ == "__main__":
    main()
