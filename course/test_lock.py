"""The lock agrees with pyproject.toml: every declared range holds the locked version, on each Python.

A range changed without `make lock` (or a lock edited by hand) fails here, naming the package.
"""

from __future__ import annotations

import re
import tomllib

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from course import ROOT
from course.lock import LOCK_DIR, PYTHONS, UPSTREAM

PIN = re.compile(r"^([A-Za-z0-9._-]+)==([^\s\\;]+)", re.M)


def _locked(text: str) -> dict[str, Version]:
    return {canonicalize_name(m[1]): Version(m[2]) for m in PIN.finditer(text)}


def _declared() -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    self_name = canonicalize_name(project["name"])
    reqs: list[Requirement] = []
    todo, seen = ["dev", "upstream"], set()
    reqs += [Requirement(r) for r in project["dependencies"]]
    while todo:
        extra = todo.pop()
        if extra in seen:
            continue
        seen.add(extra)
        for line in extras[extra]:
            req = Requirement(line)
            if canonicalize_name(req.name) == self_name:
                todo += sorted(req.extras)
            else:
                reqs.append(req)
    return reqs


@pytest.mark.parametrize("python", PYTHONS)
def test_every_declared_range_holds_the_locked_version(python: str) -> None:
    path = ROOT / LOCK_DIR / f"py{python}.txt"
    assert path.is_file(), f"{path.relative_to(ROOT)} is missing: run `make lock`"
    locked = _locked(path.read_text())
    env = {"python_version": python, "sys_platform": "linux", "platform_system": "Linux",
           "platform_machine": "x86_64"}
    checked = 0
    for req in _declared():
        name = canonicalize_name(req.name)
        if req.marker is not None and not req.marker.evaluate(env):
            continue
        if name == "torch":
            assert "torch" not in locked, "torch is installed by its own step (make venv), never from the lock"
            assert str(req.specifier) == "==2.13.0", f"the course's torch pin changed to {req.specifier}"
            continue
        assert name in locked, (
            f"{req.name} is declared in pyproject.toml but not locked for Python {python}: run `make lock`")
        assert req.specifier.contains(locked[name], prereleases=True), (
            f"{req.name}: pyproject.toml asks for {req.specifier!s}, the Python {python} lock has "
            f"{locked[name]}: run `make lock` (or fix the range)")
        checked += 1
    assert checked > 50, f"only {checked} requirements checked: is pyproject.toml's dev/upstream extra parsed?"


@pytest.mark.parametrize("python", PYTHONS)
def test_the_lock_is_hashed_and_pins_everything(python: str) -> None:
    text = (ROOT / LOCK_DIR / f"py{python}.txt").read_text()
    entries = [e for e in re.split(r"\n(?=[A-Za-z0-9])", text) if PIN.match(e)]
    assert entries
    for entry in entries:
        name = PIN.match(entry)[1]
        assert "--hash=sha256:" in entry, f"{name} in the Python {python} lock has no sha256 (pip --require-hashes)"
    for line in text.splitlines():
        if line and not line.startswith((" ", "#")):
            assert PIN.match(line), f"an unpinned line in the Python {python} lock: {line!r}"
    assert "vllm" not in _locked(text), "vllm stays out of the lock (its torch pin conflicts); it is in upstream.txt"


def test_numpy_is_below_what_numba_rejects() -> None:
    for python in PYTHONS:
        locked = _locked((ROOT / LOCK_DIR / f"py{python}.txt").read_text())
        assert locked["numba"] == Version("0.65.0")
        assert locked["numpy"] < Version("2.5"), f"numba 0.65 refuses numpy {locked['numpy']} (Python {python})"


def test_vllm_is_pinned_with_hashes() -> None:
    text = (ROOT / UPSTREAM).read_text()
    assert _locked(text) == {"vllm": Version("0.22.1")}, "requirements/upstream.txt pins exactly vllm==0.22.1"
    assert text.count("--hash=sha256:") >= 1
