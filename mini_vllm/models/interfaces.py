"""What a mini_vllm model is, and the class flags the registry reads.

Mirrors vllm/model_executor/models/interfaces_base.py:114 — VllmModelForTextGeneration (the
``forward`` / ``compute_logits`` contract), vllm/model_executor/models/interfaces_base.py:148 —
VllmModelForPooling, and the opt-in mixins vllm/model_executor/models/interfaces.py:538 —
SupportsLoRA, vllm/model_executor/models/interfaces.py:616 — SupportsPP and
vllm/model_executor/models/interfaces.py:762 — IsAttentionFree, with their ``supports_lora`` /
``supports_pp`` / ``is_attention_free`` checks.
A model declares a capability by inheriting the mixin, which sets a class variable to ``True``;
the checks read that variable, so they answer from the class without building a model.

The contract every model in ``mini_vllm/models/`` keeps::

    __init__(config)                      # config: the dict parsed from config.json
    forward(input_ids, positions, kv_caches, attn_metadata) -> hidden [T, H]
    compute_logits(hidden_states) -> logits [N, vocab]
    load_weights(weights: iterable of (hf_name, np.ndarray)) -> set of loaded parameter names
    get_kv_cache_spec() -> KVCacheSpec    # 0 layers: no KV cache to allocate

Left out: multimodal, transcription, hybrid / Mamba state, quantization and every other mixin.
"""

from __future__ import annotations

from typing import Any, ClassVar, Protocol, runtime_checkable

import numpy as np

from ..attention import AttentionMetadata, KVCacheSpec

__all__ = [
    "IsAttentionFree",
    "KVCacheSpec",
    "SupportsLoRA",
    "SupportsPP",
    "VllmModelForPooling",
    "VllmModelForTextGeneration",
    "is_attention_free",
    "is_pooling_model",
    "is_text_generation_model",
    "get_supported_tasks",
    "supports_lora",
    "supports_pp",
]


@runtime_checkable
class VllmModelForTextGeneration(Protocol):
    def __init__(self, config: dict[str, Any]) -> None: ...

    def forward(
        self,
        input_ids: np.ndarray,
        positions: np.ndarray,
        kv_caches: list[np.ndarray],
        attn_metadata: AttentionMetadata,
    ) -> np.ndarray: ...

    def compute_logits(self, hidden_states: np.ndarray) -> np.ndarray: ...

    def load_weights(self, weights) -> set[str]: ...

    def get_kv_cache_spec(self) -> KVCacheSpec: ...


class VllmModelForPooling:
    """A model that returns embeddings instead of next-token logits: it has a ``pooler``
    (``pooler.py``) and no ``compute_logits`` to serve (``adapters.as_embedding_model``)."""

    is_pooling_model: ClassVar[bool] = True


class SupportsLoRA:
    """The model can apply LoRA adapters to its layers."""

    supports_lora: ClassVar[bool] = True


class SupportsPP:
    """The model can be cut into pipeline-parallel stages."""

    supports_pp: ClassVar[bool] = True


class IsAttentionFree:
    """The model has no attention layers, so no paged KV cache (Mamba upstream; the toy here)."""

    is_attention_free: ClassVar[bool] = True


def _flag(model: object, name: str) -> bool:
    return getattr(model, name, False) is True


def supports_lora(model: object) -> bool:
    return _flag(model, "supports_lora")


def supports_pp(model: object) -> bool:
    return _flag(model, "supports_pp")


def is_attention_free(model: object) -> bool:
    return _flag(model, "is_attention_free")


def is_pooling_model(model: object) -> bool:
    return _flag(model, "is_pooling_model")


def is_text_generation_model(model: object) -> bool:
    """A class with the generation contract that is not a pooling model."""
    needed = ("forward", "compute_logits", "load_weights", "get_kv_cache_spec")
    return all(callable(getattr(model, m, None)) for m in needed) and not is_pooling_model(model)


def get_supported_tasks(model: object) -> tuple[str, ...]:
    """What a model (class or instance) can serve: ``("generate",)`` or its pooler's tasks.

    vllm/v1/worker/gpu_model_runner.py:3209 — GPUModelRunner.get_supported_tasks; the engine
    refuses a request whose task is not in it (vllm/v1/engine/input_processor.py:81).
    """
    if is_pooling_model(model):
        pooler = getattr(model, "pooler", None)
        return tuple(sorted(pooler.get_supported_tasks())) if pooler is not None else ("embed", "token_embed")
    return ("generate",) if is_text_generation_model(model) else ()
