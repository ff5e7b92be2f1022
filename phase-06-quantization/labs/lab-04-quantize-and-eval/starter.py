"""Lab 06-04 — quantize a model and measure what it costs (starter: write the quantizers, CPU path).

A small seeded torch model (an MLP block: Linear 256→1024, GELU, Linear 1024→256, no biases) is
quantized four ways, through the same two-method interface vLLM uses for every format:

    get_quant_method(fmt)  ->  a LinearMethod           (vLLM: QuantizationConfig.get_quant_method)
    method.create_weights(layer, weight)                (allocate + fill the stored tensors)
    method.apply(layer, x) -> y                         (the layer's matmul, in that format)

Formats (names as a model card would write them):

* ``fp16``      16-bit weights, the serving baseline.
* ``int8``      W8A16: int8 weights, one fp32 scale per output channel; activations untouched.
* ``fp8``       W8A8: float8_e4m3fn weights with ONE per-tensor scale (what vLLM's online
                ``quantization="fp8"`` stores), and activations quantized to e4m3 per token on
                every call (its "dynamic" activation scheme). The matmul runs on the fp8 values and
                both scales are applied once to the result, as a scaled-mm kernel does.
* ``fp8-w8a16`` the same fp8 weights with activations left alone: what vLLM falls back to (Marlin,
                weight-only) on GPUs without fp8 tensor cores.
* ``int4-g128`` / ``int4-g32``  W4A16: int4 nibbles packed two per byte (lab-02's layout), one
                fp16 scale per group of 128 (or 32) inputs.

``quantize_model`` swaps every ``nn.Linear`` for a ``QuantLinear`` whose ``forward`` only calls
``self.quant_method.apply``: the model code never branches on the format.

On a GPU box, ``run.py`` does the same comparison with the real vLLM 0.22.1 and a real model.
"""

from __future__ import annotations

import torch
from torch import nn

from course.runtime import use_lab

LAB03 = use_lab("phase-06/lab-02-int4-groups-and-packing")   # lab-02's reference

FP8 = torch.float8_e4m3fn
FP8_MAX = float(torch.finfo(FP8).max)     # 448.0: the largest finite e4m3fn value
FORMATS = ("fp16", "int8", "fp8-w8a16", "fp8", "int4-g32", "int4-g128")


# --------------------------------------------------------------------------- provided: the interface
class LinearMethod:
    """One quantization format for linear layers (vLLM: ``LinearMethodBase``)."""

    def create_weights(self, layer: QuantLinear, weight: torch.Tensor) -> None:
        """Compute and register on ``layer`` the tensors this format stores for ``weight`` (out, in)."""
        raise NotImplementedError

    def apply(self, layer: QuantLinear, x: torch.Tensor) -> torch.Tensor:
        """``y ≈ x @ weight.T`` from the stored tensors; ``x`` is (tokens, in) float32."""
        raise NotImplementedError


class UnquantizedMethod(LinearMethod):
    """The fp16 baseline (vLLM: ``UnquantizedLinearMethod``): store the weight in 16 bits."""

    def create_weights(self, layer, weight):
        layer.register_buffer("weight", weight.to(torch.float16))

    def apply(self, layer, x):
        return x @ layer.weight.float().T


class QuantLinear(nn.Module):
    """A linear layer that owns a method and delegates its math to it (vLLM: ``LinearBase``)."""

    def __init__(self, weight: torch.Tensor, quant_method: LinearMethod):
        super().__init__()
        self.out_features, self.in_features = weight.shape
        self.quant_method = quant_method
        quant_method.create_weights(self, weight.detach().float())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.quant_method.apply(self, x)


# --------------------------------------------------------------------------- the lab
def quantize_fp8(t: torch.Tensor, dim: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Scale ``t`` into e4m3's range and cast: returns ``(t_fp8, scale)`` with ``t ≈ t_fp8.float() * scale``.

    ``dim=None``: one scale for the tensor, ``max|t| / 448``. ``dim=-1``: one scale per row (per
    token), shape (rows, 1). A zero max gets scale 1. Values are clamped to ±448 before the cast
    (some backends turn out-of-range values into NaN instead of saturating).
    """
    raise NotImplementedError(
        'quantize_fp8: find the largest |value| (over the whole tensor, or along `dim` keeping the '
        'dimension so a (rows, 1) scale comes out), map it to FP8_MAX, replace a zero scale by 1, '
        'and clamp to +/-FP8_MAX before the cast to FP8 (e4m3fn has no infinity)'
    )


class Int8PerChannelMethod(LinearMethod):
    """W8A16: ``qweight`` int8 (out, in) and ``weight_scale`` float32 (out,), ``scale = max|row| / 127``."""

    def create_weights(self, layer, weight):
        raise NotImplementedError(
            "Int8PerChannelMethod.create_weights: lab-01's per-channel recipe in torch (one scale "
            'per OUTPUT row, zero rows -> 1, round, clamp to +/-127, store as torch.int8); register'
            " the two tensors as buffers named 'qweight' and 'weight_scale' so weight_bytes can "
            'count them'
        )

    def apply(self, layer, x):
        raise NotImplementedError(
            'Int8PerChannelMethod.apply: rebuild the float weight from layer.qweight and '
            'layer.weight_scale (each row times its own scale), then compute y the way nn.Linear '
            'does'
        )


class Fp8Method(LinearMethod):
    """``weight`` float8_e4m3fn (out, in) + ``weight_scale`` (one float32, shape (1,)).

    ``quantize_activations=True`` is W8A8: every call quantizes ``x`` to e4m3 with one scale per
    token, multiplies the fp8 values, and applies both scales to the result. ``False`` is W8A16:
    the weight is dequantized and ``x`` is used as is.
    """

    def __init__(self, quantize_activations: bool = True):
        self.quantize_activations = quantize_activations

    def create_weights(self, layer, weight):
        raise NotImplementedError(
            'Fp8Method.create_weights: one per-tensor call of your quantize_fp8 on the weight; '
            "register the e4m3 tensor as 'weight' and its scale, shaped (1,), as 'weight_scale'"
        )

    def apply(self, layer, x):
        raise NotImplementedError(
            'Fp8Method.apply: W8A16 (quantize_activations False) dequantizes the weight and '
            'multiplies as usual; W8A8 also quantizes x with ONE SCALE PER TOKEN, multiplies the '
            'two fp8 tensors (as float), and only then applies both scales to the product, as a '
            'scaled-mm epilogue does'
        )


class Int4GroupMethod(LinearMethod):
    """W4A16: ``qweight`` uint8 (out, in // 2), two nibbles per byte; ``scales`` float16 (out, in // group)."""

    def __init__(self, group_size: int = 128):
        self.group_size = group_size

    def create_weights(self, layer, weight):
        raise NotImplementedError(
            "Int4GroupMethod.create_weights: lab-02's reference (LAB03) already quantizes in groups"
            ' and packs nibbles; run it on the weight as numpy with self.group_size and register '
            "the packed bytes as 'qweight' and the fp16 scales as 'scales' (torch tensors)"
        )

    def apply(self, layer, x):
        raise NotImplementedError(
            "Int4GroupMethod.apply: reverse create_weights with lab-02's helpers (unpack the "
            'nibbles, multiply by the group scales) to get the float weight back, then multiply as '
            'nn.Linear would'
        )


def get_quant_method(fmt: str) -> LinearMethod:
    """The registry: a format name -> a fresh method object. Unknown names raise ValueError listing FORMATS."""
    raise NotImplementedError(
        'get_quant_method: map each name in FORMATS to a NEW method object (fp8 and fp8-w8a16 '
        "differ only in quantize_activations; the number after 'int4-g' is the group size); any "
        'other name must raise ValueError whose message lists the known FORMATS'
    )


def quantize_model(model: nn.Module, fmt: str) -> nn.Module:
    """A deep copy of ``model`` with every ``nn.Linear`` replaced by a ``QuantLinear`` for ``fmt``.

    The original model is left untouched. Each layer gets its own method object from
    ``get_quant_method``.
    """
    raise NotImplementedError(
        'quantize_model: work on a copy.deepcopy of the model; walk EVERY module, not only the top '
        'level (real models nest their linears), and replace each nn.Linear child via setattr on '
        'its parent with a QuantLinear built from its weight and a fresh get_quant_method(fmt)'
    )


# --------------------------------------------------------------------------- provided: model, meters
def build_model(seed: int = 0, d_model: int = 256, d_hidden: int = 1024) -> nn.Sequential:
    """The seeded fp32 MLP block every format is measured on (weights ~ N(0, 1/fan_in))."""
    g = torch.Generator().manual_seed(seed)
    model = nn.Sequential(nn.Linear(d_model, d_hidden, bias=False), nn.GELU(), nn.Linear(d_hidden, d_model, bias=False))
    with torch.no_grad():
        for layer in (model[0], model[2]):
            layer.weight.copy_(torch.randn(layer.weight.shape, generator=g) / layer.in_features**0.5)
    return model


def sample_inputs(seed: int = 1, tokens: int = 64, d_model: int = 256) -> torch.Tensor:
    """A seeded batch of activations, (tokens, d_model)."""
    return torch.randn(tokens, d_model, generator=torch.Generator().manual_seed(seed))


def weight_bytes(model: nn.Module) -> int:
    """Bytes of every stored weight tensor: parameters of plain layers plus buffers of QuantLinear layers."""
    total = 0
    for module in model.modules():
        if isinstance(module, QuantLinear):
            total += sum(b.numel() * b.element_size() for b in module.buffers(recurse=False))
        elif isinstance(module, nn.Linear):
            total += sum(p.numel() * p.element_size() for p in module.parameters(recurse=False))
    return total


def output_error(reference: nn.Module, candidate: nn.Module, x: torch.Tensor) -> float:
    """Relative Frobenius error of ``candidate(x)`` against ``reference(x)``."""
    with torch.no_grad():
        y, y_hat = reference(x), candidate(x)
    return float((y_hat - y).norm() / y.norm())


def main() -> None:
    model, x = build_model(), sample_inputs()
    n_params = sum(p.numel() for p in model.parameters())
    print(f"MLP block 256 -> 1024 -> 256 (GELU), {n_params:,} weights; 64 seeded tokens; reference = fp32")
    print(f"{'format':<10} {'what is stored':<44} {'bytes':>9} {'vs fp16':>8} {'error':>8}")
    what = {"fp16": "16-bit weights",
            "int8": "int8 + fp32 scale per out channel (W8A16)",
            "fp8-w8a16": "e4m3 + 1 fp32 scale (W8A16)",
            "fp8": "e4m3 + 1 scale; x -> e4m3 per token (W8A8)",
            "int4-g128": "2 nibbles/byte + fp16 scale per 128 (W4A16)",
            "int4-g32": "2 nibbles/byte + fp16 scale per 32 (W4A16)"}
    base = None
    for fmt in FORMATS:
        q = quantize_model(model, fmt)
        nbytes = weight_bytes(q)
        base = base or nbytes
        print(f"{fmt:<10} {what[fmt]:<44} {nbytes:>9,} {base / nbytes:>7.2f}x {output_error(model, q, x):>8.3%}")
    print()
    print("Decode is weight-bandwidth-bound, so the 'vs fp16' column is also the ceiling on the")
    print("decode speedup of the weight read (predicted, not measured; Phase 0's roofline).")


if __name__ == "__main__":
    main()
