"""Lab 03-05 on a GPU box: ask the real vLLM 0.22.1 selector, compare with your predictions.

Needs a CUDA GPU and `pip install vllm==0.22.1` (its CUDA wheel brings flash-attn and FlashInfer).

    python run.py                                  # real selector vs. your predictions, this GPU, all MODELS
    python run.py --backend TRITON_ATTN            # the same with an explicit override
    python run.py --backend FLASHMLA               # an invalid override: read the reasons
    python run.py --run-model facebook/opt-125m --backend FLASHINFER   # a real engine; read its log line
    python run.py --cpu-probe --capability 9.0     # no GPU: run the real priority walk on this CPU box

The prediction side is your `solution.py` (or `--impl starter` for your own `starter.py`).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import types
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _lab(impl: str):
    from course.runtime.bench import this_lab

    return this_lab(__file__, impl)


def _torch_dtype(name: str):
    import torch
    return getattr(torch, name)


def real_choice(cfg, backend: str | None) -> str:
    """Call vllm.v1.attention.selector.get_attn_backend exactly as the Attention layer does."""
    from vllm.config import AttentionConfig, VllmConfig, set_current_vllm_config
    from vllm.v1.attention.selector import get_attn_backend

    vllm_config = VllmConfig(attention_config=AttentionConfig(backend=backend))
    with set_current_vllm_config(vllm_config):
        cls = get_attn_backend(cfg.head_size, _torch_dtype(cfg.dtype), cfg.kv_cache_dtype,
                               use_mla=cfg.use_mla, has_sink=cfg.has_sink, use_sparse=cfg.use_sparse)
    return cls.get_name()


def compare_on_this_gpu(lab, backend: str | None) -> int:
    import torch

    cap = torch.cuda.get_device_capability()
    print(f"device: {torch.cuda.get_device_name()}  compute capability {cap}  override={backend}")
    misses = 0
    for model, cfg in lab.MODELS.items():
        if cfg.dtype == "bfloat16" and cap < (8, 0):
            print(f"  {model:24s} skipped: bf16 needs compute capability >= 8.0")
            continue
        try:
            predicted = lab.select_backend(cfg, cap, override=backend)
        except ValueError as exc:
            predicted = f"error ({str(exc)[:60]}...)"
        try:
            real = real_choice(cfg, backend)
        except ValueError as exc:
            real = f"error ({str(exc)[:60]}...)"
        hit = predicted.split(" ")[0] == real.split(" ")[0]
        misses += not hit
        print(f"  {model:24s} predicted {predicted:28s} real {real:28s} {'HIT' if hit else 'MISS'}")
    print(f"{misses} misses")
    return 1 if misses else 0


def run_model(model: str, backend: str | None, gpu_memory_utilization: float) -> int:
    from vllm import LLM, SamplingParams

    os.environ.setdefault("VLLM_LOGGING_LEVEL", "INFO")     # the selector logs its choice at INFO
    kwargs = {"attention_backend": backend} if backend else {}
    llm = LLM(model=model, gpu_memory_utilization=gpu_memory_utilization, **kwargs)
    out = llm.generate(["The capital of France is"], SamplingParams(max_tokens=8, temperature=0.0))
    print(repr(out[0].outputs[0].text))
    print("look above for: 'Using <NAME> attention backend out of potential backends: [...]'")
    return 0


def cpu_probe(lab, capability: tuple[int, int]) -> int:
    """Run CudaPlatformBase.get_valid_backends on a CPU box for a pretend GPU generation."""
    added = []
    for name in ("vllm._C", "vllm._C_stable_libtorch"):
        try:
            importlib.import_module(name)
        except ImportError:                      # no libcuda: stub the op libraries for the import only
            sys.modules[name] = types.ModuleType(name)
            added.append(name)
    try:
        from vllm.platforms.cuda import CudaPlatformBase
    finally:
        for name in added:
            sys.modules.pop(name, None)
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.config.device import DeviceConfig
    from vllm.platforms.interface import DeviceCapability
    from vllm.v1.attention.selector import AttentionSelectorConfig

    with set_current_vllm_config(VllmConfig(device_config=DeviceConfig(device="cpu"))):
        for model, cfg in lab.MODELS.items():
            sel = AttentionSelectorConfig(head_size=cfg.head_size, dtype=_torch_dtype(cfg.dtype),
                                          kv_cache_dtype=cfg.kv_cache_dtype, block_size=cfg.block_size,
                                          use_mla=cfg.use_mla, has_sink=cfg.has_sink, use_sparse=cfg.use_sparse)
            try:
                valid, invalid = CudaPlatformBase.get_valid_backends(DeviceCapability(*capability), sel)
            except Exception as exc:             # some checks query the (absent) CUDA device
                print(f"{model:24s} probe failed: {type(exc).__name__}: {exc}")
                continue
            names = [b.name for b, _ in valid]
            missing = [b.name for b, (_, r) in invalid.items() if r == ["ImportError"]]
            print(f"{model:24s} real chain picks {names[0] if names else '-':16s} "
                  f"(cannot import here: {missing})")
    print("A GPU box with the vLLM CUDA wheel imports FLASH_ATTN and FLASHINFER too; compare with "
          "select_backend(cfg, cap, unavailable=frozenset({...}))")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backend", default=None, help="explicit choice, e.g. FLASH_ATTN, FLASHINFER, TRITON_ATTN")
    ap.add_argument("--impl", default="solution", choices=["solution", "starter"])
    ap.add_argument("--run-model", metavar="MODEL", help="build a real LLM engine with this model")
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.4)
    ap.add_argument("--cpu-probe", action="store_true", help="no GPU needed; pretend capability below")
    ap.add_argument("--capability", default="9.0", help="for --cpu-probe, e.g. 8.0, 9.0, 10.0")
    args = ap.parse_args()
    lab = _lab(args.impl)
    if args.cpu_probe:
        major, minor = (int(x) for x in args.capability.split("."))
        return cpu_probe(lab, (major, minor))
    import torch
    if not torch.cuda.is_available():
        print("no CUDA device: run `pytest` for the CPU path, or `python run.py --cpu-probe`")
        return 2
    if args.run_model:
        return run_model(args.run_model, args.backend, args.gpu_memory_utilization)
    return compare_on_this_gpu(lab, args.backend)


if __name__ == "__main__":
    sys.exit(main())
