"""Lab 13-01 starter: pixels -> patches -> tokens -> KV blocks, and the prompt rewrite.

``image_token_count`` is a vision encoder's patch arithmetic (with an optional spatial merge),
``expand_prompt`` turns each image marker into that many placeholder tokens and records where
they sit, and ``kv_blocks_needed`` is Phase 02's bill, unchanged: the engine only sees tokens.
Grade with: LAB_IMPL=starter pytest phase-13-multimodal-models/labs/lab-01-image-token-expansion -q
"""

from __future__ import annotations

from collections.abc import Sequence

from mini_vllm.multimodal import PlaceholderRange


def image_token_count(height: int, width: int, patch: int = 14, merge: int = 1) -> int:
    """Tokens an ``height x width`` image becomes.

    The encoder cuts the image into ``patch x patch`` squares, ``ceil(side / patch)`` per side
    (a partial patch is padded, not dropped); a ``merge x merge`` spatial merge then folds each
    block of neighbours into one token, again rounding up per side. ``merge=1`` is LLaVA-1.5
    (336 x 336 -> 24 x 24 = 576); ``merge=2`` is the Qwen2-VL family (-> 12 x 12 = 144).
    Raises ``ValueError`` for a non-positive size, patch or merge."""
    raise NotImplementedError(
        'image_token_count: validate the inputs, then per side ceil(side / patch) patches and ceil(patches / '
        'merge) tokens; multiply rows by cols (-(-a // b) is a ceiling division)'
    )


def expand_prompt(
    token_ids: Sequence[int],
    image_token_id: int,
    image_token_counts: Sequence[int],
    placeholder_id: int | None = None,
) -> tuple[list[int], list[PlaceholderRange]]:
    """Replace the k-th ``image_token_id`` marker by ``image_token_counts[k]`` placeholder ids.

    The placeholder id is ``image_token_id`` itself unless ``placeholder_id`` is given (upstream
    LLaVA repeats the image token). Returns the expanded ids and one ``PlaceholderRange`` per
    image, in prompt order, with offsets into the *expanded* ids. Raises ``ValueError`` when the
    number of markers differs from the number of counts, or a count is not positive."""
    raise NotImplementedError(
        'expand_prompt: count the markers and compare with len(image_token_counts); walk the ids, copying '
        'text and appending n placeholder ids per marker, recording PlaceholderRange(offset=len(ids so far), '
        'length=n) before you append'
    )


def kv_blocks_needed(num_tokens: int, block_size: int = 16) -> int:
    """KV blocks a sequence of ``num_tokens`` holds: ``ceil(num_tokens / block_size)``."""
    raise NotImplementedError(
        'kv_blocks_needed: reject num_tokens < 0 or block_size <= 0, then ceil(num_tokens / block_size)'
    )


def main() -> None:
    print("image side -> tokens (patch 14)     merge 1 (LLaVA-1.5)   merge 2 (Qwen2-VL style)")
    for side in (28, 224, 336, 337, 448, 672, 1344):
        t1, t2 = image_token_count(side, side, merge=1), image_token_count(side, side, merge=2)
        print(f"  {side:5d} x {side:<5d}                   {t1:6d} = {kv_blocks_needed(t1):4d} blocks"
              f"    {t2:6d} = {kv_blocks_needed(t2):4d} blocks")
    print()
    image = image_token_count(336, 336)
    text = list(range(1, 20))  # 19 text tokens + 1 marker = a 20-token prompt
    prompt = text[:5] + [32000] + text[5:]
    ids, ranges = expand_prompt(prompt, 32000, [image])
    print(f"a {len(prompt)}-token prompt with one LLaVA-1.5 image (336 x 336):")
    print(f"  expanded to {len(ids)} tokens = {len(prompt) - 1} text + {image} image; range {ranges[0]}")
    print(f"  KV blocks (16 tokens each): {kv_blocks_needed(len(ids))} for the request, "
          f"{kv_blocks_needed(image)} for the image alone, {kv_blocks_needed(len(prompt))} without the image")


if __name__ == "__main__":
    main()
