"""mini_vllm's models: the contract (``interfaces``), the registry, the loader, Llama and the toy.

Mirrors ``vllm/model_executor/models/`` (one module per architecture, a registry that imports
them lazily) and ``vllm/model_executor/model_loader/``. Importing this package imports no model.
"""

from .interfaces import KVCacheSpec
from .loader import get_model, safetensors_weights_iterator
from .registry import ModelRegistry

__all__ = ["KVCacheSpec", "ModelRegistry", "get_model", "safetensors_weights_iterator"]
