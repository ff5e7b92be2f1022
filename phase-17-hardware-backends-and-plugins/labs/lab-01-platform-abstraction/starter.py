"""Lab 01 (starter): a platform interface, a registry, and a resolver with an override and a floor.

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
        raise NotImplementedError(
            "return dtype if it is in supported_dtypes, else warn and return FALLBACK_DTYPE"
        )


def make_default_platforms() -> dict[str, Platform]:
    """A fresh registry with the two in-tree platforms (a new dict on every call)."""
    raise NotImplementedError(
        "return a new dict: 'cpu' (torch_sdpa, float32+bfloat16, no graphs) and 'cuda' "
        "(flash_attn, float32+float16+bfloat16, graphs)"
    )


def register_platform(registry: dict[str, Platform], platform: Platform) -> None:
    """Add ``platform``; a name already taken (in-tree or not) is refused and nothing changes."""
    raise NotImplementedError("refuse a non-Platform (TypeError) and a taken name (ValueError), else add it")


def resolve_platform(
    registry: dict[str, Platform], detected_devices: list[str], override: str | None = None
) -> Platform:
    """The one platform to run: the override, else a detected plugin, else a detected in-tree
    accelerator, else cpu (the floor).

    Two detected out-of-tree platforms (or two in-tree accelerators) is an error naming both,
    as upstream refuses two activated plugins. Neither argument is modified.
    """
    raise NotImplementedError(
        "override first (unknown: ValueError listing the names); then detected plugins, then "
        "detected in-tree accelerators (two at once: ValueError naming both); then 'cpu' "
        "(missing: LookupError)"
    )


# -- mini_vllm's seam ---------------------------------------------------------------------------
MINI_BACKENDS = {"torch_sdpa": "torch", "numpy_paged": "numpy"}


def as_mini_platform(platform: Platform):
    """A ``mini_vllm.platforms.Platform`` that answers with ``platform``'s decisions.

    Its attention backend follows ``platform.attention_backend`` (``torch_sdpa`` → mini's torch
    kernels, ``numpy_paged`` → the numpy ones; anything else has no kernel here: ``ValueError``),
    its dtype negotiation is ``platform.check_dtype``, graph support is ``supports_graphs``.
    """
    raise NotImplementedError(
        "subclass mini's TorchCpuPlatform or NumpyPlatform by "
        "MINI_BACKENDS[platform.attention_backend] (unknown: ValueError naming it), answering "
        "with the lab platform's name, dtypes, check_dtype and supports_graphs"
    )


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
