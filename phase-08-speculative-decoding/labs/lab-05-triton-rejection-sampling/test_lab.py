import importlib
import os

import numpy as np
import pytest

from course.runtime import lab_module

lab = lab_module(__file__)   # solution.py by default; LAB_IMPL=starter grades starter.py


torch = pytest.importorskip("torch")

PH = -1  # the placeholder


@pytest.fixture(scope="module", autouse=True)
def _warm_interpreter():
    """Warm Triton's interpreter once, in the parent, on a kernel of the grader's own (never the learner's, which
    must run isolated): each triton test's forked child then skips the interpreter's first-launch cost."""
    if os.environ.get("TRITON_INTERPRET") != "1":    # a GPU compiles each kernel for real: nothing to warm
        return
    triton = pytest.importorskip("triton")
    import triton.language as tl

    @triton.jit
    def _touch(X, n, BLOCK: tl.constexpr):
        acc = 0.0
        for _i in range(n):
            if acc >= 0:
                offs = tl.arange(0, BLOCK)
                best, idx = tl.max(tl.load(X + offs.to(tl.int64), mask=offs < n, other=0.0), axis=0, return_indices=True)
                acc += best + idx.to(tl.float32)
        tl.store(X + tl.program_id(0), acc)

    _touch[(1,)](torch.ones(4), 4, BLOCK=4)


# --------------------------------------------------------------------------- the grader's own reference
def reference(drafts, counts, q, p, bonus, u, recovered=None, inv_e=None, width=None):
    """Plain numpy: walk each request's drafts; the residual race is computed in float32 like the kernel."""
    width = (max(counts, default=0) if width is None else width) + 1
    out = np.full((len(counts), width), PH, dtype=np.int64)
    start = 0
    for r, n in enumerate(counts):
        for j in range(n):
            t, x = start + j, int(drafts[start + j])
            ok = q[t, x] > 0 and np.float64(np.float32(p[t, x]) / np.float32(q[t, x])) >= u[t]
            if ok:
                out[r, j] = x
                continue
            if recovered is not None:
                out[r, j] = recovered[t]
            else:
                score = np.maximum(p[t].astype(np.float32) - q[t].astype(np.float32), 0) * inv_e[r].astype(np.float32)
                out[r, j] = int(np.argmax(score))
            break
        else:
            out[r, n] = bonus[r]
        start += n
    return out


def problem(counts, vocab, seed, skew=1.0):
    """Random drafter / target rows, drafts drawn from q, float64 uniforms and 1/Exp(1) rows."""
    rng = np.random.default_rng(seed)
    n = sum(counts)
    q = rng.dirichlet(np.full(vocab, skew), n).astype(np.float32)
    p = rng.dirichlet(np.full(vocab, skew), n).astype(np.float32)
    drafts = np.array([rng.choice(vocab, p=row / row.sum()) for row in q.astype(np.float64)], dtype=np.int64)
    u = rng.random(n)
    inv_e = (1.0 / rng.exponential(size=(len(counts), vocab))).astype(np.float32)
    recovered = rng.integers(0, vocab, n)
    bonus = rng.integers(0, vocab, len(counts)) + 1000       # recognisable: >= 1000
    return drafts, q, p, u, inv_e, recovered, bonus


def run(drafts, counts, q, p, bonus, u, recovered=None, inv_e=None, **kw):
    t = torch.as_tensor
    out = lab.rejection_sample_random(
        t(drafts), counts, q if torch.is_tensor(q) else t(q), p if torch.is_tensor(p) else t(p), t(bonus), t(u),
        recovered_token_ids=None if recovered is None else t(recovered),
        inv_exponentials=None if inv_e is None else t(inv_e), **kw,
    )
    assert out.dtype == torch.int32, f"the output is int32 like vLLM's sampled_token_ids, got {out.dtype}"
    return out.numpy().astype(np.int64)


def _same(got, want, what):
    bad = np.argwhere(got != want)
    assert bad.size == 0, (
        f"{what}: first difference at request {bad[0][0]}, slot {bad[0][1]}: got row {got[bad[0][0]].tolist()}, "
        f"want {want[bad[0][0]].tolist()}"
    )


# --------------------------------------------------------------------------- against the numpy reference
@pytest.mark.triton
def test_ragged_batch_matches_reference_both_ways():
    counts, vocab = [3, 0, 2, 4, 1, 0, 5], 16
    drafts, q, p, u, inv_e, rec, bonus = problem(counts, vocab, seed=1)
    got = run(drafts, counts, q, p, bonus, u, recovered=rec)
    _same(got, reference(drafts, counts, q, p, bonus, u, recovered=rec), "given recovered tokens")
    assert got[1].tolist() == [int(bonus[1])] + [PH] * 5, (
        f"a request with 0 drafts emits only its bonus token, in slot 0; got {got[1].tolist()}"
    )
    got = run(drafts, counts, q, p, bonus, u, inv_e=inv_e, block_v=4)
    _same(got, reference(drafts, counts, q, p, bonus, u, inv_e=inv_e), "recovered drawn in the kernel, 4-wide tiles")
    assert (got[:, :] != PH).sum() > len(counts), "the fixture should accept some drafts"


@pytest.mark.triton
def test_all_accepted_writes_the_bonus_after_the_last_draft():
    counts, vocab = [2, 4, 1], 8
    drafts, q, _, u, inv_e, _, bonus = problem(counts, vocab, seed=2)
    got = run(drafts, counts, q, q.copy(), bonus, u, inv_e=inv_e, max_spec_len=6)
    want = np.full((3, 7), PH)
    start = 0
    for r, n in enumerate(counts):
        want[r, :n] = drafts[start:start + n]
        want[r, n] = bonus[r]
        start += n
    _same(got, want, "p == q: every ratio is 1 >= u, so every draft is kept and the bonus goes to slot num_drafts "
                     "(not slot max_spec_len), with placeholders after it")


@pytest.mark.triton
def test_first_draft_rejected_stops_the_walk():
    counts, vocab = [3, 2], 8
    drafts, q, p, _, inv_e, rec, bonus = problem(counts, vocab, seed=3)
    p = q.copy()                        # later drafts would all be accepted...
    for t in (0, 3):                    # ...but the first draft of each request has p(x) = 0
        p[t] = np.where(np.arange(vocab) == drafts[t], 0.0, q[t] / (1 - q[t, drafts[t]]))
    u = np.full(5, 0.5)
    got = run(drafts, counts, q, p, bonus, u, recovered=rec)
    want = np.array([[rec[0], PH, PH, PH], [rec[3], PH, PH, PH]])
    _same(got, want, "a rejected first draft puts the recovered token in slot 0 and ends the request's walk: the later "
                     "drafts (which would pass) and the bonus are never written")


@pytest.mark.triton
def test_ratio_exactly_equal_to_u_is_accepted():
    q = np.array([[0.5, 0.25, 0.125, 0.125]] * 2, dtype=np.float32)
    p = np.array([[0.25, 0.25, 0.25, 0.25]] * 2, dtype=np.float32)
    drafts = np.array([0, 0])
    u = np.array([0.5, np.nextafter(0.5, 1.0)])     # p/q = 0.5 exactly, then the next float64 above it
    got = run(drafts, [1, 1], q, p, np.array([7, 7]), u, recovered=np.array([3, 3]))
    assert got.tolist() == [[0, 7], [3, PH]], (
        f"p/q = 0.25/0.5 = 0.5: u = 0.5 is accepted (vLLM tests ratio >= u) and u one ulp above is rejected; "
        f"got {got.tolist()}"
    )


@pytest.mark.triton
def test_draft_with_zero_draft_probability_is_rejected():
    q = np.array([[0.0, 0.5, 0.5, 0.0], [0.0, 0.5, 0.5, 0.0]], dtype=np.float32)
    p = np.array([[1.0, 0.0, 0.0, 0.0], [0.0, 0.5, 0.5, 0.0]], dtype=np.float32)
    drafts = np.array([0, 1])                         # request 0 drafts token 0, where q = 0 and p = 1
    inv_e = np.ones((1, 4), dtype=np.float32)
    got = run(drafts, [2], q, p, np.array([9]), np.array([1e-9, 0.1]), inv_e=inv_e)
    assert got.tolist() == [[0, PH, PH]], (
        f"q(x) = 0 is rejected (vLLM checks draft_prob > 0 before dividing) even though p(x) = 1: the residual "
        f"max(p - q, 0) is all on token 0, so the recovered token is 0 and the walk stops; got {got.tolist()}"
    )


@pytest.mark.triton
def test_residual_race_ties_go_to_the_lower_token():
    q = np.zeros((2, 8), dtype=np.float32)
    q[:, 0] = 1.0                                      # the drafter is sure of token 0 ...
    p = np.zeros((2, 8), dtype=np.float32)
    p[0, [1, 5]] = 0.5                                 # ... the target never picks it: residual 0.5 on tokens 1 and 5
    p[1, [6, 7]] = 0.5                                 # (request 1: both in the second tile)
    got = run(np.array([0, 0]), [1, 1], q, p, np.array([9, 9]), np.array([0.5, 0.5]), inv_e=np.ones((2, 8), np.float32),
              block_v=4)
    assert got[:, 0].tolist() == [1, 6], (
        f"equal scores (same residual, same 1/E): the lower token wins, as in vLLM's kernel (one 8192-wide tile, "
        f"first index of the maximum); with 4-wide tiles a later tile must beat the best so far strictly; got {got[:, 0]}"
    )


@pytest.mark.triton
def test_race_reads_nothing_past_the_row():
    # a 6-token vocabulary in 4-wide tiles: the second tile covers columns 4..7, two of them past the row. Right
    # after each row of p sits 1.0 (q is 0 there, 1/E is 1): read as residual it would beat the real 0.5.
    vocab = 6
    pw, qw = torch.zeros(2, vocab + 2), torch.zeros(2, vocab + 2)
    pw[:, vocab:] = 1.0
    pw[0, [1, 2]] = 0.5  # request 0: draft 0 has p = 0, rejected; residual 0.5 on 1 and 2
    qw[0, 0] = 1.0
    pw[1, 3] = qw[1, 3] = 1.0  # request 1: p == q at its draft, accepted (no race)
    p, q, inv_e = pw[:, :vocab], qw[:, :vocab], np.ones((2, vocab), np.float32)
    got = run(np.array([0, 3]), [1, 1], q, p, np.array([9, 9]), np.array([0.5, 0.5]), inv_e=inv_e, block_v=4)
    assert got.tolist() == [[1, PH], [3, 9]], (
        f"got {got.tolist()}: the residual race must mask every column >= vocab_size (offs < vocab_size); "
        f"token {got[0, 0]} >= {vocab} means a column past the row was read and won the race"
    )


@pytest.mark.triton
def test_strided_probability_rows():
    counts, vocab = [2, 3, 1], 12
    drafts, q, p, _, inv_e, _, bonus = problem(counts, vocab, seed=4, skew=0.3)
    # every uniform sits exactly on its draft's ratio (accepted), except draft 1's, one ulp above (rejected): a
    # q(x) or p(x) read through the wrong stride gives another ratio and flips some of these decisions
    u = np.array([np.float64(np.float32(p[t, x]) / np.float32(q[t, x])) for t, x in enumerate(drafts)])
    u[1] = np.nextafter(u[1], 2.0)
    want = reference(drafts, counts, q, p, bonus, u, inv_e=inv_e)
    assert (want[:, 0] == drafts[[0, 2, 5]]).all() and want[0, 1] != PH and want[1, 3] == bonus[1]
    wide = torch.zeros(6, vocab + 9)
    wide[:, 5:5 + vocab] = torch.tensor(p)
    p_view = wide[:, 5:5 + vocab]                     # a column slice: row stride vocab + 9
    q_view = torch.tensor(q).t().contiguous().t()     # a transposed view: strides (1, num_tokens)
    assert not p_view.is_contiguous() and q_view.stride() == (1, 6)
    got = run(drafts, counts, q_view, p_view, bonus, u, inv_e=inv_e, block_v=8)
    _same(got, want, "p as a column slice and q as a transposed view: index every row and column with its own stride")
    # the other way round: p(x) and q(x) are each loaded twice (the draft's entry, then the residual's rows), and
    # every load must use both strides, so the column stride of p matters as much as q's
    wide = torch.zeros(6, vocab + 9)
    wide[:, 5 : 5 + vocab] = torch.tensor(q)
    p_t = torch.tensor(p).t().contiguous().t()  # strides (1, num_tokens): column stride 6, not 1
    assert p_t.stride() == (1, 6)
    got = run(drafts, counts, wide[:, 5 : 5 + vocab], p_t, bonus, u, inv_e=inv_e, block_v=8)
    _same(
        got,
        want,
        "p as a transposed view (column stride 6): load p(x) at t * stride_pt + x * stride_pv, not at t * stride_pt + x",
    )


def _huge_float32(n):
    """n float32 elements; on CPU an untouched anonymous mapping, so only the pages written cost memory."""
    if torch.cuda.is_available():
        return torch.zeros(n, device="cuda"), None
    import mmap
    flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | getattr(mmap, "MAP_NORESERVE", 0)
    mm = mmap.mmap(-1, 4 * n, flags=flags)
    return torch.frombuffer(mm, dtype=torch.float32, count=n), mm


@pytest.mark.triton
def test_offsets_past_2_pow_31_elements():
    # Row 2 of p starts 2 * (2**30 + 64) = 2**31 + 128 elements in: in int32, t * stride_pt wraps to -2**31 + 128,
    # inside the untouched (zero) pages before p. The 16 GiB buffer is virtual on CPU; only p's three rows are
    # touched. A real batch passes 2**31 elements at about 16,700 draft rows of a 128,256-token vocabulary.
    vocab, stride = 8, (1 << 30) + 64
    big, keep = _huge_float32((1 << 31) + 2 * stride + vocab)
    p = torch.as_strided(big, (3, vocab), (stride, 1), 1 << 31)
    dev = p.device
    q = torch.zeros(3, vocab, device=dev)
    q[:, 1] = 1.0                                     # the drafter is sure of token 1 at every position
    p[0, 1] = p[1, 1] = 1.0                           # the target agrees at rows 0 and 1 ...
    p[2, 1] = p[2, 5] = 0.5                           # ... and at the far row gives token 1 half its mass
    args = (torch.tensor([1, 1, 1], device=dev), [3], q, p, torch.tensor([9], device=dev))
    inv_e = torch.ones(1, vocab, device=dev)
    kept = lab.rejection_sample_random(*args, torch.tensor([0.2, 0.2, 0.5], dtype=torch.float64, device=dev),
                                       inv_exponentials=inv_e)
    cut = lab.rejection_sample_random(*args, torch.tensor([0.2, 0.2, 0.6], dtype=torch.float64, device=dev),
                                      inv_exponentials=inv_e)
    got = [kept.cpu().tolist(), cut.cpu().tolist()]
    del p, big, keep
    assert got == [[[1, 1, 1, 9]], [[1, 1, 5, PH]]], (
        f"draft row 2 of p starts 2**31 + 128 elements in: p(x) = 0.5 there (accepted at u = 0.5, rejected at 0.6, "
        f"then the residual is all on token 5); got {got}. t * stride_pt overflowed int32: make the draft row t "
        f"(and the vocabulary offsets) int64 before multiplying by a stride"
    )


# --------------------------------------------------------------------------- against vLLM's own kernels
@pytest.fixture(scope="module")
def real():
    """vLLM's rejection sampler, its Triton kernels real under the interpreter (the conftest's env).

    Imported once per module, in the parent, so forked triton tests inherit it. A cold vLLM import takes
    15-20 s on a loaded 2-core machine, and it lands in the setup of whichever test asks first: those
    tests carry a timeout of their own so the import never counts against the default 60 s."""
    return importlib.import_module("mini_vllm.testing.real_spec_decode")


@pytest.mark.timeout(240)   # the setup may pay the cold vLLM import (see `real`)
@pytest.mark.triton
@pytest.mark.upstream
def test_output_for_output_against_vllms_random_kernel(real):
    from vllm.v1.sample.rejection_sampler import rejection_random_sample_kernel

    counts, vocab = [3, 0, 4, 1, 2], 10
    drafts, q, p, u, _, rec, bonus = problem(counts, vocab, seed=5, skew=0.5)
    u[4] = np.float64(np.float32(p[4, drafts[4]]) / np.float32(q[4, drafts[4]]))   # an exact tie inside the batch
    ti = lambda a: torch.tensor(np.asarray(a), dtype=torch.int32)  # noqa: E731
    theirs = torch.full((5, 5), PH, dtype=torch.int32)
    rejection_random_sample_kernel[(5,)](
        theirs, ti(np.cumsum(counts)), ti(drafts), torch.tensor(q), torch.tensor(p), ti(bonus), ti(rec),
        torch.tensor(u), torch.zeros(5, dtype=torch.bool), 4, vocab, None, NO_DRAFT_PROBS=False, SYNTHETIC_MODE=False,
    )
    got = run(drafts, counts, q, p, bonus, u, recovered=rec)
    _same(got, theirs.numpy().astype(np.int64), "vLLM's rejection_random_sample_kernel on the same inputs")

    # the residual race's tie rule: vLLM's recovered-token kernel on test_residual_race_ties_go_to_the_lower_token's rows
    from vllm.v1.sample.rejection_sampler import sample_recovered_tokens_kernel

    tq = torch.zeros(2, 8)
    tq[:, 0] = 1.0
    tp = torch.zeros(2, 8)
    tp[0, [1, 5]] = 0.5
    tp[1, [6, 7]] = 0.5
    rec_theirs = torch.empty(2, dtype=torch.int32)
    sample_recovered_tokens_kernel[(2, 1)](rec_theirs, ti([1, 2]), ti([0, 0]), tq, tp, torch.ones(2, 8), 8, 8192,
                                           NO_DRAFT_PROBS=False)
    assert rec_theirs.tolist() == [1, 6], f"vLLM's tie rule changed: {rec_theirs.tolist()}"


@pytest.mark.timeout(240)   # the setup may pay the cold vLLM import (see `real`)
@pytest.mark.triton
@pytest.mark.upstream
def test_output_for_output_against_vllms_rejection_sample(real):
    counts, vocab = [2, 0, 3, 1], 12
    rng = np.random.default_rng(7)
    n = sum(counts)
    q = rng.dirichlet(np.full(vocab, 0.4), n).astype(np.float32)
    logits = rng.normal(scale=2.0, size=(n, vocab)).astype(np.float32)
    drafts = rng.integers(0, vocab, n)
    bonus = np.arange(len(counts)) + 1000
    theirs = real.rejection_sample(drafts, counts, q, logits, bonus, [1.0] * len(counts), seed=11)
    uniforms, exps = real.torch_randomness(11, n, len(counts), vocab)
    target = torch.softmax(torch.tensor(logits), dim=-1)               # what rejection_sample verifies against
    inv_e = torch.tensor(exps, dtype=torch.float32).reciprocal()      # vLLM's inv_q
    got = run(drafts, counts, q, target, bonus, uniforms, inv_e=inv_e, block_v=8)
    _same(got, theirs.astype(np.int64), "vLLM's rejection_sample (its recovered-token kernel and its walk), same draws")
    assert (theirs != PH).sum() > len(counts), "the fixture should accept at least one draft"


# --------------------------------------------------------------------------- the theorem
@pytest.mark.triton         # 480 interpreted programs, one launch: a few tenths of a second once the interpreter is warm
def test_acceptance_rate_is_the_overlap():
    """480 one-draft requests, stratified: every token is drafted 60 times (q uniform) and meets every
    8th of the sorted uniforms, so the count pins the rate to about 1/60 per token, not 1/sqrt(480)."""
    rng = np.random.default_rng(8)
    vocab, n = 8, 480
    q = np.full(vocab, 1 / vocab)
    p = rng.dirichlet(np.full(vocab, 0.5))
    alpha = np.minimum(p, q).sum()
    u = rng.random(n)
    drafts = np.empty(n, dtype=np.int64)
    drafts[np.argsort(u, kind="stable")] = np.tile(rng.permutation(vocab), n // vocab)
    got = run(drafts, [1] * n, np.tile(q, (n, 1)).astype(np.float32), np.tile(p, (n, 1)).astype(np.float32),
              np.full(n, 1000), u, recovered=np.full(n, 999))
    accepted = got[:, 1] == 1000                        # the bonus is written only after an accepted draft
    assert ((got[:, 0] == drafts) == accepted).all() and ((got[:, 0] == 999) == ~accepted).all(), (
        "one draft per request: either [draft, bonus] or [recovered, placeholder]"
    )
    rate = accepted.mean()
    assert abs(rate - alpha) < 0.01, (
        f"accepted {rate:.4f} of {n} drafts; the overlap sum(min(p, q)) = {alpha:.4f}: "
        f"accept exactly when p(x) / q(x) >= u (a draft from q then survives with probability sum(min(p, q)))"
    )


# --------------------------------------------------------------------------- host side
@pytest.mark.triton
def test_every_promised_error():
    t = torch.tensor
    q = torch.full((3, 4), 0.25)
    args = (t([0, 1, 2]), [2, 1], q, q.clone(), t([5, 6]), t([0.1, 0.2, 0.3], dtype=torch.float64))
    with pytest.raises(ValueError, match="exactly one"):
        lab.rejection_sample_random(*args)
    with pytest.raises(ValueError, match="exactly one"):
        lab.rejection_sample_random(*args, recovered_token_ids=t([0, 0, 0]), inv_exponentials=torch.ones(2, 4))
    with pytest.raises(ValueError, match=">= 0"):
        lab.rejection_sample_random(t([0, 1, 2]), [4, -1], q, q, t([5, 6]), args[5], recovered_token_ids=t([0, 0, 0]))
    with pytest.raises(ValueError, match="num_tokens"):
        lab.rejection_sample_random(t([0, 1, 2]), [2, 2], q, q, t([5, 6]), args[5], recovered_token_ids=t([0, 0, 0]))
    with pytest.raises(ValueError, match="bonus"):
        lab.rejection_sample_random(*args[:4], t([5]), args[5], recovered_token_ids=t([0, 0, 0]))
    with pytest.raises(ValueError, match="inv_exponentials"):
        lab.rejection_sample_random(*args, inv_exponentials=torch.ones(2, 3))
    got = lab.rejection_sample_random(*args, recovered_token_ids=t([0, 0, 0]))   # the same call, valid: it runs
    assert got.tolist() == [[0, 1, 5], [2, 6, PH]], (
        f"p == q keeps every draft: [0, 1, bonus 5] and [2, bonus 6, placeholder]; got {got.tolist()}"
    )


def test_predicted_bytes_by_hand():
    out = np.array([[4, 5, 9, PH], [1000, PH, PH, PH], [3, PH, PH, PH]])
    counts, vocab = [2, 0, 3], 100
    # request 0: 2 drafts kept + bonus; request 1: no drafts, bonus; request 2: rejected at slot 0
    want = (8 + 2 * 24 + 8) + (8 + 8) + (8 + 1 * 24 + 3 * 4 * vocab)
    assert lab.predicted_bytes(out, counts, vocab, recovered_given=False) == want, (
        "per request 8 B of counts; 24 B per draft looked at (id, uniform, p(x), q(x), stored token); "
        "8 B for a bonus; on a rejection three float32 vocabulary rows (p, q, 1/E)"
    )
    assert lab.predicted_bytes(out, counts, vocab, recovered_given=True) == want - 3 * 4 * vocab + 4
    rejected_late = np.array([[4, 5, 7, PH]])
    assert lab.predicted_bytes(rejected_late, [3], 10, True) == 8 + 3 * 24 + 4, (
        "two kept and the third rejected: three drafts looked at, no bonus"
    )


@pytest.mark.gpu
@pytest.mark.triton
def test_full_size_matches_vllm_gpu():
    from vllm.v1.sample.rejection_sampler import (
        rejection_random_sample_kernel,
        sample_recovered_tokens_kernel,
    )

    batch, k, vocab = 256, 6, 32000
    counts = [k] * batch
    g = torch.Generator(device="cuda").manual_seed(0)
    n = batch * k
    q = torch.softmax(torch.randn(n, vocab, device="cuda", generator=g) * 3, -1)
    p = torch.softmax(torch.randn(n, vocab, device="cuda", generator=g) * 3, -1)
    drafts = torch.multinomial(q, 1, generator=g).view(-1).to(torch.int32)
    u = torch.rand(n, dtype=torch.float64, device="cuda", generator=g)
    inv_e = torch.empty(batch, vocab, device="cuda").exponential_(generator=g).reciprocal()
    bonus = torch.arange(batch, device="cuda", dtype=torch.int32)
    cu = torch.cumsum(torch.tensor(counts, device="cuda"), 0).to(torch.int32)
    rec = torch.empty(n, dtype=torch.int32, device="cuda")
    sample_recovered_tokens_kernel[(batch, k)](rec, cu, drafts, q, p, inv_e, vocab, 8192, NO_DRAFT_PROBS=False)
    theirs = torch.full((batch, k + 1), PH, dtype=torch.int32, device="cuda")
    rejection_random_sample_kernel[(batch,)](theirs, cu, drafts, q, p, bonus, rec, u,
                                             torch.zeros(batch, dtype=torch.bool, device="cuda"), k, vocab, None,
                                             NO_DRAFT_PROBS=False, SYNTHETIC_MODE=False)
    got = lab.rejection_sample_random(drafts, counts, q, p, bonus, u, inv_exponentials=inv_e)
    assert torch.equal(got, theirs), f"{(got != theirs).sum().item()} slots differ from vLLM's two kernels at full size"
