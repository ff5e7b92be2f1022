"""mini_vllm.multimodal: placeholders, the toy encoder, the encoder cache, the doorstep rule, the splice."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mini_vllm.multimodal import (
    EncoderCacheManager,
    MultiModalFeature,
    PlaceholderRange,
    ToyVisionEncoder,
    embed_with_images,
    expand_markers,
    free_consumed_encoder_inputs,
    merge_multimodal_embeddings,
    mm_hash,
    num_image_tokens,
    try_schedule_encoder_inputs,
)
from mini_vllm.testing.mm_traces import MMArrival, simulate, three_requests

IMG = 9  # the marker token id in these tests


def feat(name, offset, length):
    return MultiModalFeature(name, PlaceholderRange(offset, length))


# --- placeholders ---------------------------------------------------------------------------


def test_mm_expansion_two_images():
    small, big = b"s" * 10, b"b" * 200  # 1 and 4 tokens
    ids, ranges = expand_markers([1, 2, IMG, 3, IMG, 4], [small, big], IMG)
    assert ranges == [PlaceholderRange(2, 1), PlaceholderRange(4, 4)], "later offsets must include earlier expansions"
    assert ids == [1, 2, IMG, 3, IMG, IMG, IMG, IMG, 4]
    assert len(ids) == 6 - 2 + num_image_tokens(small) + num_image_tokens(big)


@pytest.mark.parametrize("n_bytes,tokens", [(0, 1), (63, 1), (64, 2), (127, 2), (128, 3)])
def test_num_image_tokens_boundaries(n_bytes, tokens):
    assert num_image_tokens(b"x" * n_bytes) == tokens


def test_marker_image_count_mismatch_is_refused():
    with pytest.raises(ValueError, match="2 image markers but 1 images"):
        expand_markers([IMG, IMG], [b"a"], IMG)
    with pytest.raises(ValueError, match="0 image markers but 1 images"):
        expand_markers([1, 2], [b"a"], IMG)


def test_placeholder_range_validates_and_counts_embeds():
    r = PlaceholderRange(3, 6, is_embed=(True, True, False, True, True, False))
    assert r.get_num_embeds() == 4 and r.end == 9
    assert r.num_embeds_in(2, 3) == 0 and r.num_embeds_in(0, 6) == 4
    with pytest.raises(ValueError, match="length > 0"):
        PlaceholderRange(0, 0)
    with pytest.raises(ValueError, match="is_embed has 2 entries"):
        PlaceholderRange(0, 3, is_embed=(True, False))


# --- identity and the toy encoder --------------------------------------------------------------


def test_mm_hash_is_content_identity():
    a = bytes(range(200))
    assert mm_hash(a) == mm_hash(bytearray(a)) and len(mm_hash(a)) == 64
    assert mm_hash(a) != mm_hash(a[:-1] + b"\x00"), "one changed byte must change the hash"
    with pytest.raises(TypeError, match="bytes"):
        mm_hash("not bytes")


def test_toy_encoder_is_deterministic_and_counts_calls():
    enc = ToyVisionEncoder(hidden_size=4)
    x, y = enc.encode(b"q" * 100), ToyVisionEncoder(hidden_size=4).encode(b"q" * 100)
    assert x.shape == (2, 4) and np.array_equal(x, y) and enc.calls == 1
    assert not np.array_equal(enc.encode(b"r" * 100), x) and enc.calls == 2
    with pytest.raises(ValueError, match="hidden_size"):
        ToyVisionEncoder(0)


# --- the encoder cache --------------------------------------------------------------------------


def test_encoder_cache_shares_by_content():
    cache, calls = EncoderCacheManager(100), []
    img1, img2 = b"a" * 64, b"b" * 64  # same length, different bytes
    for rid, img in [("r1", img1), ("r2", img1), ("r3", img2)]:
        if not cache.check_and_update_cache(rid, mm_hash(img)):
            assert cache.can_allocate(2, 10**6)
            cache.allocate(rid, mm_hash(img), 2)
            calls.append(rid)
    assert calls == ["r1", "r3"], "same bytes must hit the cache; different bytes of equal length must not"
    assert cache.cached[mm_hash(img1)] == {"r1", "r2"} and cache.num_free_slots == 96


def test_encoder_cache_evicts_unreferenced():
    cache = EncoderCacheManager(4)  # holds exactly one 4-embedding image
    ha, hb = mm_hash(b"A"), mm_hash(b"B")
    cache.allocate("A", ha, 4)
    assert not cache.can_allocate(4, 100), "A still references its entry: nothing may be evicted"
    cache.free("A")
    assert cache.freeable == {ha: 4} and ha in cache.cached, "finish only de-references; data stays"
    assert (cache.num_free_slots, cache.num_freeable_slots) == (0, 4)
    assert cache.can_allocate(4, 100)
    cache.allocate("B", hb, 4)
    assert cache.get_freed_mm_hashes() == [ha] and cache.get_freed_mm_hashes() == []
    assert ha not in cache.cached and cache.cached[hb] == {"B"}


def test_encoder_cache_hit_revives_a_freeable_entry_and_evicts_oldest_first():
    cache = EncoderCacheManager(6)
    for rid, h in [("r1", "h1"), ("r2", "h2"), ("r3", "h3")]:
        cache.allocate(rid, h, 2)
        cache.free(rid)
    assert list(cache.freeable) == ["h1", "h2", "h3"] and cache.num_freeable_slots == 6
    assert cache.check_and_update_cache("r4", "h1"), "an unreferenced entry is still a hit"
    assert "h1" not in cache.freeable and cache.num_freeable_slots == 4
    assert cache.can_allocate(4, 100)
    assert cache.freed == ["h2", "h3"], "eviction goes oldest unreferenced first and stops when enough is free"


def test_can_allocate_budget_and_space_boundaries():
    cache = EncoderCacheManager(10)
    assert cache.can_allocate(5, encoder_compute_budget=5), "a budget exactly equal to the image must suffice"
    assert not cache.can_allocate(6, encoder_compute_budget=5)
    assert cache.can_allocate(5, 100, num_embeds_to_schedule=5) and not cache.can_allocate(6, 100, 5)


def test_encoder_cache_errors_and_refused_free_leave_state_unchanged():
    cache = EncoderCacheManager(4)
    with pytest.raises(ValueError, match="cache_size"):
        EncoderCacheManager(-1)
    cache.allocate("r", "h", 3)
    with pytest.raises(ValueError, match="already cached"):
        cache.allocate("s", "h", 3)
    with pytest.raises(ValueError, match="no room"):
        cache.allocate("s", "g", 2)
    before = (dict(cache.cached), dict(cache.freeable), cache.num_free_slots, cache.num_freeable_slots)
    cache.free_encoder_input("stranger", "h")
    cache.free("nobody")
    assert (dict(cache.cached), dict(cache.freeable), cache.num_free_slots, cache.num_freeable_slots) == before


# --- the doorstep rule --------------------------------------------------------------------------


def plan(computed, new, features, budget, cache=None, rid="r", **kw):
    return try_schedule_encoder_inputs(rid, computed, new, features, budget, cache or EncoderCacheManager(1000), **kw)


def test_text_only_chunk_is_unchanged():
    assert plan(0, 30, [feat("a", 40, 10)], 0) == ([], 30, 0)
    assert plan(0, 40, [feat("a", 40, 10)], 0) == ([], 40, 0), "an image starting exactly at the chunk end is not entered"
    cache = EncoderCacheManager(100)
    cache.allocate("other", "a", 10)
    assert plan(0, 40, [feat("a", 40, 10)], 100, cache) == ([], 40, 100)
    assert cache.cached["a"] == {"other"}, (
        "an image starting exactly at the chunk end is outside the chunk: stop (offset >= end) before the cache "
        "lookup, or the request holds a reference (and can_allocate may evict) for an image it has not reached"
    )
    assert plan(0, 0, [feat("a", 0, 10)], 0) == ([], 0, 0)
    assert plan(5, 30, [], 0) == ([], 30, 0)


def test_entering_an_image_encodes_it_whole():
    assert plan(0, 41, [feat("a", 40, 100)], 100) == ([0], 41, 0), "one position in: all 100 embeddings are paid"


def test_doorstep_when_budget_or_cache_is_short():
    assert plan(0, 100, [feat("a", 40, 10)], 9) == ([], 40, 9)
    assert plan(0, 100, [feat("a", 40, 10)], 100, EncoderCacheManager(9)) == ([], 40, 100)
    assert plan(45, 100, [feat("a", 40, 10)], 0) == ([], 0, 0), "started past the image without its output: 0 tokens"


def test_two_images_one_chunk_and_the_budget_split():
    two = [feat("a", 10, 20), feat("b", 40, 20)]
    assert plan(0, 100, two, 40) == ([0, 1], 100, 0)
    assert plan(0, 100, two, 39) == ([0], 40, 19), "A fits, B does not: the chunk ends at B's offset"
    assert plan(0, 100, [feat("a", 10, 20), feat("a", 40, 20)], 20) == ([0], 100, 0), "same image twice: one encode"
    assert plan(0, 200, [feat("a", 0, 60), feat("b", 80, 60)], 200, EncoderCacheManager(100)) == ([0], 80, 140), (
        "A's 60 embeddings are promised this step, so B's 60 do not fit a 100-slot cache: "
        "pass num_embeds_to_schedule (the running total) to can_allocate"
    )


def test_cache_hit_and_mid_placeholder_continuation_are_free():
    cache = EncoderCacheManager(100)
    cache.allocate("other", "a", 50)
    assert plan(0, 100, [feat("a", 10, 50)], 0, cache, rid="r") == ([], 100, 0)
    assert cache.cached["a"] == {"other", "r"}, "a hit records the new referent"
    assert plan(30, 100, [feat("a", 10, 50)], 0, cache) == ([], 100, 0)
    assert plan(60, 10, [feat("a", 10, 50)], 0) == ([], 10, 0), "an image already in the KV cache needs nothing"


def test_structural_only_overlap_is_skipped():
    f = MultiModalFeature("p", PlaceholderRange(10, 4, is_embed=(False, True, True, True)))
    assert plan(0, 11, [f], 3) == ([], 11, 3), "the chunk only touches a break token: no encode needed"
    assert plan(0, 11, [f], 2) == ([], 10, 2), "the space/budget check still comes first, as upstream orders it"
    assert plan(0, 12, [f], 3) == ([0], 12, 0)


def test_disable_chunked_mm_input_rolls_back_to_the_doorstep():
    assert plan(0, 50, [feat("a", 40, 20)], 100, disable_chunked_mm_input=True) == ([], 40, 100)
    assert plan(0, 60, [feat("a", 40, 20)], 100, disable_chunked_mm_input=True) == ([0], 60, 80)
    assert plan(40, 10, [feat("a", 40, 20)], 100, disable_chunked_mm_input=True) == ([0], 10, 80), (
        "a chunk that starts at the image's first position is not rolled back (upstream: computed < start_pos)"
    )


def test_free_consumed_encoder_inputs_only_releases_finished_images():
    cache = EncoderCacheManager(100)
    feats = [feat("a", 0, 10), feat("b", 20, 10)]
    cache.allocate("r", "a", 10)
    cache.allocate("r", "b", 10)
    free_consumed_encoder_inputs("r", feats, 25, cache)
    assert list(cache.freeable) == ["a"] and cache.cached["b"] == {"r"}
    free_consumed_encoder_inputs("r", feats, 30, cache)
    assert list(cache.freeable) == ["a", "b"], "an image whose last position is computed (end <= computed) is released"


@settings(max_examples=80, deadline=None)
@given(
    computed=st.integers(0, 120),
    new=st.integers(0, 120),
    budget=st.integers(0, 80),
    layout=st.lists(st.tuples(st.integers(0, 20), st.integers(1, 40)), min_size=0, max_size=3),
)
def test_never_computes_a_position_without_its_encoder_output(computed, new, budget, layout):
    feats, pos = [], 0
    for gap, length in layout:
        feats.append(feat(f"i{len(feats)}", pos + gap, length))
        pos += gap + length
    to_encode, n, left = plan(computed, new, feats, budget)
    assert 0 <= n <= new and left == budget - sum(feats[i].mm_position.length for i in to_encode) >= 0
    for i, f in enumerate(feats):
        r = f.mm_position
        touched = n > 0 and r.offset < computed + n and r.end > computed
        if touched:
            assert i in to_encode, f"chunk [{computed}, {computed + n}) enters image {i} {r} without encoding it"


# --- the splice ---------------------------------------------------------------------------------


def test_splice_fills_placeholders_in_order():
    emb = np.arange(10 * 3, dtype=np.float32).reshape(10, 3)
    ids, ranges = expand_markers([5, IMG, 6, IMG], [b"x" * 70, b"y"], IMG)  # 2 + 1 image tokens
    enc = ToyVisionEncoder(3)
    outs = [enc.encode(b"x" * 70), enc.encode(b"y")]
    merged = embed_with_images(ids, emb, ranges, outs)
    assert np.array_equal(merged[0], emb[5]) and np.array_equal(merged[3], emb[6])
    assert np.array_equal(merged[[1, 2, 4]], np.concatenate(outs))


def test_splice_count_mismatch_raises():
    emb = np.zeros((8, 2), dtype=np.float32)
    mask = np.zeros(8, dtype=bool)
    mask[2:6] = True
    with pytest.raises(ValueError, match=r"Attempted to assign 3 = 3 multimodal tokens to 4 placeholders"):
        merge_multimodal_embeddings(emb, mask, [np.ones((3, 2))])
    ids, ranges = expand_markers([IMG, 1], [b"z" * 64], IMG)  # 2 placeholders
    with pytest.raises(ValueError, match="1 = 1 multimodal tokens to 2 placeholders"):
        embed_with_images(ids, np.zeros((16, 2)), ranges, [np.ones((1, 2))])
    with pytest.raises(ValueError, match="runs past"):
        embed_with_images([1, 2], np.zeros((16, 2)), [PlaceholderRange(1, 2)], [np.ones((2, 2))])


def test_splice_is_in_place_and_casts_dtype():
    emb = np.zeros((3, 2), dtype=np.float16)
    out = merge_multimodal_embeddings(emb, np.array([False, True, False]), [np.full((1, 2), 0.5, dtype=np.float64)])
    assert out is emb and out.dtype == np.float16 and emb[1, 0] == np.float16(0.5)
    assert merge_multimodal_embeddings(emb, np.zeros(3, bool), []) is emb


# --- many steps ---------------------------------------------------------------------------------


def test_three_request_doorstep_table():
    steps = simulate(three_requests(), token_budget=256, encoder_budget=100, cache_size=400)
    assert [s.scheduled for s in steps] == [
        {"A": (130, (0,)), "B": (10, ()), "C": (94, ())},
        {"B": (90, (0,))},
    ], "A pays for imgA, B stops at its doorstep (20 budget left < 80), C hits A's imgA"


def test_zero_budget_step_is_delay_not_deadlock():
    arr = [MMArrival("r", tuple(range(50)), (feat("i", 0, 30),))]
    with pytest.raises(RuntimeError, match="not finished after 5 steps"):
        simulate(arr, token_budget=64, encoder_budget=0, cache_size=100, max_steps=5)
    steps = simulate(arr, token_budget=20, encoder_budget=30, cache_size=30)
    assert [s.scheduled["r"] for s in steps] == [(20, (0,)), (20, ()), (10, ())]


# --- the Scheduler (mini_vllm.scheduler applies the rule itself) --------------------------------


def _scheduler(token_budget=256, encoder_budget=100, cache_size=400, caching=True, **kw):
    from mini_vllm import Scheduler, create_engine_config

    return Scheduler(create_engine_config(
        block_size=16, num_gpu_blocks=kw.pop("num_gpu_blocks", 64), enable_prefix_caching=caching,
        max_num_batched_tokens=token_budget, max_num_encoder_input_tokens=encoder_budget,
        encoder_cache_size=cache_size, **kw,
    ))


def _request(rid, n, features, max_tokens=1):
    from mini_vllm import Request, SamplingParams

    return Request(rid, list(range(1000, 1000 + n)), SamplingParams(max_tokens=max_tokens, ignore_eos=True),
                   mm_features=features)


def _step(sched):
    out = sched.schedule()
    sampled = {r.request_id: 1 for r in out.scheduled_requests if sched.needs_sample(r, out.num_scheduled_tokens[r.request_id])}
    sched.update_from_output(out, sampled)
    return out


def test_scheduler_reproduces_the_three_request_table():
    from mini_vllm.testing.mm_traces import run_mini

    for caching, c_tokens in ((True, 94), (False, 110)):
        steps = run_mini(three_requests(prefix_hit_for_c=0), 256, 100, 400, enable_prefix_caching=caching)
        assert [s.scheduled for s in steps] == [
            {"A": (130, (0,)), "B": (10, ()), "C": (c_tokens, ())},
            {"B": (90, (0,))},
        ], f"prefix caching {caching}: the Scheduler must apply the encoder rule to every chunk (got {steps})"


def test_scheduler_budget_refills_every_step_and_the_doorstep_skips_only_that_request():
    sched = _scheduler(token_budget=100, encoder_budget=30, caching=False)
    sched.add_request(_request("r", 60, (feat("a", 10, 30), feat("b", 45, 10))))
    sched.add_request(_request("t", 20, ()))
    out = _step(sched)
    assert out.num_scheduled_tokens == {"r": 45, "t": 20} and out.scheduled_encoder_inputs == {"r": [0]}, (
        f"step 0: image a (30) takes the whole encoder budget, r stops at b's doorstep (45); t, text only, runs: {out}"
    )
    out = _step(sched)
    assert out.num_scheduled_tokens == {"r": 15} and out.scheduled_encoder_inputs == {"r": [1]}, (
        f"step 1: the budget is 30 again and pays for b: {out}"
    )
    assert not sched.has_unfinished_requests()


def test_scheduler_waiting_request_at_its_doorstep_stops_admission():
    sched = _scheduler(token_budget=100, encoder_budget=40, caching=False)
    sched.add_request(_request("p", 50, (feat("x", 0, 40),)))
    sched.add_request(_request("q", 50, (feat("y", 0, 40),)))
    sched.add_request(_request("t", 10, ()))
    out = _step(sched)
    assert out.num_scheduled_tokens == {"p": 50}, (
        f"q's image starts at 0 and the budget is spent: q gets 0 tokens, which stops admission (t waits behind it): {out}"
    )
    out = _step(sched)
    assert out.num_scheduled_tokens == {"q": 50, "t": 10} and out.scheduled_encoder_inputs == {"q": [0]}


def test_scheduler_encoder_cache_hit_skips_the_encoder_and_eviction_is_reported():
    sched = _scheduler(token_budget=100, encoder_budget=40, cache_size=40, caching=False)
    sched.add_request(_request("a", 50, (feat("img", 5, 40),)))
    out = _step(sched)
    assert out.scheduled_encoder_inputs == {"a": [0]} and not sched.has_unfinished_requests()
    assert sched.encoder_cache_manager.freeable == {"img": 40}, "a finished: its entry stays, unreferenced (freeable)"
    sched.add_request(_request("b", 50, (feat("img", 0, 40),)))
    out = _step(sched)
    assert out.num_scheduled_tokens == {"b": 50} and out.scheduled_encoder_inputs == {}, (
        "the same image again: an encoder-cache hit, no encode, no budget spent"
    )
    sched.add_request(_request("c", 50, (feat("new", 0, 40),)))
    out = _step(sched)
    assert out.scheduled_encoder_inputs == {"c": [0]} and out.free_encoder_mm_hashes == ["img"], (
        f"a new 40-embedding image needs the whole 40-slot cache: the freeable entry is evicted and reported: {out}"
    )


def test_scheduler_failed_admission_drops_the_hit_it_recorded():
    # The rule records an encoder-cache hit as it plans (the entry stops being evictable). w's hit on
    # img is recorded, then w's prompt does not fit the KV pool: the reference must go with the refusal,
    # or img stays pinned and r, reaching its own image next step, finds no room in the 40-slot cache.
    sched = _scheduler(token_budget=100, encoder_budget=40, cache_size=40, caching=False, num_gpu_blocks=10,
                       long_prefill_token_threshold=16)
    sched.add_request(_request("a", 48, (feat("img", 0, 40),)))
    sched.add_request(_request("r", 96, (feat("new", 64, 32),)))
    for _ in range(3):
        _step(sched)
    assert sched.encoder_cache_manager.freeable == {"img": 40}, "a finished: img stays cached, unreferenced"
    sched.add_request(_request("w", 96, (feat("img", 0, 40),)))
    out = _step(sched)
    assert out.num_scheduled_tokens == {"r": 16}, f"w's 6 blocks do not fit the 5 free ones: w waits: {out}"
    assert sched.encoder_cache_manager.freeable == {"img": 40}, (
        "w was refused after the rule recorded its hit on img: free(w) must drop that reference (upstream frees the "
        "request's encoder inputs when allocate_slots returns None), or img can never be evicted while w waits"
    )
    out = _step(sched)
    assert out.scheduled_encoder_inputs == {"r": [0]} and out.free_encoder_mm_hashes == ["img"], (
        f"r enters its image: img, unreferenced, is evicted to make room: {out}"
    )


def test_scheduler_books_encodes_only_for_admitted_chunks():
    # Same pool as above, but w brings a new image: the rule plans to encode it, then w's prompt does not
    # fit. Nothing may be booked for w: no encode in the output, no cache space, the budget untouched.
    sched = _scheduler(token_budget=100, encoder_budget=40, cache_size=80, caching=False, num_gpu_blocks=10,
                       long_prefill_token_threshold=16)
    sched.add_request(_request("r", 96, (feat("new", 64, 32),)))
    for _ in range(3):
        _step(sched)
    sched.add_request(_request("w", 96, (feat("fresh", 0, 40),)))
    out = _step(sched)
    assert out.num_scheduled_tokens == {"r": 16} and out.scheduled_encoder_inputs == {}, (
        "w's 6 blocks do not fit the 5 free ones, so w is not scheduled and its image must not be encoded: book the "
        f"encoder budget and the cache space only after allocate_slots succeeds: {out}"
    )
    assert "fresh" not in sched.encoder_cache_manager.cached, "no encoder-cache space for a request that was refused"


def test_scheduler_running_request_at_its_doorstep_does_not_stop_the_others():
    # r1's next chunk starts exactly at its image, and the 40-slot cache is held by r2's image (r2 still reads
    # it): r1 gets 0 tokens this step, but the loop goes on (upstream: `continue`, not `break`).
    sched = _scheduler(token_budget=100, encoder_budget=40, cache_size=40, caching=False,
                       long_prefill_token_threshold=16)
    sched.add_request(_request("r1", 64, (feat("i1", 16, 40),)))
    sched.add_request(_request("r2", 64, (feat("i2", 0, 40),)))
    out = _step(sched)
    assert out.num_scheduled_tokens == {"r1": 16, "r2": 16} and out.scheduled_encoder_inputs == {"r2": [0]}, str(out)
    out = _step(sched)
    assert out.num_scheduled_tokens == {"r2": 16}, (
        "r1 stops at its doorstep with 0 tokens (no cache room for i1 while r2 reads i2); r2 behind it must still run: "
        f"skip r1 and go on with the running requests, do not end the loop: {out.num_scheduled_tokens}"
    )


def test_scheduler_prefix_hits_depend_on_the_image():
    sched = _scheduler(token_budget=256, encoder_budget=100)
    sched.add_request(_request("a", 100, (feat("imgA", 40, 40),)))
    sched.add_request(_request("b", 100, (feat("imgB", 40, 40),)))
    sched.add_request(_request("c", 100, (feat("imgA", 40, 40),)))
    out = _step(sched)
    assert out.num_scheduled_tokens == {"a": 100, "b": 68, "c": 4}, (
        "same tokens: b, under another image, reuses only blocks [0, 32) (block [32, 48) holds the image, whose hash is in"
        " the key); c, the same image, reuses 6 blocks (96 tokens) and computes 4. Got "
        f"{out.num_scheduled_tokens}"
    )


def test_scheduler_preemption_and_abort_release_encoder_references():
    sched = _scheduler(token_budget=64, encoder_budget=40, caching=False, num_gpu_blocks=9, max_model_len=128)
    sched.add_request(_request("a", 40, (feat("ia", 0, 32),), max_tokens=60))
    sched.add_request(_request("b", 40, (feat("ib", 8, 32),), max_tokens=60))
    _step(sched)
    assert sched.encoder_cache_manager.cached["ia"] == set(), "a's image is wholly in the KV cache after its chunk"
    for _ in range(200):
        out = _step(sched)
        if out.preempted_req_ids:
            break
    else:
        pytest.fail("8 usable blocks for two growing requests: a preemption was expected within 200 steps")
    victim = next(iter(out.preempted_req_ids))
    assert all(victim not in refs for refs in sched.encoder_cache_manager.cached.values()), (
        f"preempting {victim} must drop its encoder-cache references"
    )
    sched.finish_requests(list(sched.requests))
    assert all(not refs for refs in sched.encoder_cache_manager.cached.values()), "an abort drops every reference"


def test_scheduler_disable_chunked_mm_input():
    sched = _scheduler(token_budget=30, encoder_budget=40, caching=False, disable_chunked_mm_input=True)
    sched.add_request(_request("r", 60, (feat("i", 10, 40),)))
    out = _step(sched)
    assert out.num_scheduled_tokens == {"r": 10} and out.scheduled_encoder_inputs == {}, (
        f"a 30-token chunk would end inside the image: cut back to its start (10): {out}"
    )


def test_scheduler_refuses_images_it_could_never_run():
    sched = _scheduler(encoder_budget=30, cache_size=100)
    with pytest.raises(ValueError, match="needs 40 encoder embeddings, more than max_num_encoder_input_tokens=30"):
        sched.add_request(_request("r", 60, (feat("i", 10, 40),)))
    assert not sched.has_unfinished_requests() and not sched.waiting, "a refused request leaves no trace"
    sched.add_request(_request("r", 60, (feat("i", 10, 30),)))
    assert sched.get_request_counts() == (0, 1)
    text_only = _scheduler(encoder_budget=0, cache_size=0)
    with pytest.raises(ValueError, match="encoder_cache_size=0"):
        text_only.add_request(_request("r", 60, (feat("i", 10, 1),)))


def test_request_checks_its_images():
    with pytest.raises(ValueError, match="prompt order and disjoint"):
        _request("r", 60, (feat("a", 10, 20), feat("b", 25, 5)))
    with pytest.raises(ValueError, match="past the 60-token prompt"):
        _request("r", 60, (feat("a", 50, 20),))
    with pytest.raises(TypeError, match="MultiModalFeature"):
        _request("r", 60, (PlaceholderRange(1, 2),))
    r = _request("r", 60, [feat("a", 10, 20)])
    assert r.has_encoder_inputs and r.mm_features == (feat("a", 10, 20),)
    assert not _request("t", 5, ()).has_encoder_inputs


def test_scheduler_max_loras_counts_only_running_requests_scheduled_this_step():
    # LoRA meets images: r1 (adapter 1) stops at its image's doorstep in step 1 and runs nothing, so
    # it holds no adapter slot that step; w (adapter 2) is admitted beside r2 (base model), as
    # upstream counts the adapters of the scheduled running requests only.
    from mini_vllm import Request, SamplingParams
    from mini_vllm.lora import LoRARequest

    sched = _scheduler(token_budget=100, encoder_budget=40, cache_size=40, caching=False,
                       long_prefill_token_threshold=16, enable_lora=True, max_loras=1)
    r1 = _request("r1", 64, (feat("i1", 16, 40),))
    r1.lora_request = LoRARequest("a1", 1)
    sched.add_request(r1)
    sched.add_request(_request("r2", 64, (feat("i2", 0, 40),)))
    w = Request("w", list(range(2000, 2008)), SamplingParams(max_tokens=1, ignore_eos=True),
                lora_request=LoRARequest("a2", 2))
    sched.add_request(w)
    out = _step(sched)
    assert out.num_scheduled_tokens == {"r1": 16, "r2": 16}, f"step 0: w waits, adapter 1 holds the one slot: {out}"
    out = _step(sched)
    assert out.num_scheduled_tokens == {"r2": 16, "w": 8}, (
        "step 1: r1 is running but not scheduled (at its doorstep), so its adapter takes no slot and w "
        f"(adapter 2) fits max_loras=1: count the adapters of the running requests scheduled this step: "
        f"{out.num_scheduled_tokens}"
    )
