import math

import pytest

from course.runtime import lab_module

lab = lab_module(__file__)   # solution.py by default; LAB_IMPL=starter grades starter.py


torch = pytest.importorskip("torch")

PROBS = [0.5, 0.3, 0.2]
N_DRAWS = 300
# Pearson's chi-square with k = 3 categories has 2 degrees of freedom, whose survival function is
# exp(-x / 2): the threshold with a 1-in-1000 chance of failing a correct sampler is -2 ln(0.001).
CHI2_LIMIT = -2 * math.log(1e-3)   # 13.82


def sample(logits, temp, seeds, pos, block=16):
    t = torch.as_tensor(temp, dtype=torch.float32)
    return lab.gumbel_sample(logits, t, torch.as_tensor(seeds, dtype=torch.int64),
                             torch.as_tensor(pos, dtype=torch.int64), block).tolist()


def chi2(counts, probs):
    n = sum(counts)
    return sum((c - n * p) ** 2 / (n * p) for c, p in zip(counts, probs))


def row_draws(probs, temperature=1.0, seed=1234, vocab=8, block=4, n=N_DRAWS):
    """Counts of ``n`` draws of one row (log ``probs``, -inf padding to ``vocab``) at positions 0..n-1."""
    row = torch.full((vocab,), float("-inf"))
    row[: len(probs)] = torch.log(torch.tensor(probs))
    toks = sample(row.repeat(n, 1), [temperature] * n, [seed] * n, list(range(n)), block)
    return torch.bincount(torch.tensor(toks), minlength=vocab).tolist()


def _logits(b, v, seed=0):
    return torch.randn(b, v, generator=torch.Generator().manual_seed(seed)) * 2


@pytest.mark.triton
def test_a_seeded_row_ignores_its_batch():
    target = _logits(1, 37, seed=1)[0]
    others = _logits(3, 37, seed=2)
    got = {}
    for batch, at in ((0, 0), (1, 1), (3, 0), (3, 3)):
        rows = list(others[:batch])
        rows.insert(at, target)
        seeds, pos, temp = [5, 6, 8, 9][: batch + 1], [1, 2, 3, 4][: batch + 1], [1.0, 0.0, 0.7, 2.0][: batch + 1]
        seeds[at], pos[at], temp[at] = 42, 17, 0.8
        for start in range(2):   # two consecutive positions, so one lucky token cannot pass
            p = list(pos)
            p[at] = 17 + start
            got.setdefault(start, {})[(batch, at)] = sample(torch.stack(rows), temp, seeds, p, block=64)[at]
    for start, seen in got.items():
        assert len(set(seen.values())) == 1, (
            f"the row with seed 42, position {17 + start} drew {seen} ((companions, row index) -> token): a row's "
            f"noise must depend on its seed, its position and the column only, never on its row index or its companions"
        )


@pytest.mark.triton
def test_same_inputs_same_tokens_and_positions_differ():
    logits = _logits(6, 20, seed=3)
    a = sample(logits, [1.0] * 6, [7] * 6, [0, 1, 2, 3, 4, 5], block=32)
    b = sample(logits.clone(), [1.0] * 6, [7] * 6, [0, 1, 2, 3, 4, 5], block=32)
    assert a == b, f"the same inputs must give the same tokens: {a} then {b}"
    flat = torch.zeros(12, 20)
    toks = sample(flat, [1.0] * 12, [7] * 12, list(range(12)), block=32)
    assert len(set(toks)) > 4, (
        f"12 positions of one seed over 20 equally likely tokens gave only {sorted(set(toks))}: the position must "
        f"change the key (tl.randint(seed, position)), or every step of a request repeats its first draw"
    )
    other_seed = sample(flat, [1.0] * 12, [8] * 12, list(range(12)), block=32)
    assert other_seed != toks, "a different seed must give a different stream"


@pytest.mark.triton
def test_greedy_rows_take_argmax_ties_to_the_lowest_id():
    logits = torch.tensor([[0.0, 3.0, 1.0, 3.0, -1.0, 2.0]] * 4)
    got = sample(logits, [0.0] * 4, [1, 2, 3, 4], [0, 1, 2, 3], block=4)
    assert got == [1] * 4, f"temperature 0 is argmax, and a tie (ids 1 and 3) goes to the lowest id; got {got}"
    toks = lab.gumbel_sample(logits[:1], torch.zeros(1), torch.ones(1, dtype=torch.int64), torch.zeros(1, dtype=torch.int64), 4)
    assert toks.dtype == torch.int64, f"the tokens are int64 (token ids index int64 tables downstream), got {toks.dtype}"
    across = torch.full((2, 40), -5.0)
    across[:, 3] = across[:, 20] = 4.0   # tied across two blocks of 16
    got = sample(across, [0.0, 0.0], [1, 2], [5, 6])
    assert got == [3, 3], (
        f"a tie between block 0 (id 3) and block 1 (id 20) must keep the earlier block's id, as vLLM's first-max "
        f"reduction does: use a strict > when merging blocks; got {got}"
    )
    mixed = _logits(4, 30, seed=4)
    got = sample(mixed, [0.0, 1.0, 0.0, 0.5], [9] * 4, [0, 0, 1, 1])
    assert got[0] == int(mixed[0].argmax()) and got[2] == int(mixed[2].argmax()), (
        f"greedy rows in a mixed batch still take argmax; got {got}, argmax {mixed.argmax(1).tolist()}"
    )


@pytest.mark.triton
def test_temperature_sharpens_and_flattens():
    peaked = torch.zeros(16, 16)
    peaked[:, 0] = 4.0   # p(token 0) = e^4 / (e^4 + 15) = 0.78 at T = 1
    pos = list(range(16))
    cold = sample(peaked, [0.05] * 16, [21] * 16, pos)
    assert cold == [0] * 16, (
        f"at T = 0.05 token 0 leads by 4 / 0.05 = 80 nats: every draw must be 0, got {cold}; divide the logits by T "
        f"before adding the noise (dividing the noisy score changes nothing: argmax ignores a positive scale)"
    )
    hot = sample(peaked, [50.0] * 16, [21] * 16, pos)
    assert hot.count(0) <= 6, (
        f"at T = 50 the 16 tokens are nearly uniform (p(0) = 0.07), yet {hot.count(0)} of 16 draws were token 0: "
        f"the temperature is not reaching the logits ({hot})"
    )


@pytest.mark.triton
def test_tail_of_the_vocab_is_reached_and_neg_inf_is_never_drawn():
    logits = torch.full((3, 37), -2.0)
    logits[:, 36] = 5.0   # the last id, alone in the third block of 16
    assert sample(logits, [0.0] * 3, [1, 2, 3], [0, 1, 2]) == [36] * 3, (
        "vocab 37 at block 16 is three blocks, the last one masked past id 36: loop over cdiv(37, 16) blocks"
    )
    negative = torch.full((2, 21), -3.0)
    negative[:, 7] = -1.0   # every logit below 0, and lanes 21..31 of the second block are past the vocabulary
    got = sample(negative, [0.0] * 2, [1, 2], [0, 1])
    assert got == [7, 7], (
        f"a greedy row of all-negative logits drew {got}, not its argmax 7: the lanes past the vocabulary must load "
        f"as -inf (other=float('-inf')), or a 0 there beats every real logit"
    )
    only = torch.full((20, 21), float("-inf"))
    only[:, 20] = 0.0
    only[:, 4] = -1.0
    toks = sample(only, [1.5] * 20, [3] * 20, list(range(20)), block=32)
    assert set(toks) <= {4, 20} and 4 in toks and 20 in toks, (
        f"only ids 4 and 20 have finite logits; the draws must stay on them (and reach both): {sorted(set(toks))}"
    )


@pytest.mark.triton
def test_non_contiguous_logits():
    wide = _logits(5, 50, seed=5)
    view = wide[:, 7:30]                       # a column slice: row stride 50
    seeds, pos, temp = [1, 2, 3, 4, 5], [3, 1, 4, 1, 5], [1.0, 0.0, 0.9, 1.3, 1.0]
    want = sample(view.contiguous(), temp, seeds, pos, block=32)
    assert sample(view, temp, seeds, pos, block=32) == want, "a column slice must give the contiguous copy's tokens (row stride)"
    tall = _logits(23, 5, seed=5)
    assert sample(tall.t(), temp, seeds, pos, block=32) == sample(tall.t().contiguous(), temp, seeds, pos, block=32), (
        "a transposed view (column stride 5) must give the contiguous copy's tokens: load at col * stride_col"
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
def test_offsets_past_2_pow_31_elements():
    # The logits start 2**31 elements into a buffer of zeros. With a stride of 2**30 + 8, element 2 of a
    # row (or of a column) sits 2**31 + 16 elements in: in int32 that offset wraps to -2**31 + 16, the
    # buffer's zeros. The 8 GiB buffer is virtual on CPU: only the pages written are ever touched.
    stride = (1 << 30) + 8
    big, keep = _huge_fp16((1 << 31) + 2 * stride + 16)
    rows = torch.as_strided(big, (3, 16), (stride, 1), 1 << 31)   # row 2 is 2**31 + 16 elements in
    rows.fill_(-1.0)
    rows[:, 5] = 2.0
    got_rows = sample(rows, [0.0] * 3, [1, 2, 3], [0, 1, 2])
    cols = torch.as_strided(big, (2, 3), (1, stride), 1 << 31)    # column 2 is 2**31 + 16 elements in (same pages)
    cols[:, 0], cols[:, 1], cols[:, 2] = -1.0, 1.0, 2.0
    big[16:18] = -9.0   # where a wrapped column 2 would read instead
    got_cols = sample(cols, [0.0] * 2, [1, 2], [0, 1])
    del rows, cols, big, keep
    assert got_rows == [5, 5, 5], (
        f"row 2 starts 2**31 + 16 elements in and its argmax (id 5) was missed: {got_rows}. row * stride_row "
        f"overflowed int32: compute the row's offset in int64 (row.to(tl.int64) * stride_row); a real batch of "
        f"256 x 128,256 logits is 2**25 elements, and a strided view of a bigger buffer passes 2**31"
    )
    assert got_cols == [2, 2], (
        f"column 2 sits 2**31 + 16 elements in and was missed: {got_cols}. col * stride_col overflowed int32: "
        f"compute the column offsets in int64 too (cols.to(tl.int64) * stride_col)"
    )


@pytest.mark.triton
def test_bad_inputs_are_refused():
    logits = torch.zeros(2, 8)
    ok = dict(temperature=torch.ones(2), seeds=torch.zeros(2, dtype=torch.int64), positions=torch.zeros(2, dtype=torch.int64))
    with pytest.raises(ValueError, match="2-D float"):
        lab.gumbel_sample(torch.zeros(8), **ok)
    with pytest.raises(ValueError, match="one entry per row"):
        lab.gumbel_sample(logits, torch.ones(3), ok["seeds"], ok["positions"])
    with pytest.raises(ValueError, match="temperature must be >= 0"):
        lab.gumbel_sample(logits, torch.tensor([1.0, -0.5]), ok["seeds"], ok["positions"])
    with pytest.raises(ValueError, match="power of two"):
        lab.gumbel_sample(logits, **ok, block_size=12)


@pytest.mark.slow
@pytest.mark.triton
def test_chi_square_goodness_of_fit():
    counts = row_draws(PROBS)
    assert sum(counts[3:]) == 0, f"columns at -inf were drawn: {counts}"
    stat = chi2(counts[:3], PROBS)
    assert stat < CHI2_LIMIT, (
        f"{N_DRAWS} draws of probs {PROBS} came out {counts[:3]}: chi-square {stat:.1f} > {CHI2_LIMIT:.2f} "
        f"(a correct sampler fails this 1 time in 1000): is the noise -log(-log(u)) added to logits / T?"
    )
    hot = [p ** 2 for p in PROBS]
    hot = [p / sum(hot) for p in hot]   # softmax(log p / 0.5) = p^2, renormalised: [.66, .24, .11]
    counts = row_draws(PROBS, temperature=0.5, seed=99)
    stat = chi2(counts[:3], hot)
    assert stat < CHI2_LIMIT, (
        f"at temperature 0.5 the target is p^2 normalised {[round(p, 3) for p in hot]}; got counts {counts[:3]}, "
        f"chi-square {stat:.1f}: divide the logits by the temperature before adding the noise"
    )


# --- vLLM's own kernel (model runner v2), under the interpreter -------------------------------
@pytest.fixture(scope="module")
def vllm_gumbel():
    from mini_vllm.testing import real_vllm  # noqa: F401, I001  (wires vLLM's Triton for the CPU first)
    from vllm.v1.worker.gpu.sample.gumbel import gumbel_sample

    def run(logits, temp, seeds, pos):
        b = logits.shape[0]
        return gumbel_sample(logits.contiguous(), torch.arange(b, dtype=torch.int32), torch.as_tensor(temp),
                             torch.as_tensor(seeds, dtype=torch.int64), torch.as_tensor(pos, dtype=torch.int64),
                             apply_temperature=True).tolist()

    return run


@pytest.mark.triton
@pytest.mark.upstream
def test_same_tokens_as_vllms_gumbel_sample(vllm_gumbel):
    logits = _logits(8, 70, seed=6)
    temp = [1.0, 0.0, 0.7, 1.0, 2.0, 0.0, 1.0, 0.3]
    seeds, pos = [3, 1, 4, 1, 5, 9, 2, 6], [0, 7, 1, 8, 2, 8, 1, 8]
    theirs = vllm_gumbel(logits, temp, seeds, pos)
    mine = sample(logits, temp, seeds, pos, block=16)
    assert mine == theirs, (
        f"vLLM's gumbel_sample drew {theirs}, yours {mine}: same Philox keying (tl.randint(seed, position), then "
        f"tl.rand(key, column)), u clamped to 2**-126, logits / T + -log(-log(u))"
    )
    # vLLM draws an unseeded request's seed from the whole int64 range (SamplingStates.add_request).
    # Flat rows: 16 equally likely tokens, so the token is the noise's argmax and shows every bit of the key.
    wide = [2**40 + 3, -7, 2**63 - 1, 5 + 2**32] * 2
    flat, pos = torch.zeros(8, 16), [2] * 4 + [3] * 4
    theirs = vllm_gumbel(flat, [1.0] * 8, wide, pos)
    mine = sample(flat, [1.0] * 8, wide, pos)
    assert mine == theirs, (
        f"with 64-bit seeds {wide} vLLM drew {theirs}, yours {mine}: keep the seeds int64 all the way to "
        f"tl.randint (a cast to int32 drops the high bits, and seeds 5 and 5 + 2**32 collide)"
    )


@pytest.mark.slow
@pytest.mark.triton
@pytest.mark.upstream
def test_vllms_kernel_draws_the_same_distribution(vllm_gumbel):
    row = torch.full((8,), float("-inf"))
    row[:3] = torch.log(torch.tensor(PROBS))
    toks = vllm_gumbel(row.repeat(N_DRAWS, 1), [1.0] * N_DRAWS, [1234] * N_DRAWS, list(range(N_DRAWS)))
    theirs = torch.bincount(torch.tensor(toks), minlength=8).tolist()
    assert theirs == row_draws(PROBS), "vLLM's kernel and yours draw the same 300 tokens, so the same counts"
    assert chi2(theirs[:3], PROBS) < CHI2_LIMIT


@pytest.mark.gpu
def test_full_size_on_gpu():
    g = torch.Generator(device="cuda").manual_seed(0)
    logits = torch.randn(256, 128256, device="cuda", generator=g)
    temp = torch.ones(256, device="cuda")
    temp[::4] = 0
    seeds = torch.arange(256, device="cuda", dtype=torch.int64)
    pos = torch.full((256,), 3, device="cuda", dtype=torch.int64)
    toks = lab.gumbel_sample(logits, temp, seeds, pos)
    assert torch.equal(toks[::4], logits[::4].argmax(1)), "greedy rows take argmax at full size"
    again = lab.gumbel_sample(logits[:17].clone(), temp[:17], seeds[:17], pos[:17])
    assert torch.equal(again, toks[:17]), "the first 17 rows alone give the same tokens as in the full batch"
