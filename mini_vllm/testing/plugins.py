"""Make a plugin "installed" without installing it: a module plus a ``*.dist-info`` on a folder.

``importlib.metadata`` finds entry points in every ``<name>-<version>.dist-info/entry_points.txt``
on ``sys.path``; putting the folder on ``sys.path`` is all an install would have done for a
plugin (the course's own vLLM plugin, ``course/runtime/vllm_cpu_plugin/``, works the same way).
Used by ``mini_vllm/test_platforms.py`` and the Phase 17 labs, for mini's groups and vLLM's.
"""

from __future__ import annotations

import re
from pathlib import Path


def write_plugin_dist(
    root: str | Path,
    dist_name: str,
    modules: dict[str, str],
    entry_points: dict[str, dict[str, str]],
    version: str = "0.1",
) -> Path:
    """Write ``modules`` (``{module name: source}``) and one dist-info declaring ``entry_points``.

    ``entry_points`` is ``{group: {entry name: "module:function"}}``. Returns ``root``, the folder
    to put on ``sys.path`` (or ``PYTHONPATH`` for a child process).
    """
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    for name, source in modules.items():
        (root / f"{name}.py").write_text(source, encoding="utf-8")
    safe = re.sub(r"[-_.]+", "_", dist_name)
    info = root / f"{safe}-{version}.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {dist_name}\nVersion: {version}\n", encoding="utf-8"
    )
    lines = []
    for group, entries in entry_points.items():
        lines.append(f"[{group}]")
        lines += [f"{name} = {target}" for name, target in entries.items()]
        lines.append("")
    (info / "entry_points.txt").write_text("\n".join(lines), encoding="utf-8")
    return root


def checkpoint_as(src: str | Path, dest: str | Path, arch: str) -> Path:
    """``src`` (a checkpoint folder) seen under another architecture name: links to its files in
    ``dest`` and a ``config.json`` whose ``architectures`` is ``[arch]`` (what a plugin registers)."""
    import json

    src, dest = Path(src), Path(dest)
    dest.mkdir(parents=True)
    for f in src.iterdir():
        if f.name != "config.json":
            (dest / f.name).symlink_to(f.resolve())
    cfg = json.loads((src / "config.json").read_text(encoding="utf-8"))
    (dest / "config.json").write_text(json.dumps({**cfg, "architectures": [arch]}), encoding="utf-8")
    return dest
