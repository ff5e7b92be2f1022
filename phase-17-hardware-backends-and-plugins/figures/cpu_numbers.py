"""The CPU backend in numbers: KV blocks from a byte budget, and the decode bound from bandwidth.

The model is Qwen2.5-0.5B-Instruct; its shape comes from its ``config.json`` (24 layers, 14 query
heads and 2 KV heads of size 64, 494,032,768 parameters). KV bytes per token follow the phase 00
formula, blocks follow phase 02's carving, and the decode bound is phase 00's roofline: each
decode step of one sequence reads every weight once, so tokens/s <= bandwidth / weight bytes.
Bandwidths are round datasheet-class figures, not measurements: the bounds are *predicted*.
Run: python phase-17-hardware-backends-and-plugins/figures/cpu_numbers.py
"""

from __future__ import annotations

GIB = 1 << 30
LAYERS, KV_HEADS, HEAD_DIM, PARAMS = 24, 2, 64, 494_032_768
BF16 = 2
KV_SPACE_GIB = 4  # VLLM_CPU_KVCACHE_SPACE=4
REPORTED_BLOCKS, REPORTED_TOK_S = 13_107, 9  # figures an older write-up of this lab reports
BANDWIDTH = {"CPU DRAM, ~50 GB/s": 50e9, "H100 HBM3, ~3.35 TB/s": 3.35e12}


def main() -> None:
    per_token = 2 * LAYERS * KV_HEADS * HEAD_DIM * BF16
    print(
        f"KV per token (K and V, {LAYERS} layers x {KV_HEADS} heads x {HEAD_DIM}, bf16): {per_token:,} B "
        f"= {per_token / 1024:g} KiB"
    )
    for block_size, why in [
        (16, "CacheConfig.DEFAULT_BLOCK_SIZE"),
        (128, "CpuPlatform's default at the pin"),
    ]:
        per_block = per_token * block_size
        blocks = KV_SPACE_GIB * GIB // per_block
        print(
            f"  block_size {block_size:3} ({why}): {per_block:,} B per block -> {blocks:,} blocks "
            f"= {blocks * block_size:,} tokens in {KV_SPACE_GIB} GiB"
        )
    implied = KV_SPACE_GIB * GIB / REPORTED_BLOCKS
    print(
        f"  the reported {REPORTED_BLOCKS:,} blocks imply {implied:,.0f} B per block "
        f"= {implied / 16:,.0f} B per token at block_size 16: matches neither"
    )
    weights = PARAMS * BF16
    print(f"weights in bf16: {weights / 1e9:.3f} GB; decode bound = bandwidth / weight bytes (predicted):")
    for name, bw in BANDWIDTH.items():
        print(f"  {name}: <= {bw / weights:,.0f} tokens/s for one sequence")
    print(
        f"  a measured {REPORTED_TOK_S} tokens/s means {REPORTED_TOK_S * weights / 1e9:.1f} GB/s of effective bandwidth"
    )


if __name__ == "__main__":
    main()
