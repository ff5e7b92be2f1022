"""``ModelRegistry``: the ``architectures`` string of a ``config.json`` → the class that runs it.

Mirrors vllm/model_executor/models/registry.py:956 — _ModelRegistry: a table ``"Arch": (module, class)`` whose
classes are imported only when first asked for (``_LazyRegisteredModel``; importing the registry
never imports a model), ``_ModelRegistry.register_model`` (a class, or ``"module:Class"`` for a
lazy out-of-tree model), ``get_supported_archs``, ``resolve_model_cls`` (the first of the
checkpoint's architectures that is registered wins; returns ``(cls, arch)``) and
``inspect_model_cls`` (flags read from the class, see ``interfaces.py``; upstream's
vllm/model_executor/models/registry.py:723 — _ModelInfo has many more, and no ``supports_lora``)
and ``verify_supported`` (the refusals an engine makes from those flags). An architecture nobody
registered is a ``ValueError`` that lists the registered ones. Pooling architectures
(``"LlamaModel"``) name their converted class directly (``adapters.as_embedding_model``).

Left out: upstream's subprocess inspection and its on-disk cache (mini's classes import in
milliseconds), architecture normalisation and load-time conversion (``convert_type``),
``_PREVIOUSLY_SUPPORTED_MODELS`` and out-of-tree plugin hints, multimodal and speculative tables.
"""

from __future__ import annotations

import importlib
import warnings
from dataclasses import dataclass

from . import interfaces

# (module under mini_vllm.models, class name). Upstream's table has hundreds of rows.
_TEXT_GENERATION_MODELS = {
    "LlamaForCausalLM": ("llama", "LlamaForCausalLM"),
    "MixtralForCausalLM": ("mixtral", "MixtralForCausalLM"),
    "ToyForCausalLM": ("toy", "ToyForCausalLM"),
}

# Pooling architectures. Upstream maps "LlamaModel" to LlamaForCausalLM and converts it at load
# time (convert_type="embed"); mini's row names the converted class itself.
_EMBEDDING_MODELS = {
    "LlamaModel": ("llama", "LlamaForEmbedding"),
}


@dataclass(frozen=True)
class _ModelInfo:
    architecture: str
    is_text_generation_model: bool
    is_pooling_model: bool
    supports_lora: bool
    supports_pp: bool
    is_attention_free: bool

    @staticmethod
    def from_model_cls(model: type) -> _ModelInfo:
        return _ModelInfo(
            architecture=model.__name__,
            is_text_generation_model=interfaces.is_text_generation_model(model),
            is_pooling_model=interfaces.is_pooling_model(model),
            supports_lora=interfaces.supports_lora(model),
            supports_pp=interfaces.supports_pp(model),
            is_attention_free=interfaces.is_attention_free(model),
        )


class _RegisteredModel:
    def __init__(self, model_cls: type) -> None:
        self.model_cls = model_cls

    def load_model_cls(self) -> type:
        return self.model_cls


class _LazyRegisteredModel:
    """``module:Class``, imported on first use."""

    def __init__(self, module_name: str, class_name: str) -> None:
        self.module_name, self.class_name = module_name, class_name

    def load_model_cls(self) -> type:
        module = importlib.import_module(self.module_name)
        try:
            return getattr(module, self.class_name)
        except AttributeError:
            raise ValueError(f"module {self.module_name} has no class {self.class_name}") from None


class _ModelRegistry:
    def __init__(self, models: dict[str, _RegisteredModel | _LazyRegisteredModel]) -> None:
        self.models = dict(models)

    def get_supported_archs(self) -> list[str]:
        return sorted(self.models)

    def register_model(self, model_arch: str, model_cls: type | str) -> None:
        """Register ``model_cls`` (a class, or ``"package.module:Class"``) under ``model_arch``."""
        if not isinstance(model_arch, str) or not model_arch:
            raise TypeError(f"model_arch must be a non-empty str, got {model_arch!r}")
        if model_arch in self.models:
            warnings.warn(
                f"model architecture {model_arch} is already registered; overwriting it", stacklevel=2
            )
        if isinstance(model_cls, str):
            module_name, sep, class_name = model_cls.partition(":")
            if not sep or not module_name or not class_name:
                raise ValueError(f"expected a 'module:Class' string, got {model_cls!r}")
            self.models[model_arch] = _LazyRegisteredModel(module_name, class_name)
        elif isinstance(model_cls, type):
            self.models[model_arch] = _RegisteredModel(model_cls)
        else:
            raise TypeError(f"model_cls must be a class or a 'module:Class' string, got {model_cls!r}")

    def _normalize_archs(self, architectures: str | list[str]) -> list[str]:
        if isinstance(architectures, str):
            architectures = [architectures]
        if not architectures or not all(isinstance(a, str) for a in architectures):
            raise ValueError(f"architectures must be a non-empty list of str, got {architectures!r}")
        return list(architectures)

    def _raise_for_unsupported(self, architectures: list[str]):
        raise ValueError(
            f"model architectures {architectures} are not supported; registered: {', '.join(self.get_supported_archs())}"
        )

    def resolve_model_cls(self, architectures: str | list[str]) -> tuple[type, str]:
        """``(class, arch)`` for the first of ``architectures`` that is registered."""
        archs = self._normalize_archs(architectures)
        for arch in archs:
            if arch in self.models:
                return self.models[arch].load_model_cls(), arch
        self._raise_for_unsupported(archs)

    def inspect_model_cls(self, architectures: str | list[str]) -> _ModelInfo:
        """The flags of the first registered architecture (its ``architecture`` field says which)."""
        model_cls, arch = self.resolve_model_cls(architectures)
        info = _ModelInfo.from_model_cls(model_cls)
        return _ModelInfo(**{**info.__dict__, "architecture": arch})

    def is_text_generation_model(self, architectures: str | list[str]) -> bool:
        return self.inspect_model_cls(architectures).is_text_generation_model

    def is_pooling_model(self, architectures: str | list[str]) -> bool:
        return self.inspect_model_cls(architectures).is_pooling_model

    def is_pp_supported_model(self, architectures: str | list[str]) -> bool:
        return self.inspect_model_cls(architectures).supports_pp

    def verify_supported(
        self,
        architectures: str | list[str],
        *,
        runner: str = "generate",
        enable_lora: bool = False,
        pipeline_parallel_size: int = 1,
    ) -> _ModelInfo:
        """Refuse an engine the model cannot serve, from its flags alone (nothing is built).

        ``runner`` is ``"generate"`` or ``"pooling"`` (upstream's ``runner_type``). The checks are
        upstream's, gathered: pipeline parallelism needs ``SupportsPP``
        (vllm/config/model.py:1191 — ModelConfig.verify_with_parallel_config), LoRA needs
        ``SupportsLoRA`` (vllm/v1/worker/lora_model_runner_mixin.py:30 —
        LoRAModelRunnerMixin.load_lora_model), and the runner must match what the model does
        (vllm/v1/engine/input_processor.py:81 — InputProcessor._validate_params).
        """
        info = self.inspect_model_cls(architectures)
        if runner not in ("generate", "pooling"):
            raise ValueError(f"runner must be 'generate' or 'pooling', got {runner!r}")
        if runner == "generate" and not info.is_text_generation_model:
            raise ValueError(f"{info.architecture} does not support generation (it is a pooling model)")
        if runner == "pooling" and not info.is_pooling_model:
            raise ValueError(f"{info.architecture} does not support pooling (it is a generative model)")
        if enable_lora and not info.supports_lora:
            raise ValueError(f"{info.architecture} does not support LoRA")
        if pipeline_parallel_size > 1 and not info.supports_pp:
            raise NotImplementedError(
                f"pipeline parallelism is not supported for {info.architecture}: it does not implement SupportsPP"
            )
        return info


ModelRegistry = _ModelRegistry(
    {
        arch: _LazyRegisteredModel(f"mini_vllm.models.{mod}", cls)
        for arch, (mod, cls) in {**_TEXT_GENERATION_MODELS, **_EMBEDDING_MODELS}.items()
    }
)
