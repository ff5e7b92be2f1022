"""Lab 19-03 (reference): two real defects of vLLM 0.22.1 on a CPU-only host, fixed upstream-style.

Each defect is a regression test in upstream's style (a pytest function, no course imports) and a
unified diff against ``upstream/vllm/``. ``course.defect_grader`` runs the test on a scratch copy of
the pinned file (it must fail), applies the patch (it must pass), runs the course's nearby checks
of the module (they must still pass) and keeps the diff under 100 lines.

1. ``async_tensor_h2d`` pins host memory by default, a default fixed at import from the OS name
   only; on a host with no accelerator torch refuses pinned memory, so every caller that keeps the
   default (LoRA's ``convert_mapping``) fails. The fix asks the platform at call time.
2. The CPU LoRA ops gather ``weights[index]`` per row, and index -1 ("no adapter") selects the
   last slot: base rows get somebody's adapter. The fix zeroes those rows after the gather.

Run ``python solution.py`` to grade both (the README's output).
"""

from __future__ import annotations

# ------------------------------------------------------------------------------------ defect 1


def test_async_tensor_h2d_default_on_a_host_without_pinned_memory(monkeypatch):
    """The default must follow the platform: where it cannot pin memory (a CPU-only host), don't pin."""
    import torch
    from vllm.utils import platform_utils, torch_utils

    # what CpuPlatform answers; saying it here makes the test fail at the pin on a CUDA host too
    monkeypatch.setattr(platform_utils, "is_pin_memory_available", lambda: False)
    t = torch_utils.async_tensor_h2d([3, 1, 4], torch.int64, "cpu")
    assert t.tolist() == [3, 1, 4] and t.dtype == torch.int64
    assert not t.is_pinned()


PIN_MEMORY_PATCH = '''\
--- a/upstream/vllm/utils/torch_utils.py
+++ b/upstream/vllm/utils/torch_utils.py
@@ -609,9 +609,16 @@
     data: list,
     dtype: torch.dtype,
     device: str | torch.device,
-    pin_memory: bool = PIN_MEMORY,
+    pin_memory: bool | None = None,
 ) -> torch.Tensor:
-    """Asynchronously create a tensor and copy it from host to device."""
+    """Asynchronously create a tensor and copy it from host to device.
+
+    ``pin_memory=None`` asks the platform, at call time, whether it can pin host memory.
+    """
+    if pin_memory is None:
+        from vllm.utils.platform_utils import is_pin_memory_available
+
+        pin_memory = is_pin_memory_available()
     t = torch.tensor(data, dtype=dtype, pin_memory=pin_memory, device="cpu")
     return t.to(device=device, non_blocking=True)

'''

# ------------------------------------------------------------------------------------ defect 2


def test_lora_torch_ops_leave_rows_without_an_adapter_alone():
    """Rows whose LoRA index is -1 carry no adapter: the ops must add nothing to them."""
    import torch
    from vllm.lora.ops.torch_ops import lora_ops

    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, 8, generator=g)
    weights = torch.randn(3, 6, 8, generator=g)  # 3 adapter slots, (out, in) each
    index = torch.tensor([-1, 0, 2, -1])
    none = index < 0
    base = torch.randn(4, 8, generator=g)

    out = base.clone()
    lora_ops.bgmv_expand(x, weights, out, index, add_inputs=True)
    assert torch.equal(out[none], base[none]), "bgmv_expand added an adapter to a row with index -1"
    out = base.clone()
    lora_ops.bgmv_expand_slice(x, weights, out, index, 1, 6, add_inputs=True)
    assert torch.equal(out[none], base[none]), "bgmv_expand_slice added an adapter to a row with index -1"
    out = torch.zeros(4, 6)
    lora_ops.bgmv_shrink(x, weights, out, index, 1.0)
    assert not out[none].any(), "bgmv_shrink wrote a slot's product into a row with index -1"


LORA_PATCH = """\
--- a/upstream/vllm/lora/ops/torch_ops/lora_ops.py
+++ b/upstream/vllm/lora/ops/torch_ops/lora_ops.py
@@ -4,6 +4,11 @@
 import torch


+def _zero_no_lora_rows(outputs: torch.Tensor, lora_indices: torch.Tensor) -> torch.Tensor:
+    # Index -1 means "no adapter", but weights[-1] gathers the last slot: zero those rows.
+    return outputs.masked_fill((lora_indices < 0).unsqueeze(-1), 0)
+
+
 def sgmv_expand(
     inputs: torch.Tensor,
     lora_b_weights: torch.Tensor,
@@ -33,6 +38,7 @@
         selected_loras = selected_loras.squeeze(dim=1)
     inputs = inputs.to(dtype=output_tensor.dtype)
     outputs = torch.einsum("bi, boi -> bo", inputs, selected_loras)
+    outputs = _zero_no_lora_rows(outputs, lora_indices_tensor)

     limit = output_tensor.shape[0]
     if outputs.shape[0] == 1 and output_tensor.shape[0] != 1:
@@ -76,6 +82,7 @@
         selected_loras = selected_loras.squeeze(dim=1)
     inputs = inputs.to(dtype=output_tensor.dtype)
     outputs = torch.einsum("bi, boi -> bo", inputs, selected_loras)
+    outputs = _zero_no_lora_rows(outputs, lora_indices_tensor)

     output_tensor[:, : outputs.shape[1]] = scaling * outputs[:]

@@ -121,6 +128,7 @@
     if len(selected_loras.shape) == 4:
         selected_loras = selected_loras.squeeze(dim=1)
     outputs = torch.einsum("bi, boi -> bo", inputs, selected_loras)
+    outputs = _zero_no_lora_rows(outputs, lora_indices_tensor)

     if add_inputs:
         output_tensor[:, slice_offset : slice_offset + slice_size] += outputs[:]
"""

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
