"""Lab 03 tests: the dist-info you write is found, vLLM picks your platform and resolves your model,
and the same plugin drives mini_vllm, with nothing installed."""

from __future__ import annotations

import importlib.metadata
import sys
from pathlib import Path

import pytest

from course.runtime import lab_module

lab = lab_module(__file__)  # solution.py by default; LAB_IMPL=starter grades starter.py

ROOT = Path(__file__).resolve().parents[3]
CHECKPOINT = ROOT / "mini_vllm" / "checkpoints" / "course-llama"
GROUPS = (
    "vllm.platform_plugins",
    "vllm.general_plugins",
    "mini_vllm.platform_plugins",
    "mini_vllm.general_plugins",
)


def test_entry_points_name_the_four_hooks():
    eps = lab.entry_points("vendorplug")
    assert set(eps) == set(GROUPS), f"one entry per group {GROUPS}, got groups {sorted(eps)}"
    targets = {t for entries in eps.values() for t in entries.values()}
    assert targets == {
        "vendorplug:register_vllm_platform",
        "vendorplug:register_vllm_model",
        "vendorplug:register_mini_platform",
        "vendorplug:register_mini_model",
    }, f"targets are 'module:function' (a colon before the function), got {sorted(targets)}"


def test_install_writes_a_dist_info_python_finds(tmp_path):
    root = lab.install_plugin(tmp_path / "site", module="vendorplug", version="2.3")
    dists = list(importlib.metadata.distributions(path=[str(root)]))
    assert [d.metadata["Name"] for d in dists] == ["vendorplug"], "one distribution, named in METADATA"
    assert dists[0].version == "2.3"
    found = {(ep.group, ep.name, ep.value) for ep in dists[0].entry_points}
    want = {(g, n, t) for g, entries in lab.entry_points("vendorplug").items() for n, t in entries.items()}
    assert found == want, f"entry_points.txt must declare exactly {sorted(want)}, Python read {sorted(found)}"
    assert (root / "vendorplug.py").read_text() == Path(lab.__file__).read_text(), (
        "the plugin module is this file"
    )


def test_the_platform_declines_without_its_device(monkeypatch):
    monkeypatch.setenv(lab.DEVICE_ENV, "0")
    assert lab.register_vllm_platform() is None and lab.register_mini_platform() is None, (
        "with the device absent a platform plugin returns None, so another platform can be chosen"
    )
    monkeypatch.setenv(lab.DEVICE_ENV, "1")
    assert lab.register_vllm_platform().endswith(".ToyPlatform")
    assert lab.register_mini_platform().endswith(".ToyMiniPlatform")


@pytest.mark.upstream
def test_vllm_resolves_your_platform_and_model_in_process(tmp_path, monkeypatch):
    """vLLM's own resolution and plugin loader, run again in this process on your installed folder."""
    import vllm.platforms as vp
    from vllm import ModelRegistry
    from vllm.plugins import load_plugins_by_group

    monkeypatch.syspath_prepend(str(lab.install_plugin(tmp_path / "site")))
    monkeypatch.delenv(lab.DEVICE_ENV, raising=False)
    with pytest.raises(RuntimeError, match="course_cpu.*toy|toy.*course_cpu"):
        vp.resolve_current_platform_cls_qualname()  # the course's own plugin activates too: two is an error
    monkeypatch.setenv("VLLM_PLUGINS", "toy,toy_models")  # vLLM's allow-list: only yours
    try:
        qualname = vp.resolve_current_platform_cls_qualname()
        assert qualname == "toyplat.ToyPlatform", f"vLLM must activate your platform plugin, got {qualname}"
        platform = vp.resolve_obj_by_qualname(qualname)()
        assert platform.get_device_name() == "toy-accelerator", (
            f"get_device_name() must answer your name, got {platform.get_device_name()!r}"
        )
        assert platform.is_cpu() and platform.dist_backend == "gloo", (
            "subclass CpuPlatform: every hook you do not override keeps working answers"
        )
        for func in load_plugins_by_group("vllm.general_plugins").values():
            func()
        entry = ModelRegistry.models.get(lab.MODEL_ARCH)  # lazy: the class path, not yet imported
        where = (getattr(entry, "module_name", None), getattr(entry, "class_name", None))
        assert where == ("vllm.model_executor.models.llama", "LlamaForCausalLM"), (
            f"the general plugin must register {lab.MODEL_ARCH} as vLLM's Llama by name, got {entry}"
        )
        monkeypatch.setenv(lab.DEVICE_ENV, "0")
        assert vp.resolve_current_platform_cls_qualname() == "vllm.platforms.interface.UnspecifiedPlatform", (
            f"with {lab.DEVICE_ENV}=0 your plugin must decline"
        )
    finally:
        ModelRegistry.models.pop(lab.MODEL_ARCH, None)
        sys.modules.pop("toyplat", None)


@pytest.mark.upstream
@pytest.mark.slow
def test_vllm_picks_your_platform_and_resolves_your_model(tmp_path):
    child = lab.run_vllm_child(lab.install_plugin(tmp_path / "site"))
    assert child["platform"] == "ToyPlatform", (
        f"vLLM must activate your platform plugin, got {child['platform']} (vLLM logs a plugin that fails to "
        "import and carries on: check the group name, the 'module:function' target, the module's imports)"
    )
    assert child["device_name"] == "toy-accelerator", (
        f"get_device_name() must answer your name, got {child['device_name']!r}"
    )
    assert child["is_cpu"] is True and child["dist_backend"] == "gloo", (
        "subclass CpuPlatform: every hook you do not override keeps working answers"
    )
    assert child["model_cls"] == "vllm.model_executor.models.llama.LlamaForCausalLM", (
        f"the general plugin must register ToyPluginForCausalLM; vLLM resolved {child['model_cls']}"
    )
    assert child["without_device"] == "vllm.platforms.interface.UnspecifiedPlatform", (
        f"with {lab.DEVICE_ENV}=0 your plugin must decline, got {child['without_device']}"
    )


@pytest.mark.upstream
def test_the_general_plugin_is_idempotent(monkeypatch):
    from vllm import ModelRegistry

    calls = []
    real = ModelRegistry.register_model
    monkeypatch.setattr(ModelRegistry, "register_model", lambda *a, **k: (calls.append(a), real(*a, **k)))
    try:
        lab.register_vllm_model()
        lab.register_vllm_model()
        assert lab.MODEL_ARCH in ModelRegistry.get_supported_archs()
        assert len(calls) == 1, (
            f"general plugins may run many times: register once, got {len(calls)} registrations"
        )
    finally:
        ModelRegistry.models.pop(lab.MODEL_ARCH, None)


def test_the_same_plugin_drives_mini(tmp_path, monkeypatch):
    from mini_vllm import platforms
    from mini_vllm.engine import LLMEngine
    from mini_vllm.models.registry import ModelRegistry
    from mini_vllm.platforms.numpy_platform import NumpyPlatform
    from mini_vllm.sampling_params import SamplingParams
    from mini_vllm.testing.plugins import checkpoint_as

    params = SamplingParams(temperature=0.0, max_tokens=8)
    with platforms.use_platform(NumpyPlatform()):
        want = [
            o.outputs[0].token_ids
            for o in LLMEngine(model=str(CHECKPOINT), num_gpu_blocks=32).generate(["The cat"], params)
        ]
    for var in (platforms.FORCE_ENV, "MINI_VLLM_PLUGINS", lab.DEVICE_ENV):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.syspath_prepend(str(lab.install_plugin(tmp_path / "site")))
    platforms.reset_current_platform()
    platforms.reset_general_plugins()
    try:
        ckpt = checkpoint_as(CHECKPOINT, tmp_path / "ckpt", lab.MODEL_ARCH)
        engine = LLMEngine(model=str(ckpt), num_gpu_blocks=32)
        assert type(engine.platform).__name__ == "ToyMiniPlatform", (
            f"mini must pick your platform, got {engine.platform!r}"
        )
        assert engine.platform.get_device_name() == "toy-accelerator"
        model = engine.model_executor.driver_worker.model
        assert type(model).__name__ == "LlamaForCausalLM", (
            f"{lab.MODEL_ARCH} must resolve to mini's Llama, got {type(model)}"
        )
        got = [o.outputs[0].token_ids for o in engine.generate(["The cat"], params)]
        assert got == want, "same weights under a plugin's architecture name: same greedy tokens"
        platforms.reset_current_platform()
        monkeypatch.setenv(lab.DEVICE_ENV, "0")
        assert isinstance(platforms.get_current_platform(), NumpyPlatform), (
            "device absent: mini falls back to numpy"
        )
    finally:
        ModelRegistry.models.pop(lab.MODEL_ARCH, None)
        sys.modules.pop("toyplat", None)
        platforms.reset_current_platform()
        platforms.reset_general_plugins()
