"""Find the course's pieces on disk: markdown pages, phases and labs.

Everything here tolerates a half-written course: a phase folder with no labs, a lab with no
README, a phase that does not exist yet. Callers decide whether a gap is an error.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from course.mdscan import fenced_lines

# Folders that are never course content (generated, vendored, or private to the authors).
EXCLUDED_DIRS = frozenset({"upstream", "build", ".venv", ".scratch", ".git", "node_modules", "mutants"})

PHASE_RE = re.compile(r"^phase-(\d\d)-[a-z0-9-]+$")
LAB_RE = re.compile(r"^lab-(\d\d)-[a-z0-9-]+$")
TAG_RE = re.compile(r"\[(CPU-OK|GPU-OPT|GPU-REQ)\]")

# Titles of the 20 phases (course facts), used when a phase has no guide title to read yet.
PHASE_TITLES: dict[str, str] = {
    "00": "Foundations",
    "01": "Architecture & Request Lifecycle",
    "02": "PagedAttention",
    "03": "Continuous Batching & Scheduler",
    "04": "Attention Backends",
    "05": "CUDA Graphs & torch.compile",
    "06": "Quantization",
    "07": "GEMM & MoE Kernels",
    "08": "Speculative Decoding",
    "09": "Sampling & Decoding Algorithms",
    "10": "Distributed Inference",
    "11": "Multi-LoRA",
    "12": "Structured Outputs",
    "13": "Multimodal Models",
    "14": "Model Architectures",
    "15": "Disaggregated Serving",
    "16": "Serving APIs & Parsers",
    "17": "Hardware Backends & Plugins",
    "18": "Performance Engineering",
    "19": "Capstone — Maintainer & Startup",
}


@dataclass(frozen=True)
class Lab:
    """One lab folder: ``phase-NN-*/labs/lab-NN-*/`` holding a ``test_lab.py``."""

    path: Path
    phase: str  # "00"

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def readme(self) -> Path:
        return self.path / "README.md"

    @property
    def mutants(self) -> list[Path]:
        """The lab's ``mutants/*.diff`` files (see ``course.patches`` for the format)."""
        folder = self.path / "mutants"
        return sorted(folder.glob("*.diff")) if folder.is_dir() else []

    @property
    def tag(self) -> str:
        """``CPU-OK`` / ``GPU-OPT`` / ``GPU-REQ`` from the README's title line, ``?`` if absent."""
        title = first_heading(self.readme) if self.readme.is_file() else ""
        match = TAG_RE.search(title or "")
        return match.group(1) if match else "?"


@dataclass
class Phase:
    """One ``phase-NN-<slug>/`` folder."""

    path: Path
    number: str
    labs: list[Lab] = field(default_factory=list)

    @property
    def title(self) -> str:
        return PHASE_TITLES.get(self.number) or self.path.name.split("-", 2)[-1].replace("-", " ").title()


def first_heading(path: Path) -> str | None:
    """The text of the first ``# `` heading of a markdown file (outside code fences)."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None
    lines = text.splitlines()
    for line, in_fence in zip(lines, fenced_lines(lines), strict=True):
        if not in_fence and line.startswith("# "):
            return line[2:].strip()
    return None


def find_phases(root: Path) -> list[Phase]:
    """Every phase folder under ``root``, in order, with the labs that have a ``test_lab.py``."""
    phases = []
    for path in sorted(root.glob("phase-*")):
        match = PHASE_RE.match(path.name)
        if not (path.is_dir() and match):
            continue
        phase = Phase(path=path, number=match.group(1))
        labs_dir = path / "labs"
        if labs_dir.is_dir():
            for lab_dir in sorted(labs_dir.iterdir()):
                if lab_dir.is_dir() and LAB_RE.match(lab_dir.name) and (lab_dir / "test_lab.py").is_file():
                    phase.labs.append(Lab(path=lab_dir, phase=phase.number))
        phases.append(phase)
    return phases


def labs_in_order(phases: list[Phase]) -> list[Lab]:
    """The one lab order: phase by phase, each phase's labs by folder number (grader and book)."""
    return [lab for phase in phases for lab in phase.labs]


def select_phases(phases: list[Phase], wanted: list[str]) -> list[Phase]:
    """Filter by the user's PHASE arguments: ``3``, ``03``, ``phase-03-…`` or a path to it.

    Raises ``ValueError`` naming a selector that matches nothing.
    """
    if not wanted:
        return phases
    chosen: list[Phase] = []
    for raw in wanted:
        key = Path(raw.rstrip("/")).name
        if key.isdigit():
            key = f"{int(key):02d}"
        hits = [
            p for p in phases if p.number == key or p.path.name == key or p.path.name.startswith(key + "-")
        ]
        if not hits:
            known = ", ".join(p.number for p in phases) or "none yet"
            raise ValueError(f"no phase matches {raw!r} (phases present: {known})")
        chosen.extend(p for p in hits if p not in chosen)
    return chosen


def markdown_files(root: Path, paths: list[str] | None = None) -> list[Path]:
    """The course's markdown pages: ``*.md`` under ``root`` outside excluded and hidden folders.

    ``paths`` (files or folders, relative to the working directory) narrows the search.
    Raises ``FileNotFoundError`` for a path that does not exist.
    """
    if paths:
        starts = []
        for raw in paths:
            p = Path(raw)
            if not p.exists():
                raise FileNotFoundError(f"no such file or folder: {raw}")
            starts.append(p.resolve())
    else:
        starts = [root]
    found: set[Path] = set()
    for start in starts:
        if start.is_file():
            found.add(start)
            continue
        for folder, dirs, files in os.walk(start):
            # Prune in place so .venv/, upstream/ and build/ are never even listed.
            dirs[:] = sorted(
                d
                for d in dirs
                if d not in EXCLUDED_DIRS and not d.startswith(".") and not d.endswith(".egg-info")
            )
            found.update(Path(folder) / name for name in files if name.endswith(".md"))
    return sorted(found)


def rel(path: Path, root: Path) -> str:
    """``path`` relative to ``root`` when it is inside it, else as given."""
    try:
        return str(path.resolve().relative_to(root.resolve()))
    except ValueError:
        return str(path)
