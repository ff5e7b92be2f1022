"""The one lab harness: which implementation a ``test_lab.py`` exercises, and which labs it reuses.

Every lab test ends its imports with a lazy handle::

    from course.runtime import lab_module

    lab = lab_module(__file__)   # loads on first use: solution.py, or starter.py with LAB_IMPL=starter

Nothing is imported until a test first touches ``lab.something``, so collecting the tests has no
side effects, and a lab whose optional extra is missing (torch, triton, ...) skips each test with
the command that installs it. A lab that builds on an earlier lab's reference names it in its
``lab.toml`` (``requires = ["phase-06/lab-02-int4-groups-and-packing"]``) and loads it with
``use_lab("phase-06/lab-02-int4-groups-and-packing")``; ``check-labs`` rejects an undeclared
load, a load of a later lab, and a cycle.

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
import tomllib
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
LAB_ID_RE = re.compile(r"^phase-(\d\d)/(lab-\d\d-[a-z0-9-]+)$")

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


def _probed(name: str) -> bool:
    return name.startswith(("__", "_pytest", "_fixture")) and name not in ("__file__", "__name__", "__doc__")


class LabHandle:
    """A stand-in for a lab's module that imports it the first time a test reads an attribute."""

    def __init__(self, test_file: str | os.PathLike, impl: str | None = None) -> None:
        object.__setattr__(self, "_test_file", test_file)
        object.__setattr__(self, "_impl", impl)
        object.__setattr__(self, "_module", None)

    def _load(self) -> ModuleType:
        if self._module is None:
            object.__setattr__(self, "_module", load_lab(self._test_file, self._impl))
        return self._module

    def __getattr__(self, name: str) -> Any:
        # Dunder and pytest-private names are what pytest and friends probe while collecting:
        # answer them without importing the lab, so collection stays free of side effects.
        if _probed(name):
            raise AttributeError(name)
        return getattr(self._load(), name)

    def __setattr__(self, name: str, value: Any) -> None:
        # ``monkeypatch.setattr(lab, "fn", fake)`` must patch the module the lab's own code calls.
        setattr(self._load(), name, value)

    def __delattr__(self, name: str) -> None:
        delattr(self._load(), name)

    def __dir__(self) -> list[str]:
        return dir(self._load())

    @property
    def __dict__(self) -> dict[str, Any]:  # type: ignore[override]
        # The module's namespace: what ``monkeypatch`` reads to restore a patched attribute.
        return self._load().__dict__

    def __repr__(self) -> str:
        state = "loaded" if self._module is not None else "not loaded yet"
        return f"<lab {Path(self._test_file).resolve().parent.name} ({state})>"


def lab_module(test_file: str | os.PathLike, impl: str | None = None) -> LabHandle:
    """The lazy handle a ``test_lab.py`` calls its lab: ``lab = lab_module(__file__)``."""
    return LabHandle(test_file, impl)


def lab_dir(lab_id: str, root: Path | None = None) -> Path:
    """The folder of the lab called ``phase-NN/lab-MM-slug``."""
    match = LAB_ID_RE.match(lab_id)
    if not match:
        raise ValueError(f"lab id {lab_id!r} is not of the form 'phase-NN/lab-MM-slug'")
    phase, name = match.groups()
    hits = sorted((root or ROOT).glob(f"phase-{phase}-*/labs/{name}"))
    if len(hits) != 1 or not (hits[0] / "solution.py").is_file():
        raise FileNotFoundError(f"no lab {lab_id!r} (looked for phase-{phase}-*/labs/{name}/solution.py)")
    return hits[0]


def declared_requires(folder: Path) -> list[str]:
    """The lab ids a lab folder's ``lab.toml`` declares under ``requires`` (none without the file)."""
    path = folder / "lab.toml"
    if not path.is_file():
        return []
    data = tomllib.loads(path.read_text(encoding="utf-8"))
    requires = data.get("requires", [])
    if not (isinstance(requires, list) and all(isinstance(x, str) for x in requires)):
        raise ValueError(f"{path}: 'requires' must be a list of lab ids like 'phase-01/lab-01-slug'")
    return requires


def use_lab(lab_id: str) -> LabHandle:
    """The reference solution of an earlier lab this one declares in ``lab.toml`` (loaded lazily).

    ``use_lab("phase-01/lab-01-trace-a-request")`` stands for that lab's ``solution.py`` whatever
    ``LAB_IMPL`` says: a learner builds on working code, not on their own unfinished starter.
    """
    return LabHandle(lab_dir(lab_id) / "test_lab.py", impl="solution")
