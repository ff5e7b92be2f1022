"""``Platform``: every question about the hardware, answered in one place.

Mirrors vllm/platforms/interface.py:105 — Platform: class attributes ``device_name``,
``device_type``, ``dispatch_key``, ``dist_backend``; ``supported_dtypes`` (the first is the
fallback), ``get_attn_backend_cls`` (a class path the model's attention resolves),
``is_pin_memory_available``, ``support_static_graph_mode``, ``get_device_total_memory`` and
``check_and_update_config`` (the platform's last word on the engine's settings). The engine never
asks "is this CUDA?"; it asks the platform object.

mini's additions, named for what upstream does elsewhere: ``check_dtype`` (the dtype negotiation
upstream spreads over ``ModelConfig`` and ``check_if_supports_dtype``: an unsupported dtype falls
back to the first supported one, with a warning, never a crash) and ``load_model`` (upstream's
loader moves the weights onto ``device_config.device``; here the platform decides what runs the
forward). mini's config objects are frozen, so ``check_and_update_config`` returns the config it
settled on instead of editing it in place.

Left out: the ~80 other hooks (communicators, Punica wrappers, graph pools, Ray keys, memory
introspection beyond one figure, quantization lists, custom ops, the device capability tuple).
"""

from __future__ import annotations

import enum
import warnings
from typing import Any


class PlatformEnum(enum.Enum):
    """Which family a platform belongs to (vllm/platforms/interface.py:38 — PlatformEnum)."""

    NUMPY = enum.auto()
    CPU = enum.auto()
    OOT = enum.auto()  # out of tree: any plugin's platform


class Platform:
    """The contract. Subclasses set the class attributes and override the hooks they change."""

    _enum: PlatformEnum = PlatformEnum.OOT
    device_name: str = ""
    device_type: str = ""
    dispatch_key: str = "CPU"
    dist_backend: str = ""
    # The first is the fallback of dtype negotiation.
    supported_dtypes: tuple[str, ...] = ("float32",)

    def is_cpu(self) -> bool:
        return self._enum in (PlatformEnum.CPU, PlatformEnum.NUMPY)

    def is_out_of_tree(self) -> bool:
        return self._enum == PlatformEnum.OOT

    @classmethod
    def get_device_name(cls, device_id: int = 0) -> str:
        return cls.device_name

    @classmethod
    def get_attn_backend_cls(cls, selected_backend: str | None, head_size: int, dtype: str) -> str:
        """The attention backend's path, ``"package.module.Name"`` (upstream returns a class path too)."""
        raise NotImplementedError(f"{cls.__name__} does not name an attention backend")

    @classmethod
    def is_pin_memory_available(cls) -> bool:
        return False

    @classmethod
    def support_static_graph_mode(cls) -> bool:
        """Whether CUDA-graph capture is possible (Phase 5's capture degrades to eager when not)."""
        return False

    @classmethod
    def get_device_total_memory(cls, device_id: int = 0) -> int:
        raise NotImplementedError(f"{cls.__name__} does not report its memory")

    def check_dtype(self, dtype: str) -> str:
        """``dtype`` when this platform computes in it, else the first supported dtype (with a warning)."""
        if dtype in self.supported_dtypes:
            return dtype
        fallback = self.supported_dtypes[0]
        warnings.warn(
            f"{self.device_name} platform does not support dtype {dtype!r}; using {fallback!r} "
            f"(supported: {list(self.supported_dtypes)})",
            stacklevel=2,
        )
        return fallback

    def check_and_update_config(self, vllm_config: Any) -> Any:
        """Refuse or adjust the settings this platform cannot honour; return the config it accepts.

        The base platform negotiates the model's dtype (``check_dtype``) and refuses nothing else.
        """
        model_config = getattr(vllm_config, "model_config", None)
        if model_config is not None:
            dtype = self.check_dtype(model_config.dtype)
            if dtype != model_config.dtype:
                from dataclasses import replace

                vllm_config = replace(vllm_config, model_config=replace(model_config, dtype=dtype))
        return vllm_config

    def load_model(self, model: Any, attn_backend: Any) -> Any:
        """The model as this platform runs it (the base platform: unchanged)."""
        return model

    def __repr__(self) -> str:
        return f"{type(self).__name__}(device_name={self.device_name!r}, device_type={self.device_type!r})"
