from itertools import pairwise

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from course.runtime import lab_module

lab = lab_module(__file__)   # solution.py by default; LAB_IMPL=starter grades starter.py


D, BLOCK_SIZE, NUM_BLOCKS = 8, 4, 8


def _oracle(Q, K, V, start_pos):
    """The test's own causal attention: one masked matmul (independent of the learner's code)."""
    M, n = Q.shape[0], K.shape[0]
    s = Q @ K.T / np.sqrt(D)
    pos_q = start_pos + np.arange(M)[:, None]
    s = np.where(np.arange(n)[None, :] <= pos_q, s, -np.inf)
    w = np.exp(s - s.max(axis=1, keepdims=True))
    return (w / w.sum(axis=1, keepdims=True)) @ V


def _tokens(n, seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((n, D)), rng.standard_normal((n, D)), rng.standard_normal((n, D))


def _empty_cache():
    return np.full((NUM_BLOCKS, BLOCK_SIZE, D), np.nan), np.full((NUM_BLOCKS, BLOCK_SIZE, D), np.nan)


def test_full_prefill_from_position_zero():
    Q, K, V = _tokens(13)
    table = [4, 0, 6, 2]                    # 13 tokens: 3 full blocks + 1 token in the 4th
    kc, vc = _empty_cache()
    lab.write_chunk(kc, vc, table, 0, K, V)
    out = lab.paged_causal_prefill_attention(Q, kc, vc, table, 0)
    assert out.shape == (13, D), f"one output row per query: expected (13, {D}), got {out.shape}"
    assert np.all(np.isfinite(out)), "NaN in the output: a query read a cache slot that was never written"
    err = np.max(np.abs(out - _oracle(Q, K, V, 0)))
    assert err < 1e-9, (
        f"start_pos=0 prefill differs from causal attention by {err:.2e}: row i must attend over tokens "
        f"[0, i] — that is seq_len = start_pos + i + 1 (a token sees itself)"
    )


def test_mid_sequence_chunk():
    Q, K, V = _tokens(9, seed=1)
    table = [7, 3, 5]
    kc, vc = _empty_cache()
    lab.write_chunk(kc, vc, table, 0, K, V)                 # cache holds tokens 0..8
    out = lab.paged_causal_prefill_attention(Q[5:9], kc, vc, table, 5)   # queries for positions 5..8
    err = np.max(np.abs(out - _oracle(Q[5:9], K, V, 5)))
    assert err < 1e-9, (
        f"queries at positions 5..8 (starting mid-block) differ by {err:.2e}: query row i is at absolute "
        f"position start_pos + i, so it sees start_pos + i + 1 tokens"
    )


def test_chunked_equals_one_shot():
    Q, K, V = _tokens(12, seed=2)
    table = [6, 2, 5]
    kc1, vc1 = _empty_cache()
    one_shot = lab.chunked_prefill(Q, K, V, [12], kc1, vc1, table)
    kc2, vc2 = _empty_cache()
    chunked = lab.chunked_prefill(Q, K, V, [5, 7], kc2, vc2, table)
    assert np.all(np.isfinite(chunked)), (
        "NaN in the chunked run: write each chunk's K/V into the cache BEFORE attending its queries"
    )
    err = np.max(np.abs(chunked - one_shot))
    assert err < 1e-9, f"5 + 7 chunks differ from one 12-token chunk by {err:.2e}; the cache is the only state"
    assert np.max(np.abs(one_shot - _oracle(Q, K, V, 0))) < 1e-9, "one-shot prefill is not causal attention"


def test_causality_future_tokens_are_invisible():
    Q, K, V = _tokens(8, seed=3)
    table = [1, 4]
    kc, vc = _empty_cache()
    lab.write_chunk(kc, vc, table, 0, K, V)
    before = lab.paged_causal_prefill_attention(Q, kc, vc, table, 0)
    K2, V2 = K.copy(), V.copy()
    K2[7], V2[7] = 1e3, 1e3                                 # make the last token "loud"
    lab.write_chunk(kc, vc, table, 0, K2, V2)
    after = lab.paged_causal_prefill_attention(Q, kc, vc, table, 0)
    assert np.array_equal(before[:7], after[:7]), (
        "changing token 7 changed rows 0..6: earlier queries must not see later tokens "
        "(the causal bound is seq_len = start_pos + i + 1, not the whole cache)"
    )
    assert not np.allclose(before[7], after[7]), "row 7 must see token 7 itself: include the query's own position"


def test_slot_mapping_for_a_chunk():
    slots = lab.slot_mapping([3, 1, 7], 4, 5, 4)
    assert list(slots) == [5, 6, 7, 28], (
        f"tokens 5..8 with block_table [3,1,7], block_size 4 go to slots "
        f"[1*4+1, 1*4+2, 1*4+3, 7*4+0] = [5, 6, 7, 28], got {list(slots)}: "
        f"slot = block_table[t // block_size] * block_size + t % block_size"
    )


def test_dense_causal_reference():
    Q, K, V = _tokens(6, seed=4)
    got = lab.dense_causal_attention(Q[2:], K, V, 2)
    err = np.max(np.abs(got - _oracle(Q[2:], K, V, 2)))
    assert err < 1e-12, f"dense_causal_attention with start_pos=2 differs from masked attention by {err:.2e}"


def test_dense_causal_reference_survives_extreme_scores():
    # The reference is graded too: every score near +800 (exp overflows) or -790 (exp underflows to 0)
    Q, K, V = _tokens(6, seed=6)
    Q[:, 1:] = 0.0
    Q[:, 0] = np.sqrt(D)  # score of key t = K[t, 0]
    for shift in (800.0, -790.0):
        K[:, 0] = shift + np.random.default_rng(7).standard_normal(6)
        got = lab.dense_causal_attention(Q[2:], K, V, 2)
        want = _oracle(Q[2:], K, V, 2)
        assert np.all(np.isfinite(got)) and np.max(np.abs(got - want)) < 1e-9, (
            f"dense_causal_attention with every score near {shift:g} gave row 0 = {got[0][:3]} "
            f"(want {want[0][:3]}): exponentiate s - s.max(), never s itself"
        )


def test_three_or_more_chunks_other_block_size():
    # block_size 3 (not 4), V rows 5 wide (not D), and chunkings of 3, 4 and 11 pieces
    rng = np.random.default_rng(5)
    n, d_v, block_size = 11, 5, 3
    Q, K, V = rng.standard_normal((n, D)), rng.standard_normal((n, D)), rng.standard_normal((n, d_v))
    table = [2, 6, 0, 4]
    want = _oracle(Q, K, V, 0)
    for chunks in ([4, 3, 4], [2, 5, 1, 3], [1] * n):
        kc, vc = np.full((8, block_size, D), np.nan), np.full((8, block_size, d_v), np.nan)
        out = lab.chunked_prefill(Q, K, V, chunks, kc, vc, table)
        assert out.shape == (n, d_v), f"chunks {chunks}: expected ({n}, {d_v}) (one row of V's width per query), got {out.shape}"
        err = np.max(np.abs(out - want))
        assert np.all(np.isfinite(out)) and err < 1e-9, (
            f"chunks {chunks} (block_size 3) differ from one-shot causal attention by {err:.2e}: chunk j "
            f"starts at sum(chunk_sizes[:j]) (advance start by each size, start = end), and write_chunk "
            f"must take block_size and each cache's row width from that cache's own shape"
        )


def test_chunk_sizes_that_miss_the_prompt_are_refused_before_any_write():
    Q, K, V = _tokens(12, seed=3)
    for chunks in ([5, 5], [5, 7, 1], [12, 0, 3]):
        kc, vc = _empty_cache()
        try:
            out = lab.chunked_prefill(Q, K, V, chunks, kc, vc, [6, 2, 5])
        except ValueError:
            pass
        else:
            raise AssertionError(
                f"chunk sizes {chunks} add up to {sum(chunks)} for a 12-token prompt, yet chunked_prefill returned "
                f"{out.shape[0]} rows: check sum(chunk_sizes) == len(Q) and raise ValueError"
            )
        assert np.isnan(kc).all() and np.isnan(vc).all(), (
            f"chunk sizes {chunks} were refused only after K/V had been written into the cache: check first"
        )





@settings(max_examples=30, deadline=None, derandomize=True)
@given(n=st.integers(1, 14), cuts=st.lists(st.integers(1, 13), max_size=5), block_size=st.sampled_from([1, 2, 3, 5]),
       shift=st.sampled_from([-900.0, 0.0, 900.0]), spread=st.sampled_from([0.5, 400.0]), seed=st.integers(0, 2**16))
def test_property_any_chunking_equals_causal_attention(n, cuts, block_size, shift, spread, seed):
    # any split of the prompt into chunks, any block size, scores shifted and spread to extremes
    rng = np.random.default_rng(seed)
    Q, K, V = rng.standard_normal((n, D)), rng.standard_normal((n, D)), rng.standard_normal((n, D))
    Q[:, 0], K[:, 0] = np.sqrt(D), shift + spread * rng.standard_normal(n)   # score = K[t, 0] + small noise
    bounds = sorted({0, n, *(c for c in cuts if c < n)})
    chunks = [b - a for a, b in pairwise(bounds)]
    n_blocks = -(-n // block_size)
    table = [int(b) for b in rng.permutation(n_blocks + 2)[:n_blocks]]
    kc = np.full((n_blocks + 2, block_size, D), np.nan)
    vc = np.full((n_blocks + 2, block_size, D), np.nan)
    out = lab.chunked_prefill(Q, K, V, chunks, kc, vc, table)
    want = _oracle(Q, K, V, 0)
    assert np.all(np.isfinite(out)) and np.max(np.abs(out - want)) < 1e-9, (
        f"{n} tokens in chunks {chunks}, block_size {block_size}, scores ~ {shift} +- {spread}: differs from causal "
        f"attention. Write each chunk before attending it, start chunk j at sum(chunks[:j]), and give query i of a "
        f"chunk seq_len = start + i + 1"
    )
