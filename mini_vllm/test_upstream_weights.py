"""Differential test: mini_vllm's Llama weight mapping against vLLM 0.22.1's ``LlamaForCausalLM``.

The real model is built on CPU inside a world-1 gloo group (``init_distributed_environment`` +
``initialize_model_parallel(1, 1)``, as its parallel linears need one) from the tiny Llama's
``VllmConfig`` (``course.runtime.real_vllm``), and loads a seeded random Hugging Face state dict
through its own ``load_weights`` (``stacked_params_mapping`` + each parameter's ``weight_loader``).
Mini loads the same tensors. Every parameter of the real model must hold exactly what mini's
parameter of the same name holds: every checkpoint tensor landed in the same fused rows.
"""


import numpy as np
import pytest

from mini_vllm.models.llama import LlamaForCausalLM as MiniLlama
from mini_vllm.testing.paged import llama_checkpoint_shapes

pytestmark = pytest.mark.upstream


@pytest.fixture(scope="module")
def real_llama():
    """(vLLM's LlamaForCausalLM on CPU, its hf_config as a dict), in a world-1 gloo group."""
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.models.llama import LlamaForCausalLM

    from course.runtime import real_vllm as rv
    from course.runtime.real_llama import world_one

    vllm_config = rv.make_vllm_config()
    with set_current_vllm_config(vllm_config), world_one():
        model = LlamaForCausalLM(vllm_config=vllm_config, prefix="")
        yield model, vllm_config.model_config.hf_config.to_dict()


def test_every_checkpoint_tensor_lands_in_the_same_fused_rows_as_vllm(real_llama):
    import torch

    real, config = real_llama
    rng = np.random.default_rng(0)
    checkpoint = {
        name: rng.standard_normal(shape).astype(np.float32)
        for name, shape in llama_checkpoint_shapes(config).items()
    }
    real_loaded = real.load_weights((name, torch.from_numpy(array)) for name, array in checkpoint.items())
    mini = MiniLlama(config)
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
        mismatch = np.nonzero((mini.params[name] != want).reshape(want.shape[0], -1).any(axis=1))[0]
        assert mismatch.size == 0, f"{name}: rows {mismatch[:8].tolist()}... differ from vLLM's load_weights"
