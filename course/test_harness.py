"""The lab harness: LAB_IMPL picks the file, bad values are refused, a missing optional extra
skips a lab with its install command, and strict mode turns any non-gpu skip into a failure."""

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from conftest import HAS_CUDA
from course import ROOT
from course.runtime.harness import OPTIONAL_DEPS, LabImplError, current_impl, load_lab


def _lab(tmp: Path, solution: str, starter: str, test: str) -> Path:
    lab = tmp / "labs" / "lab-01-x"
    lab.mkdir(parents=True)
    (lab / "solution.py").write_text(solution)
    (lab / "starter.py").write_text(starter)
    (lab / "test_lab.py").write_text(textwrap.dedent(test))
    return lab


def _pytest(where: Path, **env: str) -> subprocess.CompletedProcess:
    """Run pytest on ``where`` with the course's root conftest and config copied beside it."""
    shutil.copy(ROOT / "conftest.py", where / "conftest.py")
    shutil.copy(ROOT / "pyproject.toml", where / "pyproject.toml")
    full_env = {**os.environ, "PYTHONPATH": str(ROOT), **env}
    if "LAB_IMPL" not in env:
        full_env.pop("LAB_IMPL", None)
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--continue-on-collection-errors", "labs"],
        cwd=where, env=full_env, capture_output=True, text=True, timeout=120, check=False,
    )


def test_lab_impl_selects_the_file(tmp_path, monkeypatch):
    lab = _lab(tmp_path, "WHO = 'solution'\n", "WHO = 'starter'\n", "")
    monkeypatch.delenv("LAB_IMPL", raising=False)
    monkeypatch.delenv("COURSE_LAB_FILE", raising=False)
    assert load_lab(lab / "test_lab.py").WHO == "solution"
    monkeypatch.setenv("LAB_IMPL", "starter")
    assert load_lab(lab / "test_lab.py").WHO == "starter"
    assert load_lab(lab / "test_lab.py", impl="solution").WHO == "solution"


def test_unknown_lab_impl_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("LAB_IMPL", "solutoin")
    with pytest.raises(LabImplError, match="LAB_IMPL=starter"):
        current_impl()


def test_missing_extra_skips_with_the_install_command(tmp_path, monkeypatch):
    monkeypatch.delenv("COURSE_LAB_FILE", raising=False)
    monkeypatch.delenv("LAB_IMPL", raising=False)
    lab = _lab(tmp_path, "import course_fake_extra\n", "", "")
    monkeypatch.setitem(OPTIONAL_DEPS, "course_fake_extra", "pip install course-fake-extra")
    with pytest.raises(pytest.skip.Exception, match="pip install course-fake-extra"):
        load_lab(lab / "test_lab.py")


def test_strict_mode_fails_every_non_gpu_skip_but_allows_a_gpu_skip(tmp_path):
    """One pytest run: a gpu skip (allowed), a plain skip and a module skipped for a missing
    extra (both must fail in strict mode)."""
    gpu_and_plain = """
    import pytest
    from course.runtime.harness import load_lab
    lab = load_lab(__file__)

    @pytest.mark.gpu
    def test_needs_a_gpu():
        assert lab.X == 1

    def test_skips_for_no_good_reason():
        pytest.skip("dependency missing")
    """
    _lab(tmp_path, "X = 1\n", "X = 1\n", gpu_and_plain)
    missing = tmp_path / "labs" / "lab-02-y"
    missing.mkdir()
    (missing / "solution.py").write_text("import course_fake_extra\n")
    (missing / "test_lab.py").write_text(textwrap.dedent("""
    from course.runtime.harness import OPTIONAL_DEPS, load_lab
    OPTIONAL_DEPS.setdefault("course_fake_extra", "pip install course-fake-extra")
    lab = load_lab(__file__)

    def test_uses_it():
        assert lab
    """))
    strict = _pytest(tmp_path, COURSE_STRICT="1")
    out = strict.stdout
    if HAS_CUDA:
        pytest.skip("this check needs a machine without CUDA")  # pragma: no cover
    assert strict.returncode != 0, out
    assert "1 failed" in out and "1 skipped" in out and "1 error" in out, (
        "strict mode must fail the plain skip and the collection skip, and allow only the gpu skip:\n" + out
    )


def test_lab_module_loads_nothing_until_a_test_reads_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    from course.runtime import lab_module

    (tmp_path / "solution.py").write_text("LOADED = True\n")
    handle = lab_module(tmp_path / "test_lab.py")
    assert "not loaded yet" in repr(handle)
    with pytest.raises(AttributeError):
        getattr(handle, "_pytestfixturefunction")  # noqa: B009 - what pytest probes while collecting
    assert "not loaded yet" in repr(handle)
    assert handle.LOADED is True and "(loaded)" in repr(handle)
    monkeypatch.setattr(handle, "LOADED", "patched")
    assert handle._module.LOADED == "patched", "monkeypatching the handle patches the lab's module"


def test_use_lab_resolves_a_lab_id_and_rejects_a_bad_one():
    from course.runtime import use_lab

    lab01 = use_lab("phase-07/lab-01-moe-routing")
    assert callable(lab01.route)
    with pytest.raises(ValueError, match="phase-NN/lab-MM-slug"):
        use_lab("lab-01-moe-routing")
    with pytest.raises(FileNotFoundError):
        use_lab("phase-07/lab-99-nothing")


def test_collecting_a_lab_never_imports_it(tmp_path: Path):
    lab = tmp_path / "lab-01-x"
    lab.mkdir()
    (lab / "solution.py").write_text("raise RuntimeError('imported at collection')\n")
    (lab / "test_lab.py").write_text(
        "from course.runtime import lab_module\n\nlab = lab_module(__file__)\n\n\n"
        "def test_a():\n    assert lab.anything\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", str(lab / "test_lab.py")],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0 and "1 test collected" in proc.stdout, proc.stdout + proc.stderr
