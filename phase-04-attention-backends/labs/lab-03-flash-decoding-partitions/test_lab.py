from itertools import pairwise

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from course.runtime import lab_module

lab = lab_module(__file__)   # solution.py by default; LAB_IMPL=starter grades starter.py


D = 16


def _dense(q, K, V):
    s = K @ q / np.sqrt(q.shape[-1])
    w = np.exp(s - s.max())
    return (w / w.sum()) @ V


def _data(n, seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal(D), rng.standard_normal((n, D)), rng.standard_normal((n, D))


def _parts(q, K, V, p):
    return [lab.attend_partial(q, k, v) for k, v in zip(np.array_split(K, p), np.array_split(V, p))]


def test_one_partition_is_just_attention():
    q, K, V = _data(50)
    out = lab.merge_partials([lab.attend_partial(q, K, V)])
    err = np.max(np.abs(out - _dense(q, K, V)))
    assert err < 1e-12, (
        f"one summary -> output differs from dense by {err:.2e}: merge_partials must return acc / denom"
    )


def test_any_partition_count_matches_dense():
    q, K, V = _data(200, seed=1)
    want = _dense(q, K, V)
    for p in (2, 3, 7, 32, 100):
        err = np.max(np.abs(lab.partitioned_attention(q, K, V, p) - want))
        assert err < 1e-12, (
            f"{p} partitions differ from dense by {err:.2e}. If 1 partition works but 2 do not, you "
            f"normalised each partition (acc/denom) and averaged: weight partitions by denom_i*exp(m_i - m*)"
        )


def test_more_partitions_than_keys():
    q, K, V = _data(5, seed=2)
    want = _dense(q, K, V)
    out = lab.partitioned_attention(q, K, V, 8)     # array_split gives 3 empty chunks
    assert np.all(np.isfinite(out)) and np.max(np.abs(out - want)) < 1e-12, (
        "8 partitions over 5 keys: the 3 empty chunks must become empty summaries (m=-inf, denom=0, acc=0)"
    )
    parts = _parts(q, K, V, 8)
    out = lab.merge_partials(parts[::-1])             # empty summaries first: merge_two(empty, empty)
    assert np.all(np.isfinite(out)), (
        "merging two empty summaries produced NaN: exp(-inf - (-inf)) is NaN, so when max(m_a, m_b) is "
        "-inf return an empty summary instead of computing the weights"
    )
    assert np.max(np.abs(out - want)) < 1e-12, "empties-first merge differs from dense"


def test_merge_is_order_invariant():
    q, K, V = _data(120, seed=3)
    parts = _parts(q, K, V, 9)
    base = lab.merge_partials(parts)
    shuffled = [parts[i] for i in np.random.default_rng(7).permutation(len(parts))]
    for order, name in ((parts[::-1], "reversed"), (shuffled, "shuffled")):
        err = np.max(np.abs(lab.merge_partials(order) - base))
        assert err < 1e-12, f"{name} partial list changed the output by {err:.2e}: the merge must be commutative"


def test_merge_is_hierarchical():
    q, K, V = _data(90, seed=4)
    a, b, c, d = _parts(q, K, V, 4)
    union = lab.attend_partial(q, K, V)
    left = lab.merge_two(lab.merge_two(lab.merge_two(a, b), c), d)
    tree = lab.merge_two(lab.merge_two(a, b), lab.merge_two(c, d))
    for got, name in ((left, "left fold"), (tree, "balanced tree")):
        assert abs(got.m - union.m) < 1e-12, f"{name}: merged m should be the max over all keys ({union.m})"
        assert abs(got.denom - union.denom) < 1e-9 * union.denom, (
            f"{name}: merged denom {got.denom} != denom over the union {union.denom}: "
            f"rescale each side by exp(m_side - m_merged) before adding"
        )
        assert np.max(np.abs(got.acc - union.acc)) < 1e-9, f"{name}: merged acc differs from the union's acc"


def test_extreme_scores_do_not_overflow():
    q, K, V = _data(64, seed=5)
    # key 40 gets a logit of ~800: exp(800) is inf even in float64 (float32 already overflows at ~88.7)
    K[40] = q * (800.0 * np.sqrt(D) / (q @ q))
    want = _dense(q, K, V)
    for p in (1, 4, 64):
        out = lab.partitioned_attention(q, K, V, p)
        assert np.all(np.isfinite(out)), (
            f"{p} partitions: a logit of ~800 overflowed; subtract the partition max before exp and merge "
            f"with exp(m_i - m*) (exponent <= 0), never exp(m_i)"
        )
        assert np.max(np.abs(out - want)) < 1e-12, f"{p} partitions with an extreme logit differ from dense"


def test_attend_partial_keeps_acc_unnormalised():
    q = np.array([1.0])
    K = np.array([[1.0], [3.0]])
    V = np.array([[10.0], [20.0]])
    m, denom, acc = lab.attend_partial(q, K, V)
    assert m == 3.0, f"m should be the largest score, 3.0, got {m}"
    assert abs(denom - (np.exp(-2.0) + 1.0)) < 1e-12, f"denom should be e^-2 + e^0 = 1.1353, got {denom}"
    assert abs(acc[0] - (10 * np.exp(-2.0) + 20.0)) < 1e-12, (
        f"acc should be 10e^-2 + 20 = 21.3534 (NOT divided by denom), got {acc[0]}"
    )


def _scored(scores, seed):
    """q along axis 0 with length sqrt(D), so key t's score is exactly K[t, 0] = scores[t]."""
    rng = np.random.default_rng(seed)
    q = np.zeros(D)
    q[0] = np.sqrt(D)
    K, V = rng.standard_normal((len(scores), D)), rng.standard_normal((len(scores), D))
    K[:, 0] = scores
    return q, K, V


def test_all_scores_below_minus_700_with_empty_partitions():
    rng = np.random.default_rng(6)
    q, K, V = _scored(-790.0 + 5.0 * rng.standard_normal(6), seed=6)
    want = _dense(q, K, V)
    for p in (3, 10):                       # 10 partitions over 6 keys: 4 empty summaries
        out = lab.partitioned_attention(q, K, V, p)
        assert np.all(np.isfinite(out)), (
            f"{p} partitions, every score near -790: the merge produced NaN. An empty summary must have "
            f"m = -inf (not 0): with m = 0 the real partitions get weight exp(-790 - 0) = 0 and denom is 0"
        )
        assert np.max(np.abs(out - want)) < 1e-9, f"{p} partitions with scores near -790 differ from dense"


def test_value_width_differs_from_key_width():
    # K rows are D = 16 wide, V rows 5 wide (a value head size unlike the key's); 9 partitions over 6 keys
    rng = np.random.default_rng(8)
    q, K, V = rng.standard_normal(D), rng.standard_normal((6, D)), rng.standard_normal((6, 5))
    empty = lab.attend_partial(q, K[:0], V[:0])
    assert empty.m == -np.inf and empty.denom == 0 and np.shape(empty.acc) == (5,), (
        f"an empty key range (K (0, 16), V (0, 5)) must summarise to (-inf, 0, zeros(5)): acc has V's width, got "
        f"m={empty.m}, denom={empty.denom}, acc shape {np.shape(empty.acc)}: size it from V.shape[-1], not K's"
    )
    out = lab.partitioned_attention(q, K, V, 9)
    want = _dense(q, K, V)
    assert np.shape(out) == (5,) and np.max(np.abs(out - want)) < 1e-12, (
        f"9 partitions (3 empty) with 5-wide values: expected shape (5,) equal to dense, got shape {np.shape(out)}"
    )





@settings(max_examples=40, deadline=None, derandomize=True)
@given(n=st.integers(1, 24), cuts=st.lists(st.integers(0, 24), max_size=6),
       shift=st.sampled_from([-1000.0, -760.0, 0.0, 750.0]), spread=st.sampled_from([0.1, 2.0, 900.0]),
       seed=st.integers(0, 2**16), tree=st.booleans())
def test_property_random_splits_match_float64_reference(n, cuts, shift, spread, seed, tree):
    # any cut points (repeated cuts make empty parts), scores over extreme ranges, fold or tree merge
    rng = np.random.default_rng(seed)
    q, K, V = _scored(shift + spread * rng.standard_normal(n), seed)
    bounds = [0] + sorted(min(c, n) for c in cuts) + [n]
    parts = [lab.attend_partial(q, K[a:b], V[a:b]) for a, b in pairwise(bounds)]
    if tree:                                 # pairwise rounds: ((p0 p1) (p2 p3)) ...
        while len(parts) > 1:
            parts = [lab.merge_two(*parts[i:i + 2]) if i + 1 < len(parts) else parts[i]
                     for i in range(0, len(parts), 2)]
    out = lab.merge_partials(parts)
    want = _dense(q, K, V)
    assert np.all(np.isfinite(out)) and np.max(np.abs(out - want)) < 1e-9, (
        f"{n} keys cut at {bounds[1:-1]}, scores {shift} + {spread}*noise, {'tree' if tree else 'fold'} merge: "
        f"{out[:3]} vs dense {want[:3]}. Empty parts are (m=-inf, denom=0, acc=0); merge with "
        f"exp(m_i - max(m_a, m_b)), whose exponent is never positive"
    )
