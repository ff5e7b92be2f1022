"""Differential test: mini_vllm's Mixtral against vLLM 0.22.1's ``MixtralForCausalLM`` on CPU.

The real model is built from a tiny Mixtral ``config.json`` inside a world-1 gloo group (as
``test_upstream_weights.py`` does for Llama; its ``FusedMoE`` needs the expert-parallel group
``initialize_model_parallel`` creates) and loads a seeded random checkpoint in the
``block_sparse_moe.experts.{e}.w1/w2/w3`` layout through its own ``load_weights`` (the expert
params mapping + ``FusedMoE.weight_loader``). Mini loads the same tensors: every parameter must
hold exactly what vLLM's holds. Then one MoE block of each (vLLM's after
``process_weights_after_loading``, its CPU fused-MoE path) runs on the same hidden states.

The class is registered in vLLM's ``ModelRegistry`` in-process for the test (and the entry
restored after), so building ``ModelConfig`` does not start the registry's inspection subprocess.
"""

import json

import numpy as np
import pytest

from mini_vllm.models.mixtral import MixtralForCausalLM as MiniMixtral
from mini_vllm.test_mixtral import CONFIG, mixtral_checkpoint

pytestmark = pytest.mark.upstream


@pytest.fixture(scope="module")
def real_mixtral(tmp_path_factory):
    """(vLLM's MixtralForCausalLM on CPU, its VllmConfig), in a world-1 gloo group."""
    from vllm import ModelRegistry
    from vllm.config import DeviceConfig, ModelConfig, VllmConfig, set_current_vllm_config
    from vllm.model_executor.models.mixtral import MixtralForCausalLM

    from course.runtime.real_llama import world_one

    path = tmp_path_factory.mktemp("mixtral-config")
    config = {**CONFIG, "architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "dtype": "float32"}
    (path / "config.json").write_text(json.dumps(config))
    saved = ModelRegistry.models.get("MixtralForCausalLM")
    ModelRegistry.models.pop("MixtralForCausalLM", None)
    ModelRegistry.register_model("MixtralForCausalLM", MixtralForCausalLM)
    try:
        model_config = ModelConfig(
            model=str(path), skip_tokenizer_init=True, dtype="float32", max_model_len=256, seed=0
        )
        vllm_config = VllmConfig(model_config=model_config, device_config=DeviceConfig(device="cpu"))
        with set_current_vllm_config(vllm_config), world_one():
            yield MixtralForCausalLM(vllm_config=vllm_config, prefix=""), vllm_config
    finally:
        if saved is not None:
            ModelRegistry.models["MixtralForCausalLM"] = saved


def test_every_expert_tensor_lands_where_vllms_expert_mapping_puts_it(real_mixtral):
    import torch
    from vllm.config import set_current_vllm_config
    from vllm.forward_context import set_forward_context
    from vllm.model_executor.model_loader.utils import process_weights_after_loading

    real, vllm_config = real_mixtral
    checkpoint = mixtral_checkpoint(CONFIG, seed=3)
    real_loaded = real.load_weights((name, torch.from_numpy(a)) for name, a in checkpoint.items())
    mini = MiniMixtral(CONFIG)
    mini_loaded = mini.load_weights(checkpoint.items())
    assert mini_loaded == real_loaded, f"loaded parameter names differ: {sorted(mini_loaded ^ real_loaded)}"
    real_params = dict(real.named_parameters())
    assert set(real_params) == set(mini.params), (
        f"parameter names differ: {sorted(set(real_params) ^ set(mini.params))}"
    )
    for name, param in real_params.items():
        want = param.detach().numpy()
        assert mini.params[name].shape == want.shape, (
            f"{name}: mini {mini.params[name].shape}, vLLM {want.shape}"
        )
        bad = np.argwhere(mini.params[name] != want)
        assert bad.size == 0, f"{name}: entries at {bad[:4].tolist()} differ from vLLM's load_weights"

    # the same MoE block (router, fused_topk with renormalize=True, experts) on the same tokens
    x = np.random.default_rng(4).standard_normal((9, CONFIG["hidden_size"])).astype(np.float32)
    with set_current_vllm_config(vllm_config):
        process_weights_after_loading(real, vllm_config.model_config, torch.device("cpu"))
        with set_forward_context(None, vllm_config), torch.no_grad():
            want = real.model.layers[1].block_sparse_moe(torch.from_numpy(x)).numpy()
    got = mini._mlp(1, x)
    err = float(np.abs(got - want).max() / np.abs(want).max())
    assert err < 1e-5, f"mini's MoE block differs from vLLM's by {err:.2e} of its largest output"
