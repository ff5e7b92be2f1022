"""Materialize ``upstream/``: the vLLM source tree at the course's pin, verified.

Two routes, tried in order:

1. ``git clone --depth 1 --branch v0.22.1`` of vllm-project/vllm, accepted only if
   ``git rev-parse HEAD`` is the pinned commit. The complete tree.
2. The PyPI wheel ``vllm==0.22.1`` (``pip download``, cached in ``build/cache/``): its Python
   sources (and headers/configs) are extracted, compiled ``.so`` files and binaries skipped, and
   ``vllm/_version.py`` must record the pinned commit id. It lacks ``tests/``, ``csrc/``, ``docs/``.

The result is built in a staging folder and only moved into place once verified, and a marker
file ``upstream/.course-pin`` records the route, the commit and the date.
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from course import PIN_COMMIT, PIN_SHORT, PIN_TAG, PIN_WHEEL_COMMIT_ID, ROOT, VLLM_VERSION
from course.report import progress

GIT_URL = "https://github.com/vllm-project/vllm.git"
WHEEL_NAME = f"vllm-{VLLM_VERSION}-cp38-abi3-manylinux_2_28_x86_64.whl"
WHEEL_SHA256 = "cc50536c93827a577b2bc45f038b8b866c31ed220631008521a337c9b2558f4d"
MARKER = ".course-pin"
WHEEL_LACKS = "tests/, csrc/, docs/, examples/, benchmarks/ (top level), AGENTS.md and the compiled .so files"
GIT_TIMEOUT_S = 300


class PinError(RuntimeError):
    """The tree (or the wheel) is not the pinned vLLM."""


# ---------------------------------------------------------------- verification


def read_marker(tree: Path) -> dict[str, str]:
    """Parse ``upstream/.course-pin`` (``key: value`` lines); empty if absent."""
    marker = tree / MARKER
    if not marker.is_file():
        return {}
    fields = {}
    for line in marker.read_text(encoding="utf-8").splitlines():
        key, sep, value = line.partition(":")
        if sep:
            fields[key.strip()] = value.strip()
    return fields


def verify_tree(tree: Path) -> str:
    """Return the route (``git`` or ``wheel``) if ``tree`` is the pinned vLLM; raise PinError if not."""
    if not (tree / "vllm" / "v1" / "core" / "block_pool.py").is_file():
        raise PinError(f"{tree} does not look like a vLLM source tree (no vllm/v1/core/block_pool.py)")
    if (tree / ".git").exists():
        head = _git(["rev-parse", "HEAD"], cwd=tree).strip()
        if head != PIN_COMMIT:
            raise PinError(
                f"{tree} is a git checkout of {head[:12]}, not the pin {PIN_COMMIT[:12]} ({PIN_TAG})"
            )
        return "git"
    version_file = tree / "vllm" / "_version.py"
    if not version_file.is_file():
        raise PinError(f"{tree} has neither .git nor vllm/_version.py: cannot tell which commit it is")
    text = version_file.read_text(encoding="utf-8")
    commit = re.search(r"commit_id\s*=\s*['\"]([^'\"]+)['\"]", text)
    version = re.search(r"__version__\s*=\s*version\s*=\s*['\"]([^'\"]+)['\"]", text)
    found_commit = commit.group(1) if commit else "none"
    if found_commit != PIN_WHEEL_COMMIT_ID or (version and version.group(1) != VLLM_VERSION):
        found_version = version.group(1) if version else "?"
        raise PinError(
            f"{version_file} records vllm {found_version} commit {found_commit}; "
            f"the pin is {VLLM_VERSION} commit {PIN_WHEEL_COMMIT_ID}"
        )
    return "wheel"


def _git(args: list[str], cwd: Path | None = None, timeout: float = 60) -> str:
    env = dict(os.environ, GIT_TERMINAL_PROMPT="0")
    result = subprocess.run(
        ["git", *args], cwd=cwd, env=env, check=False, capture_output=True, text=True, timeout=timeout
    )
    if result.returncode != 0:
        verb = next(
            a for i, a in enumerate(args) if not a.startswith("-") and (i == 0 or args[i - 1] != "-c")
        )
        detail = (result.stderr.strip() or result.stdout.strip()).splitlines()
        raise PinError(f"git {verb} failed: {detail[-1] if detail else 'exit ' + str(result.returncode)}")
    return result.stdout


def write_marker(tree: Path, route: str, source: str) -> None:
    now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    lines = [
        f"route: {route}",
        f"tag: {PIN_TAG}",
        f"commit: {PIN_COMMIT}",
        f"date: {now}",
        f"source: {source}",
    ]
    if route == "wheel":
        lines.append(f"lacks: {WHEEL_LACKS}")
    (tree / MARKER).write_text("\n".join(lines) + "\n", encoding="utf-8")


# ---------------------------------------------------------------- route 1: git


def fetch_git(dest: Path) -> None:
    """Shallow-clone the tag into ``dest`` (which must not exist) and verify HEAD."""
    progress(f"route 1: git clone --depth 1 --branch {PIN_TAG} {GIT_URL}")
    args = [
        "-c",
        "http.lowSpeedLimit=1000",
        "-c",
        "http.lowSpeedTime=20",
        "clone",
        "--quiet",
        "--depth",
        "1",
        "--branch",
        PIN_TAG,
        GIT_URL,
        str(dest),
    ]
    try:
        _git(args, timeout=GIT_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise PinError(f"git clone took longer than {GIT_TIMEOUT_S}s") from None
    except FileNotFoundError:
        raise PinError("git is not installed") from None
    head = _git(["rev-parse", "HEAD"], cwd=dest).strip()
    if head != PIN_COMMIT:
        raise PinError(f"tag {PIN_TAG} resolved to {head}, not the pinned {PIN_COMMIT}: refusing it")


# ---------------------------------------------------------------- route 2: wheel


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def download_wheel(cache: Path) -> Path:
    """The pinned wheel from ``cache``, downloading it with pip when it is not there yet."""
    wheel = cache / WHEEL_NAME
    if wheel.is_file():
        progress(f"route 2: using cached wheel {wheel}")
        return wheel
    cache.mkdir(parents=True, exist_ok=True)
    progress(f"route 2: pip download vllm=={VLLM_VERSION} (wheel, ~260 MB) into {cache}")
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary",
        ":all:",
        "--platform",
        "manylinux_2_28_x86_64",
        "--python-version",
        "3.12",
        f"vllm=={VLLM_VERSION}",
        "-d",
        str(cache),
    ]
    result = subprocess.run(cmd, check=False)
    if result.returncode != 0 or not wheel.is_file():
        raise PinError(f"pip download of vllm=={VLLM_VERSION} failed (exit {result.returncode})")
    return wheel


def _is_binary(zf: zipfile.ZipFile, name: str) -> bool:
    if name.endswith((".so", ".pyd", ".dll", ".dylib")) or ".so." in name:
        return True
    with zf.open(name) as fh:
        return fh.read(4) == b"\x7fELF"


def extract_wheel(wheel: Path, dest: Path) -> tuple[int, str]:
    """Extract the sources of ``wheel`` (no binaries, no dist-info) into ``dest``.

    Returns (files kept, the wheel's sha256); the pinned wheel's checksum is verified first.
    """
    digest = sha256(wheel)
    if wheel.name == WHEEL_NAME and digest != WHEEL_SHA256:
        raise PinError(f"{wheel} has sha256 {digest}, expected {WHEEL_SHA256}: delete it and retry")
    with zipfile.ZipFile(wheel) as zf:
        names = [n for n in zf.namelist() if not n.endswith("/") and ".dist-info/" not in n]
        kept = 0
        for i, name in enumerate(names, 1):
            if not _is_binary(zf, name):
                target = dest / name
                if not target.resolve().is_relative_to(dest.resolve()):
                    raise PinError(f"unsafe path in wheel: {name}")
                target.parent.mkdir(parents=True, exist_ok=True)
                with zf.open(name) as src, target.open("wb") as out:
                    shutil.copyfileobj(src, out)
                kept += 1
            if i % 500 == 0 or i == len(names):
                progress(f"  extracted {i}/{len(names)} entries")
    return kept, digest


def fetch_wheel(dest: Path, cache: Path, wheel: Path | None = None) -> str:
    wheel = wheel or download_wheel(cache)
    progress(f"route 2: extracting Python sources from {wheel.name} (skipping .so and binaries)")
    dest.mkdir(parents=True)
    count, digest = extract_wheel(wheel, dest)
    progress(f"  kept {count} source files")
    return f"{wheel.name} (sha256 {digest[:16]}…)"


# ---------------------------------------------------------------- orchestration

STAGING_PREFIX = ".upstream-staging-"


def materialize(
    tree: Path, cache: Path, route: str = "auto", force: bool = False, wheel: Path | None = None
) -> str:
    """Make ``tree`` the verified pin. Returns the route used (``already`` if nothing to do)."""
    if tree.is_dir() and not any(tree.iterdir()):
        tree.rmdir()  # an empty folder is as good as none
    if tree.exists():
        try:
            found = verify_tree(tree)
        except PinError as exc:
            if not force:
                raise PinError(f"{exc}. Refusing to use it; rerun with --force to replace {tree}") from None
            found = None
        if found and not force:
            marker = read_marker(tree)
            if marker.get("commit") != PIN_COMMIT:
                write_marker(tree, found, "verified existing tree")
            return "already"

    tree.parent.mkdir(parents=True, exist_ok=True)
    # A run killed outright (SIGKILL, a closed terminal) never reaches the ``finally`` below: clear
    # what such a run left before staging again. (.gitignore covers the folder meanwhile.)
    for leftover in tree.parent.glob(STAGING_PREFIX + "*"):
        shutil.rmtree(leftover, ignore_errors=True)
    staging = Path(tempfile.mkdtemp(prefix=STAGING_PREFIX, dir=tree.parent))
    staged = staging / "tree"
    errors = []
    used = None
    try:
        if route in ("auto", "git") and wheel is None:
            try:
                fetch_git(staged)
                used, source = "git", f"{GIT_URL} @ {PIN_TAG}"
            except PinError as exc:
                errors.append(f"git route failed: {exc}")
                progress(f"  git route unavailable: {exc}")
                shutil.rmtree(staged, ignore_errors=True)
        if used is None and route in ("auto", "wheel"):
            try:
                source = fetch_wheel(staged, cache, wheel)
                used = "wheel"
            except PinError as exc:
                errors.append(f"wheel route failed: {exc}")
        if used is None:
            raise PinError("could not materialize upstream/:\n  " + "\n  ".join(errors))
        if verify_tree(staged) != used:
            raise PinError("the fetched tree does not verify as the pin")
        write_marker(staged, used, source)
        if tree.exists():
            shutil.rmtree(tree)
        staged.rename(tree)
        return used
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "upstream",
        help="materialize upstream/ at the pinned vLLM commit",
        description=f"Fetch vLLM {PIN_TAG} @ {PIN_SHORT} into upstream/ (git clone when the network allows, "
        "else the PyPI wheel's Python sources), verify the commit, and refuse anything else.",
    )
    p.add_argument("--force", action="store_true", help="replace upstream/ even if it already exists")
    p.add_argument(
        "--route",
        choices=("auto", "git", "wheel"),
        default="auto",
        help="which route to use (default: git, falling back to the wheel)",
    )
    p.add_argument("--wheel", type=Path, help="use this local vllm wheel file instead of downloading")
    p.add_argument("--dest", type=Path, default=ROOT / "upstream", help=argparse.SUPPRESS)
    p.add_argument("--cache", type=Path, default=ROOT / "build" / "cache", help=argparse.SUPPRESS)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        used = materialize(args.dest, args.cache, route=args.route, force=args.force, wheel=args.wheel)
    except PinError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    marker = read_marker(args.dest)
    if used == "already":
        print(
            f"upstream/ is already vLLM {PIN_TAG} @ {PIN_SHORT} (route: {marker.get('route', '?')}); nothing to do."
        )
    else:
        print(f"upstream/ is now vLLM {PIN_TAG} @ {PIN_COMMIT} (route: {used}).")
    if marker.get("route") == "wheel":
        print(f"note: the wheel route lacks {WHEEL_LACKS}; the course cites only files it has.")
    return 0
