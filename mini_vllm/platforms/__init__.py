"""Which platform runs this process: resolved once, on first use, from plugins or a forced name.

Mirrors vllm/platforms/__init__.py:212 — resolve_current_platform_cls_qualname and its lazy
``current_platform`` (vllm/platforms/__init__.py:262 — __getattr__): each platform plugin is a
function returning a class path when its hardware is present, or None. mini's rule:

1. ``MINI_VLLM_PLATFORM=<name>`` forces one, built-in (``numpy``, ``torch``) or plugin; an unknown
   name, or a forced plugin that declines, is an error that lists the names known.
2. else the out-of-tree plugins of ``mini_vllm.platform_plugins`` that activate: two or more is an
   error naming them; exactly one wins.
3. else ``numpy``: the floor, always there (upstream falls back to ``UnspecifiedPlatform``).

A plugin may not take a built-in name (no shadowing of ``numpy`` or ``torch``). The result is
cached; ``reset_current_platform()`` forgets it and ``use_platform(p)`` swaps it for a block
(tests). ``platforms.current_platform`` is the attribute, ``get_current_platform()`` the call.
Left out: upstream's built-in detection chain (tpu, cuda, rocm, xpu, cpu), the init trace.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from .interface import Platform, PlatformEnum
from .plugins import (
    DEFAULT_PLUGINS_GROUP,
    PLATFORM_PLUGINS_GROUP,
    PluginLoadError,
    load_general_plugins,
    load_plugins_by_group,
    reset_general_plugins,
)

FORCE_ENV = "MINI_VLLM_PLATFORM"
DEFAULT_PLATFORM = "numpy"


def numpy_platform_plugin() -> str | None:
    return "mini_vllm.platforms.numpy_platform.NumpyPlatform"


def torch_platform_plugin() -> str | None:
    """The torch platform's path when torch imports, else None."""
    try:
        import torch  # noqa: F401
    except ImportError:
        return None
    return "mini_vllm.platforms.torch_cpu.TorchCpuPlatform"


builtin_platform_plugins = {"numpy": numpy_platform_plugin, "torch": torch_platform_plugin}


def resolve_obj_by_qualname(qualname: str) -> Any:
    """``"package.module.Name"`` → the object (vllm/utils/import_utils.py's helper of the same name)."""
    module_name, _, obj_name = qualname.rpartition(".")
    if not module_name:
        raise ValueError(f"expected 'package.module.Name', got {qualname!r}")
    return getattr(importlib.import_module(module_name), obj_name)


def resolve_current_platform_cls_qualname() -> str:
    """The class path of the platform this process should run (the rule in the module docstring)."""
    plugins = load_plugins_by_group(PLATFORM_PLUGINS_GROUP)
    shadowing = sorted(set(plugins) & set(builtin_platform_plugins))
    if shadowing:
        raise RuntimeError(
            f"platform plugin {shadowing[0]!r} takes a built-in platform's name; built-in names "
            f"{sorted(builtin_platform_plugins)} are reserved"
        )
    forced = os.environ.get(FORCE_ENV)
    if forced:
        table = {**builtin_platform_plugins, **plugins}
        if forced not in table:
            raise ValueError(f"{FORCE_ENV}={forced!r} names no platform; known: {sorted(table)}")
        qualname = table[forced]()
        if qualname is None:
            why = "torch does not import" if forced == "torch" else "its plugin returned None"
            raise RuntimeError(f"{FORCE_ENV}={forced!r} cannot activate on this machine: {why}")
        return qualname
    activated = {name: qualname for name, func in plugins.items() if (qualname := func()) is not None}
    if len(activated) >= 2:
        raise RuntimeError(f"only one platform plugin can be activated, but got: {sorted(activated)}")
    if activated:
        return next(iter(activated.values()))
    return builtin_platform_plugins[DEFAULT_PLATFORM]()  # type: ignore[return-value]


_current_platform: Platform | None = None


def get_current_platform() -> Platform:
    """The platform of this process: resolved and built on the first call, the same object after."""
    global _current_platform
    if _current_platform is None:
        cls = resolve_obj_by_qualname(resolve_current_platform_cls_qualname())
        if not (isinstance(cls, type) and issubclass(cls, Platform)):
            raise TypeError(f"a platform plugin must name a Platform subclass, got {cls!r}")
        _current_platform = cls()
    return _current_platform


def reset_current_platform() -> None:
    """Forget the resolved platform: the next use resolves again (tests, or after changing plugins)."""
    global _current_platform
    _current_platform = None


@contextmanager
def use_platform(platform: Platform) -> Iterator[Platform]:
    """Make ``platform`` current inside the block, then restore whatever was there."""
    global _current_platform
    if not isinstance(platform, Platform):
        raise TypeError(f"use_platform takes a Platform, got {type(platform).__name__}")
    saved, _current_platform = _current_platform, platform
    try:
        yield platform
    finally:
        _current_platform = saved


def __getattr__(name: str) -> Any:
    if name == "current_platform":
        return get_current_platform()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "DEFAULT_PLUGINS_GROUP",
    "FORCE_ENV",
    "PLATFORM_PLUGINS_GROUP",
    "Platform",
    "PlatformEnum",
    "PluginLoadError",
    "builtin_platform_plugins",
    "get_current_platform",
    "load_general_plugins",
    "load_plugins_by_group",
    "reset_current_platform",
    "reset_general_plugins",
    "resolve_current_platform_cls_qualname",
    "use_platform",
]
