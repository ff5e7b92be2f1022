"""Count the knobs a contributor must not break, by parsing the pinned tree (no import of vllm).

* environment variables: the keys of ``environment_variables`` in ``vllm/envs.py``;
* engine arguments: the annotated fields of ``EngineArgs`` in ``vllm/engine/arg_utils.py``;
* configuration classes: classes under ``vllm/config/`` decorated with ``@config``, and their fields.
Run: python phase-19-capstone/figures/knobs.py
"""

from __future__ import annotations

import ast
from pathlib import Path

from course import ROOT

TREE = ROOT / "upstream"


def env_vars(tree: Path = TREE) -> list[str]:
    mod = ast.parse((tree / "vllm/envs.py").read_text(encoding="utf-8"))
    for node in mod.body:
        target = getattr(node, "target", None)
        if isinstance(node, ast.AnnAssign) and getattr(target, "id", "") == "environment_variables":
            return [k.value for k in node.value.keys if isinstance(k, ast.Constant)]
    raise LookupError("environment_variables not found in vllm/envs.py")


def class_fields(node: ast.ClassDef) -> list[str]:
    return [n.target.id for n in node.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)]


def engine_args(tree: Path = TREE) -> list[str]:
    mod = ast.parse((tree / "vllm/engine/arg_utils.py").read_text(encoding="utf-8"))
    cls = next(n for n in mod.body if isinstance(n, ast.ClassDef) and n.name == "EngineArgs")
    return class_fields(cls)


def config_classes(tree: Path = TREE) -> dict[str, int]:
    found = {}
    for path in sorted((tree / "vllm/config").glob("*.py")):
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if isinstance(node, ast.ClassDef):
                names = [
                    getattr(d, "id", getattr(getattr(d, "func", None), "id", None))
                    for d in node.decorator_list
                ]
                if "config" in names:
                    found[node.name] = len(class_fields(node))
    return found


def main() -> None:
    envs = env_vars()
    prefixes = {}
    for name in envs:
        key = "VLLM_" if name.startswith("VLLM_") else "other"
        prefixes[key] = prefixes.get(key, 0) + 1
    print(
        f"environment variables in vllm/envs.py: {len(envs)} ({prefixes.get('VLLM_', 0)} VLLM_*, {prefixes.get('other', 0)} other)"
    )
    print(f"EngineArgs fields (one CLI flag each, roughly): {len(engine_args())}")
    cfg = config_classes()
    print(f"@config classes under vllm/config/: {len(cfg)}, {sum(cfg.values())} fields in all")
    for name, n in sorted(cfg.items(), key=lambda kv: -kv[1])[:6]:
        print(f"  {name:<24} {n:>3} fields")


if __name__ == "__main__":
    main()
