"""Lab 18-03: batched top-k / top-p in Triton (interpreter on CPU), graded against the rule and vLLM's two paths."""

import pytest

from course.runtime import lab_module

lab = lab_module(__file__)  # solution.py by default; LAB_IMPL=starter grades starter.py

torch = pytest.importorskip("torch")


def kept(out):
    """Kept token ids per row."""
    return [row.isfinite().nonzero().flatten().tolist() for row in out]


def run(x, k=None, p=None, block=64):
    kt = None if k is None else torch.as_tensor(k, dtype=torch.int32)
    pt = None if p is None else torch.as_tensor(p, dtype=torch.float32)
    return lab.apply_top_k_top_p(x, kt, pt, block_size=block), kt, pt


def randn(b, v, seed, scale=2.0):
    return torch.randn(b, v, generator=torch.Generator().manual_seed(seed)) * scale


@pytest.mark.triton
def test_top_k_keeps_the_k_largest():
    x = randn(4, 150, seed=1)  # 150: not a multiple of the 64-column block
    out, k, _ = run(x, [1, 7, 150, 64])
    for r, ids in enumerate(kept(out)):
        want = sorted(torch.topk(x[r], int(k[r])).indices.tolist())
        assert ids == want, f"row {r}, k={int(k[r])}: kept {len(ids)} tokens, want the {len(want)} largest"
    assert torch.equal(out[out.isfinite()], x[out.isfinite()]), "kept logits pass through unchanged"
    assert torch.isneginf(out[~out.isfinite()]).all(), "dropped tokens become -inf"


@pytest.mark.triton
def test_ties_at_the_top_k_cut_all_survive():
    x = torch.tensor([[3.0, 1.0, 2.0, 2.0, 2.0, 0.0], [-0.0, 0.0, -1.0, 5.0, -2.0, -3.0]])
    out, _, _ = run(x, [2, 2], block=4)
    got = kept(out)
    assert got[0] == [0, 2, 3, 4], (
        f"k=2: the 2nd largest is 2.0 and three tokens hold it; all three stay (4 kept), as in vLLM; got {got[0]}"
    )
    assert got[1] == [0, 1, 3], f"-0.0 and +0.0 are equal logits and tie at the cut: keep both, got {got[1]}"


@pytest.mark.triton
def test_top_p_keeps_the_smallest_head_holding_p():
    x = randn(4, 120, seed=2)
    p = [0.9, 0.5, 1.0, 0.05]
    out, _, pt = run(x, None, p, block=128)
    want = kept(lab_reference(x, None, pt))
    assert kept(out) == want, (
        f"kept per row {[len(r) for r in kept(out)]}, want {[len(r) for r in want]}: keep a token when the tokens "
        f"strictly above it hold less than p of the probability"
    )
    assert len(kept(out)[2]) == 120, "p = 1 keeps the whole row"
    assert kept(out)[3] == [int(x[3].argmax())], "a tiny p keeps only the top token: never an empty row"


@pytest.mark.triton
def test_exact_dyadic_hit_drops_the_tail():
    x = torch.log(torch.tensor([[0.5, 0.25, 0.125, 0.125], [0.125, 0.5, 0.125, 0.25]]))
    out, _, _ = run(x, None, [0.75, 0.75], block=4)
    assert kept(out) == [[0, 1], [1, 3]], (
        f"0.5 + 0.25 is exactly 0.75: the 0.125s have 0.75 above them, not less than p, so they go; got {kept(out)}"
    )


@pytest.mark.triton
def test_ties_at_the_top_p_cut_share_one_fate():
    x = torch.tensor([[3.0, 1.0, 2.0, 2.0, 2.0, 0.0]])
    out, _, _ = run(x, None, [0.7], block=4)
    assert kept(out) == [[0, 2, 3, 4]], (
        f"p=0.7: the 3.0 holds 0.44 and each 2.0 0.16; the cut falls inside the three 2.0s, and equal logits "
        f"share one fate: all three stay; got {kept(out)[0]}"
    )


@pytest.mark.triton
def test_top_p_renormalizes_over_the_top_k_survivors():
    x = torch.tensor([[2.0, 1.0, 0.0] + [-1.0] * 20])
    out, _, _ = run(x, [3], [0.6], block=8)
    assert kept(out) == [[0]], (
        f"after top-k=3 the 2.0 holds e^2 / (e^2 + e + 1) = 0.67 >= 0.6 of the survivors' mass, so only it "
        f"stays; measured over the whole vocabulary it held 0.40 and more would stay; got {kept(out)[0]}"
    )


@pytest.mark.triton
def test_shift_invariant_and_extreme_logits():
    x = randn(2, 90, seed=3)
    base = kept(run(x, [5, 90], [0.8, 0.6], block=128)[0])
    for shift in (100.0, -200.0):
        got = kept(run(x + shift, [5, 90], [0.8, 0.6], block=128)[0])
        assert got == base, (
            f"softmax ignores a constant shift; at logits + {shift} the masks changed: subtract the row max before exp"
        )
    y = torch.full((1, 10), float("-inf"))
    y[0, 4] = 1.0
    assert kept(run(y, [3], [0.5], block=4)[0]) == [[4]], "-inf logits (already masked) never come back"


@pytest.mark.triton
def test_non_contiguous_rows_and_columns():
    x = randn(70, 3, seed=4).t()  # (3, 70), column stride 3
    want = kept(lab_reference(x, torch.tensor([3, 10, 70]), torch.tensor([0.9, 0.7, 0.5])))
    got = kept(run(x, [3, 10, 70], [0.9, 0.7, 0.5], block=128)[0])
    assert got == want, "a transposed view (stride_col != 1) must give the masks of its contiguous copy"
    wide = randn(2, 200, seed=5)[:, 30:130]  # row stride 200, 100 columns
    want = kept(lab_reference(wide, torch.tensor([7, 7]), torch.tensor([0.8, 0.8])))
    assert kept(run(wide, [7, 7], [0.8, 0.8], block=128)[0]) == want, "rows 200 apart: use the row stride"


def test_bad_input_refused():
    x = torch.zeros(2, 8)
    for k, p in (([0, 1], None), ([1, 9], None), (None, [0.0, 0.5]), (None, [0.5, 1.5]), ([1], None)):
        with pytest.raises(ValueError):
            run(x, k, p)
    with pytest.raises(ValueError):
        lab.apply_top_k_top_p(x.double(), None, None)


def lab_reference(x, k, p):
    return lab.reference(x, k, p)


# --------------------------------------------------------------------------- vLLM's own two paths
@pytest.fixture(scope="module")
def vllm_ops():
    from mini_vllm.testing import real_vllm  # noqa: F401, I001  (wires vLLM's Triton for the CPU first)
    from vllm.v1.sample.ops import topk_topp_triton
    from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_top_p_pytorch

    saved = topk_topp_triton.num_compute_units
    topk_topp_triton.num_compute_units = lambda index=None: 4  # the CPU platform has no SM count
    yield apply_top_k_top_p_pytorch, topk_topp_triton.apply_top_k_top_p_triton
    topk_topp_triton.num_compute_units = saved


@pytest.mark.triton
@pytest.mark.upstream
def test_same_masks_as_vllms_two_paths_on_distinct_logits(vllm_ops):
    pytorch_path, triton_path = vllm_ops
    x = randn(4, 200, seed=6)
    k = [1, 5, 200, 20]
    p = [0.9, 0.5, 0.8, 0.3]
    for kk, pp in ((k, p), (k, None), (None, p)):
        mine, kt, pt = run(x, kk, pp, block=256)
        for name, path in (("sort path", pytorch_path), ("Triton kernel", triton_path)):
            theirs = path(x.clone(), kt, pt)
            assert kept(mine) == kept(theirs), (
                f"k={kk is not None}, p={pp is not None}: kept per row {[len(r) for r in kept(mine)]}, vLLM's "
                f"{name} {[len(r) for r in kept(theirs)]}"
            )


@pytest.mark.triton
@pytest.mark.upstream
def test_vllms_sort_path_splits_ties_at_the_top_p_cut(vllm_ops):
    pytorch_path, _ = vllm_ops
    ties = torch.tensor([[3.0, 1.0, 2.0, 2.0, 2.0, 0.0]])
    theirs = kept(pytorch_path(ties.clone(), None, torch.tensor([0.7])))[0]
    mine = kept(run(ties, None, [0.7], block=8)[0])[0]
    assert mine == [0, 2, 3, 4] and len(theirs) == 3, (
        f"the sort path keeps {theirs}: its cumulative sum walks the tied 2.0s one at a time, in whatever order "
        f"the sort left them, and stops inside the tie; the lab's rule keeps equal logits together: {mine}"
    )


@pytest.mark.gpu
def test_full_size_on_gpu():
    from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_top_p_pytorch

    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(256, 128256, device="cuda", generator=g) * 3
    k = torch.randint(1, 1000, (256,), device="cuda", generator=g, dtype=torch.int32)
    p = torch.rand(256, device="cuda", generator=g) * 0.9 + 0.1
    mine = lab.apply_top_k_top_p(x, k, None)
    assert torch.equal(mine.isfinite(), apply_top_k_top_p_pytorch(x.clone(), k, None).isfinite()), (
        "top-k at 128k"
    )
    mine = lab.apply_top_k_top_p(x, k, p).isfinite()
    theirs = apply_top_k_top_p_pytorch(x.clone(), k, p).isfinite()
    rows = int((mine != theirs).any(1).sum())
    assert rows <= 2, (
        f"{rows} of 256 rows differ from the sort path (fp32 sums may split a cut once in a while)"
    )
