"""Draw overrides.svg: which of ``Platform``'s hooks each in-tree platform of vLLM 0.22.1 overrides.

Reads the installed vLLM's ``vllm/platforms/*.py`` (the pinned Python tree) with ``ast``: nothing
is imported, so the answer is the same on a laptop and on a GPU box. For every class it lists
the members of ``Platform`` the class body redefines; for the identity attributes it shows the
value. One row per hook a learner meets in this phase, one column per platform.
Run: python phase-17-hardware-backends-and-plugins/figures/overrides.py
"""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

from course.svgfig import BLUE, FAINT, GREY, ORANGE, Svg

PLATFORMS = Path(importlib.util.find_spec("vllm").origin).parent / "platforms"
COLUMNS = [
    ("Platform", "interface.py", "Platform"),
    ("CPU", "cpu.py", "CpuPlatform"),
    ("CUDA", "cuda.py", "CudaPlatformBase"),
    ("ROCm", "rocm.py", "RocmPlatform"),
    ("XPU", "xpu.py", "XPUPlatform"),
]
ATTRS = ["device_type", "dispatch_key", "dist_backend"]
HOOKS = [
    "get_attn_backend_cls",
    "check_and_update_config",
    "supported_dtypes",
    "check_if_supports_dtype",
    "supports_fp8",
    "fp8_dtype",
    "support_static_graph_mode",
    "get_static_graph_wrapper_cls",
    "get_device_communicator_cls",
    "use_custom_allreduce",
    "get_punica_wrapper",
    "is_pin_memory_available",
    "get_device_total_memory",
    "import_kernels",
    "inference_mode",
    "num_compute_units",
]


def class_body(file: str, name: str) -> dict[str, ast.AST]:
    """The members a class body defines: methods (and properties) and assigned attributes."""
    tree = ast.parse((PLATFORMS / file).read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == name:
            members: dict[str, ast.AST] = {}
            for item in node.body:
                if isinstance(item, ast.FunctionDef):
                    members[item.name] = item
                elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                    members[item.target.id] = item.value
                elif isinstance(item, ast.Assign):
                    members.update({t.id: item.value for t in item.targets if isinstance(t, ast.Name)})
            return members
    raise LookupError(f"class {name} not found in {file}")


def value(node: ast.AST | None) -> str:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return repr(node.value) if node.value else "''"
    return "(set)" if node is not None else "—"


def table() -> tuple[dict[str, dict[str, ast.AST]], list[str]]:
    bodies = {label: class_body(file, cls) for label, file, cls in COLUMNS}
    base = bodies["Platform"]
    hooks = [k for k, v in base.items() if not k.startswith("__") and isinstance(v, ast.FunctionDef)]
    return bodies, hooks


def draw(bodies: dict[str, dict[str, ast.AST]], path: Path) -> None:
    rows = ATTRS + HOOKS
    shown = COLUMNS[1:]  # the base class's answers are the empty cells; its values are in the text
    width, label_w, top, row_h = 500, 248, 64, 28
    col_w = (width - label_w - 8) / len(shown)
    height = top + len(rows) * row_h + 56
    svg = Svg(
        width,
        height,
        "Which Platform hooks each in-tree platform overrides",
        "A grid: rows are Platform's identity attributes and its main hooks, columns are "
        "CPU, CUDA, ROCm and XPU. Attribute cells show the value; a filled hook cell means the platform's "
        "class body redefines that hook, an empty one means it inherits the base default.",
    )
    svg.text(12, 24, "vLLM 0.22.1: what each platform redefines", 18, bold=True)
    for c, (label, _, _) in enumerate(shown):
        svg.text(label_w + (c + 0.5) * col_w, top - 12, label, 16, "middle", bold=True)
    for r, name in enumerate(rows):
        y = top + r * row_h
        if r % 2 == 0:
            svg.rect(8, y, width - 16, row_h, FAINT, FAINT)
        svg.text(12, y + 19, name, 14, mono=True)
        for c, (label, _, _) in enumerate(shown):
            cx = label_w + (c + 0.5) * col_w
            body = bodies[label]
            if name in ATTRS:
                svg.text(cx, y + 19, value(body.get(name)).strip("'"), 14, "middle", mono=True)
            elif name in body:
                svg.rect(cx - col_w / 2 + 10, y + 5, col_w - 20, row_h - 10, ORANGE, ORANGE, rx=3)
            else:
                svg.rect(cx - col_w / 2 + 10, y + 5, col_w - 20, row_h - 10, "none", GREY, rx=3)
    y = top + len(rows) * row_h + 24
    svg.rect(12, y - 12, 18, 14, ORANGE, ORANGE, rx=3)
    svg.text(36, y, "redefined by the platform", 14)
    svg.rect(220, y - 12, 18, 14, "none", GREY, rx=3)
    svg.text(244, y, "inherits Platform's default", 14)
    svg.text(12, y + 24, "CUDA = CudaPlatformBase (subclasses add device queries).", 14, fill=BLUE)
    svg.write(path)


def main() -> None:
    bodies, hooks = table()
    attrs = [k for k, v in bodies["Platform"].items() if not isinstance(v, ast.FunctionDef)]
    print(f"Platform (interface.py) defines {len(hooks)} methods and {len(attrs)} class attributes.")
    for label, _, cls in COLUMNS[1:]:
        body = bodies[label]
        redefined = [k for k in body if k in bodies["Platform"] and not k.startswith("__")]
        own = [k for k in body if k not in bodies["Platform"] and not k.startswith("_")]
        print(f"  {cls:17} redefines {len(redefined):2} of those members, adds {len(own)} of its own")
    for name in ATTRS:
        cells = ", ".join(
            f"{label} {value(bodies[label].get(name, bodies['Platform'].get(name)))}"
            for label, _, _ in COLUMNS[1:]
        )
        print(f"  {name}: {cells}")
    draw(bodies, Path(__file__).with_name("overrides.svg"))
    print("wrote overrides.svg")


if __name__ == "__main__":
    main()
