"""``NumpyPlatform``: mini's default, the floor every machine has. Models run on numpy as written.

Plays the part vllm/platforms/cpu.py:41 — CpuPlatform plays upstream: the platform that always
works. Its attention backend is ``NumpyPagedAttentionBackend`` (``mini_vllm/attention.py``'s cache
write and varlen paged attention, the FlashAttention contract in float32). ``dist_backend`` is
``"pipe"``: mini's multiprocess executor all-gathers over ``multiprocessing`` pipes.

Left out: threads, NUMA binding, memory introspection (``get_device_total_memory`` is the base's
refusal).
"""

from __future__ import annotations

from .. import attention
from .interface import Platform, PlatformEnum


class NumpyPagedAttentionBackend:
    """The numpy kernels, behind the two calls an attention layer makes."""

    name = "NUMPY_PAGED"
    reshape_and_cache = staticmethod(attention.reshape_and_cache)
    forward = staticmethod(attention.paged_attention)


class NumpyPlatform(Platform):
    _enum = PlatformEnum.NUMPY
    device_name = "numpy"
    device_type = "cpu"
    dispatch_key = "CPU"
    dist_backend = "pipe"
    supported_dtypes = ("float32",)

    @classmethod
    def get_attn_backend_cls(cls, selected_backend: str | None, head_size: int, dtype: str) -> str:
        if selected_backend not in (None, NumpyPagedAttentionBackend.name):
            raise ValueError(
                f"attention backend {selected_backend!r} does not run on the numpy platform; "
                f"it has {NumpyPagedAttentionBackend.name!r}"
            )
        return "mini_vllm.platforms.numpy_platform.NumpyPagedAttentionBackend"
