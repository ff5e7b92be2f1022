"""The one lab harness: which implementation a ``test_lab.py`` exercises.

Every lab test starts with::

    from course.harness import load_lab
    lab = load_lab(__file__)

``LAB_IMPL`` picks the file: ``solution`` (the default) loads ``solution.py`` beside the test,
``starter`` loads ``starter.py``; any other value is an error that says what is allowed.
``COURSE_LAB_FILE`` (used by ``python -m course check-labs`` to run mutants) overrides both with
an explicit path. Modules get a unique name per lab so twenty ``solution.py`` files never collide.
"""

from __future__ import annotations

import importlib.util
import os
import re
import sys
from pathlib import Path
from types import ModuleType

VALID_IMPLS = ("solution", "starter")


class LabImplError(ValueError):
    """LAB_IMPL names something that is not a lab implementation."""


def current_impl() -> str:
    impl = os.environ.get("LAB_IMPL", "solution").strip() or "solution"
    if impl not in VALID_IMPLS:
        raise LabImplError(
            f"LAB_IMPL={impl!r} is not understood: use LAB_IMPL=starter to grade your work, "
            f"or leave it unset (or LAB_IMPL=solution) to run the reference solution."
        )
    return impl


def _module_name(path: Path) -> str:
    parts = [p for p in path.with_suffix("").parts[-4:]]
    return "lab__" + re.sub(r"\W", "_", "__".join(parts))


def load_file(path: str | os.PathLike, name: str | None = None) -> ModuleType:
    """Import a Python file by path under a unique module name (cached in sys.modules)."""
    path = Path(path).resolve()
    if not path.is_file():
        raise FileNotFoundError(f"lab file not found: {path}")
    name = name or _module_name(path)
    if name in sys.modules and getattr(sys.modules[name], "__file__", None) == str(path):
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


def lab_file(test_file: str | os.PathLike, impl: str | None = None) -> Path:
    """The implementation file a lab's tests should exercise."""
    override = os.environ.get("COURSE_LAB_FILE")
    if override and impl is None:
        return Path(override).resolve()
    impl = impl or current_impl()
    if impl not in VALID_IMPLS:
        raise LabImplError(f"impl must be one of {VALID_IMPLS}, got {impl!r}")
    return Path(test_file).resolve().parent / f"{impl}.py"


# Optional extras a lab may need; without them its tests skip with the install command.
OPTIONAL_DEPS = {
    "torch": "pip install -e '.[torch]'",
    "triton": "pip install -e '.[triton]'",
    "matplotlib": "pip install -e '.[plot]'",
    "vllm": "make upstream-deps",
}


def load_lab(test_file: str | os.PathLike, impl: str | None = None) -> ModuleType:
    """Load the module under test for the lab that ``test_file`` belongs to.

    ``impl`` forces ``"solution"`` or ``"starter"`` (a lab that builds on another lab's
    reference passes ``impl="solution"`` with that lab's path); by default ``LAB_IMPL``
    decides. If the lab needs an optional extra that is not installed (torch, triton,
    matplotlib, vllm), the lab's tests are skipped with the command that installs it
    (and in strict mode, ``COURSE_STRICT=1``, that skip fails the run).
    """
    try:
        return load_file(lab_file(test_file, impl))
    except ModuleNotFoundError as exc:
        root = (exc.name or "").split(".")[0]
        if root not in OPTIONAL_DEPS:
            raise
        import pytest

        pytest.skip(
            f"this lab needs {root}, which is not installed: {OPTIONAL_DEPS[root]}",
            allow_module_level=True,
        )
