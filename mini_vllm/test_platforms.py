"""The platform seam: resolution, entry-point plugins, the torch backend, and the engine asking.

Plugins are never installed: each test writes a module and a ``*.dist-info`` into ``tmp_path``
and puts it on ``sys.path`` (``mini_vllm/testing/plugins.py``).
"""

from __future__ import annotations

import itertools
import sys
from pathlib import Path

import numpy as np
import pytest

from mini_vllm import platforms
from mini_vllm.engine import LLMEngine
from mini_vllm.models.registry import ModelRegistry
from mini_vllm.platforms import (
    DEFAULT_PLUGINS_GROUP,
    PLATFORM_PLUGINS_GROUP,
    PluginLoadError,
    get_current_platform,
    reset_current_platform,
    use_platform,
)
from mini_vllm.platforms.numpy_platform import NumpyPagedAttentionBackend, NumpyPlatform
from mini_vllm.platforms.torch_cpu import TorchCpuPlatform, TorchSDPABackend
from mini_vllm.sampling_params import SamplingParams
from mini_vllm.testing.plugins import checkpoint_as, write_plugin_dist

CHECKPOINT = Path(__file__).parent / "checkpoints" / "course-llama"
_ids = itertools.count()

PLATFORM_MODULE = """
from mini_vllm.platforms import Platform
from mini_vllm.platforms.numpy_platform import NumpyPlatform

class {cls}(NumpyPlatform):
    device_name = "{device}"

def register():
    return {answer}
"""


@pytest.fixture
def plugins(tmp_path, monkeypatch):
    """``add(entry_points, modules)``: one more fake-installed distribution; state reset around the test."""
    for var in (platforms.FORCE_ENV, "MINI_VLLM_PLUGINS"):
        monkeypatch.delenv(var, raising=False)
    reset_current_platform()
    platforms.reset_general_plugins()
    added: list[str] = []

    def add(entry_points: dict[str, dict[str, str]], modules: dict[str, str]) -> None:
        root = write_plugin_dist(tmp_path / f"site{next(_ids)}", f"dist{next(_ids)}", modules, entry_points)
        monkeypatch.syspath_prepend(str(root))
        added.extend(modules)

    yield add
    for name in added:
        sys.modules.pop(name, None)
    reset_current_platform()
    platforms.reset_general_plugins()


def platform_plugin(add, entry: str, answer_active: bool = True, device: str | None = None) -> str:
    """A plugin ``entry`` whose platform is ``<Entry>Platform``; returns the module name."""
    mod = f"plug_{entry}_{next(_ids)}"
    cls = f"{entry.capitalize()}Platform"
    answer = f'"{mod}.{cls}"' if answer_active else "None"
    add(
        {PLATFORM_PLUGINS_GROUP: {entry: f"{mod}:register"}},
        {mod: PLATFORM_MODULE.format(cls=cls, device=device or entry, answer=answer)},
    )
    return mod


# -- resolution ------------------------------------------------------------------------------
def test_numpy_is_the_default_and_resolved_once(plugins):
    p = get_current_platform()
    assert isinstance(p, NumpyPlatform), (
        f"with no plugin and nothing forced the platform must be numpy, got {p!r}"
    )
    assert platforms.current_platform is p, "current_platform must be cached: the same object on every use"
    reset_current_platform()
    assert get_current_platform() is not p, "reset_current_platform() must make the next use resolve again"


def test_force_by_name_and_unknown_is_loud(plugins, monkeypatch):
    monkeypatch.setenv(platforms.FORCE_ENV, "torch")
    assert isinstance(get_current_platform(), TorchCpuPlatform)
    reset_current_platform()
    monkeypatch.setenv(platforms.FORCE_ENV, "tpu")
    with pytest.raises(ValueError, match=r"'tpu'.*known: \['numpy', 'torch'\]"):
        get_current_platform()
    assert platforms._current_platform is None, "a refused resolution must leave nothing cached"


def test_one_activating_plugin_wins_and_a_declining_one_is_ignored(plugins):
    platform_plugin(plugins, "quiet", answer_active=False)
    platform_plugin(plugins, "vendor", device="vendor-npu")
    p = get_current_platform()
    assert p.device_name == "vendor-npu", f"the one plugin that activates must win, got {p!r}"


def test_two_activating_plugins_is_an_error_naming_both(plugins):
    platform_plugin(plugins, "alpha")
    platform_plugin(plugins, "beta")
    with pytest.raises(RuntimeError, match=r"\['alpha', 'beta'\]"):
        get_current_platform()


def test_force_picks_a_plugin_and_a_declining_forced_plugin_is_loud(plugins, monkeypatch):
    platform_plugin(plugins, "alpha")
    platform_plugin(plugins, "beta")
    platform_plugin(plugins, "gamma", answer_active=False)
    monkeypatch.setenv(platforms.FORCE_ENV, "beta")
    assert get_current_platform().device_name == "beta", "a forced name settles an ambiguous pair"
    reset_current_platform()
    monkeypatch.setenv(platforms.FORCE_ENV, "gamma")
    with pytest.raises(RuntimeError, match="'gamma' cannot activate"):
        get_current_platform()


def test_a_plugin_cannot_take_a_builtin_name(plugins):
    platform_plugin(plugins, "numpy")
    with pytest.raises(RuntimeError, match="'numpy' takes a built-in"):
        get_current_platform()


def test_a_plugin_that_fails_to_import_is_reported_with_its_name_and_error(plugins):
    plugins(
        {PLATFORM_PLUGINS_GROUP: {"broken": "plug_broken_mod:register"}},
        {"plug_broken_mod": "import no_such_module_anywhere\n"},
    )
    with pytest.raises(PluginLoadError, match=r"'broken'.*ModuleNotFoundError.*no_such_module_anywhere"):
        get_current_platform()


def test_the_allow_list_filters_plugins(plugins, monkeypatch):
    platform_plugin(plugins, "alpha")
    platform_plugin(plugins, "beta")
    monkeypatch.setenv("MINI_VLLM_PLUGINS", "beta")
    assert get_current_platform().device_name == "beta"
    reset_current_platform()
    monkeypatch.setenv("MINI_VLLM_PLUGINS", "")
    got = get_current_platform()
    assert got.device_name not in ("alpha", "beta"), (
        f"MINI_VLLM_PLUGINS='' (set, empty) allows no plugin, as upstream's VLLM_PLUGINS; plugin "
        f"{got.device_name!r} was loaded: only an unset variable means 'load them all'"
    )


def test_a_plugin_must_name_a_platform(plugins):
    plugins(
        {PLATFORM_PLUGINS_GROUP: {"odd": "plug_odd_mod:register"}},
        {"plug_odd_mod": "class NotAPlatform: pass\ndef register(): return 'plug_odd_mod.NotAPlatform'\n"},
    )
    with pytest.raises(TypeError, match="Platform subclass"):
        get_current_platform()


def test_torch_missing_refuses_clearly(plugins, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch -> ImportError
    assert platforms.torch_platform_plugin() is None
    with pytest.raises(RuntimeError, match="needs torch"):
        TorchCpuPlatform()
    monkeypatch.setenv(platforms.FORCE_ENV, "torch")
    with pytest.raises(RuntimeError, match="torch does not import"):
        get_current_platform()


# -- the hooks -------------------------------------------------------------------------------
def test_platform_answers():
    n, t = NumpyPlatform(), TorchCpuPlatform()
    assert (n.device_type, n.dist_backend, n.is_pin_memory_available(), n.support_static_graph_mode()) == (
        "cpu",
        "pipe",
        False,
        False,
    )
    assert (t.device_name, t.dist_backend, t.is_cpu()) == ("torch-cpu", "gloo", True)
    assert n.get_attn_backend_cls(None, 64, "float32").endswith("NumpyPagedAttentionBackend")
    assert t.get_attn_backend_cls(None, 64, "float32").endswith("TorchSDPABackend")
    with pytest.raises(ValueError, match="TORCH_SDPA"):
        t.get_attn_backend_cls("FLASH_ATTN", 64, "float32")


def test_dtype_negotiation_falls_back_with_a_warning():
    p = NumpyPlatform()
    assert p.check_dtype("float32") == "float32"
    with pytest.warns(UserWarning, match="'bfloat16'"):
        assert p.check_dtype("bfloat16") == "float32"


# -- the engine asks ---------------------------------------------------------------------------
class CountingBackend:
    """The torch kernels, counting how often the model called them."""

    name = "COUNTING"
    calls = 0

    @staticmethod
    def reshape_and_cache(*args):
        return TorchSDPABackend.reshape_and_cache(*args)

    @staticmethod
    def forward(*args):
        CountingBackend.calls += 1
        return TorchSDPABackend.forward(*args)


class TripwirePlatform(TorchCpuPlatform):
    """Records what the engine asked; its backend is ``CountingBackend``."""

    device_name = "tripwire"

    def __init__(self) -> None:
        super().__init__()
        self.asked: list[str] = []

    def get_attn_backend_cls(self, selected_backend, head_size, dtype):
        self.asked.append(f"attn:{head_size}:{dtype}")
        return f"{__name__}.CountingBackend"

    def check_and_update_config(self, vllm_config):
        self.asked.append("config")
        return super().check_and_update_config(vllm_config)

    def load_model(self, model, attn_backend):
        self.asked.append(f"load:{attn_backend.name}")
        return super().load_model(model, attn_backend)


def greedy(prompts, n=24, **kw):
    engine = LLMEngine(model=str(CHECKPOINT), num_gpu_blocks=48, block_size=16, **kw)
    outs = engine.generate(prompts, SamplingParams(temperature=0.0, max_tokens=n))
    return engine, [o.outputs[0].token_ids for o in outs]


PROMPTS = ["Once upon a time", "The cat sat on the mat and", "In the beginning"]


def test_use_platform_restores_the_previous_platform_even_when_the_block_raises():
    outer = NumpyPlatform()
    with use_platform(outer):
        with pytest.raises(RuntimeError, match="boom"):
            with use_platform(TorchCpuPlatform()):
                raise RuntimeError("boom")
        current = platforms.get_current_platform()
        assert current is outer, (
            f"after an exception inside use_platform the current platform is {current!r}, not the one "
            "saved on entry: restore it in a finally"
        )


def test_engine_consults_only_the_platform(plugins):
    platform = TripwirePlatform()
    CountingBackend.calls = 0
    with use_platform(platform):
        engine, toks = greedy(PROMPTS, n=8)
    assert engine.platform is platform
    assert platform.asked == ["config", "attn:64:float32", "load:COUNTING"], platform.asked
    assert CountingBackend.calls > 0, "the model must run the attention backend the platform named"
    assert engine.model_executor.driver_worker.attn_backend is CountingBackend


def test_torch_platform_is_token_identical_to_numpy_greedy(plugins):
    with use_platform(NumpyPlatform()):
        _, want = greedy(PROMPTS)
    with use_platform(TorchCpuPlatform()):
        engine, got = greedy(PROMPTS)
    assert engine.model_executor.driver_worker.attn_backend is TorchSDPABackend
    assert got == want, f"torch-cpu greedy {got} differs from numpy {want}"


def test_torch_platform_chunked_prefill_and_prefix_cache_match_numpy(plugins):
    long = ["The cat sat on the mat and the dog sat on the log and then", "The cat sat on the mat and"]
    kw = dict(max_num_batched_tokens=16, enable_prefix_caching=True)
    with use_platform(NumpyPlatform()):
        _, want = greedy(long, n=12, **kw)
    with use_platform(TorchCpuPlatform()):
        _, got = greedy(long, n=12, **kw)
    assert got == want


def test_torch_attention_matches_numpy_on_a_mixed_batch():
    import torch

    from mini_vllm.attention import AttentionMetadata

    rng = np.random.default_rng(0)
    cache_np = rng.standard_normal((2, 8, 4, 2, 8)).astype(np.float32)
    md = AttentionMetadata.build([3, 1, 0], [5, 9, 2], [[3, 1, 0], [7, 2, 5], [6, 0, 0]], 4)
    q = rng.standard_normal((4, 4, 8)).astype(np.float32)
    want = NumpyPagedAttentionBackend.forward(q, cache_np, md, 0.3)
    got = TorchSDPABackend.forward(torch.from_numpy(q), cache_np, md, 0.3).numpy()
    np.testing.assert_allclose(got, want, atol=1e-5)


def test_torch_platform_refuses_what_it_cannot_run():
    from mini_vllm.models.mixtral import MixtralForCausalLM

    model = MixtralForCausalLM.__new__(MixtralForCausalLM)
    with pytest.raises(ValueError, match="MixtralForCausalLM"):
        TorchCpuPlatform().load_model(model, TorchSDPABackend)


def test_toy_model_runs_unchanged_on_torch(plugins):
    with use_platform(NumpyPlatform()):
        want = LLMEngine(num_gpu_blocks=16).generate(["hi"], SamplingParams(temperature=0.0, max_tokens=5))
    with use_platform(TorchCpuPlatform()):
        got = LLMEngine(num_gpu_blocks=16).generate(["hi"], SamplingParams(temperature=0.0, max_tokens=5))
    assert got[0].outputs[0].token_ids == want[0].outputs[0].token_ids


# -- general plugins -------------------------------------------------------------------------
GENERAL_MODULE = """
from mini_vllm.models.llama import LlamaForCausalLM
from mini_vllm.models.registry import ModelRegistry

CALLS = []

class PluginLlamaForCausalLM(LlamaForCausalLM):
    pass

def register():
    CALLS.append(1)
    ModelRegistry.register_model("PluginLlamaForCausalLM", "{mod}:PluginLlamaForCausalLM")
"""


def test_general_plugin_registers_a_model_once_at_engine_start(plugins, tmp_path):
    mod = f"plug_general_{next(_ids)}"
    plugins(
        {DEFAULT_PLUGINS_GROUP: {"llama_alias": f"{mod}:register"}}, {mod: GENERAL_MODULE.format(mod=mod)}
    )
    ckpt = checkpoint_as(CHECKPOINT, tmp_path / "ckpt", "PluginLlamaForCausalLM")
    try:
        with pytest.raises(ValueError, match="not supported"):
            ModelRegistry.resolve_model_cls(["PluginLlamaForCausalLM"])  # nothing registered it yet
        _, want = greedy(PROMPTS[:1], n=6)
        engine = LLMEngine(model=str(ckpt), num_gpu_blocks=48, block_size=16)
        assert sys.modules[mod].CALLS == [1], (
            "general plugins run once per process, at the first engine start"
        )
        assert type(engine.model_executor.driver_worker.model).__name__ == "PluginLlamaForCausalLM"
        got = engine.generate(PROMPTS[:1], SamplingParams(temperature=0.0, max_tokens=6))
        assert [got[0].outputs[0].token_ids] == want
    finally:
        ModelRegistry.models.pop("PluginLlamaForCausalLM", None)
