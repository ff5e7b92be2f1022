"""Lab 11-02: LoRA economics. Grades solution.py, or starter.py with LAB_IMPL=starter.

``test_adapter_size_matches_the_lab02_capture`` keeps its planned name: "lab02" is the serving
capture's lab in the first plan (the "0.03 GiB" vLLM logs for this adapter).
"""

import pytest

from course.runtime import lab_module

lab = lab_module(__file__)   # solution.py by default; LAB_IMPL=starter grades starter.py

MIB, GIB = 1024**2, 1024**3


def test_per_layer_params():
    assert lab.lora_params_per_layer(4096, 4096, 16) == 131_072, "r·(in+out) = 16·8192 = 131,072"
    assert lab.lora_params_per_layer(4096, 11008, 8) == 8 * (4096 + 11008), (
        "non-square layers (Llama's MLP up-projection): A is (r, in), B is (out, r) — r·(in+out), not r·in·out"
    )
    assert lab.lora_params_per_layer(1, 1, 1) == 2


def test_adapter_size_matches_the_lab02_capture():
    b = lab.adapter_bytes(4096, 32, 16)
    assert b == 32 * MIB, (
        f"131,072 params × 4 targets (q,k,v,o) × 32 layers × 2 bytes (fp16) = 32 MiB, got {b / MIB} MiB"
    )
    assert round(b / GIB, 2) == 0.03, "vLLM's log rounds 32 MiB to '0.03 GiB'"


def test_thirty_two_adapters_per_gib():
    got = lab.adapters_per_gib(4096, 32, 16)
    assert got == 32, f"1 GiB / 32 MiB = 32 adapters (binary GiB, 2**30 bytes), got {got}"
    assert lab.adapters_per_gib(4096, 32, 8) == 64, "halving the rank doubles the adapters per GiB"


def test_hundreds_of_adapters_per_gib():
    """'Hundreds per GiB' is true only for small adapters: the q/k/v/o r = 16 adapter gives 32."""
    assert lab.adapters_per_gib(4096, 32, 16) == 32, "the headline adapter (q,k,v,o, r = 16) gives 32 per GiB, not hundreds"
    assert lab.adapters_per_gib(4096, 32, 4, targets=2) == 256, (
        "r = 4 on q and v only: 4 · 8192 · 2 · 32 · 2 B = 4 MiB, so 256 per GiB; pass rank and targets on"
    )


def test_per_gib_passes_targets_and_dtype_on():
    assert lab.adapters_per_gib(4096, 32, 16, targets=8) == 16, (
        "8 targets make a 64 MiB adapter: 16 per GiB; pass targets on to adapter_bytes"
    )
    assert lab.adapters_per_gib(4096, 32, 16, bytes_per_param=4) == 16, (
        "fp32 (4 bytes) makes a 64 MiB adapter: 16 per GiB; pass bytes_per_param on to adapter_bytes"
    )


def test_shrink_ratio_is_the_headline():
    got = lab.shrink_ratio(7_000_000_000, 4096, 32, 16)
    assert 400 <= got <= 450, f"7e9 / 16,777,216 adapter params ≈ 417x, got {got:.1f}x (compare parameters with parameters)"
    assert got == pytest.approx(7_000_000_000 / 16_777_216)


def test_rank_is_a_linear_dial():
    r16, r64 = lab.adapter_bytes(4096, 32, 16), lab.adapter_bytes(4096, 32, 64)
    assert r64 == 4 * r16, "adapter size is linear in r: r=64 costs exactly 4x r=16"
    assert lab.adapter_bytes(4096, 16, 16) * 2 == r16, "and linear in the layer count"


def test_targets_and_dtype_are_parameters():
    assert lab.adapter_bytes(4096, 32, 16, targets=7) == 7 * 8 * MIB, "7 targets (q,k,v,o,gate,up,down if square) = 56 MiB"
    assert lab.adapter_bytes(4096, 32, 16, bytes_per_param=4) == 64 * MIB, "fp32 doubles the bytes"
    assert lab.shrink_ratio(7_000_000_000, 4096, 32, 16, targets=8) == pytest.approx(7e9 / (8 * 131_072 * 32))


def test_gpus_saved():
    assert lab.gpus_saved(100, 8) == 87, "100 tenants on max_loras=8 need ceil(100/8) = 13 engines: 87 saved"
    assert lab.gpus_saved(96, 8) == 84, "96/8 = 12 engines exactly: no extra engine when it divides"
    assert lab.gpus_saved(100, 1) == 0, "one adapter per engine saves nothing"
    assert lab.gpus_saved(5, 8) == 4, "fewer tenants than slots still needs one engine"


@pytest.mark.parametrize(
    ("func", "args", "kwargs"),
    [
        ("lora_params_per_layer", (4096, 4096, 0), {}),
        ("lora_params_per_layer", (-1, 4096, 16), {}),
        ("adapter_bytes", (4096, 0, 16), {}),
        ("adapter_bytes", (4096, 32, 16), {"targets": 0}),
        ("shrink_ratio", (0, 4096, 32, 16), {}),
        # every size of shrink_ratio is checked, not only base_params (0 layers would divide by zero)
        ("shrink_ratio", (7_000_000_000, 4096, 0, 16), {}),
        ("shrink_ratio", (7_000_000_000, 4096, -32, 16), {}),
        ("shrink_ratio", (7_000_000_000, 4096, 32, 16), {"targets": 0}),
        ("gpus_saved", (100, 0), {}),
        ("gpus_saved", (0, 8), {}),
        ("lora_params_per_layer", (4096, 4096, 16.0), {}),
        # bool is a subclass of int: True slips through as 1 unless _positive refuses bools by name
        ("gpus_saved", (100, True), {}),
        ("adapter_bytes", (4096, 32, 16), {"targets": True}),
        ("lora_params_per_layer", (4096, 4096, True), {}),
    ],
)
def test_bad_sizes_are_rejected(func, args, kwargs):
    call = f"{func}{args}" + (f" with {kwargs}" if kwargs else "")
    try:
        getattr(lab, func)(*args, **kwargs)
    except ValueError as exc:
        assert "positive int" in str(exc), (
            f"{call}: the ValueError should say a positive int is needed; got {exc}"
        )
    else:
        pytest.fail(
            f"{call} returned instead of raising ValueError: every size must be a positive int "
            "(not 0, not negative, not a float, not a bool)"
        )
