"""The one entry point every lab ``bench.py`` and ``run.py`` shares.

A bench file defines ``measure(lab, args)`` (needs CUDA) and usually ``predict(lab, args)`` (runs
anywhere: formulas and datasheet peaks), then ends with::

    if __name__ == "__main__":
        sys.exit(bench_main(__file__, __doc__, measure, predict))

``bench_main`` parses ``--impl`` (``solution``, or ``starter`` to time your own code; default
``LAB_IMPL``) and ``--predict``, loads the lab beside the bench file, and runs ``predict`` or,
on a CUDA machine, ``measure``. Without a GPU and without ``--predict`` it says what to do instead
and exits 2.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

from course.runtime.devices import DevicePeak, lookup
from course.runtime.harness import load_lab

Step = Callable[[ModuleType, argparse.Namespace], Any]


def this_lab(bench_file: str | os.PathLike, impl: str | None = None) -> ModuleType:
    """The lab module beside ``bench_file``: ``solution.py``, ``starter.py``, or ``LAB_IMPL``'s choice."""
    return load_lab(Path(bench_file).with_name("test_lab.py"), impl=impl)


def bench_main(
    bench_file: str | os.PathLike,
    doc: str | None,
    measure: Step,
    predict: Step | None = None,
    add_arguments: Callable[[argparse.ArgumentParser], None] | None = None,
    argv: list[str] | None = None,
) -> int:
    """Parse the common flags, load the lab, and run ``predict`` or ``measure``; returns an exit code."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    if predict is not None:
        ap.add_argument("--predict", action="store_true", help="no GPU needed: formula and datasheet figures")
    ap.add_argument(
        "--impl",
        default=os.environ.get("LAB_IMPL", "solution") or "solution",
        choices=["solution", "starter"],
        help="which implementation to run (default: LAB_IMPL, else solution)",
    )
    if add_arguments:
        add_arguments(ap)
    args = ap.parse_args(argv)
    lab = this_lab(bench_file, args.impl)
    if predict is not None and args.predict:
        return int(predict(lab, args) or 0)
    import torch

    if not torch.cuda.is_available():
        hint = "run with --predict for the formula-based figures" if predict else "run it on a GPU box"
        print(f"no CUDA device: {Path(bench_file).name} measures on CUDA only; {hint}")
        return 2
    return int(measure(lab, args) or 0)


def device_peak(need_flops: bool = False) -> tuple[str, DevicePeak | None]:
    """This GPU's name and datasheet row; ``None`` (after saying how to add it) when the table lacks it."""
    import torch

    name = torch.cuda.get_device_name()
    found = lookup(name)
    if found is None or (need_flops and found.dense_bf16_flops is None):
        print(f"{name}: not in the peak table; add it to course/runtime/devices.py with its datasheet values")
        return name, None
    return name, found


def device_bandwidth() -> float | None:
    """This GPU's datasheet HBM bandwidth in bytes/s, after printing which device and source; ``None``
    (after saying how to add the device) when the peak table lacks it."""
    name, found = device_peak()
    if found is None:
        return None
    print(f"device: {name}; {found.reference}")
    return found.hbm_bytes_per_s
