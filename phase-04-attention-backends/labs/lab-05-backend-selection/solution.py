"""Lab 03-05 — predict which attention backend vLLM 0.22.1 picks on a CUDA GPU (reference).

vLLM's CUDA platform chooses a backend in three moves (vllm/platforms/cuda.py):

1. an explicit choice (``--attention-backend`` / ``attention_config.backend``) is validated alone
   and either used or rejected with its reasons;
2. otherwise a priority list is built from (MLA?, GPU generation) — ``_get_backend_priorities``;
3. every backend in the list is validated against the model's needs
   (``AttentionBackend.validate_configuration``) and the first valid one, in priority order, wins.

This module replays that logic in plain Python so you can predict the choice for any GPU and
model on a laptop. ``RULES`` transcribes each backend's capability checks from the pinned source
(the README cites every one); the three functions below are yours to write.

Simplifications, stated once: FlashAttention's head-size limit is taken as 256 (FA4 builds that
allow 512 are not modelled); FlashInfer's sink support assumes its TRTLLM cubins are reachable on
Blackwell; model-specific MLA checks (qk_nope_head_dim, the tokenspeed package) are reduced to the
DeepSeek-V3 shape. Sparse-MLA backends are listed so the priority chains are complete.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

Capability = tuple[int, int]          # CUDA compute capability, e.g. (9, 0) for H100


@dataclass(frozen=True)
class SelectorConfig:
    """What the model asks of attention; mirrors vLLM's AttentionSelectorConfig."""

    head_size: int
    dtype: str = "bfloat16"            # "float16" | "bfloat16" | "float32"
    kv_cache_dtype: str = "auto"       # "auto" | "fp8" | ... (vLLM's CacheDType strings)
    block_size: int | None = None      # only set when the user passes --block-size
    use_mla: bool = False
    has_sink: bool = False
    use_sparse: bool = False


@dataclass(frozen=True)
class BackendRule:
    """One backend's answers to the questions validate_configuration asks."""

    name: str
    dtypes: tuple[str, ...]
    head_size_ok: Callable[[int], bool]
    kv_cache_dtype_ok: Callable[[str, Capability], bool]
    kernel_block_sizes: tuple[int, ...]            # a user block size must be a multiple of one of these
    capability_ok: Callable[[Capability], bool]
    is_mla: bool = False
    is_sparse: bool = False
    sink_ok: Callable[[Capability], bool] = field(default=lambda cap: False)
    combination: Callable[[SelectorConfig, Capability], str | None] = field(default=lambda cfg, cap: None)


_HALF = ("float16", "bfloat16")
_AUTO_HALF = ("auto", "float16", "bfloat16")
_FP8 = ("fp8", "fp8_e4m3")


def _kv_in(*allowed: str) -> Callable[[str, Capability], bool]:
    return lambda kv, cap: kv in allowed


def _mla(name: str, cap_ok: Callable[[Capability], bool], blocks: tuple[int, ...],
         kv: tuple[str, ...] = _AUTO_HALF + _FP8, sparse: bool = False,
         combination: Callable[[SelectorConfig, Capability], str | None] = lambda cfg, cap: None) -> BackendRule:
    # MLACommonBackend: head sizes 320 and 576 (the latent + rope width); TRITON_MLA lifts that.
    return BackendRule(name, _HALF, lambda h: h in (320, 576), _kv_in(*kv), blocks, cap_ok,
                       is_mla=True, is_sparse=sparse, combination=combination)


RULES: dict[str, BackendRule] = {r.name: r for r in [
    # flash_attn.py — FlashAttentionBackend
    BackendRule(
        "FLASH_ATTN", _HALF,
        head_size_ok=lambda h: h % 8 == 0 and h <= 256,
        kv_cache_dtype_ok=lambda kv, cap: kv in _AUTO_HALF or (kv in _FP8 and cap[0] == 9),  # fp8: FA3 only
        kernel_block_sizes=(16,),
        capability_ok=lambda cap: cap >= (8, 0),
        sink_ok=lambda cap: cap[0] >= 9,                                  # sinks need FA3/FA4
        combination=lambda cfg, cap: ("sink not supported on compute capability < 9.0"
                                      if cfg.has_sink and cap < (9, 0) else None),
    ),
    # flashinfer.py — FlashInferBackend
    BackendRule(
        "FLASHINFER", _HALF,
        head_size_ok=lambda h: h in (64, 128, 256, 512),
        kv_cache_dtype_ok=_kv_in(*_AUTO_HALF, *_FP8, "fp8_e5m2", "nvfp4"),
        kernel_block_sizes=(16, 32, 64),
        capability_ok=lambda cap: (7, 5) <= cap <= (12, 1),
        sink_ok=lambda cap: cap[0] == 10,                                 # via TRTLLM kernels, SM100 only
    ),
    # triton_attn.py — TritonAttentionBackend
    BackendRule(
        "TRITON_ATTN", _HALF + ("float32",),
        head_size_ok=lambda h: h >= 32,
        kv_cache_dtype_ok=_kv_in(*_AUTO_HALF, *_FP8, "fp8_e5m2", "int8_per_token_head", "fp8_per_token_head"),
        kernel_block_sizes=(16,),
        capability_ok=lambda cap: True,
        sink_ok=lambda cap: True,
    ),
    # flex_attention.py — FlexAttentionBackend
    BackendRule(
        "FLEX_ATTENTION", _HALF + ("float32",),
        head_size_ok=lambda h: True,
        kv_cache_dtype_ok=_kv_in(*_AUTO_HALF),
        kernel_block_sizes=(16,),
        capability_ok=lambda cap: True,
    ),
    # turboquant_attn.py — TurboQuantAttentionBackend (only for turboquant_* KV caches)
    BackendRule(
        "TURBOQUANT", _HALF,
        head_size_ok=lambda h: h > 0,
        kv_cache_dtype_ok=lambda kv, cap: kv.startswith("turboquant_"),
        kernel_block_sizes=(16, 32, 64, 128),
        capability_ok=lambda cap: True,
    ),
    # mla/*.py — the MLA family
    _mla("FLASH_ATTN_MLA", lambda cap: cap[0] == 9, (16,), kv=_AUTO_HALF),
    _mla("FLASHMLA", lambda cap: cap[0] in (9, 10), (64,),
         combination=lambda cfg, cap: (None if cap[0] == 9
                                       else "FlashMLA Dense is only supported on Hopper devices.")),
    _mla("FLASHINFER_MLA", lambda cap: cap[0] == 10, (32, 64)),
    _mla("TOKENSPEED_MLA", lambda cap: cap[0] == 10, (32, 64), kv=_FP8),
    _mla("CUTLASS_MLA", lambda cap: cap[0] == 10, (128,)),
    BackendRule("TRITON_MLA", _HALF, lambda h: True, _kv_in(*_AUTO_HALF, *_FP8), (16,),
                lambda cap: True, is_mla=True),
    _mla("FLASHMLA_SPARSE", lambda cap: cap[0] in (9, 10), (64,), kv=("auto", "bfloat16", "fp8_ds_mla", "fp8"),
         sparse=True),
    _mla("FLASHINFER_MLA_SPARSE", lambda cap: cap[0] == 10, (32, 64), sparse=True),
]}


# Compute capabilities from NVIDIA's CUDA GPUs table (developer.nvidia.com/cuda-gpus).
GPUS: dict[str, Capability] = {
    "T4": (7, 5), "A100": (8, 0), "A10": (8, 6), "L4": (8, 9), "H100": (9, 0), "H200": (9, 0), "B200": (10, 0),
}

# Shapes from each model's config.json (head_dim = hidden_size / num_attention_heads unless set).
MODELS: dict[str, SelectorConfig] = {
    "opt-125m (fp16)": SelectorConfig(head_size=64, dtype="float16"),
    "Llama-3.1-8B": SelectorConfig(head_size=128),
    "Llama-3.1-8B fp8 KV": SelectorConfig(head_size=128, kv_cache_dtype="fp8"),
    "phi-2 (head 80, fp16)": SelectorConfig(head_size=80, dtype="float16"),
    "gpt-oss-20b (sinks)": SelectorConfig(head_size=64, has_sink=True),
    "any model in fp32": SelectorConfig(head_size=64, dtype="float32"),
    "DeepSeek-V3 (MLA)": SelectorConfig(head_size=576, use_mla=True),
}


def backend_priorities(use_mla: bool, capability: Capability, num_heads: int | None = None,
                       kv_cache_dtype: str | None = None) -> list[str]:
    """The ordered candidate list for this GPU generation (mirror of cuda.py's _get_backend_priorities).

    Blackwell (major 10) prefers FlashInfer-based kernels; every other generation prefers
    FlashAttention. MLA models get a separate list; on Blackwell its sparse tail is ordered by
    KV dtype (quantized -> FlashInfer first) and then by head count (<= 16 -> FlashInfer first).
    """
    blackwell = capability[0] == 10
    if not use_mla:
        if blackwell:
            return ["FLASHINFER", "FLASH_ATTN", "TRITON_ATTN", "FLEX_ATTENTION", "TURBOQUANT"]
        return ["FLASH_ATTN", "FLASHINFER", "TRITON_ATTN", "FLEX_ATTENTION", "TURBOQUANT"]
    if not blackwell:
        return ["FLASH_ATTN_MLA", "FLASHMLA", "FLASHINFER_MLA", "TRITON_MLA", "FLASHMLA_SPARSE"]
    quantized = kv_cache_dtype is not None and (
        kv_cache_dtype.startswith("fp8") or kv_cache_dtype.endswith("per_token_head") or kv_cache_dtype == "nvfp4")
    if quantized or (num_heads is not None and num_heads <= 16):
        sparse = ["FLASHINFER_MLA_SPARSE", "FLASHMLA_SPARSE"]
    else:
        sparse = ["FLASHMLA_SPARSE", "FLASHINFER_MLA_SPARSE"]
    return ["FLASHINFER_MLA", "TOKENSPEED_MLA", "CUTLASS_MLA", "FLASH_ATTN_MLA", "FLASHMLA", "TRITON_MLA", *sparse]


def invalid_reasons(rule: BackendRule, cfg: SelectorConfig, capability: Capability) -> list[str]:
    """Why `rule`'s backend cannot serve `cfg` on this GPU; [] means valid.

    Same checks, same strings, same order as AttentionBackend.validate_configuration.
    """
    reasons = []
    if not rule.head_size_ok(cfg.head_size):
        reasons.append("head_size not supported")
    if cfg.dtype not in rule.dtypes:
        reasons.append("dtype not supported")
    if not rule.kv_cache_dtype_ok(cfg.kv_cache_dtype, capability):
        reasons.append("kv_cache_dtype not supported")
    if cfg.block_size is not None and not any(cfg.block_size % b == 0 for b in rule.kernel_block_sizes):
        reasons.append("block_size not supported")
    if cfg.use_mla != rule.is_mla:
        reasons.append("MLA not supported" if cfg.use_mla else "non-MLA not supported")
    if cfg.has_sink and not rule.sink_ok(capability):
        reasons.append("attention sinks not supported")
    if cfg.use_sparse != rule.is_sparse:
        reasons.append("sparse not supported" if cfg.use_sparse else "non-sparse not supported")
    if not rule.capability_ok(capability):
        reasons.append("compute capability not supported")
    extra = rule.combination(cfg, capability)
    if extra is not None:
        reasons.append(extra)
    return reasons


def select_backend(cfg: SelectorConfig, capability: Capability, override: str | None = None,
                   unavailable: frozenset[str] = frozenset(),
                   rules: dict[str, BackendRule] = RULES) -> str:
    """The backend name vLLM would use, or ValueError (mirror of CudaPlatformBase.get_attn_backend_cls).

    ``override`` is the user's explicit choice: it is validated alone and never silently replaced.
    Backends in ``unavailable`` fail to import (reason ["ImportError"]), as FA and FlashInfer do on
    a machine without their wheels.
    """
    def reasons(name: str) -> list[str]:
        return ["ImportError"] if name in unavailable else invalid_reasons(rules[name], cfg, capability)

    if override is not None:
        why = reasons(override)
        if why:
            raise ValueError(f"Selected backend {override} is not valid for this configuration. Reason: {why}")
        return override
    rejected = {}
    for name in backend_priorities(cfg.use_mla, capability, kv_cache_dtype=cfg.kv_cache_dtype):
        why = reasons(name)
        if not why:
            return name
        rejected[name] = why
    raise ValueError(f"No valid attention backend found for {cfg}. Reasons: {rejected}")


# --- demo ---------------------------------------------------------------------------------

def _log_line(cfg: SelectorConfig, capability: Capability, override: str | None = None) -> str:
    """The INFO line cuda.py would print for this choice (format strings from get_attn_backend_cls)."""
    name = select_backend(cfg, capability, override=override)
    if override is not None:
        return f"Using AttentionBackendEnum.{name} backend."
    valid = [b for b in backend_priorities(cfg.use_mla, capability, kv_cache_dtype=cfg.kv_cache_dtype)
             if not invalid_reasons(RULES[b], cfg, capability)]
    return f"Using {name} attention backend out of potential backends: {valid}."


def main() -> None:
    opt = MODELS["opt-125m (fp16)"]
    print("predicted startup lines on an L4 (cc 8.9):")
    print("  opt-125m, default:             ", _log_line(opt, GPUS["L4"]))
    print("  opt-125m, --attention-backend FLASHINFER: ", _log_line(opt, GPUS["L4"], "FLASHINFER"))
    print("  opt-125m, --attention-backend TRITON_ATTN:", _log_line(opt, GPUS["L4"], "TRITON_ATTN"))
    print("  DeepSeek-V3 (MLA), default:    ", _log_line(MODELS["DeepSeek-V3 (MLA)"], GPUS["L4"]))
    print()
    gpus = ["T4", "A100", "L4", "H100", "B200"]
    print(f"{'model':24s}" + "".join(f"{g + ' ' + str(GPUS[g]):>22s}" for g in gpus))
    for model, cfg in MODELS.items():
        cells = []
        for g in gpus:
            if g == "T4" and cfg.dtype == "bfloat16":
                cells.append("(no bf16 on T4)")     # the platform rejects bf16 below cc 8.0 before selection
                continue
            try:
                cells.append(select_backend(cfg, GPUS[g]))
            except ValueError:
                cells.append("error")
        print(f"{model:24s}" + "".join(f"{c:>22s}" for c in cells))
    print()
    llama = MODELS["Llama-3.1-8B"]
    print("override TRITON_ATTN on H100 ->", select_backend(llama, GPUS["H100"], override="TRITON_ATTN"))
    try:
        select_backend(MODELS["opt-125m (fp16)"], GPUS["L4"], override="FLASHMLA")
    except ValueError as exc:
        print("override FLASHMLA for opt-125m on L4 ->", exc)
    print("H100 without the FA and FlashInfer wheels ->",
          select_backend(llama, GPUS["H100"], unavailable=frozenset({"FLASH_ATTN", "FLASHINFER"})))
    try:
        select_backend(SelectorConfig(head_size=128, block_size=8), GPUS["H100"])
    except ValueError:
        print("--block-size 8 on H100 -> error: every non-MLA backend needs a multiple of 16")


if __name__ == "__main__":
    main()
