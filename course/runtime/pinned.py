"""Compile chosen definitions straight out of the pinned ``upstream/`` tree, without importing vllm.

Some labs check that their reimplementation agrees with the real code at the pin. Importing vllm
for that is slow and drags in torch, so instead we parse the pinned file and compile only the
definitions a test names, into a namespace the test fills with light stand-ins for their
dependencies. Nothing is copied into the course: the source is read from ``upstream/`` at test time.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

from course import ROOT


def compile_definitions(
    relpath: str, names: list[str], env: dict[str, Any], root: Path | None = None
) -> list[Any]:
    """Compile ``names`` from ``upstream/<relpath>`` into ``env`` and return them in order.

    A name is a top-level class or function (``"CUDAGraphMode"``) or a method
    (``"VllmConfig._set_cudagraph_sizes"``), which is compiled as a plain function taking ``self``.
    """
    path = (root or ROOT / "upstream") / relpath
    tree = ast.parse(path.read_text(encoding="utf-8"))
    top = {n.name: n for n in tree.body if isinstance(n, (ast.ClassDef, ast.FunctionDef))}
    nodes: list[ast.stmt] = []
    for name in names:
        owner, _, member = name.partition(".")
        if owner not in top:
            raise LookupError(f"{relpath}: no top-level definition {owner!r} at the pin")
        node = top[owner]
        if member:
            found = [n for n in getattr(node, "body", []) if isinstance(n, ast.FunctionDef) and n.name == member]
            if not found:
                raise LookupError(f"{relpath}: {owner} has no method {member!r} at the pin")
            node = found[0]
        nodes.append(node)
    code = compile(ast.Module(body=nodes, type_ignores=[]), relpath, "exec")
    exec(code, env)  # noqa: S102 — our own parse of the pinned file, for a test
    return [env[name.rpartition(".")[2]] for name in names]
