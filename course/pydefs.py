"""Where names are defined in a Python source file, and which class owns each definition.

Used by the citation checker: ``def``/``async def``/``class``, ``NAME =``, ``NAME: T`` and
``self.NAME =`` (owned by the class of the enclosing method), read with ``ast`` so multi-line
signatures and class headers never confuse it.
"""

from __future__ import annotations

import ast
import functools
from dataclasses import dataclass
from pathlib import Path

MODULE = None  # owner of a module-level definition
FUNCTION_LOCAL = "<local>"  # owner of a definition inside a function body


@dataclass(frozen=True)
class Definition:
    name: str
    line: int
    owner: str | None  # class name, MODULE (None) or FUNCTION_LOCAL


_BLOCKS = (ast.stmt, ast.excepthandler, ast.match_case)


class _Collector:
    """Walks statements only (definitions are statements), which keeps big files fast."""

    def __init__(self) -> None:
        self.found: list[Definition] = []
        self.scopes: list[tuple[str, str]] = []  # ("class" | "function", name)

    def _owner(self) -> str | None:
        if not self.scopes:
            return MODULE
        kind, name = self.scopes[-1]
        return name if kind == "class" else FUNCTION_LOCAL

    def _method_class(self) -> str | None:
        """The class whose method we are in (for ``self.x = ...``)."""
        if len(self.scopes) >= 2 and self.scopes[-1][0] == "function" and self.scopes[-2][0] == "class":
            return self.scopes[-2][1]
        return None

    def walk(self, node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if not isinstance(child, _BLOCKS):
                continue
            if isinstance(child, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                self.found.append(Definition(child.name, child.lineno, self._owner()))
                kind = "class" if isinstance(child, ast.ClassDef) else "function"
                self.scopes.append((kind, child.name))
                self.walk(child)
                self.scopes.pop()
                continue
            if isinstance(child, ast.Assign):
                for target in child.targets:
                    self._target(target)
            elif isinstance(child, ast.AnnAssign):
                self._target(child.target)
            self.walk(child)

    def _target(self, target: ast.expr) -> None:
        if isinstance(target, ast.Name):
            self.found.append(Definition(target.id, target.lineno, self._owner()))
        elif isinstance(target, (ast.Tuple, ast.List)):
            for element in target.elts:
                self._target(element)
        elif (
            isinstance(target, ast.Attribute)
            and isinstance(target.value, ast.Name)
            and target.value.id == "self"
            and self._method_class()
        ):
            self.found.append(Definition(target.attr, target.lineno, self._method_class()))


@functools.lru_cache(maxsize=256)
def definitions(path: Path) -> tuple[Definition, ...] | None:
    """Every definition in ``path``, or None when the file does not parse."""
    try:
        tree = ast.parse(path.read_text(encoding="utf-8", errors="replace"), filename=str(path))
    except (SyntaxError, ValueError):
        return None
    collector = _Collector()
    collector.walk(tree)
    return tuple(collector.found)
