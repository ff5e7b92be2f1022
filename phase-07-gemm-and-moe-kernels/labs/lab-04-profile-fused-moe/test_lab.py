import pytest

from course.runtime import lab_module

lab = lab_module(__file__)   # solution.py by default; LAB_IMPL=starter grades starter.py


torch = pytest.importorskip("torch")

T, D, F, E, K = 16, 32, 64, 8, 2


@pytest.fixture(scope="module")
def setup():
    layer = lab.TorchMoE(hidden=D, intermediate=F, num_experts=E, top_k=K, seed=0)
    x = torch.randn(T, D, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ids = torch.topk(x @ layer.gate_weight.T, K, dim=-1).indices
    counts = torch.bincount(ids.reshape(-1), minlength=E).tolist()
    return layer, x, counts


@pytest.fixture(scope="module")
def grouped_events(setup):
    layer, x, _ = setup
    return lab.profile_forward(layer, x, "grouped")


@pytest.fixture(scope="module")
def naive_events(setup):
    layer, x, _ = setup
    return lab.profile_forward(layer, x, "naive")


def test_grouped_matches_naive(setup):
    layer, x, _ = setup
    with torch.no_grad():
        got, want = layer.forward_grouped(x), layer.forward_naive(x)
    err = (got - want).abs().max().item()
    assert err < 1e-5, (
        f"forward_grouped differs from forward_naive by {err:.2e}: route with topk + softmax over the k values, "
        f"gather x[order // k], run self.expert(e, block) per expert, then put rows back and weight them"
    )


def test_grouped_matches_naive_other_top_k_and_batch():
    # top-1 and top-3 on 5 experts, a single decode token and a 7-token batch
    for k in (1, 3):
        layer = lab.TorchMoE(hidden=16, intermediate=32, num_experts=5, top_k=k, seed=3)
        for tokens in (1, 7):
            x = torch.randn(tokens, 16, generator=torch.Generator().manual_seed(10 + tokens))
            with torch.no_grad():
                got, want = layer.forward_grouped(x), layer.forward_naive(x)
            err = (got - want).abs().max().item()
            assert got.shape == want.shape and err < 1e-5, (
                f"top_k={k}, {tokens} token(s): grouped differs from naive by {err:.2e}: use self.top_k everywhere "
                f"(order // k, the view to (T, k, d)), never a hard-coded 2"
            )


def test_every_moe_step_is_one_labelled_region(grouped_events):
    summary = lab.summarize_profile(grouped_events)
    for region in lab.REGIONS:
        assert region in summary, f"the grouped profile has no {region!r} label: wrap that step in record_function({region!r})"
        assert summary[region].calls == 1, f"{region} should run once per forward, ran {summary[region].calls} times"


def test_router_is_one_small_matmul(grouped_events, naive_events):
    for name, events in (("grouped", grouped_events), ("naive", naive_events)):
        router = lab.summarize_profile(events)["moe/router"]
        assert router.matmuls == 1, f"{name}: the router is ONE (T, d) x (d, E) GEMM, counted {router.matmuls}"
        assert router.flops == 2 * T * D * E == 8192, (
            f"{name}: router GEMM FLOPs = 2·T·d·E = 8,192, got {router.flops}: sum ev.flops of the aten::mm under the label"
        )


def test_grouped_runs_two_matmuls_per_active_expert(grouped_events, setup):
    _, _, counts = setup
    summary = lab.summarize_profile(grouped_events)
    for e, c in enumerate(counts):
        label = f"{lab.EXPERT_LABEL}{e}"
        assert label in summary, f"expert {e} received {c} rows, so its label {label!r} must appear (attribute ops to the INNERMOST moe/ label)"
        s = summary[label]
        assert (s.calls, s.matmuls) == (1, 2), (
            f"grouped: expert {e} should run once with 2 GEMMs (w13, then w2) on its whole block, got {s.calls} calls, {s.matmuls} GEMMs"
        )
        assert s.flops == 6 * c * D * F, (
            f"expert {e}: {c} rows x (2·d·2f for w13 + 2·f·d for w2) = {6 * c * D * F:,} FLOPs, got {s.flops:,}"
        )
    experts = lab.region_totals(summary)["moe/experts"]
    assert experts.matmuls == 2 * sum(1 for c in counts if c), "grouped experts region: 2 GEMMs per expert with rows"


def test_experts_without_rows_are_never_called():
    # One decode token, top-2 of 8 experts: six experts get no rows and must cost nothing (no label, no GEMM).
    layer = lab.TorchMoE(hidden=D, intermediate=F, num_experts=E, top_k=K, seed=0)
    x = torch.randn(1, D, generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        chosen = set(torch.topk(x @ layer.gate_weight.T, K, dim=-1).indices.reshape(-1).tolist())
    summary = lab.summarize_profile(lab.profile_forward(layer, x, "grouped"))
    called = sorted(
        int(name.removeprefix(lab.EXPERT_LABEL)) for name in summary if name.startswith(lab.EXPERT_LABEL)
    )
    assert called == sorted(chosen), (
        f"one token routed to experts {sorted(chosen)}, but the grouped forward entered the labels of experts "
        f"{called}: call self.expert(e, block) only for an expert whose count is non-zero"
    )
    experts = lab.region_totals(summary)["moe/experts"]
    assert experts.matmuls == 2 * len(chosen), (
        f"{len(chosen)} experts with rows = {2 * len(chosen)} GEMMs, counted {experts.matmuls}: an empty block still "
        f"launches a (0, d) GEMM"
    )


def test_labels_are_not_counted_as_ops(grouped_events):
    summary = lab.summarize_profile(grouped_events)
    for name, s in summary.items():
        labels = sorted(op for op in s.ops if op.startswith("moe/"))
        assert not labels, (
            f"{name} lists the labels {labels} among its ATen ops: a moe/ event is a label, count it in calls "
            f"and move on (skip it when attributing ops)"
        )


def test_naive_runs_two_matmuls_per_assignment(naive_events, setup):
    _, _, counts = setup
    summary = lab.summarize_profile(naive_events)
    for e, c in enumerate(counts):
        s = summary[f"{lab.EXPERT_LABEL}{e}"]
        assert s.matmuls == 2 * c, f"naive: expert {e} has {c} assignments, each a separate pair of 1-row GEMMs = {2 * c}, got {s.matmuls}"
    experts = lab.region_totals(summary)["moe/experts"]
    assert experts.matmuls == 2 * T * K == 64, f"naive: 2 GEMMs per (token, slot) = 2·16·2 = 64, got {experts.matmuls}"


def test_same_flops_far_fewer_launches(grouped_events, naive_events):
    g = lab.region_totals(lab.summarize_profile(grouped_events))["moe/experts"]
    n = lab.region_totals(lab.summarize_profile(naive_events))["moe/experts"]
    assert g.flops == n.flops == 6 * T * K * D * F, (
        f"both forwards do the same expert arithmetic, 6·T·k·d·f = {6 * T * K * D * F:,} FLOPs; got grouped {g.flops:,}, naive {n.flops:,}. "
        f"Count only the leaf GEMM ops (aten::mm), not the aten::matmul wrappers"
    )
    assert n.matmuls == 4 * g.matmuls, f"naive launches 64 GEMMs, grouped 16 (2 per expert): got {n.matmuls} and {g.matmuls}"


def test_routing_and_permute_ops_land_in_their_regions(grouped_events):
    regions = lab.region_totals(lab.summarize_profile(grouped_events))
    assert "aten::topk" in regions["moe/topk"].ops and "aten::softmax" in regions["moe/topk"].ops, (
        f"moe/topk should hold aten::topk and aten::softmax, holds {sorted(regions['moe/topk'].ops)}"
    )
    assert {"aten::argsort", "aten::bincount"} <= set(regions["moe/permute"].ops), (
        f"moe/permute should hold the sort and the histogram (aten::argsort, aten::bincount), holds {sorted(regions['moe/permute'].ops)}"
    )
    for r in ("moe/topk", "moe/permute", "moe/combine"):
        assert regions[r].matmuls == 0, f"{r} must contain no GEMM, counted {regions[r].matmuls}"
