import numpy as np

from course.runtime import lab_module

lab = lab_module(__file__)   # solution.py by default; LAB_IMPL=starter grades starter.py


BS = 16


def dense_attention(q, k, v):
    """Oracle: plain softmax attention over contiguous K/V ([seq, kv_heads, dim]), GQA-aware."""
    heads, dim = q.shape
    group = heads // k.shape[1]
    out = np.empty_like(q)
    for h in range(heads):
        s = k[:, h // group, :] @ q[h] / np.sqrt(dim)
        p = np.exp(s - s.max())
        out[h] = (p / p.sum()) @ v[:, h // group, :]
    return out


def setup(seq_len, table, heads=4, kv_heads=2, dim=8, num_blocks=16, seed=0):
    rng = np.random.default_rng(seed)
    k_cache = np.zeros((num_blocks * BS, kv_heads, dim))
    v_cache = np.zeros_like(k_cache)
    k = rng.standard_normal((seq_len, kv_heads, dim))
    v = rng.standard_normal((seq_len, kv_heads, dim))
    slots = lab.build_slot_mapping(np.array(table), BS, 0, seq_len)
    lab.write_kv(k_cache, v_cache, k, v, slots)
    q = np.abs(rng.standard_normal((heads, dim)))
    return q, k, v, k_cache, v_cache


def test_slot_mapping_formula():
    table = np.array([5, 2, 9])
    got = lab.build_slot_mapping(table, BS, 0, 3)
    assert got.tolist() == [80, 81, 82], f"tokens 0..2 live in block 5 -> slots 80, 81, 82; got {got.tolist()}"
    got = lab.build_slot_mapping(table, BS, 15, 2)
    assert got.tolist() == [95, 32], (
        f"token 15 is the last slot of block 5 (95) and token 16 the first of block 2 (32); got {got.tolist()}")
    got = lab.build_slot_mapping(table, BS, 20, 3)
    assert got.tolist() == [36, 37, 38], f"tokens 20..22 sit at offsets 4..6 of block 2; got {got.tolist()}"
    got = lab.build_slot_mapping(table, BS, 35, 1)
    assert got.tolist() == [9 * 16 + 3], (
        f"a decode write at start=seq_len=35 goes to block_table[35 // 16] * 16 + 35 % 16 = 147; got {got.tolist()}")
    assert len(lab.build_slot_mapping(table, BS, 7, 0)) == 0, "zero tokens -> an empty mapping"


def test_write_then_gather_round_trips():
    rng = np.random.default_rng(1)
    table = np.array([7, 3, 11, 0])
    k_cache = np.zeros((12 * BS, 2, 4))
    v_cache = np.zeros_like(k_cache)
    k = rng.standard_normal((50, 2, 4))
    v = rng.standard_normal((50, 2, 4))
    # prefill in two chunks (0..31, 32..47), then two decode steps
    for start, n in [(0, 32), (32, 16), (48, 1), (49, 1)]:
        lab.write_kv(k_cache, v_cache, k[start:start + n], v[start:start + n],
                     lab.build_slot_mapping(table, BS, start, n))
    slots = lab.build_slot_mapping(table, BS, 0, 50)
    assert np.array_equal(k_cache[slots], k) and np.array_equal(v_cache[slots], v), (
        "gathering through the block table must return exactly the rows written with slot_mapping; "
        "check write_kv scatters new_k/new_v to k_cache[slot_mapping]/v_cache[slot_mapping]")
    untouched = np.setdiff1d(np.arange(12 * BS), slots)
    assert not k_cache[untouched].any(), "write_kv must touch only the slots it is given"


def test_paged_matches_dense_exactly():
    table = np.random.default_rng(2).permutation(16)[:5]           # shuffled, non-identity placement
    seq_len = 5 * BS
    q, k, v, k_cache, v_cache = setup(seq_len, table)
    got = lab.paged_attention(q, k_cache, v_cache, table, seq_len, BS)
    want = dense_attention(q, k, v)
    assert got.shape == want.shape, f"output must be [num_heads, head_dim] = {want.shape}, got {got.shape}"
    assert np.allclose(got, want, rtol=0, atol=1e-12), (
        f"paged attention must equal dense attention to 1e-12 in float64; max|diff| = {np.abs(got - want).max():.2e}")


def test_partial_tail_block_is_masked():
    table = np.array([3, 12, 4])
    seq_len = 35                                                      # 2 full blocks + 3 tokens
    q, k, v, k_cache, v_cache = setup(seq_len, table)
    pad = lab.build_slot_mapping(table, BS, seq_len, 3 * BS - seq_len)
    assert len(pad) == 13
    k_cache[pad] = 1e6
    v_cache[pad] = 1e6
    got = lab.paged_attention(q, k_cache, v_cache, table, seq_len, BS)
    want = dense_attention(q, k, v)
    assert np.allclose(got, want, rtol=0, atol=1e-12), (
        f"seq_len=35 must read exactly 35 rows: the 13 padding slots (filled with 1e6) leaked in; "
        f"max|diff| = {np.abs(got - want).max():.2e}")
    overread = lab.paged_attention(q, k_cache, v_cache, table, 3 * BS, BS)
    assert np.abs(overread - want).max() > 1e3, "sanity: reading len(table) * block_size rows must blow up"


def test_indirection_is_the_identity():
    seq_len = 40
    rng = np.random.default_rng(3)
    heads, kv_heads, dim = 4, 2, 8
    k = rng.standard_normal((seq_len, kv_heads, dim))
    v = rng.standard_normal((seq_len, kv_heads, dim))
    q = rng.standard_normal((heads, dim))
    outs = []
    for table in (np.array([1, 2, 3]), np.array([14, 6, 9])):
        k_cache = rng.standard_normal((16 * BS, kv_heads, dim))      # garbage everywhere else
        v_cache = rng.standard_normal((16 * BS, kv_heads, dim))
        lab.write_kv(k_cache, v_cache, k, v, lab.build_slot_mapping(table, BS, 0, seq_len))
        outs.append(lab.paged_attention(q, k_cache, v_cache, table, seq_len, BS))
    assert np.array_equal(outs[0], outs[1]), (
        "the same logical tokens under two physical placements must give bit-identical output: "
        "paging moves bytes, it must not change values")


def test_gqa_maps_query_heads_onto_shared_kv_heads():
    table = np.array([2, 8])
    q, k, v, k_cache, v_cache = setup(20, table, heads=8, kv_heads=2, dim=4, seed=5)
    got = lab.paged_attention(q, k_cache, v_cache, table, 20, BS)
    want = dense_attention(q, k, v)
    assert np.allclose(got, want, rtol=0, atol=1e-12), (
        "with 8 query heads and 2 KV heads, query head h must read KV head h // 4")
    q, k, v, k_cache, v_cache = setup(20, table, heads=6, kv_heads=3, dim=4, seed=6)
    got = lab.paged_attention(q, k_cache, v_cache, table, 20, BS)
    want = dense_attention(q, k, v)
    bad = [h for h in range(6) if not np.allclose(got[h], want[h], rtol=0, atol=1e-12)]
    assert not bad, (
        f"with 6 query heads and 3 KV heads (groups of 2), query heads {bad} read the wrong KV head: "
        f"heads 0,1 -> KV 0, heads 2,3 -> KV 1, heads 4,5 -> KV 2, i.e. h // group (not h % anything)")


def test_scores_all_below_minus_700_stay_finite_and_exact():
    # K points away from q, so every score is around -850: exp() of any of them underflows to 0.0.
    rng = np.random.default_rng(7)
    table = np.array([9, 4])
    seq_len, heads, kv_heads, dim = 20, 4, 2, 8
    k = -100.0 - rng.random((seq_len, kv_heads, dim))
    v = rng.standard_normal((seq_len, kv_heads, dim))
    q = np.full((heads, dim), 3.0)
    k_cache = np.zeros((16 * BS, kv_heads, dim))
    v_cache = np.zeros_like(k_cache)
    lab.write_kv(k_cache, v_cache, k, v, lab.build_slot_mapping(table, BS, 0, seq_len))
    assert (k[:, 0, :] @ q[0] / np.sqrt(dim)).max() < -700, "sanity: every score is below -700"
    got = lab.paged_attention(q, k_cache, v_cache, table, seq_len, BS)
    want = dense_attention(q, k, v)
    assert np.all(np.isfinite(got)), (
        "scores all below -700 gave NaN/inf: shift by the true maximum score (a running max starts at "
        "-inf, never at 0) before exp")
    assert np.allclose(got, want, rtol=0, atol=1e-12), (
        f"with scores around -850 the output must still equal dense attention; max|diff| = {np.abs(got - want).max():.2e}")


def test_documented_errors_are_raised():
    k_cache = np.zeros((4 * BS, 2, 4))
    v_cache = np.zeros_like(k_cache)
    slots = lab.build_slot_mapping(np.array([1]), BS, 0, 3)
    one_row = np.ones((1, 2, 4))
    for new_k, new_v in ((one_row, np.ones((3, 2, 4))), (np.ones((3, 2, 4)), one_row)):
        try:
            lab.write_kv(k_cache, v_cache, new_k, new_v, slots)
        except ValueError:
            pass
        else:
            raise AssertionError(
                f"write_kv with 3 slots, new_k of {len(new_k)} rows and new_v of {len(new_v)} rows must raise "
                f"ValueError (numpy would broadcast a single row into all 3 slots silently)")
        assert not k_cache.any() and not v_cache.any(), "a refused write must leave both caches untouched"
    q = np.ones((6, 4))
    try:
        lab.paged_attention(q, np.ones((4 * BS, 4, 4)), np.ones((4 * BS, 4, 4)), np.array([1]), 3, BS)
    except ValueError:
        pass
    else:
        raise AssertionError("6 query heads over 4 KV heads is not grouped-query attention: raise ValueError")


def test_padding_holding_nan_or_inf_never_reaches_the_output():
    # Finite poison (1e6) can be hidden by a -inf score mask: its weight is exactly 0. NaN and inf
    # cannot: 0 * NaN is NaN. Only reading exactly seq_len rows keeps them out.
    table = np.array([3, 12, 4])
    seq_len = 35
    for poison in (np.nan, np.inf):
        q, k, v, k_cache, v_cache = setup(seq_len, table)
        pad = lab.build_slot_mapping(table, BS, seq_len, 3 * BS - seq_len)
        k_cache[pad] = poison
        v_cache[pad] = poison
        got = lab.paged_attention(q, k_cache, v_cache, table, seq_len, BS)
        want = dense_attention(q, k, v)
        assert np.all(np.isfinite(got)) and np.allclose(got, want, rtol=0, atol=1e-12), (
            f"padding slots past seq_len=35 hold {poison}: the output must still equal dense attention, got "
            f"{np.count_nonzero(~np.isfinite(got))} non-finite values; gather exactly seq_len rows "
            f"(a score mask after reading whole blocks still multiplies 0 by {poison})"
        )


def test_slot_mapping_is_int64_past_2_31():
    # A big pool: physical block 2**27 at block size 16 starts at slot 2**31, past int32. Block
    # tables are often int32 (the ids fit): the slots must still be computed and returned in int64.
    want = [2**31 + 14, 2**31 + 15, 5 * BS]
    for table in (np.array([2**27, 5]), np.array([2**27, 5], dtype=np.int32), [2**27, 5]):
        kind = type(table).__name__ + (f"[{table.dtype}]" if isinstance(table, np.ndarray) else "")
        got = lab.build_slot_mapping(table, BS, 14, 3)
        assert got.dtype == np.int64, (
            f"the slot mapping must be int64 whatever the block table's dtype; a {kind} table gave {got.dtype}"
        )
        assert got.tolist() == want, (
            f"block 2**27 x 16 = 2**31 with a {kind} table: slots should be {want}, got {got.tolist()}; "
            f"cast the table to int64 before multiplying (int32 wraps)"
        )


def test_block_size_is_a_parameter_not_16():
    # Block size 4: tokens 2..9 of table [5, 2, 9] sit at 5*4+2, 5*4+3, then 2*4+0..3, then 9*4+0..1.
    table = np.array([5, 2, 9])
    got = lab.build_slot_mapping(table, 4, 2, 8)
    want = [22, 23, 8, 9, 10, 11, 36, 37]
    assert got.tolist() == want, (
        f"block_size=4: tokens 2..9 go to slots {want}, got {got.tolist()}; use the block_size argument, not 16"
    )
    # Attention through the same table at block size 4, the cache written with the formula by hand.
    rng = np.random.default_rng(4)
    seq_len = 10
    k = rng.standard_normal((seq_len, 2, 8))
    v = rng.standard_normal((seq_len, 2, 8))
    k_cache = np.zeros((16 * 4, 2, 8))
    v_cache = np.zeros_like(k_cache)
    slots = [int(table[t // 4]) * 4 + t % 4 for t in range(seq_len)]
    k_cache[slots] = k
    v_cache[slots] = v
    q = rng.standard_normal((4, 8))
    out = lab.paged_attention(q, k_cache, v_cache, table, seq_len, 4)
    err = np.abs(out - dense_attention(q, k, v)).max()
    assert err < 1e-12, f"paged attention at block_size=4 differs from dense attention by {err:.2e}"
