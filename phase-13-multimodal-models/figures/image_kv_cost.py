"""Print what images cost in tokens, KV blocks and KV bytes (the numbers of guide §13.4).

Token counts use lab 01's patch arithmetic (its reference solution) and, for Qwen2-VL, a resize
written from the rule its image processor documents: round each side to a multiple of 28
(14-px patches, 2 x 2 merge), then scale down to fit ``max_pixels`` / up to ``min_pixels``.
KV bytes use Phase 00's formula for Llama-3-8B (32 layers, 8 KV heads, head_dim 128, fp16):
2 x 32 x 8 x 128 x 2 B = 128 KiB per token. Nothing here is measured: these are predictions.
Run: python phase-13-multimodal-models/figures/image_kv_cost.py
"""

from __future__ import annotations

import math

from course.runtime import use_lab

LAB01 = use_lab("phase-13/lab-01-image-token-expansion")

BLOCK = 16
KV_BYTES_PER_TOKEN = 2 * 32 * 8 * 128 * 2  # K and V, layers, KV heads, head_dim, fp16


def qwen2_vl_resize(h: int, w: int, factor: int = 28, min_pixels: int = 56 * 56, max_pixels: int = 28 * 28 * 1280) -> tuple[int, int]:
    """Each side to the nearest multiple of ``factor``, then rescaled (keeping the aspect) into
    ``[min_pixels, max_pixels]``, rounding down when shrinking and up when growing."""
    hh, ww = max(factor, round(h / factor) * factor), max(factor, round(w / factor) * factor)
    if hh * ww > max_pixels:
        beta = math.sqrt(h * w / max_pixels)
        hh, ww = math.floor(h / beta / factor) * factor, math.floor(w / beta / factor) * factor
    elif hh * ww < min_pixels:
        beta = math.sqrt(min_pixels / (h * w))
        hh, ww = math.ceil(h * beta / factor) * factor, math.ceil(w * beta / factor) * factor
    return hh, ww


def main() -> None:
    llava = LAB01.image_token_count(336, 336)
    print(f"LLaVA-1.5, any image (resized to 336 x 336): {llava} tokens = {LAB01.kv_blocks_needed(llava)} blocks"
          f" = {llava * KV_BYTES_PER_TOKEN / 2**20:.0f} MiB of KV (Llama-3-8B-sized LLM)")
    print("Qwen2-VL (14-px patches, 2 x 2 merge), predicted:")
    for h, w, max_px, label in [(336, 336, 12845056, "default max_pixels"), (960, 1280, 12845056, "default max_pixels"),
                                (960, 1280, 28 * 28 * 1280, "max_pixels = 1280 x 28 x 28"),
                                (480, 640, 12845056, "half each side"), (3000, 4000, 12845056, "12 MP photo"),
                                (3000, 4000, 28 * 28 * 1280, "12 MP, max_pixels = 1280 x 28 x 28")]:
        hh, ww = qwen2_vl_resize(h, w, max_pixels=max_px)
        t = LAB01.image_token_count(hh, ww, patch=14, merge=2)
        print(f"  {w:4d} x {h:<4d} -> {ww:4d} x {hh:<4d} {t:6d} tokens {LAB01.kv_blocks_needed(t):5d} blocks  ({label})")
    print()
    text, images = 19, 1
    total = text + images * llava
    print(f"one request: {text} text + {llava} image = {total} tokens -> {LAB01.kv_blocks_needed(total)} blocks"
          f" (image alone {LAB01.kv_blocks_needed(llava)}, text alone {LAB01.kv_blocks_needed(text + 1)})")
    n, per = 50, 1000
    blocks = n * LAB01.kv_blocks_needed(per)
    gib = blocks * BLOCK * KV_BYTES_PER_TOKEN / 2**30
    img_gib = n * LAB01.kv_blocks_needed(llava) * BLOCK * KV_BYTES_PER_TOKEN / 2**30
    print(f"{n} prompts x {per} tokens (one LLaVA image each): {blocks} blocks = {gib:.2f} GiB of KV")
    print(f"  = {100 * gib / 8:.0f}% of an 8 GiB KV budget; the images alone {img_gib:.2f} GiB = {100 * img_gib / 8:.0f}%")


if __name__ == "__main__":
    main()
