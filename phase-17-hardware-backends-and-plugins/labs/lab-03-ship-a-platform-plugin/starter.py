"""Lab 03 (starter): ship a platform plugin and a model plugin; vLLM and mini_vllm both pick them.

This file *is* the plugin: ``install_plugin`` copies it into a folder as ``toyplat.py`` next to a
``toyplat-0.1.dist-info`` whose ``entry_points.txt`` names its functions in four groups, two of
vLLM's and two of mini_vllm's. Put the folder on ``sys.path`` (or ``PYTHONPATH``) and both engines
find it, as if ``pip install`` had run. ``python solution.py`` prints the README's figures.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")  # keep vLLM's log lines off stdout

if __name__ == "__main__":  # run as a script: wire tier 1 before the first vLLM import
    from course.runtime import cpu_env

    cpu_env.apply()

from vllm.platforms.cpu import CpuPlatform  # noqa: E402

from mini_vllm.platforms.numpy_platform import NumpyPlatform  # noqa: E402

DEVICE_ENV = "TOY_ACCELERATOR"  # "0": the toy accelerator is absent, the platform plugins decline
DEVICE_NAME = "toy-accelerator"
MODEL_ARCH = "ToyPluginForCausalLM"


# -- the plugin --------------------------------------------------------------------------------
class ToyPlatform(CpuPlatform):
    """vLLM's CPU platform under another name: every hook it does not override stays CpuPlatform's."""

    device_name = DEVICE_NAME

    @classmethod
    def get_device_name(cls, device_id: int = 0) -> str:
        raise NotImplementedError("CpuPlatform answers 'cpu' here: answer DEVICE_NAME")


class ToyMiniPlatform(NumpyPlatform):
    """mini_vllm's numpy platform under the same name."""

    device_name = DEVICE_NAME


def _present() -> bool:
    return os.environ.get(DEVICE_ENV, "1") != "0"


def register_vllm_platform() -> str | None:
    """``vllm.platform_plugins``: the platform's class path when the device is present, else None."""
    raise NotImplementedError(
        "return this class's path, f'{__name__}.ToyPlatform', when _present(), else None"
    )


def register_mini_platform() -> str | None:
    """``mini_vllm.platform_plugins``: the same decision for mini_vllm."""
    raise NotImplementedError("the same for ToyMiniPlatform")


def register_vllm_model() -> None:
    """``vllm.general_plugins``: ``ToyPluginForCausalLM`` runs vLLM's Llama (lazily, by name).

    General plugins may run in every process and more than once: register only if absent.
    """
    raise NotImplementedError(
        "from vllm import ModelRegistry; register MODEL_ARCH as "
        "'vllm.model_executor.models.llama:LlamaForCausalLM' unless it is already there"
    )


def register_mini_model() -> None:
    """``mini_vllm.general_plugins``: the same architecture name, mini's Llama."""
    raise NotImplementedError(
        "mini_vllm.models.registry.ModelRegistry: MODEL_ARCH -> "
        "'mini_vllm.models.llama:LlamaForCausalLM', once"
    )


# -- shipping it -------------------------------------------------------------------------------
def entry_points(module: str) -> dict[str, dict[str, str]]:
    """``{group: {entry name: "module:function"}}`` for the four hooks above."""
    raise NotImplementedError(
        "four groups: vllm.platform_plugins, vllm.general_plugins, mini_vllm.platform_plugins, "
        "mini_vllm.general_plugins; targets 'module:function'"
    )


def entry_points_txt(groups: dict[str, dict[str, str]]) -> str:
    """The INI text of ``entry_points.txt``: a ``[group]`` line, then ``name = target`` lines."""
    raise NotImplementedError("'[group]' then 'name = target' lines, a blank line after each group")


def install_plugin(root: str | Path, module: str = "toyplat", version: str = "0.1") -> Path:
    """Copy this file to ``root/<module>.py`` and write ``root/<module>-<version>.dist-info``
    (``METADATA`` with Name and Version, ``entry_points.txt``). Returns ``root``."""
    raise NotImplementedError(
        "copy this file to root/<module>.py; write <module>-<version>.dist-info/METADATA "
        "(Metadata-Version, Name, Version) and entry_points.txt"
    )


# What the child prints: the platform vLLM resolved, and the class behind the plugin's architecture.
CHILD = """
import json, os
import vllm.platforms as vp
from vllm.platforms import current_platform
from vllm.plugins import load_general_plugins
from vllm import ModelRegistry
load_general_plugins()
cls = ModelRegistry._try_load_model_cls("ToyPluginForCausalLM")
os.environ["TOY_ACCELERATOR"] = "0"
print(json.dumps({
    "platform": type(current_platform).__name__,
    "device_name": current_platform.get_device_name(),
    "is_cpu": current_platform.is_cpu(),
    "dist_backend": current_platform.dist_backend,
    "model_cls": None if cls is None else f"{cls.__module__}.{cls.__name__}",
    "without_device": vp.resolve_current_platform_cls_qualname(),
}))
"""


def run_vllm_child(root: str | Path) -> dict[str, Any]:
    """``CHILD`` in a fresh interpreter that sees ``root`` and not the course's own plugin."""
    from course import ROOT
    from course.runtime import use_lab

    env = use_lab("phase-17/lab-02-run-cpu-vllm").env_without_plugin(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(root), str(ROOT), env["PYTHONPATH"]]).rstrip(os.pathsep)
    done = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        raise RuntimeError(f"the vLLM child failed ({done.returncode}): {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        root = install_plugin(Path(tmp) / "site")
        print(f"{root.name}/: {sorted(p.name for p in root.iterdir())}")
        print((root / "toyplat-0.1.dist-info" / "entry_points.txt").read_text().strip())
        child = run_vllm_child(root)
        print("\nvLLM in a child process with the plugin on PYTHONPATH:")
        for key, value in child.items():
            print(f"  {key:<15} {value}")


if __name__ == "__main__":
    main()
