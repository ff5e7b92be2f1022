"""``as_embedding_model``: turn a causal LM class into an embedding model of the same weights.

Mirrors vllm/model_executor/models/adapters.py:230 — as_embedding_model, built on
vllm/model_executor/models/adapters.py:129 — _create_pooling_model_cls: subclass the generator,
mark it ``is_pooling_model`` (``VllmModelForPooling``), give it a ``pooler``
(``DispatchPooler.for_embedding``: ``embed`` and ``token_embed``), drop the LM head (upstream
builds it as a missing stage), and load either checkpoint layout: a ``*ForCausalLM`` one
(``model.layers...``, its ``lm_head`` ignored) or a bare ``*Model`` one (``layers...``, which gets
the ``model.`` prefix, the prefix search of ``ModelForPooling.load_weights``). The class name
follows vllm/model_executor/models/adapters.py:119 — _get_pooling_model_name:
``LlamaForCausalLM`` → ``LlamaForEmbedding``. The default pooling is the class's
``default_seq_pooling_type`` (``"LAST"``, vllm/model_executor/models/interfaces_base.py:160);
``pooling_type=`` chooses another.

Upstream reaches this class through the registry too, differently: ``"LlamaModel"`` maps to
``LlamaForCausalLM`` and ``ModelConfig``'s ``convert_type="embed"`` wraps it at load time
(vllm/model_executor/model_loader/utils.py:202); mini registers the converted class directly.
Left out: ``as_seq_cls_model`` (classification), multimodal backbones, projector layers.
"""

from __future__ import annotations

from typing import Any, ClassVar

from .interfaces import VllmModelForPooling
from .pooler import DispatchPooler


def as_embedding_model(cls: type) -> type:
    """``cls`` as an embedding model; a class that already pools is returned unchanged."""
    if getattr(cls, "is_pooling_model", False):
        return cls

    class ModelForEmbedding(cls, VllmModelForPooling):
        default_seq_pooling_type: ClassVar[str] = "LAST"

        def __init__(self, config: Any, pooling_type: str | None = None) -> None:
            super().__init__(config)
            self.params.pop("lm_head.weight", None)
            self.pooler = DispatchPooler.for_embedding(pooling_type or self.default_seq_pooling_type)

        def compute_logits(self, hidden_states):
            raise TypeError(f"{type(self).__name__} is a pooling model: it has no LM head to give logits")

        def load_weights(self, weights) -> set[str]:
            def renamed():
                for name, tensor in weights:
                    if name.startswith("lm_head."):
                        continue  # the generator's head: a pooling model has none
                    if name not in self.params and f"model.{name}" in self._checkpoint_names():
                        name = f"model.{name}"
                    yield name, tensor

            return super().load_weights(renamed())

        def _checkpoint_names(self) -> set[str]:
            """Parameter names plus the unfused checkpoint names (``q_proj``, ``gate_proj``, ...)."""
            if not hasattr(self, "_names"):
                self._names = set(self.params) | set(self.missing_checkpoint_tensors(set()))
            return self._names

    ModelForEmbedding.__name__ = ModelForEmbedding.__qualname__ = (
        cls.__name__.removesuffix("ForCausalLM") + "ForEmbedding"
    )
    return ModelForEmbedding
