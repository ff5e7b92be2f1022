"""The upstream fetcher: verification, wheel extraction, fallback order, refusal and idempotence."""

from __future__ import annotations

import argparse
import zipfile
from pathlib import Path

import pytest

from course import ROOT, upstream
from course.upstream import PinError, materialize, read_marker, verify_tree

GOOD_VERSION = "__version__ = version = '0.22.1'\n__commit_id__ = commit_id = 'g0decac0d9'\n"
BAD_VERSION = "__version__ = version = '0.21.0'\n__commit_id__ = commit_id = 'gdeadbeef1'\n"


def make_wheel(path: Path, version_text: str = GOOD_VERSION) -> Path:
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("vllm/_version.py", version_text)
        zf.writestr("vllm/v1/core/block_pool.py", "class BlockPool:\n    pass\n")
        zf.writestr("vllm/_C.abi3.so", b"\x7fELF binary")
        zf.writestr("vllm/vllm-rs", b"\x7fELF binary")
        zf.writestr("vllm/csrc/kernel.cuh", "// header kept\n")
        zf.writestr("vllm-0.22.1.dist-info/METADATA", "Name: vllm\n")
    return path


@pytest.fixture(autouse=True)
def no_network(monkeypatch: pytest.MonkeyPatch):
    """The git route never touches the network in these tests."""

    def fail(dest: Path) -> None:
        raise PinError("network disabled in tests")

    monkeypatch.setattr(upstream, "fetch_git", fail)


def test_wheel_route_extracts_sources_skips_binaries_and_writes_the_marker(tmp_path: Path):
    tree = tmp_path / "upstream"
    used = materialize(tree, tmp_path / "cache", wheel=make_wheel(tmp_path / "v.whl"))
    assert used == "wheel"
    assert (tree / "vllm/v1/core/block_pool.py").is_file() and (tree / "vllm/csrc/kernel.cuh").is_file()
    assert not (tree / "vllm/_C.abi3.so").exists() and not (tree / "vllm/vllm-rs").exists()
    assert not (tree / "vllm-0.22.1.dist-info").exists()
    marker = read_marker(tree)
    assert marker["route"] == "wheel" and marker["commit"] == "0decac0d96c42b49572498019f0a0e3600f50398"
    assert "tests/" in marker["lacks"] and "csrc/" in marker["lacks"]


def test_git_failure_falls_through_to_the_wheel(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    cache = tmp_path / "cache"
    cache.mkdir()
    monkeypatch.setattr(upstream, "WHEEL_SHA256", "not-checked-for-synthetic-wheel")
    make_wheel(cache / "other-name.whl")
    monkeypatch.setattr(upstream, "download_wheel", lambda cache_dir: cache_dir / "other-name.whl")
    assert materialize(tmp_path / "upstream", cache) == "wheel"


def test_staging_is_removed_on_failure_and_leftovers_are_cleared(tmp_path: Path):
    leftover = tmp_path / ".upstream-staging-killed"
    (leftover / "tree").mkdir(parents=True)
    with pytest.raises(PinError, match="gdeadbeef1"):
        materialize(
            tmp_path / "upstream", tmp_path / "cache", wheel=make_wheel(tmp_path / "v.whl", BAD_VERSION)
        )
    assert not list(tmp_path.glob(".upstream-staging-*")), "a failed fetch leaves no staging folder behind"


def test_refuses_a_wheel_that_is_not_the_pin(tmp_path: Path):
    with pytest.raises(PinError, match="gdeadbeef1"):
        materialize(
            tmp_path / "upstream", tmp_path / "cache", wheel=make_wheel(tmp_path / "v.whl", BAD_VERSION)
        )
    assert not (tmp_path / "upstream").exists(), "a refused tree must not be left in place"


def test_refuses_an_existing_wrong_tree_unless_forced(tmp_path: Path):
    tree = tmp_path / "upstream"
    (tree / "vllm/v1/core").mkdir(parents=True)
    (tree / "vllm/v1/core/block_pool.py").write_text("")
    (tree / "vllm/_version.py").write_text(BAD_VERSION)
    with pytest.raises(PinError, match="--force"):
        materialize(tree, tmp_path / "cache", wheel=make_wheel(tmp_path / "v.whl"))
    assert materialize(tree, tmp_path / "cache", force=True, wheel=tmp_path / "v.whl") == "wheel"
    assert verify_tree(tree) == "wheel"


def test_second_run_is_a_quick_no_op(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    tree = tmp_path / "upstream"
    materialize(tree, tmp_path / "cache", wheel=make_wheel(tmp_path / "v.whl"))
    args = argparse.Namespace(dest=tree, cache=tmp_path / "cache", route="auto", force=False, wheel=None)
    assert upstream.run(args) == 0
    out = capsys.readouterr().out
    assert "already" in out and "lacks tests/" in out


def test_a_wrong_wheel_file_is_rejected_by_checksum(tmp_path: Path):
    fake = make_wheel(tmp_path / upstream.WHEEL_NAME)
    with pytest.raises(PinError, match="sha256"):
        upstream.extract_wheel(fake, tmp_path / "out")


@pytest.mark.upstream(needs="tree")
def test_the_checked_out_tree_is_the_pin():
    assert verify_tree(ROOT / "upstream") in ("git", "wheel")
