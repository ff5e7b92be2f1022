"""Differential test: mini's registry flags against vLLM 0.22.1's for the same architecture names.

vLLM's ``ModelRegistry`` resolves each name to its class; its ``_ModelInfo.from_model_cls`` (the
function its inspection subprocess runs) reads the flags, here in-process. ``"LlamaModel"`` is
compared with ``as_embedding_model`` applied to the class vLLM resolves, because that is the class
vLLM's loader builds for it (``convert_type="embed"``); vLLM's registry itself reports the
unconverted generator for that name, which the ``slow`` test shows through the real
``ModelRegistry.inspect_model_cls`` (a subprocess per architecture, ~15 s each on first use).

The kind of model (generates, pools, attention-free) must agree, with one difference pinned by
the test: vLLM's converted embedding class still counts as text generation (a structural check). ``supports_pp`` / ``supports_lora``
may be ``False`` in mini where vLLM says ``True`` (mini implements neither), never the reverse.
"""

from types import SimpleNamespace

import pytest

from mini_vllm.models import ModelRegistry as MiniRegistry

pytestmark = pytest.mark.upstream

ARCHS = ["LlamaForCausalLM", "MixtralForCausalLM", "LlamaModel"]


def vllm_flags(arch):
    """(generates, pools, attention-free, supports_pp, supports_lora) of the class vLLM builds."""
    from vllm import ModelRegistry
    from vllm.model_executor.models.adapters import as_embedding_model
    from vllm.model_executor.models.interfaces import supports_lora
    from vllm.model_executor.models.registry import _ModelInfo

    cls = ModelRegistry.models[arch].load_model_cls()
    if arch == "LlamaModel":
        cls = as_embedding_model(cls)
    info = _ModelInfo.from_model_cls(cls)
    return (
        info.is_text_generation_model,
        info.is_pooling_model,
        info.is_attention_free,
        info.supports_pp,
        supports_lora(cls),
    )


@pytest.mark.parametrize("arch", ARCHS)
def test_mini_flags_agree_with_vllms_and_never_claim_more(arch):
    gen, pool, free, pp, lora = vllm_flags(arch)
    mini = MiniRegistry.inspect_model_cls(arch)
    if arch == "LlamaModel":
        # vLLM's flag is a structural check (vllm/model_executor/models/interfaces_base.py:135 —
        # is_text_generation_model): the converted class still has compute_logits, so it says
        # True; the runner type, not the flag, keeps it from generating. Mini's embedding class
        # refuses compute_logits: False.
        assert gen and not mini.is_text_generation_model, (gen, mini.is_text_generation_model)
        gen = False
    assert (mini.is_text_generation_model, mini.is_pooling_model, mini.is_attention_free) == (
        gen,
        pool,
        free,
    ), (
        f"{arch}: mini (generate, pool, attention-free) = "
        f"{(mini.is_text_generation_model, mini.is_pooling_model, mini.is_attention_free)}, vLLM {(gen, pool, free)}"
    )
    assert pp or not mini.supports_pp, f"{arch}: mini claims SupportsPP, vLLM's class does not"
    assert lora or not mini.supports_lora, f"{arch}: mini claims SupportsLoRA, vLLM's class does not"
    assert pp and lora, f"{arch}: vLLM's class supports PP and LoRA (mini's does not; the docs say why)"


@pytest.mark.slow
def test_real_inspect_model_cls_reports_what_the_in_process_flags_say():
    from vllm import ModelRegistry

    config = SimpleNamespace(model_impl="auto", convert_type="none", runner_type="generate")
    for arch in ARCHS:
        info, resolved = ModelRegistry.inspect_model_cls([arch], config)
        assert resolved == arch
        got = (info.is_text_generation_model, info.is_pooling_model, info.is_attention_free, info.supports_pp)
        want = vllm_flags("LlamaForCausalLM" if arch == "LlamaModel" else arch)[:4]
        assert got == want, f"{arch}: vLLM's registry says {got}, its class {want}"
