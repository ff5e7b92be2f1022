"""mini_vllm.attention: the paged cache write and the varlen paged attention against a dense reference."""

import numpy as np
import pytest

from mini_vllm.attention import (
    AttentionMetadata,
    KVCacheSpec,
    allocate_kv_caches,
    compute_slot_mapping,
    paged_attention,
    reshape_and_cache,
)

HQ, HKV, D = 4, 2, 8


def dense_attention(q, k, v, scale):
    """One request, keys 0..S-1 contiguous: query i sits at position S - len(q) + i (repeat-KV GQA)."""
    group = q.shape[1] // k.shape[1]
    k, v = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)  # head h reads KV head h // group
    s_len, q_len = k.shape[0], q.shape[0]
    out = np.zeros_like(q, dtype=np.float64)
    for i in range(q_len):
        pos = s_len - q_len + i
        for h in range(q.shape[1]):
            scores = k[: pos + 1, h].astype(np.float64) @ q[i, h] * scale
            p = np.exp(scores - scores.max())
            out[i, h] = (p / p.sum()) @ v[: pos + 1, h]
    return out


class Paged:
    """K/V of several requests in one cache, blocks handed out in a shuffled (non-contiguous) order."""

    def __init__(self, block_size, num_blocks=64, seed=0):
        self.block_size = block_size
        self.cache = allocate_kv_caches(1, num_blocks, block_size, HKV, D)[0]
        self.free = list(np.random.default_rng(seed).permutation(np.arange(1, num_blocks)))
        self.tables, self.lens = [], []

    def add(self, num_tokens):
        blocks = [int(self.free.pop()) for _ in range(-(-num_tokens // self.block_size))]
        self.tables.append(blocks)
        self.lens.append(num_tokens)

    def table(self):
        """The requests' block tables as one array, short rows padded with block 0."""
        table = np.zeros((len(self.tables), max(len(t) for t in self.tables)), dtype=np.int32)
        for r, t in enumerate(self.tables):
            table[r, : len(t)] = t
        return table

    def step(self, query_lens, k, v):
        """Write this step's K/V (the last query_lens[r] tokens of each request) and return its metadata."""
        md = AttentionMetadata.build(query_lens, self.lens, self.table(), self.block_size)
        reshape_and_cache(k, v, self.cache, md.slot_mapping)
        return md


def run_batch(block_size, seq_lens, query_lens, seed=0):
    """Mini's paged result and the dense reference for one varlen batch, history written first."""
    rng = np.random.default_rng(seed)
    paged = Paged(block_size, seed=seed)
    ks = [rng.standard_normal((s, HKV, D)).astype(np.float32) for s in seq_lens]
    vs = [rng.standard_normal((s, HKV, D)).astype(np.float32) for s in seq_lens]
    qs = [rng.standard_normal((q, HQ, D)).astype(np.float32) for q in query_lens]
    for s in seq_lens:
        paged.add(s)
    history = [s - q for s, q in zip(seq_lens, query_lens)]
    if any(history):  # earlier steps: write the context in one go, as if computed before
        md = AttentionMetadata.build(history, history, paged.table(), block_size)
        reshape_and_cache(
            np.concatenate([k[:h] for k, h in zip(ks, history)]),
            np.concatenate([v[:h] for v, h in zip(vs, history)]),
            paged.cache,
            md.slot_mapping,
        )
    md = paged.step(
        query_lens,
        np.concatenate([k[h:] for k, h in zip(ks, history)]),
        np.concatenate([v[h:] for v, h in zip(vs, history)]),
    )
    scale = D**-0.5
    got = paged_attention(np.concatenate(qs), paged.cache, md, scale)
    want = np.concatenate([dense_attention(q, k, v, scale) for q, k, v in zip(qs, ks, vs)])
    return got, want, md


@pytest.mark.parametrize("block_size", [16, 32])
def test_varlen_batch_of_prefills_chunks_and_decodes_equals_dense(block_size):
    # a full prefill, a decode deep in its sequence, a chunk in the middle, a 1-token prompt, a decode at a block edge
    seq_lens = [37, 70, 50, 1, block_size + 1]
    query_lens = [37, 1, 13, 1, 1]
    got, want, md = run_batch(block_size, seq_lens, query_lens)
    assert md.num_actual_tokens == sum(query_lens) and md.max_query_len == 37 and md.max_seq_len == 70
    np.testing.assert_allclose(
        got, want, atol=2e-5, err_msg="paged attention must equal dense causal GQA attention"
    )


def test_first_token_of_a_chunk_sees_the_whole_context_and_no_future():
    # one request, 20 tokens in the cache, a chunk of the last 4: query 0 is at position 16
    got, want, _ = run_batch(16, [20], [4], seed=3)
    np.testing.assert_allclose(
        got[0], want[0], atol=2e-5, err_msg="query 0 of the chunk must see keys 0..16, not 0..15 or 0..17"
    )
    np.testing.assert_allclose(got, want, atol=2e-5)


def test_gqa_head_h_reads_kv_head_h_over_group():
    # K/V heads made very different, so reading the wrong one changes every output
    block_size, rng = 16, np.random.default_rng(5)
    paged = Paged(block_size)
    paged.add(5)
    k = rng.standard_normal((5, HKV, D)).astype(np.float32)
    v = np.zeros((5, HKV, D), dtype=np.float32)
    v[:, 0], v[:, 1] = 1.0, -1.0  # KV head 0 says +1, head 1 says -1
    q = rng.standard_normal((5, HQ, D)).astype(np.float32)
    md = paged.step([5], k, v)
    out = paged_attention(q, paged.cache, md, D**-0.5)
    np.testing.assert_allclose(
        out[:, :2], 1.0, atol=1e-6, err_msg="query heads 0 and 1 form group 0: they read KV head 0"
    )
    np.testing.assert_allclose(
        out[:, 2:], -1.0, atol=1e-6, err_msg="query heads 2 and 3 form group 1: they read KV head 1"
    )


@pytest.mark.parametrize("block_size", [16, 32])
def test_chunked_prefill_equals_one_shot(block_size):
    rng = np.random.default_rng(7)
    n = 45
    q = rng.standard_normal((n, HQ, D)).astype(np.float32)
    k = rng.standard_normal((n, HKV, D)).astype(np.float32)
    v = rng.standard_normal((n, HKV, D)).astype(np.float32)
    one = Paged(block_size, seed=1)
    one.add(n)
    whole = paged_attention(q, one.cache, one.step([n], k, v), 0.3)
    chunked = Paged(block_size, seed=2)
    chunked.add(n)
    pieces, done = [], 0
    for size in (8, 8, 20, 9):
        chunked.lens[0] = done + size
        md = chunked.step([size], k[done : done + size], v[done : done + size])
        pieces.append(paged_attention(q[done : done + size], chunked.cache, md, 0.3))
        done += size
    np.testing.assert_allclose(
        np.concatenate(pieces), whole, atol=2e-6, err_msg="prefill in chunks 8/8/20/9 must equal one shot"
    )


def test_slot_mapping_is_block_id_times_block_size_plus_offset():
    table = np.array([[7, 3, 9], [2, 0, 0]], dtype=np.int32)
    # request 0: 3 new tokens at positions 15, 16, 17 (seq_len 18); request 1: 2 tokens at 0, 1
    slots = compute_slot_mapping(table, np.array([0, 3, 5]), np.array([18, 2]), block_size=16)
    assert slots.tolist() == [7 * 16 + 15, 3 * 16 + 0, 3 * 16 + 1, 2 * 16 + 0, 2 * 16 + 1], slots.tolist()
    assert slots.dtype == np.int64


def test_slot_minus_one_is_skipped_and_padding_rows_are_zero():
    cache = allocate_kv_caches(1, 4, 16, HKV, D)[0]
    key = np.ones((3, HKV, D), dtype=np.float32)
    reshape_and_cache(key, 2 * key, cache, np.array([16, -1, 17]))
    assert cache[0, 1, 0].min() == 1 and cache[1, 1, 1].min() == 2, (
        "slots 16 and 17 are block 1, offsets 0 and 1"
    )
    assert np.count_nonzero(cache[0]) == 2 * HKV * D, "slot -1 (padding) must not be written anywhere"
    md = AttentionMetadata(2, 2, np.array([0, 2]), 2, np.array([2]), np.array([[1]]), np.array([16, 17, -1]))
    out = paged_attention(np.ones((3, HQ, D), dtype=np.float32), cache, md, 1.0)
    assert np.all(out[2] == 0), "rows past num_actual_tokens are padding and come back as zeros"
    np.testing.assert_allclose(out[:2], 2.0, atol=1e-6)


def test_slot_zero_is_a_real_slot_and_the_last_slot_is_written():
    cache = allocate_kv_caches(1, 4, 16, HKV, D)[0]
    key = np.arange(1, 3 * HKV * D + 1, dtype=np.float32).reshape(3, HKV, D)
    reshape_and_cache(key, -key, cache, np.array([0, -1, 4 * 16 - 1]))
    np.testing.assert_array_equal(
        cache[0, 0, 0], key[0], err_msg="slot 0 (block 0, offset 0) is a real slot: only -1 means padding"
    )
    np.testing.assert_array_equal(cache[1, 0, 0], -key[0], err_msg="slot 0's value was not written")
    np.testing.assert_array_equal(
        cache[0, 3, 15], key[2], err_msg="the cache's last slot (63) was not written"
    )
    assert np.count_nonzero(cache[0]) == 2 * HKV * D, "slot -1 (padding) must not be written anywhere"
    with pytest.raises(ValueError, match="outside the cache"):
        reshape_and_cache(key, key, cache, np.array([0, 1, 4 * 16]))  # one past the last slot


def test_allocate_shape_and_spec_bytes():
    caches = allocate_kv_caches(3, 10, 16, HKV, D)
    assert len(caches) == 3 and all(c.shape == (2, 10, 16, HKV, D) and not c.any() for c in caches)
    assert caches[0] is not caches[1], "each layer gets its own tensor"
    assert KVCacheSpec(2, HKV, D).page_size_bytes(16) == 2 * 16 * HKV * D * 4 * 2
    with pytest.raises(ValueError, match="num_blocks"):
        allocate_kv_caches(1, 0, 16, HKV, D)


def test_bad_shapes_are_refused_and_leave_the_cache_untouched():
    paged = Paged(16)
    paged.add(4)
    k = np.ones((4, HKV, D), dtype=np.float32)
    md = paged.step([4], k, k)
    before = paged.cache.copy()
    with pytest.raises(ValueError, match="key and value"):
        reshape_and_cache(np.ones((4, HQ, D)), np.ones((4, HQ, D)), paged.cache, md.slot_mapping)
    with pytest.raises(ValueError, match="outside the cache"):
        reshape_and_cache(k, k, paged.cache, np.array([0, 1, 2, 64 * 16]))
    with pytest.raises(ValueError, match="slot_mapping"):
        reshape_and_cache(k, k, paged.cache, np.zeros(5, dtype=np.int64))
    np.testing.assert_array_equal(paged.cache, before, err_msg="a refused write must write nothing")
    with pytest.raises(ValueError, match="query must be"):
        paged_attention(np.ones((4, HQ, D + 1)), paged.cache, md, 1.0)
    with pytest.raises(ValueError, match="multiple of num_kv_heads"):
        paged_attention(np.ones((4, 3, D)), paged.cache, md, 1.0)
    narrow = AttentionMetadata(4, 4, md.query_start_loc, 40, np.array([40]), md.block_table, md.slot_mapping)
    with pytest.raises(ValueError, match="needs 3 blocks"):
        paged_attention(np.ones((4, HQ, D)), paged.cache, narrow, 1.0)
    bad_block = AttentionMetadata(4, 4, md.query_start_loc, 4, md.seq_lens, np.array([[99]]), md.slot_mapping)
    with pytest.raises(ValueError, match="block ids"):
        paged_attention(np.ones((4, HQ, D)), paged.cache, bad_block, 1.0)
    short_seq = AttentionMetadata(4, 4, md.query_start_loc, 3, np.array([3]), md.block_table, md.slot_mapping)
    with pytest.raises(ValueError, match="seq_lens"):
        paged_attention(np.ones((4, HQ, D)), paged.cache, short_seq, 1.0)
    with pytest.raises(ValueError, match="kv_cache must be"):
        paged_attention(np.ones((4, HQ, D)), paged.cache[0], md, 1.0)
    with pytest.raises(ValueError, match="block-table entry"):
        AttentionMetadata.build([4], [40], [[1]], 16)


def test_slots_past_seq_len_are_never_read_even_when_they_hold_nan():
    # The last block is only partly filled: its tail (and every block past the request's) holds
    # garbage. Gathering the whole block and trusting the causal mask still multiplies 0 by that
    # garbage; NaN there shows it (finite garbage would hide the read).
    block_size, seq_len, q_len = 8, 8 + 3, 2
    rng = np.random.default_rng(4)
    paged = Paged(block_size, num_blocks=8, seed=4)
    paged.cache[...] = np.nan
    paged.add(seq_len)
    k = rng.standard_normal((seq_len, HKV, D)).astype(np.float32)
    v = rng.standard_normal((seq_len, HKV, D)).astype(np.float32)
    q = rng.standard_normal((q_len, HQ, D)).astype(np.float32)
    md = AttentionMetadata.build([seq_len], [seq_len], paged.table(), block_size)
    reshape_and_cache(k, v, paged.cache, md.slot_mapping)
    md = AttentionMetadata.build([q_len], [seq_len], paged.table(), block_size)
    got = paged_attention(q, paged.cache, md, D**-0.5)
    bad = np.argwhere(~np.isfinite(got))
    assert not bad.size, (
        f"output row {bad[0][0] if bad.size else None} is not finite: keys/values must be cut at seq_len={seq_len} "
        f"(the last block's slots {seq_len % block_size}..{block_size - 1} are unwritten), not only masked"
    )
    np.testing.assert_allclose(got, dense_attention(q, k, v, D**-0.5), atol=2e-5)


def test_a_negative_block_id_in_the_used_part_of_the_table_is_refused():
    kv = allocate_kv_caches(1, 4, 2, 1, 4)[0]
    md = AttentionMetadata.build([1], [3], [[0, -1]], block_size=2)  # position 2 lives in block -1
    with pytest.raises(ValueError, match="block ids"):
        paged_attention(np.zeros((1, 1, 4), dtype=np.float32), kv, md, scale=1.0)
    # -1 past the blocks the request needs is padding, never read
    ok = AttentionMetadata.build([1], [2], [[0, -1]], block_size=2)
    paged_attention(np.zeros((1, 1, 4), dtype=np.float32), kv, ok, scale=1.0)
