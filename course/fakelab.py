"""Builders for tiny throwaway labs, used by the tooling's own tests (and handy for trying the tools).

A fake lab follows the real contract: ``test_lab.py`` loads the module under test with
``course.runtime.lab_module(__file__)``; ``solution.py`` is right, ``starter.py`` raises
``NotImplementedError``, ``mutants/*.diff`` are plausible wrong solutions as deltas.
"""

from __future__ import annotations

from pathlib import Path

from course import patches

SOLUTION = '''"""Reference: add two numbers."""


def add(a: int, b: int) -> int:
    """Return a + b."""
    return a + b
'''

STARTER = '''"""Starter: add two numbers."""


def add(a: int, b: int) -> int:
    """Return a + b."""
    raise NotImplementedError("return the sum of a and b")
'''

# Mutants: the wrong solution.py each one stands for (make_lab stores them as deltas).
MUTANT_WRONG = SOLUTION.replace("return a + b", "return a - b")
MUTANT_SAME = SOLUTION.replace("return a + b", "return b + a")  # secretly correct: nothing catches it

TESTS = """from course.runtime import lab_module

lab = lab_module(__file__)


def test_adds_small_numbers():
    assert lab.add(2, 3) == 5, "2 + 3 should be 5"


def test_adds_negative_numbers():
    assert lab.add(-2, 7) == 5, "-2 + 7 should be 5"
"""

LAZY_TEST = """

def test_constant_that_never_calls_the_lab():
    assert 5 == 5
"""


def make_lab(
    root: Path,
    phase: str = "phase-00-fake",
    name: str = "lab-01-add",
    *,
    tag: str = "CPU-OK",
    mutants: dict[str, str] | None = None,
    lazy_test: bool = False,
    starter: str = STARTER,
) -> Path:
    """Write one fake lab under ``root/phase/labs/name`` and return its folder."""
    lab = root / phase / "labs" / name
    lab.mkdir(parents=True)
    (lab / "README.md").write_text(f"# Lab 01 — Add two numbers [{tag}]\n\nA fake lab.\n", encoding="utf-8")
    (lab / "solution.py").write_text(SOLUTION, encoding="utf-8")
    (lab / "starter.py").write_text(starter, encoding="utf-8")
    (lab / "test_lab.py").write_text(TESTS + (LAZY_TEST if lazy_test else ""), encoding="utf-8")
    if mutants is None:
        mutants = {"subtracts": MUTANT_WRONG}
    if mutants:
        (lab / "mutants").mkdir()
        for name, text in mutants.items():
            delta = patches.write_diff(f"Fake mutant {name}.", {"solution.py": (SOLUTION, text)})
            (lab / "mutants" / f"{name}.diff").write_text(delta, encoding="utf-8")
    return lab
