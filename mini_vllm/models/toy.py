"""``ToyForCausalLM``: the toy model of ``mini_vllm/model.py`` behind the model contract.

Registered as architecture ``"ToyForCausalLM"`` so a ``config.json`` can name it, as any model
does (upstream's registry table, ``vllm/model_executor/models/registry.py``). Its config keys:
``vocab_size`` (default 257) and ``seed`` (default 0), the two arguments of ``ToyModel``.

The toy never reads the KV cache, so it asks for none: ``get_kv_cache_spec()`` has 0 layers and
the class is ``IsAttentionFree``. Its "hidden state" is the pair (token, position) as an int64
``[T, 2]`` array, and ``compute_logits`` does ``ToyModel.forward``'s table lookup on the pairs
it is given: the logits are bit-for-bit ``ToyModel``'s, float64 as ``ToyModel`` returns them (the
one exception to the float32 logits of the contract; the engine's exactness tests rely on it).
It has no weights: ``load_weights`` accepts an empty iterable and refuses any tensor.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..model import ToyModel
from .interfaces import IsAttentionFree, KVCacheSpec


class ToyForCausalLM(IsAttentionFree):
    def __init__(self, config: dict[str, Any]) -> None:
        self.config = config
        self.model = ToyModel(vocab_size=config.get("vocab_size", 257), seed=config.get("seed", 0))
        self.vocab_size = self.model.vocab_size

    def forward(self, input_ids, positions, kv_caches=None, attn_metadata=None) -> np.ndarray:
        """``[T, 2]`` int64: each token with its position (the lookup keys of ``compute_logits``)."""
        ids, pos = np.asarray(input_ids), np.asarray(positions)
        if ids.ndim != 1 or pos.shape != ids.shape:
            raise ValueError(
                f"input_ids and positions must be 1-D and the same length, got {ids.shape} and {pos.shape}"
            )
        return np.stack([ids, pos], axis=1).astype(np.int64).reshape(-1, 2)

    def compute_logits(self, hidden_states: np.ndarray) -> np.ndarray:
        hidden = np.asarray(hidden_states)
        if hidden.ndim != 2 or hidden.shape[1] != 2:
            raise ValueError(
                f"the toy's hidden states are [N, 2] (token, position) pairs, got {hidden.shape}"
            )
        return self.model.forward(hidden[:, 0], hidden[:, 1])

    def load_weights(self, weights) -> set[str]:
        for name, _ in weights:
            raise ValueError(f"the toy model has no parameters; the checkpoint has {name!r}")
        return set()

    def named_parameters(self):
        return iter(())

    def get_kv_cache_spec(self) -> KVCacheSpec:
        return KVCacheSpec(num_layers=0, num_kv_heads=0, head_size=0, dtype=np.float32)
