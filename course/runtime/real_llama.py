"""The real vLLM ``LlamaForCausalLM``, built on a CPU and loaded from a Hugging Face state dict.

Phase 14's weight-loading labs compare the learner's mapping with what vLLM's own loader does.
``build(**config)`` makes a ``VllmConfig`` for a tiny Llama (``course.runtime.tiny_model``'s shape
unless keywords change it), joins a world-1 gloo group once per process (vLLM's parallel layers
ask the tensor-parallel group for their rank even when it is 1), and constructs the model.
``hf_model(config, seed)`` is the matching Hugging Face ``LlamaForCausalLM`` with seeded weights.
``loaded(...)`` returns both, after ``load_weights`` has read the Hugging Face state dict, as a
``Loaded`` record: the two models, the names ``load_weights`` reported, and the state dict.

Importing this module imports torch, transformers and vLLM (seconds). The attention forward of
the CPU model needs the engine's forward context and is not run here; the embedding, RMSNorm,
MLP, RoPE and ``compute_logits`` run standalone and match Hugging Face exactly.
"""

from __future__ import annotations

import contextlib
import socket
from dataclasses import dataclass
from typing import Any

from course.runtime import real_vllm

torch = real_vllm.torch


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ensure_world_one() -> None:
    """Join a world-size-1 gloo process group and vLLM's model-parallel groups, unless this process
    already has them (another test module may have made them, and may tear them down again)."""
    import vllm.distributed.parallel_state as ps

    if ps.model_parallel_is_initialized():
        return
    ps.init_distributed_environment(
        world_size=1,
        rank=0,
        distributed_init_method=f"tcp://127.0.0.1:{_free_port()}",
        local_rank=0,
        backend="gloo",
    )
    ps.initialize_model_parallel(1, 1)


@contextlib.contextmanager
def world_one():
    """A fresh world-size-1 group for the length of a ``with`` block, built under the current vLLM
    config (an MoE model needs the expert-parallel group that a dense model's set-up leaves out):
    groups an earlier test left are torn down first, and this block's on the way out. Use it inside
    ``set_current_vllm_config``; ``ensure_world_one`` rebuilds groups for whoever needs them next."""
    import vllm.distributed.parallel_state as ps

    if ps.model_parallel_is_initialized():
        ps.destroy_model_parallel()
        ps.destroy_distributed_environment()
    ensure_world_one()
    try:
        yield
    finally:
        ps.destroy_model_parallel()
        ps.destroy_distributed_environment()


def vllm_config(**hf_overrides: Any):
    """A CPU ``VllmConfig`` whose ``hf_config`` is the tiny Llama with ``hf_overrides`` applied."""
    vc = real_vllm.make_vllm_config()
    for key, value in hf_overrides.items():
        setattr(vc.model_config.hf_config, key, value)
    return vc


def hf_model(hf_config: Any, seed: int = 0):
    """Hugging Face's ``LlamaForCausalLM`` for ``hf_config``, weights drawn from ``torch.manual_seed(seed)``."""
    from transformers import LlamaForCausalLM

    torch.manual_seed(seed)
    model = LlamaForCausalLM(hf_config).float().eval()
    with (
        torch.no_grad()
    ):  # RMSNorm weights start at 1.0: perturb them so a norm loaded from the wrong tensor shows
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.add_(0.1 * torch.randn_like(p))
    return model


@dataclass
class Loaded:
    vllm_model: Any
    hf_model: Any
    loaded_names: set
    state_dict: dict
    vllm_config: Any


def loaded(seed: int = 0, **hf_overrides: Any) -> Loaded:
    """vLLM's ``LlamaForCausalLM`` after ``load_weights`` read a seeded Hugging Face Llama's state dict."""
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.model_loader.utils import process_weights_after_loading
    from vllm.model_executor.models.llama import LlamaForCausalLM

    vc = vllm_config(**hf_overrides)
    with set_current_vllm_config(vc):
        ensure_world_one()
        model = LlamaForCausalLM(vllm_config=vc, prefix="")
        hf = hf_model(vc.model_config.hf_config, seed)
        state = {k: v.detach().clone() for k, v in hf.state_dict().items()}
        names = model.load_weights(iter(state.items()))
        # what the model loader does next: each layer's quant method prepares its weights (on CPU, the
        # unquantized linear picks its GEMM here; without this step a forward fails)
        process_weights_after_loading(model, vc.model_config, torch.device("cpu"))
    return Loaded(model.eval(), hf, set(names), state, vc)
