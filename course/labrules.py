"""Static lab rules ``check-labs`` applies before running anything.

* **Same surface.** ``starter.py`` defines the same public names as ``solution.py``, and every
  public function and method has the same signature (parameters, defaults, annotations), so a
  learner's finished starter is a drop-in for the reference.
* **Declared dependencies.** A lab that reuses another lab's code names it in ``lab.toml``
  (``requires = ["phase-NN/lab-MM-slug"]``) and loads it with ``use_lab("phase-NN/lab-MM-slug")``.
  A dependency must be an earlier lab (an earlier phase, or a lower lab number in the same phase),
  there is no cycle, and no file reaches another lab any other way (a hand-built path to a
  ``lab-NN-*`` folder, ``load_lab`` on anything but ``__file__``, an undeclared ``use_lab``).
* **No typed counts.** The README never counts its tests, cases or mutants ("The grader (8
  tests).", "eleven plausible wrong solutions"): tests and mutants are added all the time and a
  typed count goes stale. It says what kinds there are instead (markers, what the mutants plant).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from course.citations import OUTPUT_CLOSE, OUTPUT_OPEN_RE
from course.discover import Lab
from course.mdscan import fenced_lines
from course.runtime.harness import LAB_ID_RE, declared_requires

USE_LAB_RE = re.compile(r"""use_lab\(\s*["']([^"']+)["']""")
LAB_PATH_RE = re.compile(r"""["'/](lab-\d\d-[a-z0-9-]+)""")
LOAD_LAB_RE = re.compile(r"load_lab\((?!\s*__file__)")


def lab_id(lab: Lab) -> str:
    return f"phase-{lab.phase}/{lab.name}"


def _order(lab_id_: str) -> tuple[str, str]:
    match = LAB_ID_RE.match(lab_id_)
    return (match.group(1), match.group(2)[:6]) if match else ("99", "lab-99")


# ------------------------------------------------------------------ same public surface
def public_surface(path: Path) -> dict[str, str]:
    """``name -> signature`` for the public top-level functions, classes (and their methods) and constants."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    surface: dict[str, str] = {}

    def sig(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> str:
        return f"({ast.unparse(fn.args)})" + (f" -> {ast.unparse(fn.returns)}" if fn.returns else "")

    for node in tree.body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                name = (alias.asname or alias.name).split(".")[0]
                if not name.startswith("_") and isinstance(node, ast.ImportFrom):
                    surface[name] = "import"  # re-exported from elsewhere (mini_vllm, an earlier lab)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and not node.name.startswith("_"):
            surface[node.name] = "def " + sig(node)
        elif isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
            surface[node.name] = "class"
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and (
                    not item.name.startswith("_") or item.name == "__init__"
                ):
                    surface[f"{node.name}.{item.name}"] = "def " + sig(item)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                if isinstance(target, ast.Name) and not target.id.startswith("_"):
                    surface[target.id] = "constant"
    return surface


def surface_problems(lab: Lab) -> list[str]:
    solution, starter = lab.path / "solution.py", lab.path / "starter.py"
    if not (solution.is_file() and starter.is_file()):
        return ["starter.py and solution.py must both exist"]
    want, got = public_surface(solution), public_surface(starter)
    title = (ast.get_docstring(ast.parse(starter.read_text(encoding="utf-8"))) or "").split("\n", 1)[0]
    copied_title = (
        ["starter.py's docstring calls it the reference: say it is the starter"]
        if ("(reference" in title)
        else []
    )

    def imported(surface: dict[str, str], name: str) -> bool:
        return surface.get(name.split(".")[0]) == "import"

    problems = copied_title
    for name in sorted(want.keys() - got.keys()):
        if want[name] != "import" and not imported(got, name):
            problems.append(f"starter.py lacks {name} ({want[name]}) that solution.py defines")
    for name in sorted(got.keys() - want.keys()):
        if got[name] != "import" and not imported(want, name):
            problems.append(f"starter.py defines {name} ({got[name]}) that solution.py does not")
    for name in sorted(want.keys() & got.keys()):
        kinds = {want[name][:3], got[name][:3]}
        if want[name] != got[name] and not kinds & {"con", "imp"}:
            problems.append(
                f"starter.py {name}{got[name][4:]} differs from solution.py {name}{want[name][4:]}"
            )
    return problems


# ------------------------------------------------------------------ no typed counts in the README
_UNITS = "one two three four five six seven eight nine".split()
_TEENS = "ten eleven twelve thirteen fourteen fifteen sixteen seventeen eighteen nineteen".split()
_TENS = ["twenty", "thirty", "forty"]
NUMBER_WORDS = [*_UNITS, *_TEENS, *_TENS, *(f"{t}-{u}" for t in _TENS for u in _UNITS), "fifty"]
_NUMBER = r"\d+|" + "|".join(sorted(NUMBER_WORDS, key=len, reverse=True))
# Words that may sit between the number and the noun without ending the count ("seven `triton`
# tests", "nine CPU tests") are any single word but these, which start a new phrase ("2 and refuses
# wrong", "5 The test").
_NOT_A_QUALIFIER = frozenset(
    "a an and the of in on per plus has have is are to from with than or for by".split()
)
COUNT_RE = re.compile(
    rf"(?<![\w.-])(?P<n>{_NUMBER})\s+(?:(?P<q>`[^`]+`|[A-Za-z][\w-]*)\s+)?"
    r"(?:tests?|cases|mutants|wrong|plausible)\b",
    re.IGNORECASE,
)
# "Lab 01 tests", "tier 1 tests", "phase 2 test": the number names something, it counts nothing.
_NAMING_WORD_RE = re.compile(
    r"\b(?:lab|labs|tier|phase|step|part|section|exercise|question|chapter)\s*$", re.I
)


def typed_counts(text: str) -> list[tuple[int, str]]:
    """``(line, phrase)`` for each typed count of tests, cases or mutants outside code and output blocks."""
    lines = text.split("\n")
    found: list[tuple[int, str]] = []
    in_output = False
    for number, (line, in_fence) in enumerate(zip(lines, fenced_lines(lines), strict=True), 1):
        stripped = line.strip()
        if not in_fence and OUTPUT_OPEN_RE.match(stripped):
            in_output = True
        elif in_output and stripped == OUTPUT_CLOSE:
            in_output = False
        if in_fence or in_output:
            continue
        for m in COUNT_RE.finditer(line):
            qualifier = (m.group("q") or "").lower()
            if qualifier in _NOT_A_QUALIFIER or _NAMING_WORD_RE.search(line[: m.start()]):
                continue
            found.append((number, m.group(0)))
    return found


def readme_count_problems(lab: Lab) -> list[str]:
    """Typed counts in the lab's README (they go stale as tests and mutants are added)."""
    if not lab.readme.is_file():
        return []
    return [
        f"README.md:{line}: '{phrase}' counts tests or mutants by hand; describe them instead "
        "(what they check, their markers, what the mutants plant): counts go stale"
        for line, phrase in typed_counts(lab.readme.read_text(encoding="utf-8"))
    ]


# ------------------------------------------------------------------ declared dependencies
def _lab_files(lab: Lab) -> list[Path]:
    return sorted(p for p in lab.path.glob("*.py"))


def dependency_problems(lab: Lab, known: set[str]) -> list[str]:
    """Problems with one lab's declared and actual cross-lab loads (``known``: every lab id)."""
    me = lab_id(lab)
    try:
        declared = declared_requires(lab.path)
    except (ValueError, OSError) as exc:
        return [f"lab.toml: {exc}"]
    problems = []
    for dep in declared:
        if not LAB_ID_RE.match(dep) or dep not in known:
            problems.append(
                f"lab.toml requires {dep!r}, which is not a lab (ids look like 'phase-01/lab-01-slug')"
            )
        elif _order(dep) >= _order(me):
            problems.append(f"lab.toml requires {dep}, a later lab: a lab may only build on earlier ones")
    for path in _lab_files(lab):
        text = path.read_text(encoding="utf-8", errors="replace")
        used = set(USE_LAB_RE.findall(text))
        for dep in sorted(used - set(declared)):
            problems.append(f"{path.name} loads {dep} with use_lab but lab.toml does not declare it")
        for n, line in enumerate(text.splitlines(), 1):
            if LOAD_LAB_RE.search(line) and "def load_lab" not in line:
                problems.append(
                    f"{path.name}:{n} calls load_lab on another file: use use_lab('phase-NN/lab-MM-…') "
                    f"and declare it in lab.toml"
                )
            for other in LAB_PATH_RE.findall(line):
                if other != lab.name and "use_lab(" not in line:
                    problems.append(
                        f"{path.name}:{n} builds a path to {other}: load it with use_lab and declare it in lab.toml"
                    )
    return problems


def find_cycle(graph: dict[str, list[str]]) -> list[str] | None:
    """One dependency cycle (as a list of ids, first repeated last) or ``None``."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in graph.get(node, []):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt) :] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def mutant_folder_problems(lab: Lab) -> list[str]:
    """Anything in ``mutants/`` that is not a ``.diff`` (an old whole-copy mutant would be ignored)."""
    folder = lab.path / "mutants"
    if not folder.is_dir():
        return []
    return [
        f"mutants/{p.name}: mutants are deltas now: python -m course mutant new {Path(*lab.path.parts[-3:])} {p.stem}, "
        f"copy the mistake in, then mutant save"
        for p in sorted(folder.iterdir())
        if p.is_file() and p.suffix != ".diff"
    ]


def static_problems(labs: list[Lab], all_labs: list[Lab]) -> dict[Path, list[str]]:
    """Every static problem, per lab folder (``all_labs`` resolves dependencies outside the selection)."""
    known = {lab_id(lab) for lab in all_labs}
    graph = {}
    for lab in all_labs:
        try:
            graph[lab_id(lab)] = declared_requires(lab.path)
        except (ValueError, OSError):
            graph[lab_id(lab)] = []
    cycle = find_cycle(graph)
    out: dict[Path, list[str]] = {}
    for lab in labs:
        problems = surface_problems(lab) + dependency_problems(lab, known) + mutant_folder_problems(lab)
        problems += readme_count_problems(lab)
        if cycle and lab_id(lab) in cycle:
            problems.append("dependency cycle: " + " -> ".join(cycle))
        out[lab.path] = problems
    return out
