"""Lab 01 (reference): a platform interface, a registry, and a resolver with an override and a floor.

The shape of vllm/platforms/interface.py (one object answers every hardware question) and
vllm/platforms/__init__.py (plugins register, exactly one is chosen, once). ``as_mini_platform``
plugs your choice into mini_vllm's engine. ``python solution.py`` prints the README's figures.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field

IN_TREE = ("cpu", "cuda")  # names the core ships; a plugin may not take them
FALLBACK_DTYPE = "float32"


@dataclass
class Platform:
    """What the engine asks the hardware, in one object."""

    name: str
    device_type: str
    attention_backend: str
    supported_dtypes: set[str] = field(default_factory=set)
    supports_graphs: bool = False

    def check_dtype(self, dtype: str) -> str:
        """``dtype`` when supported, else ``"float32"`` with a warning; never raises."""
        if dtype in self.supported_dtypes:
            return dtype
        warnings.warn(
            f"{self.name} does not support {dtype!r}; falling back to {FALLBACK_DTYPE!r}", stacklevel=2
        )
        return FALLBACK_DTYPE


def make_default_platforms() -> dict[str, Platform]:
    """A fresh registry with the two in-tree platforms (a new dict on every call)."""
    return {
        "cpu": Platform("cpu", "cpu", "torch_sdpa", {"float32", "bfloat16"}, supports_graphs=False),
        "cuda": Platform(
            "cuda", "cuda", "flash_attn", {"float32", "float16", "bfloat16"}, supports_graphs=True
        ),
    }


def register_platform(registry: dict[str, Platform], platform: Platform) -> None:
    """Add ``platform``; a name already taken (in-tree or not) is refused and nothing changes."""
    if not isinstance(platform, Platform):
        raise TypeError(f"register_platform takes a Platform, got {type(platform).__name__}")
    if platform.name in registry:
        raise ValueError(f"platform {platform.name!r} is already registered; a plugin cannot replace it")
    registry[platform.name] = platform


def resolve_platform(
    registry: dict[str, Platform], detected_devices: list[str], override: str | None = None
) -> Platform:
    """The one platform to run: the override, else a detected plugin, else a detected in-tree
    accelerator, else cpu (the floor).

    Two detected out-of-tree platforms (or two in-tree accelerators) is an error naming both,
    as upstream refuses two activated plugins. Neither argument is modified.
    """
    if override is not None:
        if override not in registry:
            raise ValueError(f"override {override!r} names no registered platform; known: {sorted(registry)}")
        return registry[override]
    detected = set(detected_devices)
    found = [p for p in registry.values() if p.name != "cpu" and p.device_type in detected]
    for group in ([p for p in found if p.name not in IN_TREE], [p for p in found if p.name in IN_TREE]):
        if len(group) >= 2:
            raise ValueError(f"only one platform can be activated, but got: {sorted(p.name for p in group)}")
        if group:
            return group[0]
    if "cpu" not in registry:
        raise LookupError("no platform matches and the registry has no 'cpu' floor")
    return registry["cpu"]


# -- mini_vllm's seam ---------------------------------------------------------------------------
MINI_BACKENDS = {"torch_sdpa": "torch", "numpy_paged": "numpy"}


def as_mini_platform(platform: Platform):
    """A ``mini_vllm.platforms.Platform`` that answers with ``platform``'s decisions.

    Its attention backend follows ``platform.attention_backend`` (``torch_sdpa`` → mini's torch
    kernels, ``numpy_paged`` → the numpy ones; anything else has no kernel here: ``ValueError``),
    its dtype negotiation is ``platform.check_dtype``, graph support is ``supports_graphs``.
    """
    from mini_vllm.platforms.numpy_platform import NumpyPlatform
    from mini_vllm.platforms.torch_cpu import TorchCpuPlatform

    kind = MINI_BACKENDS.get(platform.attention_backend)
    if kind is None:
        raise ValueError(
            f"{platform.name}'s attention backend {platform.attention_backend!r} has no kernel in mini_vllm; "
            f"it runs {sorted(MINI_BACKENDS)}"
        )
    base = TorchCpuPlatform if kind == "torch" else NumpyPlatform
    lab_platform = platform

    class LabPlatform(base):
        device_name = lab_platform.name
        device_type = lab_platform.device_type
        supported_dtypes = tuple(sorted(lab_platform.supported_dtypes))

        def check_dtype(self, dtype: str) -> str:
            return lab_platform.check_dtype(dtype)

        @classmethod
        def support_static_graph_mode(cls) -> bool:
            return lab_platform.supports_graphs

    return LabPlatform()


def main() -> None:
    registry = make_default_platforms()
    register_platform(
        registry, Platform("mytpu", "tpu", "pallas", {"bfloat16", "float32"}, supports_graphs=True)
    )
    cases = [
        ([], None),
        (["cpu"], None),
        (["cpu", "cuda"], None),
        (["cpu", "cuda", "tpu"], None),
        (["cpu", "cuda"], "cpu"),
    ]
    print(f"{'detected':<22} {'override':<9} {'platform':<8} {'attention':<11} graphs")
    for devices, override in cases:
        p = resolve_platform(registry, devices, override)
        print(
            f"{str(devices):<22} {str(override):<9} {p.name:<8} {p.attention_backend:<11} {p.supports_graphs}"
        )
    for devices, override in ((["cpu"], "cdua"),):
        try:
            resolve_platform(registry, devices, override)
        except ValueError as exc:
            print(f"override 'cdua': ValueError: {exc}")
    try:
        register_platform(registry, Platform("cpu", "cpu", "evil_attn", {"float32"}))
    except ValueError as exc:
        print(f"a plugin named 'cpu': ValueError: {exc}")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name in ("cpu", "cuda", "mytpu"):
            got = {d: registry[name].check_dtype(d) for d in ("float16", "bfloat16", "fp8")}
            print(f"check_dtype on {name:<5}: {got}")


if __name__ == "__main__":
    main()
