import pytest

from course.runtime import lab_module

lab = lab_module(__file__)   # solution.py by default; LAB_IMPL=starter grades starter.py


torch = pytest.importorskip("torch", reason="lab-05 needs torch (pip install -e '.[torch]')")


@pytest.fixture(scope="module")
def tiny():
    """The tiny CPU copy of the decoder: model, caches for batch 8, and its eager step."""
    model = lab.build_decoder(lab.TINY)
    k, v = lab.make_kv_cache(lab.TINY, 8)
    return model, k, v, (lambda tokens: model(tokens, k, v))


def test_count_launches_counts_kernels_not_views():
    x = torch.ones(4, 4)
    got = lab.count_launches(lambda t: (t * 2).view(-1).t() + 1, x)
    assert got == 2, (
        f"(x * 2).view(-1).t() + 1 launches 2 kernels (mul, add); view and t are metadata only, got {got}"
    )
    assert lab.count_launches(lambda t: t.transpose(0, 1).contiguous(), x) == 1, (
        "a .contiguous() after a transpose is a real copy kernel and must be counted"
    )


def test_launch_count_is_flat_in_batch():
    model = lab.build_decoder(lab.TINY)
    counts = []
    for b in (1, 8, 64):
        k, v = lab.make_kv_cache(lab.TINY, b)
        counts.append(lab.count_launches(model, lab.make_tokens(lab.TINY, b), k, v))
    assert counts[0] == counts[1] == counts[2], (
        f"a decode step launches the same kernels at every batch size (bigger kernels, not more), got {counts}"
    )
    assert counts[0] == 7 + 24 * lab.TINY.n_layers, (
        f"the TINY step (2 layers) should launch 7 + 24 x 2 = 55 kernels (count every non-view aten op), got {counts[0]}"
    )


def test_graphed_step_copies_into_static_input(tiny):
    step = tiny[-1]
    first, second = lab.make_tokens(lab.TINY, 8, seed=3), lab.make_tokens(lab.TINY, 8, seed=4)
    first_before = first.clone()
    g = lab.GraphedStep(step, first, warmup=1, backend=lab.eager_replay_backend)
    buf, out_buf = g.static_input, g.static_output
    with torch.no_grad():
        out = g(second)
        want = step(second)
    assert torch.allclose(out, want), "a replay with new tokens must equal the eager step on those tokens"
    assert g.static_input is buf and torch.equal(buf, second), (
        "copy the new tokens INTO the captured static_input (static_input.copy_(x)); never rebind it"
    )
    assert out is out_buf, "a replay returns the graph's static output tensor (the same object every time)"
    assert torch.equal(first, first_before), (
        "the example tensor passed to GraphedStep changed after a replay: clone it into self.static_input; "
        "capturing the caller's own tensor lets every copy_ overwrite the caller's data"
    )


def test_graphed_step_rejects_other_shapes(tiny):
    step = tiny[-1]
    g = lab.GraphedStep(step, lab.make_tokens(lab.TINY, 8), warmup=1, backend=lab.eager_replay_backend)
    with pytest.raises(ValueError):
        g(lab.make_tokens(lab.TINY, 4))  # a graph captured at batch 8 cannot run batch 4: pad to 8 first


def test_prediction_fades_with_batch():
    rows = lab.predict_rows(175, lab.DecoderConfig(), batches=(1, 8, 64))
    s = [r["speedup"] for r in rows]
    assert [r["batch"] for r in rows] == [1, 8, 64], "one row per batch, in order"
    assert s[0] == pytest.approx(877 / 355, rel=1e-3), (
        f"batch 1: eager 5 + 174 x 5 + 2 = 877 us, graph 5 + 175 x 2 = 355 us -> 2.47x, got {s[0]:.3f}x"
    )
    assert s[0] >= s[1] > s[2] > 1.0, f"the predicted win shrinks with batch but never inverts, got {s}"
    assert rows[2]["gpu_us"] == pytest.approx(2 * (lab.DecoderConfig().weight_params
                                                   + lab.DecoderConfig().kv_elems(64)) / 3.35e6), (
        "at batch 64 the GPU time is the bytes read (fp16 weights + KV cache) / 3.35 TB/s"
    )


def test_model_comparison_fits_launch_cost():
    lab02 = lab.LAB02
    n, launch = 175, 7.0
    measured = {}
    for b, k_us in ((1, 1.0), (8, 2.0), (64, 9.0)):
        measured[b] = (lab02.eager_step_us(n, launch, k_us), lab02.graph_step_us(n, launch, k_us))
    rows = lab.compare_with_model(n, measured)
    assert [r["batch"] for r in rows] == [1, 8, 64]
    assert rows[0]["launch_us"] == pytest.approx(measured[1][0] / n), "fit launch_us from the smallest batch"
    for r in rows:
        assert r["predicted_eager_us"] == pytest.approx(r["eager_us"], rel=0.02), (
            f"batch {r['batch']}: data made by lab-02's own model must be predicted within 2%, got "
            f"{r['predicted_eager_us']:.0f} vs {r['eager_us']:.0f} us"
        )
    assert rows[2]["speedup"] == pytest.approx(1.0, abs=0.01), "GPU-bound batch 64 gains nothing"


def test_prediction_reads_dtype_and_the_compute_roof():
    for dtype, nbytes in (("float32", 4), ("bfloat16", 2)):  # bfloat16 is 2 bytes, like float16
        dcfg = lab.DecoderConfig(dtype=dtype)
        row = lab.predict_rows(175, dcfg, batches=(64,))[0]
        want = nbytes * (dcfg.weight_params + dcfg.kv_elems(64)) / 3.35e6
        assert row["gpu_us"] == pytest.approx(want), (
            f"a {dtype} model moves {nbytes} bytes per element: batch 64 reads {want:.0f} us worth of bytes at "
            f"3.35 TB/s, got {row['gpu_us']:.0f} us: take the element size from cfg.dtype"
        )
    cfg = lab.DecoderConfig()
    row = lab.predict_rows(175, cfg, batches=(64,), peak_tflops=1.0)[0]
    flops = 2 * 64 * cfg.weight_params + 2 * cfg.kv_elems(64)
    assert row["gpu_us"] == pytest.approx(flops / 1e6), (
        f"at 1 TFLOP/s the compute roof binds: 2 flops per weight per sequence (x 64) + 2 per cached element = "
        f"{flops:.3g} flops = {flops / 1e6:.0f} us, got {row['gpu_us']:.0f} us"
    )


def test_prediction_reads_launch_floor_and_bandwidth():
    cfg, lab02 = lab.DecoderConfig(), lab.LAB02
    rows = lab.predict_rows(175, cfg, batches=(1, 64), launch_us=10.0, kernel_floor_us=3.0, hbm_tb_s=1.0)
    floor_us, hbm_us = 175 * 3.0, 2 * (cfg.weight_params + cfg.kv_elems(64)) / 1e6
    for row, gpu in zip(rows, (floor_us, hbm_us)):
        want = lab02.eager_step_us(175, 10.0, gpu / 175), lab02.graph_step_us(175, 10.0, gpu / 175)
        assert row["gpu_us"] == pytest.approx(gpu) and (row["eager_us"], row["graph_us"]) == pytest.approx(want), (
            f"batch {row['batch']} with launch 10 us, floor 3 us/kernel, 1 TB/s: GPU time {gpu:.0f} us, "
            f"eager/graph {want[0]:.0f}/{want[1]:.0f} us; got {row['gpu_us']:.0f}, "
            f"{row['eager_us']:.0f}/{row['graph_us']:.0f}: use the launch_us, kernel_floor_us and hbm_tb_s arguments"
        )


def test_model_comparison_fits_from_the_smallest_batch_whatever_the_order():
    lab02 = lab.LAB02
    n, launch = 175, 7.0
    measured = {}
    for b, k_us in ((64, 9.0), (8, 2.0), (1, 1.0)):  # largest batch first
        measured[b] = (lab02.eager_step_us(n, launch, k_us), lab02.graph_step_us(n, launch, k_us))
    rows = lab.compare_with_model(n, measured)
    assert [r["batch"] for r in rows] == [1, 8, 64], f"rows come in batch order, got {[r['batch'] for r in rows]}"
    got = rows[0]["launch_us"]
    assert got == pytest.approx(measured[1][0] / n), (
        f"launch_us must be fitted from the smallest batch (1: {measured[1][0] / n:.2f} us), not the first key of "
        f"the dict (64, GPU-bound); got {got:.2f} us"
    )


@pytest.mark.gpu
@pytest.mark.parametrize("batch", [1, 8, 64])
def test_cuda_graph_matches_eager(batch):
    cfg = lab.DecoderConfig()
    model = lab.build_decoder(cfg, device="cuda")
    k, v = lab.make_kv_cache(cfg, batch, device="cuda")

    def step(tokens):
        return model(tokens, k, v)

    g = lab.GraphedStep(step, lab.make_tokens(cfg, batch, device="cuda", seed=5))
    tokens = lab.make_tokens(cfg, batch, device="cuda", seed=6)
    with torch.no_grad():
        want = step(tokens).float()
    got = g(tokens).float()
    torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-2,
                               msg=f"batch {batch}: a CUDA-graph replay must match the eager step")


@pytest.mark.gpu
def test_cuda_graph_replay_reads_new_input():
    cfg = lab.DecoderConfig()
    model = lab.build_decoder(cfg, device="cuda")
    k, v = lab.make_kv_cache(cfg, 8, device="cuda")
    g = lab.GraphedStep(lambda t: model(t, k, v), lab.make_tokens(cfg, 8, device="cuda", seed=7))
    a = g(lab.make_tokens(cfg, 8, device="cuda", seed=8)).clone()
    b = g(lab.make_tokens(cfg, 8, device="cuda", seed=9)).clone()
    assert not torch.equal(a, b), "two replays with different tokens must give different logits (copy_ into the buffer)"
