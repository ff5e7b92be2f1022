"""The registry's flags are honest: each registered architecture's ``_ModelInfo`` matches what an
instance of its class really does, and ``verify_supported`` refuses an engine on those flags.

Honest here means about mini: none of mini's models applies LoRA weights or can be cut into
pipeline stages, so none claims ``supports_lora`` / ``supports_pp`` even where vLLM's class of
the same name does (``test_upstream_model_flags.py`` checks mini never claims more than vLLM).
"""

import numpy as np
import pytest

from mini_vllm.models import ModelRegistry
from mini_vllm.models.interfaces import get_supported_tasks
from mini_vllm.testing.paged import PagedDriver

TINY = dict(
    vocab_size=32, hidden_size=16, intermediate_size=8, num_hidden_layers=1, num_attention_heads=4,
    num_key_value_heads=2, head_dim=4, num_local_experts=2, num_experts_per_tok=1,
)  # fmt: skip


def behaviour(arch):
    """What an instance of ``arch`` does: (generates logits, pools, needs a KV cache)."""
    cls, _ = ModelRegistry.resolve_model_cls(arch)
    model = cls(TINY)
    needs_kv = model.get_kv_cache_spec().num_layers > 0
    if needs_kv:
        hidden, _ = PagedDriver(model, num_blocks=8, block_size=4).forward({0: [1, 2, 3]})
    else:  # nothing to page: run it with no caches at all
        hidden = model.forward(np.array([1, 2, 3]), np.arange(3), [], None)
    try:
        generates = model.compute_logits(hidden).shape[0] == 3
    except TypeError:
        generates = False
    pools = hasattr(model, "pooler") and bool(get_supported_tasks(model))
    return generates, pools, needs_kv


@pytest.mark.parametrize("arch", ModelRegistry.get_supported_archs())
def test_every_registered_architecture_reports_what_it_does(arch):
    info = ModelRegistry.inspect_model_cls(arch)
    generates, pools, needs_kv = behaviour(arch)
    assert info.is_text_generation_model == generates, (
        f"{arch}: is_text_generation_model={info.is_text_generation_model}"
    )
    assert info.is_pooling_model == pools, f"{arch}: is_pooling_model={info.is_pooling_model}, pools={pools}"
    assert info.is_attention_free == (not needs_kv), (
        f"{arch}: is_attention_free but asks for a KV cache, or not and none"
    )
    assert not info.supports_lora, f"{arch}: mini's models apply no LoRA weights; SupportsLoRA would be a lie"
    assert not info.supports_pp, f"{arch}: mini has no pipeline stages; SupportsPP would be a lie"


def test_verify_supported_refuses_on_the_flags():
    assert ModelRegistry.verify_supported("MixtralForCausalLM").architecture == "MixtralForCausalLM"
    assert ModelRegistry.verify_supported("LlamaModel", runner="pooling").is_pooling_model
    for arch, kwargs, error, match in (
        ("LlamaModel", {}, ValueError, "LlamaModel does not support generation"),
        ("LlamaForCausalLM", dict(runner="pooling"), ValueError, "does not support pooling"),
        (
            "MixtralForCausalLM",
            dict(enable_lora=True),
            ValueError,
            "MixtralForCausalLM does not support LoRA",
        ),
        ("LlamaForCausalLM", dict(pipeline_parallel_size=2), NotImplementedError, "SupportsPP"),
        ("ToyForCausalLM", dict(runner="encode"), ValueError, "runner must be"),
    ):
        with pytest.raises(error, match=match):
            ModelRegistry.verify_supported(arch, **kwargs)
    assert ModelRegistry.is_pooling_model("LlamaModel") and not ModelRegistry.is_pp_supported_model(
        "ToyForCausalLM"
    )
    assert np.all([ModelRegistry.is_text_generation_model(a) for a in ("LlamaForCausalLM", "ToyForCausalLM")])
