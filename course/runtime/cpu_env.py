"""Tier 1: the environment that lets the real vLLM 0.22.1 run its components on a CPU.

One home for the wiring that must be in place *before the first* ``import vllm``; the root
``conftest.py``, the lab checker, the output refresher and ``course.runtime.real_vllm`` all call
it, so a test run, a ``check-labs`` child and a learner's ``python solution.py`` see the same vLLM.
Importing this module is cheap: it never imports torch, triton or vllm.

On a machine without CUDA:

* ``CUDA_VISIBLE_DEVICES=""`` — ``vllm/triton_utils/importing.py`` swaps every upstream
  ``@triton.jit`` kernel for a no-op placeholder when Triton sees no active driver, unless this
  variable is set *and empty* (its branch for distributed workers). Set, the real kernels load.
* ``TRITON_INTERPRET=1`` — those real kernels then run in Triton's interpreter, on numpy.
* the platform plugin in ``vllm_cpu_plugin/`` goes on ``sys.path`` (and on ``PYTHONPATH`` for
  child processes), so vLLM resolves ``CpuPlatform`` instead of ``UnspecifiedPlatform``.

Everywhere: ``TORCHDYNAMO_DISABLE=1`` (on ``CpuPlatform`` the random sampler is a
``torch.compile`` function: ~35 s of compiling on 2 cores, for nothing a test checks).
Values already in the environment win, so a learner can override any of them.
"""

from __future__ import annotations

import os
import sys
from collections.abc import MutableMapping
from pathlib import Path

PLUGIN_DIR = Path(__file__).resolve().parent / "vllm_cpu_plugin"


def has_cuda() -> bool:
    """A cheap probe: imports torch only when a driver is visible."""
    if not (Path("/dev/nvidiactl").exists() or Path("/proc/driver/nvidia").exists()):
        return False
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def tier1_env(cuda: bool | None = None) -> dict[str, str]:
    """The variables tier 1 sets (before any ``setdefault``), for a machine with or without CUDA."""
    cuda = has_cuda() if cuda is None else cuda
    env = {"TORCHDYNAMO_DISABLE": "1"}
    if not cuda:
        env.update(CUDA_VISIBLE_DEVICES="", TRITON_INTERPRET="1")
    return env


def apply_env(env: MutableMapping[str, str], cuda: bool | None = None) -> MutableMapping[str, str]:
    """Add the tier-1 variables to ``env`` (keeping values already there) and return it.

    Without CUDA the plugin folder is prepended to ``PYTHONPATH``, so a child process that
    imports vllm selects the CPU platform too.
    """
    cuda = has_cuda() if cuda is None else cuda
    for key, value in tier1_env(cuda).items():
        env.setdefault(key, value)
    if not cuda:
        parts = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
        if str(PLUGIN_DIR) not in parts:
            env["PYTHONPATH"] = os.pathsep.join([str(PLUGIN_DIR), *parts])
    return env


def apply(cuda: bool | None = None) -> None:
    """Wire this process: ``os.environ`` and ``sys.path``. Raises if vllm was imported first."""
    cuda = has_cuda() if cuda is None else cuda
    if "vllm.triton_utils.importing" in sys.modules and not cuda and os.environ.get("CUDA_VISIBLE_DEVICES") != "":
        raise RuntimeError(
            "vllm was imported before course.runtime.cpu_env.apply(): its Triton kernels are already "
            "placeholders. Call apply() (or import course.runtime.real_vllm) before the first `import vllm`."
        )
    apply_env(os.environ, cuda)
    if not cuda and str(PLUGIN_DIR) not in sys.path:
        sys.path.insert(0, str(PLUGIN_DIR))


def strip_env(env: MutableMapping[str, str]) -> MutableMapping[str, str]:
    """Undo ``apply_env`` on a copy meant for another interpreter (the tier-2 engine venv)."""
    for key in ("CUDA_VISIBLE_DEVICES", "TRITON_INTERPRET"):
        env.pop(key, None)
    parts = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != str(PLUGIN_DIR)]
    if parts:
        env["PYTHONPATH"] = os.pathsep.join(parts)
    else:
        env.pop("PYTHONPATH", None)
    return env
