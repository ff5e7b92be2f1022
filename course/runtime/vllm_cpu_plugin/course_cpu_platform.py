"""A vLLM platform plugin that selects vLLM's own CPU platform, found without a pip install.

vLLM looks for platforms under the ``vllm.platform_plugins`` entry-point group. Python finds
entry points in every ``*.dist-info`` folder on ``sys.path``, so this folder (this module plus
``course_cpu_platform-1.0.dist-info/entry_points.txt``) becomes an installed plugin the moment
``course.runtime.cpu_env`` puts it on ``sys.path``. Phase 17 builds one of these by hand.

Why the course needs it: the standard ``vllm`` wheel activates its CPU platform only when its
version string contains "cpu", so in the course venv vLLM would otherwise settle on
``UnspecifiedPlatform`` (pinned memory assumed, no ``num_compute_units``, another sampler path).
"""

from __future__ import annotations

from pathlib import Path

CPU_PLATFORM = "vllm.platforms.cpu.CpuPlatform"


def register() -> str | None:
    """The platform's qualified name when this machine has no CUDA device; None leaves the choice to vLLM."""
    if Path("/dev/nvidiactl").exists() or Path("/proc/driver/nvidia").exists():
        import torch

        if torch.cuda.is_available():
            return None
    return CPU_PLATFORM
