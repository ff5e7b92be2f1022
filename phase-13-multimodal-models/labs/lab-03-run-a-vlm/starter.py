"""Lab 13-03 (your file): predict what the real vLLM does with an image before you run it.

Four predictions, each checked against vLLM 0.22.1's own classes on the CPU (``test_lab.py``,
marker ``upstream``) and, on a GPU, against a real vision-language model (``run.py``):

1. ``same_hash``: does ``MultiModalHasher`` give two arrays the same identity?
2. ``num_embeds`` / ``embeds_in_range``: how many encoder embeddings a ``PlaceholderRange`` with
   an ``is_embed`` mask takes, and which of them a slice of its positions reads.
3. ``merge_multimodal_embeddings``: the splice, including the count check and its message.
4. ``block_keys`` / ``prefix_hit_tokens`` / ``predict_step_table``: prefix-cache hits with images
   in the block keys, fed into lab 02's encoder rule, give the real scheduler's step table.

Run ``python phase-13-multimodal-models/labs/lab-03-run-a-vlm/solution.py``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from course.runtime import use_lab
from mini_vllm.multimodal import MultiModalFeature, PlaceholderRange
from mini_vllm.testing.mm_traces import MMArrival, three_requests

LAB02 = use_lab("phase-13/lab-02-encoder-scheduling")   # doorstep_table and plan_chunk


# --------------------------------------------------------------------------- 1. content identity
def same_hash(a: np.ndarray, b: np.ndarray) -> bool:
    """Predict ``MultiModalHasher.hash_kwargs(image=a) == hash_kwargs(image=b)`` for numpy arrays.

    The hasher serializes an array as its dtype string, its shape and its bytes in C order, so
    two arrays hash alike exactly when all three agree: a copy does, a transposed view equals
    its own contiguous copy, but the same bytes under another shape or dtype do not."""
    raise NotImplementedError(
        'compare what the hasher serializes: a.dtype.str, a.shape and the C-order bytes '
        '(np.ascontiguousarray(x).tobytes())'
    )


# --------------------------------------------------------------------------- 2. placeholders
def num_embeds(length: int, is_embed: Sequence[bool] | None) -> int:
    """Embeddings the encoder produces for a placeholder range: ``length`` when there is no mask,
    else the number of True entries (the others are structural tokens, e.g. row breaks)."""
    raise NotImplementedError(
        "ValueError for length <= 0 ('positive length') or a mask of the wrong size ('is_embed has N entries "
        "for a range of length L'); no mask: length; else the number of True entries"
    )


def embeds_in_range(is_embed: Sequence[bool] | None, start: int, end: int) -> tuple[int, int]:
    """Which encoder embeddings ``[first, last)`` the range's own positions ``[start, end)`` use.

    Without a mask position ``i`` is embedding ``i``. With one, embedding indices count the True
    entries before a position: ``first`` = Trues in ``[0, start)``, ``last`` = Trues in ``[0, end)``."""
    raise NotImplementedError(
        'ValueError unless 0 <= start <= end; no mask: (start, end); else (Trues in is_embed[:start], Trues '
        'in is_embed[:end])'
    )


# --------------------------------------------------------------------------- 3. the splice
def merge_multimodal_embeddings(
    inputs_embeds: np.ndarray, is_multimodal: np.ndarray, mm_embeds: Sequence[np.ndarray]
) -> np.ndarray:
    """Write the concatenated ``mm_embeds`` over the rows where ``is_multimodal`` is True, in order,
    in place (cast to ``inputs_embeds``' dtype), and return ``inputs_embeds``. When the counts
    differ, raise ``ValueError`` with vLLM's message: "Attempted to assign 2 + 1 = 3 multimodal
    tokens to 4 placeholders" (one term per item)."""
    raise NotImplementedError(
        "no items: return inputs_embeds; concatenate the items; if their row count differs from the mask's "
        'True count raise ValueError(f\'Attempted to assign {"2 + 1"} = 3 multimodal tokens to 4 '
        "placeholders'); else inputs_embeds[mask] = rows (cast), return it"
    )


# --------------------------------------------------------------------------- 4. prefix hits with pixels
def block_keys(prompt: Sequence[int], features: Sequence[MultiModalFeature], block_size: int) -> list[tuple]:
    """One key per *full* block of the prompt: its token ids, plus ``(identifier, offset - block
    start)`` for every image whose placeholder range overlaps the block. The same tokens with a
    different image, or the same image starting elsewhere in the block, give a different key."""
    raise NotImplementedError(
        'ValueError for block_size <= 0; for each full block [start, start + block_size): (tuple of its '
        'tokens, tuple of (identifier, offset - start) for each image overlapping the block: offset < start + '
        'block_size and start < offset + length)'
    )


def prefix_hit_tokens(
    prompt: Sequence[int],
    features: Sequence[MultiModalFeature],
    earlier: Sequence[tuple[Sequence[int], Sequence[MultiModalFeature]]],
    block_size: int,
) -> int:
    """Tokens the prefix cache supplies: the longest run of leading blocks whose keys equal the
    leading blocks of any one earlier prompt (keys chain, so a block hits only if every block
    before it did), times ``block_size``, and never the whole prompt: at most
    ``(len(prompt) - 1) // block_size`` blocks, so one token is left to compute the logits."""
    raise NotImplementedError(
        'block_keys for this prompt and each earlier one; count matching leading keys (stop at the first '
        'mismatch: keys chain); take the best; cap at '
        '(len(prompt) - 1) // block_size blocks; return blocks * block_size'
    )


def predict_step_table(
    arrivals: Sequence[MMArrival], token_budget: int, encoder_budget: int, block_size: int = 16
) -> list[dict[str, tuple[int, tuple[int, ...]]]]:
    """The real scheduler's step table (request id -> (tokens, images encoded), one dict per step)
    for requests that all wait at step 0 with ``max_tokens=1`` and prefix caching on.

    Each arrival's prefix hit is ``prefix_hit_tokens`` against the arrivals before it (assumed
    cached in full by the time it is admitted: true when each earlier request's first chunk
    covers the blocks they share); then lab 02's ``doorstep_table`` applies the encoder rule."""
    raise NotImplementedError(
        "replace each arrival's prefix_hit (dataclasses.replace) by prefix_hit_tokens against the arrivals "
        'before it, then return LAB02.doorstep_table(those, token_budget, encoder_budget, '
        'plan=LAB02.plan_chunk)'
    )


def main() -> None:
    img = np.arange(48, dtype=np.uint8).reshape(4, 4, 3)
    one_pixel = img.copy()
    one_pixel[0, 0, 0] ^= 1
    print("1. MultiModalHasher identity (predicted)")
    others = [("a copy", img.copy()), ("one pixel changed", one_pixel),
              ("same bytes, shape (8, 2, 3)", img.reshape(8, 2, 3)), ("same values as uint16", img.astype(np.uint16))]
    for name, other in others:
        print(f"   {name:<30} same hash: {same_hash(img, other)}")
    mask = [True, True, False, True, True, False]
    print("2. PlaceholderRange(offset=3, length=6, is_embed=[1, 1, 0, 1, 1, 0])")
    print(f"   embeddings: {num_embeds(6, mask)}; positions [2, 5) of the range read embeddings {embeds_in_range(mask, 2, 5)}")
    emb = np.zeros((8, 2), np.float32)
    is_mm = np.zeros(8, bool)
    is_mm[[1, 2, 5, 6]] = True
    merge_multimodal_embeddings(emb, is_mm, [np.full((2, 2), 1.0), np.full((2, 2), 2.0)])
    print(f"3. merge: rows filled {np.flatnonzero(emb[:, 0]).tolist()} with {emb[is_mm, 0].tolist()}")
    try:
        merge_multimodal_embeddings(emb, is_mm, [np.ones((2, 2)), np.ones((1, 2))])
    except ValueError as exc:
        print(f"   3 rows for 4 placeholders: ValueError: {exc}")
    print("4. prefix hits and the step table, token budget 256, encoder budget 100, block 16")
    arrivals = three_requests(prefix_hit_for_c=0)
    for i, a in enumerate(arrivals):
        hit = prefix_hit_tokens(a.prompt_token_ids, a.features, [(b.prompt_token_ids, b.features) for b in arrivals[:i]], 16)
        print(f"   {a.request_id}: {len(a.prompt_token_ids)} tokens, image {a.features[0].identifier} at "
              f"{a.features[0].mm_position.offset}, prefix hit {hit}")
    for step, table in enumerate(predict_step_table(arrivals, 256, 100)):
        print(f"   step {step}: " + "  ".join(f"{rid} {n:3d} {list(enc)}" for rid, (n, enc) in table.items()))
    a = arrivals[0]
    other_image = MMArrival("D", a.prompt_token_ids, (MultiModalFeature("imgX", PlaceholderRange(40, 80)),))
    shifted = MMArrival("E", a.prompt_token_ids, (MultiModalFeature("imgA", PlaceholderRange(41, 80)),))
    for b in (other_image, shifted):
        hit = prefix_hit_tokens(b.prompt_token_ids, b.features, [(a.prompt_token_ids, a.features)], 16)
        f = b.features[0]
        print(f"   A's exact tokens with {f.identifier} at {f.mm_position.offset}: prefix hit {hit} "
              f"(block [32, 48) holds the image's first positions)")


if __name__ == "__main__":
    main()
