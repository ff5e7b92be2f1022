"""Plugins by entry point: the ``mini_vllm.platform_plugins`` and ``mini_vllm.general_plugins`` groups.

Mirrors vllm/plugins/__init__.py:28 — load_plugins_by_group (every entry point of the group,
filtered by the allow-list in ``VLLM_PLUGINS``, here ``MINI_VLLM_PLUGINS``, comma-separated) and
vllm/plugins/__init__.py:69 — load_general_plugins (once per process; each function is called
for its side effect, e.g. registering a model in ``ModelRegistry``). Python finds entry points in
every ``*.dist-info/entry_points.txt`` on ``sys.path``, installed or not, which is how the tests
add plugins without installing anything.

One difference, on purpose: upstream logs a plugin that fails to import and carries on; mini
raises ``PluginLoadError`` naming the plugin, its target and the error, so a broken plugin never
turns silently into a different platform.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from importlib.metadata import entry_points
from typing import Any

PLATFORM_PLUGINS_GROUP = "mini_vllm.platform_plugins"
DEFAULT_PLUGINS_GROUP = "mini_vllm.general_plugins"
ALLOW_ENV = "MINI_VLLM_PLUGINS"

_plugins_loaded = False


class PluginLoadError(RuntimeError):
    """A plugin's entry point did not import (its name, target and the error are in the message)."""


def load_plugins_by_group(group: str) -> dict[str, Callable[[], Any]]:
    """``{entry point name: loaded function}`` for every allowed plugin of ``group``, sorted by name."""
    allow = os.environ.get(ALLOW_ENV)
    allowed = None if allow is None else {a.strip() for a in allow.split(",") if a.strip()}
    plugins: dict[str, Callable[[], Any]] = {}
    for ep in sorted(entry_points(group=group), key=lambda e: e.name):
        if allowed is not None and ep.name not in allowed:
            continue
        if ep.name in plugins:
            continue  # the same distribution seen twice on sys.path: the first copy wins
        try:
            func = ep.load()
        except Exception as exc:
            raise PluginLoadError(
                f"plugin {ep.name!r} of group {group!r} ({ep.value}) failed to import: "
                f"{type(exc).__name__}: {exc}"
            ) from exc
        if not callable(func):
            raise PluginLoadError(f"plugin {ep.name!r} of group {group!r} ({ep.value}) is not callable")
        plugins[ep.name] = func
    return plugins


def load_general_plugins() -> list[str]:
    """Run every general plugin once per process; returns the names run (empty on later calls)."""
    global _plugins_loaded
    if _plugins_loaded:
        return []
    _plugins_loaded = True
    plugins = load_plugins_by_group(DEFAULT_PLUGINS_GROUP)
    for func in plugins.values():
        func()
    return list(plugins)


def reset_general_plugins() -> None:
    """Forget that the general plugins ran (tests)."""
    global _plugins_loaded
    _plugins_loaded = False
