"""Which platform does the real vLLM pick? Six set-ups through ``resolve_current_platform_cls_qualname``.

Each set-up puts the course's own CPU plugin and a few hand-made plugin distributions (a module and a ``*.dist-info`` folder with
``entry_points.txt``) on ``sys.path`` and sets or clears ``VLLM_PLUGINS``, then asks vLLM 0.22.1's
own resolver (``vllm/platforms/__init__.py``) which platform class it would build. Nothing is
installed; the folders live in a temporary directory. Each plugin's verdict comes from vLLM's own
loader (``load_plugins_by_group``) and a call of the loaded function; ``resolve.svg`` draws them,
one panel per set-up. It also runs ``load_general_plugins`` to show a general plugin registering a
model. On a machine with a GPU the first line changes (the
built-in ``cuda`` probe activates); the course's CI has none.
Run: python phase-17-hardware-backends-and-plugins/figures/resolve.py
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

from course.runtime.cpu_env import PLUGIN_DIR  # noqa: E402  (cheap: no torch, no vllm)

os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")  # vLLM's own log lines stay off stdout
os.environ.pop("VLLM_PLUGINS", None)
# Start from the standard wheel's view: the course's own plugin folder only where a set-up adds it.
sys.path[:] = [p for p in sys.path if Path(p).resolve() != PLUGIN_DIR]

import vllm.platforms as platforms  # noqa: E402
import vllm.plugins as plugins  # noqa: E402

from course.svgfig import BLUE, FAINT, GREY, INK, ORANGE, PAPER, RED, Svg  # noqa: E402

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


@contextlib.contextmanager
def plugin_path(folders: list[Path], allowed: str | None) -> Iterator[None]:
    """The plugin folders first on ``sys.path`` and ``VLLM_PLUGINS`` set (or unset), then restored."""
    saved = list(sys.path)
    sys.path[:0] = [str(f) for f in folders]
    if allowed is None:
        os.environ.pop("VLLM_PLUGINS", None)
    else:
        os.environ["VLLM_PLUGINS"] = allowed
    importlib.invalidate_caches()
    try:
        yield
    finally:
        sys.path[:] = saved
        os.environ.pop("VLLM_PLUGINS", None)


def resolve() -> str:
    try:
        return platforms.resolve_current_platform_cls_qualname()
    except RuntimeError as e:  # the names come from a set: sort them so the page is stable
        text = str(e)
        head, _, listed = text.partition("[")
        names = sorted(n.strip(" '") for n in listed.rstrip("]").split(","))
        return f"RuntimeError: {head}{names}"


def verdict(func: Callable[[], object]) -> str:
    """What one candidate says when the resolver calls it: activated, declined or raised."""
    try:
        return "activated" if func() is not None else "declined"
    except Exception:
        return "raised"


def plugin_verdicts(names: list[str], allowed: str | None) -> dict[str, str]:
    """Each plugin of a set-up through vLLM's own loader, then called the way the resolver calls it."""
    loaded = plugins.load_plugins_by_group(plugins.PLATFORM_PLUGINS_GROUP)
    out = {}
    for name in names:
        if name in loaded:
            out[name] = verdict(loaded[name])
        elif allowed is not None and name not in allowed.split(","):
            out[name] = "filtered"
        else:
            out[name] = "no import"
    return out


COLOURS = {
    "activated": (ORANGE, ORANGE, INK),
    "declined": (PAPER, GREY, INK),
    "raised": (PAPER, RED, RED),
    "no import": (PAPER, RED, RED),
    "filtered": (FAINT, GREY, GREY),
}


def draw(builtins: dict[str, str], rows: list[tuple[str, dict[str, str], str]], path: Path) -> None:
    width, top, panel_h = 500, 96, 92
    svg = Svg(
        width,
        top + len(rows) * panel_h + 40,
        "How the real vLLM resolved its platform in six set-ups",
        "Stacked panels, one per set-up: each platform plugin on sys.path as a chip coloured by what it did "
        "(activated, declined, raised, could not be imported, filtered out by VLLM_PLUGINS), and the class "
        "vLLM resolved, or its error. The first line shows the five built-in probes on this machine.",
    )
    svg.text(12, 24, "vLLM 0.22.1 picks a platform", 18, bold=True)
    svg.text(12, 50, "built-in probes on this machine:", 14)
    for i, (name, said) in enumerate(builtins.items()):
        fill, stroke, ink = COLOURS[said]
        svg.rect(12 + i * 64, 60, 58, 24, fill, stroke, 1.5, rx=4)
        svg.text(41 + i * 64, 77, name, 14, "middle", fill=ink, mono=True)
    for r, (label, said, result) in enumerate(rows):
        y = top + r * panel_h
        svg.line(12, y + 4, width - 12, y + 4, GREY)
        svg.text(12, y + 24, label, 14, bold=True)
        for i, (name, what) in enumerate(said.items()):
            fill, stroke, ink = COLOURS[what]
            x = 12 + i * 150
            svg.rect(x, y + 34, 144, 26, fill, stroke, 1.5, rx=4, dash=what in ("raised", "no import"))
            svg.text(
                x + 72, y + 52, f"{name}: {what}" if what != "activated" else name, 13, "middle", fill=ink
            )
        if not said:
            svg.text(12, y + 52, "(no plugins)", 13, fill=GREY)
        svg.text(
            12,
            y + 80,
            "→ " + result.split(".")[-1] if "Error" not in result else "→ RuntimeError",
            14,
            fill=BLUE if "Error" not in result else RED,
            bold=True,
            mono=True,
        )
    y = top + len(rows) * panel_h + 20
    for x, what, text in [
        (12, "activated", "activated"),
        (112, "declined", "declined"),
        (206, "raised", "raised / no import"),
        (370, "filtered", "filtered"),
    ]:
        fill, stroke, _ = COLOURS[what]
        svg.rect(x, y - 12, 16, 14, fill, stroke, 1.5, rx=3, dash=what == "raised")
        svg.text(x + 22, y, text, 13)
    svg.write(path)


def main() -> None:
    counter = Counter()
    logging.getLogger("vllm.plugins").addHandler(counter)
    builtins = {name: verdict(probe) for name, probe in platforms.builtin_platform_plugins.items()}
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        folders = {name: make_dist(Path(tmp), name) for name in PLUGINS}
        folders["course_cpu"] = PLUGIN_DIR
        print("vLLM 0.22.1, resolve_current_platform_cls_qualname() on this machine:")
        print(f"  built-in probes: {', '.join(f'{n} {v}' for n, v in builtins.items())}")
        for label, names, allowed in SETUPS:
            with plugin_path([folders[n] for n in names], allowed):
                said = plugin_verdicts(names, allowed)
                counter.names.clear()
                result = resolve()
            rows.append((label, said, result))
            print(f"  {label}")
            print(f"    -> {result}")
            if counter.names:
                print(f"       logged, not raised: failed to load plugin {', '.join(counter.names)}")
            raised = [n for n, v in said.items() if v == "raised"]
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
    draw(builtins, rows, Path(__file__).with_name("resolve.svg"))
    print("wrote resolve.svg")


if __name__ == "__main__":
    main()
