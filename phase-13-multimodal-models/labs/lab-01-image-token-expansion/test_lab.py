"""Lab 13-01 spec: image sizes become token counts, markers become placeholder ranges, tokens become blocks."""

import pytest

from course.runtime import lab_module

lab = lab_module(__file__)   # solution.py by default; LAB_IMPL=starter grades starter.py

IMG = 32000  # LLaVA's <image> token id


def test_patch_arithmetic():
    got = lab.image_token_count(336, 336)
    assert got == 576, f"LLaVA-1.5: 336 px / 14 px = 24 patches per side, 24 x 24 = 576 tokens, got {got}"
    got = lab.image_token_count(336, 336, merge=2)
    assert got == 144, f"a 2 x 2 merge (Qwen2-VL style) folds 24 x 24 patches into 12 x 12 = 144 tokens, got {got}"
    got = lab.image_token_count(10, 10, merge=2)
    assert got == 1, f"a thumbnail smaller than one patch is padded to one patch, one token: got {got}"
    got = lab.image_token_count(337, 337, merge=2)
    assert got == 169, (
        f"ceil at both stages: ceil(337/14) = 25 patches, ceil(25/2) = 13 tokens per side, 13 x 13 = 169; got {got}"
        " (floor gives 144 or 12 x 12 = 144: a dropped partial patch loses pixels)"
    )
    got = lab.image_token_count(336, 337)
    assert got == 24 * 25, f"height and width are counted separately: 24 rows x 25 cols = 600, got {got}"
    got = lab.image_token_count(320, 640, patch=16, merge=2)
    assert got == 10 * 20, f"patch 16, merge 2: ceil(320/16/2) = 10 rows, ceil(640/16/2) = 20 cols = 200, got {got}"
    got = lab.image_token_count(15, 15)
    assert got == 4, f"15 px with 14 px patches needs 2 patches per side (the 15th pixel pads a patch): 4, got {got}"


@pytest.mark.parametrize("args", [(0, 336), (336, -1), (336, 336, 0), (336, 336, 14, 0)])
def test_non_positive_sizes_are_refused(args):
    with pytest.raises(ValueError, match="must be positive"):
        lab.image_token_count(*args)


def test_resolution_is_quadratic_cost():
    for merge in (1, 2):
        base = lab.image_token_count(336, 336, merge=merge)
        double = lab.image_token_count(672, 672, merge=merge)
        assert double == 4 * base, (
            f"doubling each side quadruples the patches (merge {merge}): {base} -> {4 * base}, got {double}"
        )
    assert lab.image_token_count(672, 672, merge=2) == 576, "672 px with a 2 x 2 merge costs what LLaVA pays at 336 px"


def test_expansion_splices_in_place():
    prompt = [1, 2, 3, IMG, 4, 5]
    ids, ranges = lab.expand_prompt(prompt, IMG, [7])
    assert ids == [1, 2, 3] + [IMG] * 7 + [4, 5], f"text before, 7 placeholders, text after, nothing else: got {ids}"
    assert [(r.offset, r.length) for r in ranges] == [(3, 7)], f"the image starts where its marker was: {ranges}"
    ids, _ = lab.expand_prompt(prompt, IMG, [7], placeholder_id=-100)
    assert ids == [1, 2, 3] + [-100] * 7 + [4, 5], "placeholder_id replaces the fill, not the surrounding text"
    ids, _ = lab.expand_prompt(prompt, IMG, [2], placeholder_id=0)
    assert ids == [1, 2, 3, 0, 0, 4, 5], (
        f"placeholder_id=0 is a real token id (often <unk> or <pad>) and must be used as the fill; got {ids}: "
        "test 'placeholder_id is None', not its truthiness"
    )
    ids, ranges = lab.expand_prompt([IMG], IMG, [1])
    assert ids == [IMG] and [(r.offset, r.length) for r in ranges] == [(0, 1)], "a 1-token image at position 0"
    ids, ranges = lab.expand_prompt([5, 6], IMG, [])
    assert ids == [5, 6] and ranges == [], "a text-only prompt passes through unchanged"


def test_multi_image_ranges_are_ordered_and_disjoint():
    prompt = [10, IMG, 11, 12, IMG, IMG, 13]
    counts = [4, 2, 3]
    ids, ranges = lab.expand_prompt(prompt, IMG, counts, placeholder_id=-100)
    got = [(r.offset, r.length) for r in ranges]
    assert got == [(1, 4), (7, 2), (9, 3)], (
        f"later offsets must include earlier expansions (marker 2 was at 4, now at 4 + 3 = 7): got {got}"
    )
    for r in ranges:
        assert ids[r.offset : r.offset + r.length] == [-100] * r.length, f"{r} must hold only placeholders"
    assert sum(1 for t in ids if t == -100) == sum(counts), "no placeholder outside a range"
    assert len(ids) == len(prompt) - len(counts) + sum(counts)
    assert ids[-1] == 13 and ids[6] == 12, "text between the images keeps its order"


def test_mismatched_counts_assert():
    with pytest.raises(ValueError, match="2 image markers .* 1 image token counts"):
        lab.expand_prompt([IMG, 1, IMG], IMG, [5])
    with pytest.raises(ValueError, match="1 image markers .* 2 image token counts"):
        lab.expand_prompt([IMG, 1], IMG, [5, 5])
    with pytest.raises(ValueError, match="at least one token"):
        lab.expand_prompt([IMG, 1], IMG, [0])


def test_the_scheduler_sees_only_the_expanded_length():
    prompt = list(range(1, 20))
    prompt.insert(5, IMG)  # 20 tokens, one of them the marker
    ids, ranges = lab.expand_prompt(prompt, IMG, [lab.image_token_count(336, 336)])
    assert len(ids) == 595, f"19 text tokens + 576 image tokens = 595, got {len(ids)}"
    blocks = lab.kv_blocks_needed(len(ids))
    assert blocks == 38, f"ceil(595 / 16) = 38 blocks for the request, got {blocks}"
    assert lab.kv_blocks_needed(ranges[0].length) == 36, "the image alone is 576 / 16 = 36 blocks"
    assert lab.kv_blocks_needed(len(prompt)) == 2, "without the image the 20-token prompt is 2 blocks"


def test_kv_blocks_boundaries_and_block_size():
    for n, bs, want in [(0, 16, 0), (16, 16, 1), (17, 16, 2), (576, 16, 36), (595, 32, 19), (1, 1, 1)]:
        got = lab.kv_blocks_needed(n, bs)
        assert got == want, f"ceil({n} / {bs}) = {want} blocks, got {got}: a partial block is still a whole block"
    with pytest.raises(ValueError, match="block_size > 0"):
        lab.kv_blocks_needed(10, 0)
    with pytest.raises(ValueError, match="num_tokens >= 0"):
        lab.kv_blocks_needed(-1)
