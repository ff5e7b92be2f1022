
import numpy as np
import pytest

from course.runtime import lab_module, use_lab

lab = lab_module(__file__)   # solution.py by default; LAB_IMPL=starter grades starter.py


torch = pytest.importorskip("torch")

LAB01 = use_lab("phase-07/lab-01-moe-routing")

T, K, E, D, F = 8, 2, 4, 16, 32     # tiny interpreter shapes: 16 assignments, 4 experts, one 16-wide K step


def _problem(seed=0, tokens=T):
    w_gate, experts = LAB01.make_moe(num_experts=E, hidden=D, ffn=F, seed=seed)
    x = np.random.default_rng(seed + 1).standard_normal((tokens, D))
    ids, w = LAB01.route(x, w_gate, K)
    return x, experts, ids, w


def _error_vs_lab01(x, experts, ids, w) -> float:
    """Max |grouped_moe_forward - lab 01's per-expert loop| for one routed batch."""
    ref = LAB01.moe_forward_reference(x, experts, ids, w)
    w1, w2 = lab.stack_experts(experts)
    got = lab.grouped_moe_forward(torch.tensor(x, dtype=torch.float32), w1, w2, torch.tensor(ids), torch.tensor(w))
    return float(np.max(np.abs(got.double().numpy() - ref)))


def test_align_reproduces_vllms_docstring_example():
    # The example in vLLM's moe_align_block_size docstring (expert ids 1..4, so 5 experts with expert 0 unused).
    ids = torch.tensor([[2, 3, 4], [1, 2, 4], [1, 3, 4], [1, 2, 3]])
    s, e, n = lab.moe_align(ids, 5, 4)
    assert int(n) == 16, f"4 experts x 3 rows each, padded to blocks of 4 = 16 slots in use, got {int(n)}"
    assert s[:16].tolist() == [3, 6, 9, 12, 0, 4, 10, 12, 1, 7, 11, 12, 2, 5, 8, 12], (
        f"expert 1 owns flat ids 3, 6, 9 then one pad (12 = T·k), expert 2 owns 0, 4, 10, ...; got {s[:16].tolist()}"
    )
    assert e[:4].tolist() == [1, 2, 3, 4], f"one expert id per block of 4 slots; expert 0 has no rows and no block; got {e[:4].tolist()}"
    assert s.numel() == 12 + 5 * 3 and (s[16:] == 12).all(), (
        "the buffer is sized for the worst case, T·k + E·(block_m - 1) = 27 slots, and every unused slot holds the pad id 12"
    )
    assert (e[4:] == -1).all(), "blocks past the padded end carry expert id -1"


def test_align_gives_every_block_one_expert():
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(0, 8, (40, 2), generator=g)        # 80 assignments over 8 experts (repeats allowed)
    bm = 4
    s, e, n = lab.moe_align(ids, 8, bm)
    flat = ids.reshape(-1)
    counts = torch.bincount(flat, minlength=8)
    want_n = int(((counts + bm - 1) // bm * bm).sum())
    assert int(n) == want_n, f"num_tokens_post_padded = sum over experts of ceil(count / 4) x 4 = {want_n}, got {int(n)}"
    used = s[: int(n)]
    valid = used[used < flat.numel()]
    assert sorted(valid.tolist()) == list(range(flat.numel())), "every flat id appears exactly once: nothing dropped or duplicated"
    for b in range(int(n) // bm):
        block = s[b * bm:(b + 1) * bm]
        rows = block[block < flat.numel()].long()
        assert len(rows) > 0, f"block {b} holds only padding: an expert with no rows must get no block"
        assert (flat[rows] == e[b]).all(), f"block {b} mixes experts: every valid row in it must belong to expert_ids[{b}] = {int(e[b])}"
        assert rows.tolist() == sorted(rows.tolist()), f"inside an expert's run the flat ids are increasing (a stable sort); block {b}"


@pytest.mark.triton
def test_grouped_kernel_matches_lab01_reference_in_two_launches(monkeypatch):
    x, experts, ids, w = _problem()
    ref = LAB01.moe_forward_reference(x, experts, ids, w)
    w1, w2 = lab.stack_experts(experts)
    launches = []
    real = lab.invoke_grouped_gemm

    def counting(*args, **kwargs):
        launches.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(lab, "invoke_grouped_gemm", counting)
    got = lab.grouped_moe_forward(torch.tensor(x, dtype=torch.float32), w1, w2, torch.tensor(ids), torch.tensor(w))
    err = np.max(np.abs(got.double().numpy() - ref))
    assert err < 1e-4, (
        f"grouped MoE differs from lab 01's reference by {err:.2e}: gather A rows at id // top_k, pick B by "
        f"expert_ids[pid_m], mask padding rows (id >= num_valid), scatter C to row id, weight rows only in GEMM 2"
    )
    assert len(launches) == 2, f"the whole MoE is two grouped-GEMM launches (up, down) whatever E is, counted {len(launches)}"


@pytest.mark.triton
def test_unused_and_repeated_experts():
    x, experts, _, _ = _problem(seed=5)
    ids = np.array([[0, 1], [1, 0], [2, 2], [0, 2], [1, 1], [0, 0], [2, 1], [1, 2]])   # expert 3 unused; repeats
    w = np.full(ids.shape, 0.5)
    err = _error_vs_lab01(x, experts, ids, w)
    assert err < 1e-4, (
        f"with an expert nobody chose and tokens routed to one expert twice, the result differs by {err:.2e}: "
        f"an empty expert gets no block, and a repeated (token, expert) is simply two rows of that expert's block"
    )


@pytest.mark.triton
def test_padding_rows_are_never_written():
    # 5 tokens, top-2, 4 experts: 10 real rows, each expert's run padded to 16 -> 54 padding slots, all holding id 10.
    x, experts, _, _ = _problem(seed=7, tokens=5)
    ids = torch.tensor([[0, 1], [1, 2], [2, 0], [3, 1], [0, 3]])
    w1, _ = lab.stack_experts(experts)
    s, e, n_post = lab.moe_align(ids, E, 16)
    xs = torch.tensor(x, dtype=torch.float32)
    x_guard = torch.cat([xs, torch.full((1, D), 1e3)])      # a guard row where token 5 would be
    out = torch.full((11, F), 7.0)                           # 10 real rows + row 10, where the pad id points
    lab.invoke_grouped_gemm(x_guard, w1, out, s, e, n_post, top_k=K, num_valid=10)
    assert (out[10] == 7.0).all(), (
        f"row 10 (= T·k, the pad id) was written ({out[10, :4].tolist()}...): padding slots hold num_valid, so mask "
        f"the store (and the loads) with id < num_valid"
    )
    want = torch.stack([xs[i // K] @ w1[int(ids.reshape(-1)[i])] for i in range(10)])
    err = (out[:10] - want).abs().max().item()
    assert err < 1e-4, f"real row i must be x[i // top_k] @ w1[expert of i]; max error {err:.2e}"


@pytest.mark.triton
def test_ragged_hidden_sizes():
    # d = 20 and f = 24 are not multiples of the 16-wide blocks: partial K steps and partial N tiles in both GEMMs.
    w_gate, experts = LAB01.make_moe(num_experts=E, hidden=20, ffn=24, seed=11)
    x = np.random.default_rng(12).standard_normal((6, 20))
    ids, w = LAB01.route(x, w_gate, K)
    err = _error_vs_lab01(x, experts, ids, w)
    assert err < 1e-4, (
        f"with d = 20 and f = 24 (not multiples of 16) the result differs by {err:.2e}: run ceil(K / BLOCK_K) K steps, "
        f"the last one partial, and mask k < K on both loads and n < N on the weight load and the store"
    )


@pytest.mark.triton
def test_every_operand_strided_other_block_sizes():
    # x: a column slice of a wider activation; w: (E, N, K) storage viewed as (E, K, N), the way vLLM stores
    # w13 and passes its transpose; out: a column slice of a wider buffer; BLOCK_M 32, BLOCK_K 32 (not 16)
    g = torch.Generator().manual_seed(21)
    ids = torch.tensor([[0, 1], [1, 2], [2, 0], [1, 1], [0, 2]])           # expert 3 (the highest) gets no rows
    n = ids.numel()
    x = torch.randn(5, D + 9, generator=g)[:, 4:4 + D]
    w = torch.randn(E, F, D, generator=g).transpose(1, 2)                   # (E, D, F), strides (F*D, 1, D)
    out_wide = torch.full((n + 1, F + 5), 7.0)
    out = out_wide[:, 2:2 + F]
    s, e, n_post = lab.moe_align(ids, E, 32)
    lab.invoke_grouped_gemm(x, w, out, s, e, n_post, top_k=K, num_valid=n, block_m=32, block_n=16, block_k=32)
    want = torch.stack([x[i // K] @ w[int(ids.reshape(-1)[i])] for i in range(n)])
    err = (out[:n] - want).abs().max().item()
    assert err < 1e-4, (
        f"x (strides {x.stride()}), w (strides {w.stride()}) and out (strides {out.stride()}) each with their own "
        f"layout, BLOCK_M = BLOCK_K = 32: max error {err:.2e}. Pass every tensor's own .stride() to the kernel; "
        f"the expert weight is often a transposed view (stride_wk = 1)"
    )
    assert (out_wide[:, :2] == 7.0).all() and (out_wide[:, 2 + F:] == 7.0).all(), (
        "columns outside the output slice were written: store through out.stride(0), not a row width of N"
    )



@pytest.mark.triton
def test_gate_weight_is_read_at_the_flat_id_whatever_top_k():
    # The gated GEMM launched with top_k = 2 (the forward only gates with top_k = 1, where the flat id
    # and the source row coincide): row i reads x[i // 2] but must be scaled by gate.flat[i].
    g = torch.Generator().manual_seed(41)
    ids = torch.tensor([[0, 1], [1, 2], [2, 0], [3, 1], [0, 3]])
    n = ids.numel()
    x = torch.randn(5, D, generator=g)
    w = torch.randn(E, D, F, generator=g)
    gate = torch.arange(1, n + 1, dtype=torch.float32).reshape(5, K) / n      # every slot its own weight
    out = torch.zeros(n, F)
    s, e, n_post = lab.moe_align(ids, E, 16)
    lab.invoke_grouped_gemm(x, w, out, s, e, n_post, top_k=K, topk_weights=gate, num_valid=n)
    want = torch.stack([gate.reshape(-1)[i] * (x[i // K] @ w[int(ids.reshape(-1)[i])]) for i in range(n)])
    err = (out - want).abs().amax(dim=1)
    bad = [i for i in range(n) if err[i] > 1e-4]
    assert not bad, (
        f"top_k = {K} with gate weights: flat rows {bad} are off (max error {err.max().item():.2e}); row i is "
        f"scaled by gate.flat[i] (load Gate + flat id), not by the weight at its source row i // top_k"
    )


@pytest.mark.triton
def test_nothing_past_k_is_read_even_when_it_is_nan():
    # K = 20 with 16-wide K steps: x and each expert's weight are slices of buffers that hold NaN past
    # K, so a load not masked in k < K turns rows NaN even though the other operand's mask gives 0
    g = torch.Generator().manual_seed(31)
    ids = torch.tensor([[0, 1], [1, 2], [2, 0], [3, 1], [0, 3]])
    n, k_dim, f = ids.numel(), 20, 24
    x_buf = torch.full((5, 32), float("nan"))
    x_buf[:, :k_dim] = torch.randn(5, k_dim, generator=g)
    w_buf = torch.full((E, 32, f), float("nan"))
    w_buf[:, :k_dim] = torch.randn(E, k_dim, f, generator=g)
    x, w = x_buf[:, :k_dim], w_buf[:, :k_dim]
    out = torch.zeros(n, f)
    s, e, n_post = lab.moe_align(ids, E, 16)
    lab.invoke_grouped_gemm(x, w, out, s, e, n_post, top_k=K, num_valid=n)
    want = torch.stack([x[i // K] @ w[int(ids.reshape(-1)[i])] for i in range(n)])
    bad = int(torch.isnan(out).sum())
    assert bad == 0 and (out - want).abs().max().item() < 1e-4, (
        f"{bad} NaN outputs: a load read past K = {k_dim}, where the buffers hold NaN; mask k < K on the "
        "activation tile AND the weight tile, not only one of them"
    )

def _huge_fp16(n):
    """n fp16 elements; on CPU an untouched anonymous mapping, so only the pages written cost memory."""
    if torch.cuda.is_available():
        return torch.zeros(n, dtype=torch.float16, device="cuda"), None
    import mmap
    flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | getattr(mmap, "MAP_NORESERVE", 0)
    mm = mmap.mmap(-1, 2 * n, flags=flags)
    return torch.frombuffer(mm, dtype=torch.float16, count=n), mm


@pytest.mark.triton
def test_expert_offsets_past_2_pow_31_elements():
    # Expert 2's weights start 2 * (2**30 + 8) = 2**31 + 16 elements past w: in int32, expert * stride_we
    # wraps to -2**31 + 16, inside the (all-zero) first pages of the buffer w sits in. The 8 GiB buffer is
    # virtual on CPU: only the three experts' pages are touched. Real stacked expert weights pass 2**31.
    stride = (1 << 30) + 8
    big, keep = _huge_fp16((1 << 31) + 2 * stride + D * F)
    w = torch.as_strided(big, (3, D, F), (stride, F, 1), 1 << 31)
    g = torch.Generator().manual_seed(22)
    for e in range(3):
        w[e] = torch.randn(D, F, generator=g).to(torch.float16).to(w.device)
    x = torch.randn(3, D, generator=g).to(torch.float16).to(w.device)
    ids = torch.tensor([[2], [0], [2]], device=w.device)
    s, e_ids, n_post = lab.moe_align(ids, 3, 16)
    out = torch.zeros(4, F, device=w.device)
    lab.invoke_grouped_gemm(x, w, out, s, e_ids, n_post, top_k=1, num_valid=3)
    want = torch.stack([x[i].float() @ w[int(ids[i, 0])].float() for i in range(3)])
    err = (out[:3] - want).abs().max().item()
    del w, big, keep
    assert err < 1e-2, (
        f"expert 2's weights start 2**31 + 16 elements into w and the output is off by {err:.2e}: "
        f"expert * stride_we overflowed int32; load the expert id and cast it to int64 before multiplying"
    )


def test_padding_is_the_price_of_alignment():
    ids = torch.tensor([[e, (e + 1) % 8] for e in range(8)])     # decode batch 8, top-2: every expert gets 2 rows
    valid, padded = lab.padding_waste(ids, 8, 16)
    assert (valid, padded) == (16, 128), (
        f"16 assignments spread 2 per expert over 8 experts, each padded to a 16-row block: 8 x 16 = 128 rows, got {padded}"
    )
    assert lab.padding_waste(ids, 8, 4) == (16, 32), "with block_m = 4 the same batch computes 8 x 4 = 32 rows"
    big = torch.tensor([[e % 8, (e + 3) % 8] for e in range(512)])
    assert lab.padding_waste(big, 8, 16) == (1024, 1024), "a 512-token prefill gives each expert 128 rows: no padding at all"


@pytest.mark.gpu
@pytest.mark.triton
def test_full_shape_bf16_matches_torch_gpu():
    g = torch.Generator(device="cuda").manual_seed(0)
    Tf, Kf, Ef, Df, Ff = 1024, 2, 8, 1024, 2048
    x = torch.randn(Tf, Df, device="cuda", generator=g).to(torch.bfloat16)
    w1 = (torch.randn(Ef, Df, Ff, device="cuda", generator=g) / Df ** 0.5).to(torch.bfloat16)
    w2 = (torch.randn(Ef, Ff, Df, device="cuda", generator=g) / Ff ** 0.5).to(torch.bfloat16)
    logits = torch.randn(Tf, Ef, device="cuda", generator=g)
    vals, ids = torch.topk(logits, Kf, dim=-1)
    w = torch.softmax(vals, dim=-1)
    ref = torch.zeros(Tf, Df, device="cuda")
    for e in range(Ef):
        rows, slot = torch.nonzero(ids == e, as_tuple=True)
        h = torch.relu(x[rows].float() @ w1[e].float())
        ref.index_add_(0, rows, w[rows, slot, None] * (h @ w2[e].float()))
    for cfg in lab.GPU_CONFIGS[:2]:
        bm, bn, bk, nw, ns = cfg
        got = lab.grouped_moe_forward(x, w1, w2, ids, w, bm, bn, bk, nw, ns).float()
        rel = ((got - ref).abs().max() / ref.abs().max()).item()
        assert rel < 2e-2, f"config {cfg}: max error {rel:.2e} of the largest output (bf16 in, fp32 accumulation)"


@pytest.mark.triton
def test_fp16_partials_accumulate_in_fp32():
    # fp16 tokens and experts with K = 32 and BLOCK_K = 16: two K steps whose partial dots are +-2049 and -+2048.
    # 2049 is not an fp16 number (spacing 2 above 2048): an fp32 accumulator gives +-1 exactly, while a partial
    # rounded to fp16 before it is added becomes 2048 and the row is 0. Only the final store is fp16.
    x = torch.zeros((2, 32), dtype=torch.float16)
    x[:, 0], x[:, 1], x[:, 16] = 2047.0, 2.0, 2048.0
    w = torch.ones((2, 32, 16), dtype=torch.float16)
    w[1, 16:] = -1.0  # expert 1: +1 then -1 -> 2049 - 2048 = 1
    w[0, :16] = -1.0  # expert 0: -1 then +1 -> -2049 + 2048 = -1
    ids = torch.tensor([[1], [0]])
    s, e_ids, n_post = lab.moe_align(ids, 2, 16)
    out = torch.zeros((3, 16), dtype=torch.float16)
    lab.invoke_grouped_gemm(x, w, out, s, e_ids, n_post, top_k=1, num_valid=2, block_k=16)
    got = [out[0].float().unique().tolist(), out[1].float().unique().tolist()]
    assert got == [[1.0], [-1.0]], (
        f"token 0 (expert 1) should be 1 and token 1 (expert 0) -1 in every column, got {got}: pass the "
        f"accumulator to tl.dot (acc = tl.dot(x, w, acc)) or add its float32 result unrounded; cast to the "
        f"output dtype only when storing"
    )
