"""Lab 19-03 starter: fix two real defects of vLLM 0.22.1 on a CPU-only host, upstream-style.

For each defect write a regression test in upstream's style (a pytest function that imports vllm
and nothing from the course) and a unified diff against ``upstream/vllm/`` (``diff -u`` of a copy,
headers ``--- a/upstream/vllm/...`` and ``+++ b/upstream/vllm/...``). The grader runs your test on
a scratch copy of the pinned file (it must fail), applies your patch (it must pass), runs the
course's nearby checks of the module (they must still pass) and keeps the diff under 100 lines.

1. ``vllm.utils.torch_utils.async_tensor_h2d`` called without ``pin_memory`` on this machine.
2. The CPU LoRA ops in ``vllm/lora/ops/torch_ops/lora_ops.py`` on a row whose LoRA index is -1.

Grade with: LAB_IMPL=starter .venv/bin/python -m pytest phase-19-capstone/labs/lab-03-fix-a-real-defect -q
"""

from __future__ import annotations

# ------------------------------------------------------------------------------------ defect 1


def test_async_tensor_h2d_default_on_a_host_without_pinned_memory(monkeypatch):
    """The default must follow the platform: where it cannot pin memory (a CPU-only host), don't pin."""
    raise NotImplementedError(
        "call async_tensor_h2d the way LoRA's convert_mapping does (no pin_memory argument) and check "
        "the tensor it returns; with monkeypatch, make vllm.utils.platform_utils say it cannot pin, so "
        "the test fails at the pin on any machine"
    )


PIN_MEMORY_PATCH = ""  # your diff of upstream/vllm/utils/torch_utils.py

# ------------------------------------------------------------------------------------ defect 2


def test_lora_torch_ops_leave_rows_without_an_adapter_alone():
    """Rows whose LoRA index is -1 carry no adapter: the ops must add nothing to them."""
    raise NotImplementedError(
        "give bgmv_expand, bgmv_expand_slice and bgmv_shrink a batch with index -1 rows and adapters "
        "in every slot, and check what lands in the -1 rows"
    )


LORA_PATCH = ""  # your diff of upstream/vllm/lora/ops/torch_ops/lora_ops.py

# name -> (the regression test in this file, the patch)
SUBMISSIONS = {
    "pin-memory-default": ("test_async_tensor_h2d_default_on_a_host_without_pinned_memory", PIN_MEMORY_PATCH),
    "lora-no-adapter-rows": ("test_lora_torch_ops_leave_rows_without_an_adapter_alone", LORA_PATCH),
}


def main() -> None:
    from course.defect_grader import GradeFailure, grade

    for name, (test, patch) in SUBMISSIONS.items():
        print(f"{name}:")
        try:
            report = grade(patch, f"{__file__}::{test}")
        except GradeFailure as exc:
            print(f"  REFUSED ({exc.kind}): {exc}")
            continue
        print("  " + report.render().replace("\n", "\n  "))


if __name__ == "__main__":
    main()
