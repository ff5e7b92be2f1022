import numpy as np

from course.runtime import lab_module

lab = lab_module(__file__)   # solution.py by default; LAB_IMPL=starter grades starter.py


E, K, D, F = 8, 2, 16, 32   # Mixtral's routing shape (8 experts, top-2) at toy width


def _layer(seed=0, tokens=24):
    w_gate, experts = lab.make_moe(num_experts=E, hidden=D, ffn=F, seed=seed)
    x = np.random.default_rng(seed + 100).standard_normal((tokens, D))
    return x, w_gate, experts


def test_route_selects_then_normalises():
    # One token, hidden size 4, four experts; W_gate = identity, so the logits are x itself.
    x = np.array([[1.0, 3.0, 2.0, 0.0]])
    ids, w = lab.route(x, np.eye(4), 2)
    assert ids.shape == (1, 2) and w.shape == (1, 2), f"route must return (T, k) arrays, got {ids.shape} and {w.shape}"
    assert ids.tolist() == [[1, 2]], f"the two best logits are 3.0 (expert 1) then 2.0 (expert 2), best first; got {ids.tolist()}"
    want = np.exp([3.0, 2.0]) / np.exp([3.0, 2.0]).sum()   # softmax over the SELECTED logits: [0.731, 0.269]
    assert np.allclose(w, [want]), (
        f"weights should be softmax([3, 2]) = {np.round(want, 3)}, got {np.round(w, 3)}. Select the top-k logits "
        f"first, then normalise over those k only (a softmax over all E experts gives {np.round(np.exp([3, 2]) / np.exp(x).sum(), 3)}, "
        f"which does not sum to 1)"
    )
    ids, _ = lab.route(np.array([[2.0, 5.0, 5.0, 1.0]]), np.eye(4), 2)
    assert ids.tolist() == [[1, 2]], f"a tie between experts 1 and 2 goes to the lower id first; got {ids.tolist()}"


def test_route_large_router_logits():
    # logits of several thousand: exp(logit) is inf in float64, exp(logit - max) is not
    x = np.array([[3000.0, 2990.0, -5.0, 2000.0], [800.0, -800.0, 10.0, 0.0]])
    ids, w = lab.route(x, np.eye(4), 2)
    assert ids.tolist() == [[0, 1], [0, 2]], f"best two experts per token, best first; got {ids.tolist()}"
    assert np.all(np.isfinite(w)), (
        f"router logits of ~3000 gave non-finite gate weights {w.tolist()}: subtract the row max of the "
        f"selected logits before exponentiating"
    )
    want0 = np.array([1.0, np.exp(-10.0)]) / (1.0 + np.exp(-10.0))
    assert np.allclose(w[0], want0, rtol=1e-12, atol=0), f"softmax([3000, 2990]) = {want0}, got {w[0]}"
    assert w[1].tolist() == [1.0, 0.0], (
        f"logits 800 and 10: exp(10 - 800) underflows to exactly 0, so the weights are exactly [1, 0]; got {w[1].tolist()}"
    )


def test_route_ties_at_the_top_k_cut():
    # Ties go to the lower expert id, at the cut as well as inside the top-k. That is what vLLM's CUDA
    # topk_softmax kernel does (equal values: the lower expert wins); its CPU fallback calls torch.topk,
    # whose order for equal values is unspecified. Pin the deterministic rule: a stable sort on -logits.
    ids, _ = lab.route(np.array([[5.0, 2.0, 2.0, 1.0]]), np.eye(4), 2)
    assert ids.tolist() == [[0, 1]], f"experts 1 and 2 tie for the second slot: the lower id (1) wins; got {ids.tolist()}"
    logits = np.random.default_rng(3).integers(0, 3, (6, 64)).astype(float)   # 64 experts, many ties
    ids, _ = lab.route(logits, np.eye(64), 5)
    for t in range(6):
        want = sorted(range(64), key=lambda e: (-logits[t, e], e))[:5]
        assert ids[t].tolist() == want, (
            f"token {t}: with tied logits the k experts are the highest logits, lower id first among equals: "
            f"{want}, got {ids[t].tolist()}. np.argsort's default kind is not stable on long rows: use "
            f"kind='stable' on -logits"
        )


def test_combine_weights_sum_to_one():
    for seed in range(5):
        x, w_gate, _ = _layer(seed)
        ids, w = lab.route(x, w_gate, K)
        sums = w.sum(axis=1)
        assert np.allclose(sums, 1.0), (
            f"seed {seed}: every token's k gate weights must sum to 1 (a convex combination), got sums "
            f"{np.round(sums[:4], 4)}...: normalise over the selected logits, not over all experts"
        )
        assert (w > 0).all() and (np.diff(w, axis=1) <= 1e-12).all(), "weights are positive and ordered best expert first"
        assert all(len(set(row)) == K for row in ids.tolist()), "top-k picks k DIFFERENT experts per token"


def test_expert_mlp_is_relu_between_two_matmuls():
    x = np.array([[1.0, -1.0]])
    W1 = np.array([[1.0, -1.0, 2.0], [1.0, 1.0, 0.0]])     # x @ W1 = [0, -2, 2] -> relu -> [0, 0, 2]
    W2 = np.array([[1.0, 1.0], [5.0, 5.0], [0.5, -1.0]])    # [0, 0, 2] @ W2 = [1, -2]
    got = lab.expert_mlp(x, W1, W2)
    assert np.allclose(got, [[1.0, -2.0]]), f"relu(x @ W1) @ W2 should be [[1, -2]], got {got}: clamp negatives to 0 between the matmuls"


def test_reference_weights_each_tokens_experts():
    x, _, experts = _layer(tokens=3)
    ids = np.array([[5, 1], [0, 7], [3, 4]])
    w = np.array([[0.9, 0.1], [0.5, 0.5], [0.25, 0.75]])
    out = lab.moe_forward_reference(x, experts, ids, w)
    want = 0.5 * lab.expert_mlp(x[1:2], *experts[0]) + 0.5 * lab.expert_mlp(x[1:2], *experts[7])
    assert np.allclose(out[1], want[0]), "token 1 must be 0.5·expert0(x1) + 0.5·expert7(x1): weight each expert output by its gate weight"
    want0 = 0.9 * lab.expert_mlp(x[0:1], *experts[5]) + 0.1 * lab.expert_mlp(x[0:1], *experts[1])
    assert np.allclose(out[0], want0[0]), "token 0 must be 0.9·expert5(x0) + 0.1·expert1(x0)"


def test_permute_makes_each_expert_contiguous():
    x, w_gate, _ = _layer()
    ids, _ = lab.route(x, w_gate, K)
    x_sorted, order, offsets = lab.permute(x, ids, E)
    T = x.shape[0]
    assert x_sorted.shape == (T * K, D) and order.shape == (T * K,), (
        f"permute must return T·k = {T * K} rows, got x_sorted {x_sorted.shape}, order {order.shape}"
    )
    counts = np.bincount(ids.reshape(-1), minlength=E)
    assert offsets.tolist() == [0] + np.cumsum(counts).tolist(), (
        f"expert_offsets must be the prefix sum of per-expert counts starting at 0 ({[0] + np.cumsum(counts).tolist()}), got {offsets.tolist()}"
    )
    assert sorted(order.tolist()) == list(range(T * K)), "order must be a permutation of the T·k flat indices: nothing dropped, nothing duplicated"
    for e in range(E):
        rows = order[offsets[e]:offsets[e + 1]]
        assert (ids.reshape(-1)[rows] == e).all(), f"rows {offsets[e]}:{offsets[e + 1]} must all belong to expert {e}"
        want_tokens = sorted(np.nonzero((ids == e).any(axis=1))[0].tolist())
        assert sorted((rows // K).tolist()) == want_tokens, (
            f"expert {e} must receive exactly the tokens routed to it, {want_tokens}; got {sorted((rows // K).tolist())}"
        )
        assert np.array_equal(x_sorted[offsets[e]:offsets[e + 1]], x[rows // K]), (
            f"x_sorted rows of expert {e} must be the token rows x[order // k] (flat index i is token i // k)"
        )


def test_experts_with_no_rows_including_the_highest():
    # experts 0 and 7 (the lowest and the highest id) receive nothing
    x, w_gate, experts = _layer(seed=4, tokens=10)
    ids, w = lab.route(x, w_gate[1:7], K)
    ids = ids + 1                                  # route over experts 1..6 only
    _, _, offsets = lab.permute(x, ids, E)
    counts = np.bincount(ids.reshape(-1), minlength=E)
    assert offsets.tolist() == [0] + np.cumsum(counts).tolist(), (
        f"with experts 0 and 7 unused, expert_offsets must still have E + 1 = {E + 1} entries "
        f"{[0] + np.cumsum(counts).tolist()}, got {offsets.tolist()}: count with np.bincount(..., minlength=E)"
    )
    got = lab.moe_forward_grouped(x, experts, ids, w)
    assert np.max(np.abs(got - lab.moe_forward_reference(x, experts, ids, w))) < 1e-10, (
        "with the lowest and highest experts unused the grouped forward must still equal the reference"
    )


def test_unpermute_inverts_permute():
    x, w_gate, _ = _layer()
    ids, w = lab.route(x, w_gate, K)
    x_sorted, order, _ = lab.permute(x, ids, E)
    back = lab.unpermute(x_sorted, order, w, x.shape[0])
    assert np.allclose(back, x), (
        "with identity experts, un-permute ∘ permute must give x back (each token's k weights sum to 1). "
        "Every token appears k times in order // k: accumulate with np.add.at; out[idx] += ... silently keeps "
        f"only one of the repeated rows (max error here {np.max(np.abs(back - x)):.3f})"
    )
    hot = np.zeros_like(w)
    hot[:, 1] = 1.0   # put all the weight on each token's second expert
    assert np.allclose(lab.unpermute(x_sorted, order, hot, x.shape[0]), x), (
        "weights [0, 1] must give x back too: weight row r with topk_weights.flat[order[r]]"
    )


def test_grouped_equals_reference():
    x, w_gate, experts = _layer(tokens=64)
    ids, w = lab.route(x, w_gate, K)
    ref = lab.moe_forward_reference(x, experts, ids, w)
    got = lab.moe_forward_grouped(x, experts, ids, w)
    err = np.max(np.abs(got - ref))
    assert err < 1e-10, (
        f"grouped forward differs from the token-by-token reference by {err:.2e}: permute, one expert call per "
        f"block, un-permute and combine must reproduce exactly the same arithmetic"
    )


def test_float32_activations_keep_the_float64_arithmetic():
    # Activations often arrive in float32 while the router and expert weights are float64: every
    # intermediate buffer must hold the promoted dtype, or the result is rounded to float32 on the way.
    x64, w_gate, experts = _layer(tokens=32)
    x = x64.astype(np.float32)
    ids, w = lab.route(x, w_gate, K)
    xs = x.astype(np.float64)
    want = np.zeros((x.shape[0], D))
    for t in range(x.shape[0]):
        for j in range(K):
            W1, W2 = experts[ids[t, j]]
            want[t] += w[t, j] * (np.maximum(xs[t] @ W1, 0.0) @ W2)
    for name in ("moe_forward_reference", "moe_forward_grouped"):
        got = getattr(lab, name)(x, experts, ids, w)
        err = float(np.max(np.abs(got - want)))
        assert got.dtype == np.float64 and err < 1e-10, (
            f"{name} on float32 activations with float64 experts returned {got.dtype}, off by {err:.2e} from the "
            f"float64 computation: allocate every buffer (output, y_sorted) with np.result_type of its inputs, "
            f"not like x, so the expert outputs are not rounded to float32"
        )
    x_sorted, order, _ = lab.permute(x, ids, E)
    back = lab.unpermute(x_sorted, order, w, x.shape[0])  # float32 rows, float64 gate weights
    err = float(np.max(np.abs(back - xs * w.sum(axis=1, keepdims=True))))
    assert back.dtype == np.float64 and err < 1e-12, (
        f"unpermute of float32 rows with float64 weights returned {back.dtype}, off by {err:.2e}: the output "
        f"must take np.result_type(y_sorted, weights)"
    )


def test_grouped_calls_each_expert_once(monkeypatch):
    x, w_gate, experts = _layer(tokens=32)
    ids, w = lab.route(x, w_gate, K)
    ids[ids == 6] = 5                      # nobody routes to expert 6 any more (one token may now pick 5 twice)
    calls = []
    real = lab.expert_mlp

    def counting(rows, W1, W2):
        calls.append(rows.shape[0])
        return real(rows, W1, W2)

    monkeypatch.setattr(lab, "expert_mlp", counting)
    got = lab.moe_forward_grouped(x, experts, ids, w)
    active = len(set(ids.reshape(-1).tolist()))
    assert len(calls) == active, (
        f"the grouped forward should call expert_mlp once per expert that received rows ({active}), got {len(calls)} "
        f"calls: run each expert on its whole contiguous block, and skip experts with no rows"
    )
    assert sum(calls) == ids.size, f"the blocks must cover all {ids.size} assignments exactly once, covered {sum(calls)}"
    calls.clear()
    ref = lab.moe_forward_reference(x, experts, ids, w)
    assert len(calls) == ids.size, f"the reference makes one tiny call per assignment ({ids.size}), got {len(calls)}"
    assert np.max(np.abs(got - ref)) < 1e-10, "with an unused expert and a repeated one, grouped must still equal the reference"
