"""Lab 01 tests: resolution, the floor, the override, dtypes, plugins, refusals, and mini's seam."""

from __future__ import annotations

import copy
import warnings
from pathlib import Path

import pytest

from course.runtime import lab_module

lab = lab_module(__file__)  # solution.py by default; LAB_IMPL=starter grades starter.py

ROOT = Path(__file__).resolve().parents[3]
CHECKPOINT = ROOT / "mini_vllm" / "checkpoints" / "course-llama"


def mytpu(name="mytpu", device_type="tpu", backend="pallas"):
    return lab.Platform(name, device_type, backend, {"bfloat16", "float32"}, True)


def test_resolution_prefers_the_accelerator():
    reg = lab.make_default_platforms()
    for devices in (["cpu", "cuda"], ["cuda", "cpu"], ["cuda"]):
        p = reg_choice = lab.resolve_platform(reg, devices)
        assert p.name == "cuda", f"with devices {devices} the GPU must win over the cpu floor, got {p.name!r}"
        assert (reg_choice.attention_backend, reg_choice.supports_graphs) == ("flash_attn", True), (
            "cuda brings its answers as a bundle: attention 'flash_attn' and graph support True, "
            f"got {reg_choice.attention_backend!r}, {reg_choice.supports_graphs!r}"
        )
    cpu = reg["cpu"]
    assert (cpu.device_type, cpu.attention_backend, cpu.supports_graphs) == ("cpu", "torch_sdpa", False), (
        f"the cpu platform is device 'cpu', attention 'torch_sdpa', no graphs; got {cpu}"
    )


def test_cpu_is_the_floor():
    reg = lab.make_default_platforms()
    for devices in ([], ["cpu"], ["rocm"], ["tpu", "xpu"]):
        p = lab.resolve_platform(reg, devices)
        assert p.name == "cpu", (
            f"devices {devices} match no accelerator in the registry: resolve to cpu, got {p.name!r}"
        )
    del reg["cpu"]
    with pytest.raises(LookupError, match="cpu"):
        lab.resolve_platform(reg, [])


def test_override_wins_and_unknown_is_loud():
    reg = lab.make_default_platforms()
    assert lab.resolve_platform(reg, ["cpu", "cuda"], override="cpu").name == "cpu", (
        "an override beats detection (the bisection knob): override='cpu' with a GPU present must give cpu"
    )
    assert lab.resolve_platform(reg, [], override="cuda").name == "cuda", (
        "the override does not need detection"
    )
    for typo in ("cdua", "CPU", ""):
        with pytest.raises(ValueError, match="cpu.*cuda"):
            lab.resolve_platform(reg, ["cpu", "cuda"], override=typo)


def test_dtype_negotiation():
    reg = lab.make_default_platforms()
    cpu, cuda = reg["cpu"], reg["cuda"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert cpu.check_dtype("float16") == "float32", "fp16 is not a CPU dtype here: fall back to float32"
        assert caught, "a fallback must warn (degrade explicitly, never silently)"
        assert cpu.check_dtype("bfloat16") == "bfloat16", "bf16 runs everywhere: keep it"
        assert cuda.check_dtype("float16") == "float16", "cuda supports fp16: keep it"
        for odd in ("fp8", "float8_e4m3fn", "int4", ""):
            for p in (cpu, cuda):
                assert p.check_dtype(odd) == "float32", (
                    f"{p.name}.check_dtype({odd!r}) must fall back to float32"
                )
    assert "float16" not in cpu.supported_dtypes and "bfloat16" in cuda.supported_dtypes


def test_out_of_tree_plugin_changes_decisions_without_core_edits():
    reg = lab.make_default_platforms()
    before = copy.deepcopy(reg)
    lab.register_platform(reg, mytpu())
    p = lab.resolve_platform(reg, ["cpu", "tpu"])
    assert (p.name, p.attention_backend) == ("mytpu", "pallas"), (
        f"the plugin's device is present: expected mytpu/pallas, got {p}"
    )
    assert lab.resolve_platform(reg, ["cpu", "cuda"]).name == "cuda", (
        "absent hardware: the plugin must not activate"
    )
    assert lab.resolve_platform(reg, ["cpu"]).name == "cpu"
    assert {k: reg[k] for k in before} == before, "registering a plugin must not change the in-tree platforms"
    fresh = lab.make_default_platforms()
    assert sorted(fresh) == ["cpu", "cuda"], (
        f"make_default_platforms must build a fresh registry, got {sorted(fresh)}"
    )


def test_plugin_wins_over_in_tree_when_both_are_detected():
    reg = lab.make_default_platforms()
    lab.register_platform(reg, mytpu(device_type="cuda", backend="vendor_attn"))
    p = lab.resolve_platform(reg, ["cuda", "cpu"])
    assert p.name == "mytpu", (
        "a plugin that claims the detected device wins over the in-tree platform (upstream checks "
        f"out-of-tree plugins first), got {p.name!r}"
    )


def test_two_activated_plugins_is_an_error_naming_both():
    reg = lab.make_default_platforms()
    lab.register_platform(reg, mytpu("vendor_a", "npu"))
    lab.register_platform(reg, mytpu("vendor_b", "npu"))
    with pytest.raises(ValueError, match="vendor_a.*vendor_b"):
        lab.resolve_platform(reg, ["npu"])
    assert lab.resolve_platform(reg, ["npu"], override="vendor_b").name == "vendor_b", (
        "the override settles it"
    )


def test_duplicate_registration_is_refused():
    reg = lab.make_default_platforms()
    cpu = reg["cpu"]
    for name in ("cpu", "cuda"):
        with pytest.raises(ValueError, match=name):
            lab.register_platform(reg, lab.Platform(name, "cpu", "evil_attn", {"float32"}, False))
    assert reg["cpu"] is cpu and reg["cpu"].attention_backend == "torch_sdpa", (
        "a refused plugin must change nothing"
    )
    lab.register_platform(reg, mytpu())
    with pytest.raises(ValueError, match="mytpu"):
        lab.register_platform(reg, mytpu(backend="other"))
    assert reg["mytpu"].attention_backend == "pallas", "the first registration stays"
    with pytest.raises(TypeError):
        lab.register_platform(reg, {"name": "dict"})


def test_resolution_does_not_modify_its_inputs():
    reg = lab.make_default_platforms()
    devices = ["cuda", "cpu"]
    names = sorted(reg)
    lab.resolve_platform(reg, devices)
    assert devices == ["cuda", "cpu"] and sorted(reg) == names


# -- graded through mini_vllm: your platform runs the engine ----------------------------------------
def _greedy(platform_obj):
    from mini_vllm.engine import LLMEngine
    from mini_vllm.platforms import use_platform
    from mini_vllm.sampling_params import SamplingParams

    with use_platform(platform_obj):
        engine = LLMEngine(model=str(CHECKPOINT), num_gpu_blocks=32, block_size=16)
        outs = engine.generate(["Once upon a time", "The cat"], SamplingParams(temperature=0.0, max_tokens=8))
    return engine, [o.outputs[0].token_ids for o in outs]


def test_your_platform_runs_minis_engine():
    from mini_vllm.platforms.numpy_platform import NumpyPagedAttentionBackend, NumpyPlatform
    from mini_vllm.platforms.torch_cpu import TorchSDPABackend

    _, want = _greedy(NumpyPlatform())
    reg = lab.make_default_platforms()
    chosen = lab.resolve_platform(reg, [])
    engine, got = _greedy(lab.as_mini_platform(chosen))
    assert engine.platform.device_name == "cpu", (
        f"the engine must run the platform you resolved, got {engine.platform}"
    )
    backend = engine.model_executor.driver_worker.attn_backend
    assert backend is TorchSDPABackend, f"cpu's 'torch_sdpa' must select mini's torch kernels, got {backend}"
    assert got == want, "same checkpoint, same greedy tokens on every platform"
    lab.register_platform(reg, lab.Platform("npu0", "npu", "numpy_paged", {"float32"}, False))
    engine, got = _greedy(lab.as_mini_platform(lab.resolve_platform(reg, ["npu"])))
    assert engine.model_executor.driver_worker.attn_backend is NumpyPagedAttentionBackend, (
        "a plugin naming 'numpy_paged' must switch mini's engine to the numpy kernels, with no core edit"
    )
    assert got == want
    assert engine.platform.support_static_graph_mode() is False


def test_a_backend_mini_cannot_run_is_refused():
    reg = lab.make_default_platforms()
    with pytest.raises(ValueError, match="flash_attn"):
        lab.as_mini_platform(reg["cuda"])
    assert lab.as_mini_platform(
        lab.Platform("g", "cpu", "torch_sdpa", {"float32"}, True)
    ).support_static_graph_mode()
