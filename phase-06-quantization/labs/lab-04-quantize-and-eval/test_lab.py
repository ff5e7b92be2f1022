import itertools

import pytest
import torch
from torch import nn

from course.runtime import lab_module

lab = lab_module(__file__)   # solution.py by default; LAB_IMPL=starter grades starter.py


EXPECTED_BYTES = {
    "fp16": 1_048_576,       # 524,288 weights x 2 B
    "int8": 529_408,         # 524,288 x 1 B + (1,024 + 256) fp32 scales x 4 B
    "fp8-w8a16": 524_296,    # 524,288 x 1 B + 2 per-tensor fp32 scales
    "fp8": 524_296,
    "int4-g32": 294_912,     # 262,144 B of nibbles + (1,024 x 8 + 256 x 32) fp16 scales x 2 B
    "int4-g128": 270_336,    # 262,144 B of nibbles + (1,024 x 2 + 256 x 8) fp16 scales x 2 B
}


@pytest.fixture(scope="module")
def setup():
    model, x = lab.build_model(), lab.sample_inputs()
    try:
        quantized = {fmt: lab.quantize_model(model, fmt) for fmt in lab.FORMATS}
    except NotImplementedError as exc:
        pytest.fail(f"quantize_model is not written yet: {exc}")
    return model, x, quantized


def test_registry_returns_a_method_per_format():
    for fmt in lab.FORMATS:
        m = lab.get_quant_method(fmt)
        assert isinstance(m, lab.LinearMethod), f"get_quant_method({fmt!r}) must return a LinearMethod, got {type(m).__name__}"
    assert isinstance(lab.get_quant_method("fp16"), lab.UnquantizedMethod), "'fp16' is the UnquantizedMethod baseline"
    assert lab.get_quant_method("int4-g32").group_size == 32, "'int4-g32' means group_size 32: parse the number after 'g'"
    assert lab.get_quant_method("fp8").quantize_activations is True, "'fp8' is W8A8: activations are quantized too"
    assert lab.get_quant_method("fp8-w8a16").quantize_activations is False, "'fp8-w8a16' leaves activations in float"
    with pytest.raises(ValueError, match="int8"):
        lab.get_quant_method("int3")      # unknown: the message should list the known formats


def test_quantize_model_swaps_every_linear_and_leaves_the_original(setup):
    model, _, quantized = setup
    q = quantized["int8"]
    swapped = [m for m in q.modules() if isinstance(m, lab.QuantLinear)]
    assert len(swapped) == 2, f"both nn.Linear layers must become QuantLinear, found {len(swapped)}"
    assert not any(isinstance(m, nn.Linear) for m in q.modules()), "no plain nn.Linear may remain in the quantized copy"
    assert isinstance(q[1], nn.GELU), "only the linears change: the GELU (the model code) stays as it was"
    assert all(isinstance(model[i], nn.Linear) for i in (0, 2)), (
        "quantize_model must not modify the model it was given: copy.deepcopy it first"
    )
    assert q[0].quant_method is not q[2].quant_method, "each layer gets its own method object from get_quant_method"


def test_quantize_model_reaches_nested_linears():
    g = torch.Generator().manual_seed(3)
    block = nn.Sequential(nn.Linear(64, 128, bias=False), nn.GELU(), nn.Linear(128, 64, bias=False))
    model = nn.Sequential(block, nn.Sequential(nn.LayerNorm(64), nn.Linear(64, 64, bias=False)))
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.Linear):
                m.weight.copy_(torch.randn(m.weight.shape, generator=g) / m.in_features**0.5)
    q = lab.quantize_model(model, "int8")
    left = [name for name, m in q.named_modules() if isinstance(m, nn.Linear)]
    assert not left, (
        f"real models nest their linear layers inside blocks; these stayed plain nn.Linear: {left}. "
        f"Walk every module (named_modules), not only the top-level children"
    )
    assert sum(isinstance(m, lab.QuantLinear) for m in q.modules()) == 3, "all three nested linears become QuantLinear"
    x = torch.randn(4, 64, generator=g)
    err = lab.output_error(model, q, x)
    assert err < 0.02, f"the nested int8 model should stay within 2% of the original, got {err:.3%}"

def test_weight_bytes_per_format(setup):
    _, _, quantized = setup
    for fmt, want in EXPECTED_BYTES.items():
        got = lab.weight_bytes(quantized[fmt])
        assert got == want, f"{fmt}: expected {want:,} stored bytes, got {got:,}"
    layer = quantized["int4-g128"][0]
    assert layer.qweight.dtype == torch.uint8 and tuple(layer.qweight.shape) == (1024, 128), (
        f"int4: two nibbles per byte, so the (1024, 256) weight is stored as uint8 (1024, 128), got "
        f"{layer.qweight.dtype} {tuple(layer.qweight.shape)}"
    )
    assert layer.scales.dtype == torch.float16, "int4 group scales are fp16"
    assert quantized["fp8"][0].weight.dtype == torch.float8_e4m3fn, "fp8 weights are stored as torch.float8_e4m3fn"
    assert quantized["int8"][2].qweight.dtype == torch.int8, "int8 weights are stored as torch.int8"
    assert tuple(quantized["int8"][2].weight_scale.shape) == (256,), "int8 W8A16: one scale per OUTPUT channel"


def test_output_error_ordering(setup):
    model, x, quantized = setup
    err = {fmt: lab.output_error(model, quantized[fmt], x) for fmt in lab.FORMATS}
    order = ["fp16", "int8", "fp8-w8a16", "fp8", "int4-g32", "int4-g128"]
    for a, b in itertools.pairwise(order):
        assert err[a] < err[b], f"expected error({a}) < error({b}), got {err[a]:.3%} vs {err[b]:.3%} (all: {err})"
    assert err["fp16"] < 0.001, f"16-bit weights should be within 0.1% of fp32, got {err['fp16']:.3%}"
    assert err["int8"] < 0.02, f"int8 per-channel weights should be within 2%, got {err['int8']:.3%}"
    assert err["int4-g128"] < 0.25, f"round-to-nearest int4 g128 should stay under 25%, got {err['int4-g128']:.3%}"


def test_quantize_fp8_maps_the_max_to_448():
    t = torch.tensor([[0.5, -3.0, 1.0], [0.01, 0.02, -0.04]])
    t8, s = lab.quantize_fp8(t)
    assert t8.dtype == torch.float8_e4m3fn, f"quantize_fp8 must return a float8_e4m3fn tensor, got {t8.dtype}"
    assert float(t8.float().abs().max()) == 448.0, "the largest |value| must land on e4m3's largest finite value, 448"
    assert torch.isclose(s.reshape(()), torch.tensor(3.0 / 448)), f"per-tensor scale = max|t| / 448, got {s}"
    t8r, sr = lab.quantize_fp8(t, dim=-1)
    assert tuple(sr.shape) == (2, 1), f"dim=-1 gives one scale per row with keepdim, shape (2, 1), got {tuple(sr.shape)}"
    assert torch.allclose(t8r.float().abs().amax(dim=1), torch.tensor([448.0, 448.0])), "each row's max maps to 448"


def test_quantize_fp8_zero_rows_get_scale_one():
    t = torch.tensor([[0.0, 0.0, 0.0], [1.0, -2.0, 0.5]])      # a padding token: an all-zero activation row
    t8, s = lab.quantize_fp8(t, dim=-1)
    assert torch.isfinite(t8.float()).all() and s.reshape(-1).tolist()[0] == 1.0, (
        f"an all-zero row must get scale 1 (its values stay 0), not 0/0 = NaN; got scales {s.reshape(-1).tolist()} "
        f"and row 0 = {t8.float()[0].tolist()}. Guard the zero max per ROW, not only for the whole tensor"
    )
    assert torch.allclose(t8.float() * s, t, atol=1e-2), "dequantized rows must give t back (to e4m3 precision)"
    z8, zs = lab.quantize_fp8(torch.zeros(2, 3))
    assert float(zs.reshape(())) == 1.0 and (z8.float() == 0).all(), "an all-zero tensor: scale 1, values 0"


def test_fp8_scales_activations_per_token():
    g = torch.Generator().manual_seed(7)
    w = torch.randn(64, 128, generator=g) / 128**0.5
    x = torch.randn(2, 128, generator=g)
    x[0] *= 1e5                                    # one very loud token next to a normal one
    layer = lab.QuantLinear(w, lab.get_quant_method("fp8"))
    y, ref = layer(x), x @ w.T
    quiet = float((y[1] - ref[1]).norm() / ref[1].norm())
    assert quiet < 0.1, (
        f"the quiet token's output is {quiet:.1%} off: with ONE scale for the whole activation tensor the loud "
        f"token pushes it below e4m3's smallest values. Quantize x with one scale per token (dim=-1), as vLLM's "
        f"dynamic fp8 scheme does"
    )


@pytest.mark.parametrize("fmt", ["int8", "fp8", "fp8-w8a16", "int4-g32"])
def test_a_pruned_output_row_stays_zero_in_every_format(fmt):
    # an all-zero weight row has max 0: every format must give it scale 1 (zeros stay zeros), never 0 / 0
    g = torch.Generator().manual_seed(9)
    w = torch.randn(8, 128, generator=g) / 128**0.5
    w[3] = 0.0
    x = torch.randn(4, 128, generator=g)
    y = lab.QuantLinear(w, lab.get_quant_method(fmt))(x)
    assert torch.isfinite(y).all() and (y[:, 3] == 0).all(), (
        f"{fmt}: the all-zero weight row 3 gave output column {y[:, 3].tolist()}: a zero max needs scale 1, "
        "not max / qmax = 0 (and 0 / 0 = NaN)"
    )


@pytest.mark.parametrize("name", ["int4-g64", "int4-g0", "int4-g", "fp8-w8a8", "FP16"])
def test_registry_rejects_names_close_to_a_known_format(name):
    # The registry knows exactly lab.FORMATS; a near-miss must be refused up front, never half-parsed.
    try:
        got = lab.get_quant_method(name)
    except ValueError as exc:
        assert "int4-g128" in str(exc), (
            f"the ValueError for {name!r} should list the known formats, got {exc}"
        )
        return
    pytest.fail(
        f"get_quant_method({name!r}) returned {type(got).__name__} instead of raising ValueError: only the names in "
        f"FORMATS ({', '.join(lab.FORMATS)}) are formats; check membership before parsing a group size"
    )
