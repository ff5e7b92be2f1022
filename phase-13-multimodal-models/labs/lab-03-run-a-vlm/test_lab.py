"""Lab 13-03 spec: your predictions of the real multimodal pieces, then the real pieces themselves."""

import random

import numpy as np
import pytest

from course.runtime import lab_module
from mini_vllm.multimodal import MultiModalFeature, PlaceholderRange
from mini_vllm.testing.mm_traces import MMArrival, three_requests

lab = lab_module(__file__)   # solution.py by default; LAB_IMPL=starter grades starter.py

IMG = np.arange(48, dtype=np.uint8).reshape(4, 4, 3)


def _one_pixel_changed():
    out = IMG.copy()
    out[3, 2, 1] ^= 1
    return out


# (name, other array, same identity as IMG?)
HASH_CASES = [
    ("a copy", lambda: IMG.copy(), True),
    ("one pixel changed", _one_pixel_changed, False),
    ("the same bytes as (8, 2, 3)", lambda: IMG.reshape(8, 2, 3), False),
    ("the same values as uint16", lambda: IMG.astype(np.uint16), False),
    ("the same bytes and shape viewed as int8", lambda: IMG.view(np.int8), False),
    ("a contiguous copy of a transposed view", lambda: np.ascontiguousarray(IMG.transpose(1, 0, 2)).transpose(1, 0, 2), True),
    ("a Fortran-ordered copy (same values, column-major memory)", lambda: np.asfortranarray(IMG), True),
]


def feat(name, offset, length):
    return (MultiModalFeature(name, PlaceholderRange(offset, length)),)


def _a():
    return three_requests(prefix_hit_for_c=0)[0]


def _extra_traces():
    """Traces whose answers the prefix-cache block keys decide (all waiting at step 0)."""
    a = _a()
    f_prompt = tuple(range(700, 828))  # 128 tokens: exactly 8 blocks
    return {
        "A, then A's tokens with another image": [a, MMArrival("D", a.prompt_token_ids, feat("imgX", 40, 80))],
        "A, then A's tokens and image one position later": [a, MMArrival("E", a.prompt_token_ids, feat("imgA", 41, 80))],
        "a 128-token prompt twice": [MMArrival("F", f_prompt, feat("imgF", 16, 32)), MMArrival("G", f_prompt, feat("imgF", 16, 32))],
    }


# --------------------------------------------------------------------------- 1. content identity
@pytest.mark.parametrize("name,make,want", HASH_CASES, ids=[c[0] for c in HASH_CASES])
def test_same_hash_predictions(name, make, want):
    got = lab.same_hash(IMG, make())
    assert got == want, (
        f"{name}: the hasher serializes dtype, shape and the C-order bytes, so the identity is "
        f"{'equal' if want else 'different'}; you predicted {'equal' if got else 'different'}"
    )


@pytest.mark.upstream
def test_predictions_match_the_real_hasher():
    from vllm.multimodal.hasher import MultiModalHasher

    base = MultiModalHasher.hash_kwargs(image=IMG)
    for name, make, _ in HASH_CASES:
        other = make()
        real = MultiModalHasher.hash_kwargs(image=other) == base
        assert lab.same_hash(IMG, other) == real, f"{name}: the real MultiModalHasher says same={real}"


# --------------------------------------------------------------------------- 2. placeholders
def test_num_embeds():
    assert lab.num_embeds(6, None) == 6, "no is_embed mask: every position takes an embedding"
    assert lab.num_embeds(6, [True, True, False, True, True, False]) == 4, "with a mask, count the True entries: 4 of 6"
    assert lab.num_embeds(3, [False, False, False]) == 0, "an all-structural range takes no embedding"
    with pytest.raises(ValueError, match="is_embed has 2 entries for a range of length 3"):
        lab.num_embeds(3, [True, False])
    with pytest.raises(ValueError, match="positive length"):
        lab.num_embeds(0, None)
    for empty in ([], np.zeros(0, dtype=bool)):
        try:
            got = lab.num_embeds(3, empty)
        except ValueError:
            continue
        pytest.fail(f"num_embeds(3, {empty!r}) = {got}: an empty mask is a mask with 0 entries for 3 positions "
                    "(ValueError), not 'no mask'; test 'is_embed is None', not its truthiness")


def test_embeds_in_range():
    mask = [False, True, False, True, True]
    assert lab.embeds_in_range(mask, 3, 5) == (1, 3), (
        "vLLM's docstring example: positions [3, 5) of offset-2 range [F, T, F, T, T] read embeddings 1 and 2 -> (1, 3);"
        " first = Trues before position 3, last = Trues before position 5"
    )
    assert lab.embeds_in_range(mask, 0, 5) == (0, 3), "the whole range reads all 3 embeddings"
    assert lab.embeds_in_range(mask, 2, 2) == (1, 1), "an empty slice reads nothing, starting after the 1 True before it"
    assert lab.embeds_in_range(None, 2, 4) == (2, 4), "without a mask position i is embedding i"
    with pytest.raises(ValueError, match="0 <= start <= end"):
        lab.embeds_in_range(mask, 4, 3)
    for start in (-1, -3):
        try:
            got = lab.embeds_in_range(mask, start, 2)
        except ValueError:
            continue
        pytest.fail(
            f"embeds_in_range(mask, {start}, 2) returned {got}: a negative start is not a position of the "
            "range (Python would slice from the end of the mask); raise ValueError, need 0 <= start <= end"
        )


@pytest.mark.upstream
def test_placeholder_predictions_match_placeholder_range():
    import torch
    from vllm.multimodal.inputs import PlaceholderRange as Real

    rng = random.Random(1303)
    for case in range(60):
        length = rng.randint(1, 12)
        mask = None if case % 5 == 0 else [rng.random() < 0.6 for _ in range(length)]
        real = Real(offset=rng.randint(0, 50), length=length,
                    is_embed=None if mask is None else torch.tensor(mask, dtype=torch.bool))
        assert lab.num_embeds(length, mask) == real.get_num_embeds(), f"case {case}: mask {mask}"
        start = rng.randint(0, length)
        end = rng.randint(start, length)
        assert lab.embeds_in_range(mask, start, end) == tuple(real.get_embeds_indices_in_range(start, end)), (
            f"case {case}: mask {mask}, positions [{start}, {end}): PlaceholderRange.get_embeds_indices_in_range disagrees"
        )


# --------------------------------------------------------------------------- 3. the splice
def test_merge_fills_placeholder_rows_in_order_in_place():
    emb = np.zeros((8, 2), np.float16)
    mask = np.zeros(8, bool)
    mask[[1, 2, 5, 6]] = True
    out = lab.merge_multimodal_embeddings(emb, mask, [np.full((2, 2), 1.0), np.full((2, 2), 2.0)])
    assert out is emb and emb.dtype == np.float16, "write in place into inputs_embeds, in its dtype, and return it"
    assert emb[:, 0].tolist() == [0, 1, 1, 0, 0, 2, 2, 0], f"item 1 fills rows 1, 2 and item 2 rows 5, 6: got {emb[:, 0].tolist()}"
    assert lab.merge_multimodal_embeddings(emb, mask, []) is emb, "no items: nothing to check or write"


def test_merge_count_mismatch_message():
    mask = np.zeros(8, bool)
    mask[[1, 2, 5, 6]] = True
    with pytest.raises(ValueError, match=r"^Attempted to assign 2 \+ 1 = 3 multimodal tokens to 4 placeholders$"):
        lab.merge_multimodal_embeddings(np.zeros((8, 2)), mask, [np.ones((2, 2)), np.ones((1, 2))])
    with pytest.raises(ValueError, match=r"^Attempted to assign 5 = 5 multimodal tokens to 4 placeholders$"):
        lab.merge_multimodal_embeddings(np.zeros((8, 2)), mask, [np.ones((5, 2))])


@pytest.mark.upstream
def test_merge_matches_the_real_splice():
    import torch
    from vllm.model_executor.models.utils import _merge_multimodal_embeddings

    rng = np.random.default_rng(1304)
    for case in range(20):
        n = int(rng.integers(4, 20))
        mask = rng.random(n) < 0.5
        k = int(mask.sum()) + (0 if case % 4 else int(rng.choice([-1, 1])))
        cuts = sorted(rng.integers(0, max(k, 0) + 1, size=2).tolist())
        parts = [rng.standard_normal((m, 3)).astype(np.float32) for m in (cuts[0], cuts[1] - cuts[0], k - cuts[1]) if m > 0]
        if not parts:
            continue
        try:
            want = _merge_multimodal_embeddings(torch.zeros(n, 3), [torch.from_numpy(p) for p in parts], torch.from_numpy(mask))
        except ValueError as real_err:
            with pytest.raises(ValueError) as mine:
                lab.merge_multimodal_embeddings(np.zeros((n, 3), np.float32), mask, parts)
            assert str(mine.value) == str(real_err), "the count-mismatch message must be vLLM's, word for word"
            continue
        got = lab.merge_multimodal_embeddings(np.zeros((n, 3), np.float32), mask, parts)
        assert np.array_equal(got, want.numpy()), f"case {case}: rows differ from _merge_multimodal_embeddings"


# --------------------------------------------------------------------------- 4. prefix hits with pixels
def test_block_keys():
    prompt = tuple(range(40))
    keys = lab.block_keys(prompt, feat("img", 10, 12), 8)
    assert len(keys) == 5, "40 tokens in blocks of 8: five full blocks (a partial last block has no key)"
    assert len(lab.block_keys(prompt[:39], feat("img", 10, 12), 8)) == 4, "39 tokens: the fifth block is partial, no key"
    assert keys[0] == (tuple(range(8)), ()), "block [0, 8) holds no image position: tokens only"
    assert keys[1] == (tuple(range(8, 16)), (("img", 2),)), "block [8, 16) holds the image's start: (identifier, 10 - 8)"
    assert keys[2] == (tuple(range(16, 24)), (("img", -6),)), "block [16, 24) holds its end: the offset is relative, -6"
    assert keys[3][1] == (), "the image ends at 22: block [24, 32) is text"
    two = lab.block_keys(prompt, feat("i1", 2, 3) + feat("i2", 6, 4), 8)
    assert two[0][1] == (("i1", 2), ("i2", 6)) and two[1][1] == (("i2", -2),), "every image overlapping the block, in order"
    edge = lab.block_keys(prompt, feat("img", 8, 8), 8)
    assert [k[1] for k in edge[:3]] == [(), (("img", 0),), ()], (
        "an image on [8, 16) overlaps block [8, 16) only: a block [s, e) holds it when offset < e and s < offset + length "
        "(both ends open); blocks [0, 8) and [16, 24) merely touch it and keep text-only keys"
    )
    with pytest.raises(ValueError, match="block_size must be positive"):
        lab.block_keys(prompt, (), 0)


def test_prefix_hits():
    a, b, c = three_requests(prefix_hit_for_c=0)

    def hit(x, earlier):
        return lab.prefix_hit_tokens(x.prompt_token_ids, x.features, [(e.prompt_token_ids, e.features) for e in earlier], 16)

    assert hit(a, []) == 0, "nothing cached yet"
    assert hit(c, [a, b]) == 16, "C shares A's first 20 text tokens: one full 16-token block hits, the next holds C's image"
    assert hit(c, [b, a]) == 16, "a hit may come from any earlier request, not only the first"
    traces = _extra_traces()
    d = traces["A, then A's tokens with another image"][1]
    e = traces["A, then A's tokens and image one position later"][1]
    f, g = traces["a 128-token prompt twice"]
    assert hit(d, [a]) == 32, "same tokens, another image: block [32, 48) holds the image, so its key differs (32 hit)"
    assert hit(e, [a]) == 32, "same tokens and image, one position later: the offset in the key differs from block 2 on"
    assert hit(g, [f]) == 112, (
        "an identical 128-token prompt hits 7 blocks, not 8: the last token must be computed for its logits, "
        "so at most (len - 1) // block_size blocks hit"
    )
    assert hit(a, [a]) == 128, (
        "A's 130 tokens again: all 8 full blocks hit (128 tokens). The cap is (len - 1) // block_size blocks, so it "
        "only bites when the prompt ends on a block boundary; it does not always drop the last full block"
    )
    text = tuple(range(900, 964))  # 64 tokens: another image on block [16, 32), identical text blocks after it
    x, y = MMArrival("X", text, feat("imgX", 16, 16)), MMArrival("Y", text, feat("imgY", 16, 16))
    assert hit(y, [x]) == 16, (
        "a block hits only if every block before it hit (each key chains through its parent's hash): Y's blocks "
        "[32, 48) and [48, 64) equal X's, but block [16, 32) holds another image, so the hit stops at 16"
    )


def test_predicted_three_request_table():
    table = lab.predict_step_table(three_requests(prefix_hit_for_c=0), 256, 100)
    assert table == [{"A": (130, (0,)), "B": (10, ()), "C": (94, ())}, {"B": (90, (0,))}], (
        "step 0: A 130 with imgA; B stops at its doorstep (20 of 100 encoder budget left < 80); C gets a 16-token "
        f"prefix hit and imgA from the encoder cache, so 94 tokens and no encode; step 1: B's image. Got {table}"
    )
    traces = _extra_traces()
    d_table = lab.predict_step_table(traces["A, then A's tokens with another image"], 256, 100)
    assert d_table == [{"A": (130, (0,)), "D": (8, ())}, {"D": (90, (0,))}], (
        f"D hits 32, then its own image at 40 cannot be paid (20 left): 8 tokens to the doorstep. Got {d_table}"
    )


@pytest.mark.upstream
def test_step_tables_match_the_real_scheduler():
    from mini_vllm.testing.mm_traces import run_real

    cases = {"three requests": three_requests(prefix_hit_for_c=0), **_extra_traces()}
    for name, arrivals in cases.items():
        for tb, eb in ((256, 100), (256, 160), (64, 100)):
            want = [s.scheduled for s in run_real(arrivals, tb, eb, 10_000, enable_prefix_caching=True)]
            got = lab.predict_step_table(arrivals, tb, eb)
            assert got == want, f"{name}, token budget {tb}, encoder budget {eb}: the real scheduler gives {want}, you {got}"
