"""Which platform does the real vLLM pick? Six set-ups through ``resolve_current_platform_cls_qualname``.

Each set-up puts the course's own CPU plugin and a few hand-made plugin distributions (a module and a ``*.dist-info`` folder with
``entry_points.txt``) on ``sys.path`` and sets or clears ``VLLM_PLUGINS``, then asks vLLM 0.22.1's
own resolver (``vllm/platforms/__init__.py``) which platform class it would build. Nothing is
installed; the folders live in a temporary directory. It also runs ``load_general_plugins`` once to
show a general plugin registering a model. On a machine with a GPU the first line changes (the
built-in ``cuda`` probe activates); the course's CI has none.
Run: python phase-17-hardware-backends-and-plugins/figures/resolve.py
"""

from __future__ import annotations

import importlib
import logging
import os
import sys
import tempfile
from pathlib import Path

from course.runtime.cpu_env import PLUGIN_DIR  # noqa: E402  (cheap: no torch, no vllm)

os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")  # vLLM's own log lines stay off stdout
os.environ.pop("VLLM_PLUGINS", None)
# Start from the standard wheel's view: the course's own plugin folder only where a set-up adds it.
sys.path[:] = [p for p in sys.path if Path(p).resolve() != PLUGIN_DIR]

import vllm.platforms as platforms  # noqa: E402
import vllm.plugins as plugins  # noqa: E402

# name -> (entry-point group, what the entry point's function does); "course_cpu" is the course's
# real plugin folder (course/runtime/vllm_cpu_plugin/), the others are written here.
PLUGINS = {
    "toy": ("vllm.platform_plugins", "return 'toyplat.ToyPlatform'"),
    "shy": ("vllm.platform_plugins", "return None"),
    "broken": ("vllm.platform_plugins", "raise RuntimeError('no device found')"),
    "typo": ("vllm.platform_plugins", None),  # the entry point names a module that does not exist
    "toy_models": ("vllm.general_plugins", "REGISTERED.append('ToyForCausalLM')"),
}

SETUPS = [
    ("the standard wheel, no plugins", [], None),
    ("+ the course's CPU plugin", ["course_cpu"], None),
    ("+ a plugin that declines (returns None)", ["course_cpu", "shy"], None),
    ("+ a plugin that raises, + one that cannot import", ["course_cpu", "broken", "typo"], None),
    ("two plugins both activate", ["course_cpu", "toy"], None),
    ("the same two, VLLM_PLUGINS=toy", ["course_cpu", "toy"], "toy"),
]


def make_dist(root: Path, name: str) -> Path:
    """One plugin distribution in its own folder: ``<name>_plug.py`` and its dist-info."""
    group, body = PLUGINS[name]
    folder = root / name
    info = folder / f"{name}_plug-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}-plug\nVersion: 1.0\n")
    target = f"{name}_plug:hook" if body is not None else "no_such_module:hook"
    (info / "entry_points.txt").write_text(f"[{group}]\n{name} = {target}\n")
    if body is not None:
        (folder / f"{name}_plug.py").write_text(f"REGISTERED = []\n\n\ndef hook():\n    {body}\n")
    return folder


class Counter(logging.Handler):
    """Counts the ERROR records vLLM logs while loading plugins ("Failed to load plugin ...")."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.names: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.names.append(str(record.args[0]) if record.args else record.getMessage())


def resolve(folders: list[Path], allowed: str | None) -> str:
    saved = list(sys.path)
    sys.path[:0] = [str(f) for f in folders]
    if allowed is None:
        os.environ.pop("VLLM_PLUGINS", None)
    else:
        os.environ["VLLM_PLUGINS"] = allowed
    importlib.invalidate_caches()
    try:
        return platforms.resolve_current_platform_cls_qualname()
    except RuntimeError as e:  # the names come from a set: sort them so the page is stable
        text = str(e)
        head, _, listed = text.partition("[")
        names = sorted(n.strip(" '") for n in listed.rstrip("]").split(","))
        return f"RuntimeError: {head}{names}"
    finally:
        sys.path[:] = saved
        os.environ.pop("VLLM_PLUGINS", None)


def main() -> None:
    counter = Counter()
    logging.getLogger("vllm.plugins").addHandler(counter)
    with tempfile.TemporaryDirectory() as tmp:
        folders = {name: make_dist(Path(tmp), name) for name in PLUGINS}
        folders["course_cpu"] = PLUGIN_DIR
        print("vLLM 0.22.1, resolve_current_platform_cls_qualname() on this machine:")
        for label, names, allowed in SETUPS:
            counter.names.clear()
            result = resolve([folders[n] for n in names], allowed)
            print(f"  {label}")
            print(f"    -> {result}")
            if counter.names:
                print(f"       logged, not raised: failed to load plugin {', '.join(counter.names)}")
            raised = [n for n in names if n in PLUGINS and (PLUGINS[n][1] or "").startswith("raise")]
            if raised:
                print(f"       no trace at all: plugin {', '.join(raised)} raised inside its hook")

        sys.path.insert(0, str(folders["toy_models"]))
        importlib.invalidate_caches()
        plugins.plugins_loaded = False
        plugins.load_general_plugins()
        plugins.load_general_plugins()  # a second call in the same process does nothing
        module = sys.modules["toy_models_plug"]
        print("load_general_plugins() twice in one process:")
        print(f"  the general plugin ran {len(module.REGISTERED)} time(s): registered {module.REGISTERED}")


if __name__ == "__main__":
    main()
