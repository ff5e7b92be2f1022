import importlib
import sys
import types

import pytest

from course.runtime import lab_module

lab = lab_module(__file__)   # solution.py by default; LAB_IMPL=starter grades starter.py


H100, A100, L4, B200, T4 = (9, 0), (8, 0), (8, 9), (10, 0), (7, 5)
NON_MLA_HOPPER = ["FLASH_ATTN", "FLASHINFER", "TRITON_ATTN", "FLEX_ATTENTION", "TURBOQUANT"]


def _cfg(**kw):
    return lab.SelectorConfig(**kw)


def test_priority_chain_per_gpu_generation():
    for cap in (A100, L4, H100):
        got = lab.backend_priorities(False, cap)
        assert got == NON_MLA_HOPPER, f"non-MLA chain on {cap} should start with FLASH_ATTN: {NON_MLA_HOPPER}, got {got}"
    got = lab.backend_priorities(False, B200)
    assert got[:2] == ["FLASHINFER", "FLASH_ATTN"], (
        f"on Blackwell (major 10) FlashInfer comes first, then FlashAttention; got {got}"
    )
    got = lab.backend_priorities(True, H100)
    assert got == ["FLASH_ATTN_MLA", "FLASHMLA", "FLASHINFER_MLA", "TRITON_MLA", "FLASHMLA_SPARSE"], (
        f"MLA chain off Blackwell is FLASH_ATTN_MLA, FLASHMLA, FLASHINFER_MLA, TRITON_MLA, FLASHMLA_SPARSE; got {got}"
    )
    got = lab.backend_priorities(True, B200)
    assert got[0] == "FLASHINFER_MLA" and got[-2:] == ["FLASHMLA_SPARSE", "FLASHINFER_MLA_SPARSE"], (
        f"MLA on Blackwell: FLASHINFER_MLA first; with bf16 KV and unknown head count the sparse tail is "
        f"FLASHMLA_SPARSE, FLASHINFER_MLA_SPARSE; got {got}"
    )
    got = lab.backend_priorities(True, B200, kv_cache_dtype="fp8")
    assert got[-2:] == ["FLASHINFER_MLA_SPARSE", "FLASHMLA_SPARSE"], (
        f"a quantized (fp8) KV cache puts FLASHINFER_MLA_SPARSE before FLASHMLA_SPARSE; got {got[-2:]}"
    )


def test_every_quantized_kv_dtype_reorders_the_sparse_tail():
    # 128 heads, so only the KV dtype can put FlashInfer first: every quantized dtype must, not only fp8*
    for kv in ("fp8_e5m2", "int8_per_token_head", "fp8_per_token_head", "nvfp4"):
        got = lab.backend_priorities(True, B200, num_heads=128, kv_cache_dtype=kv)
        assert got[-2:] == ["FLASHINFER_MLA_SPARSE", "FLASHMLA_SPARSE"], (
            f"kv_cache_dtype={kv!r} is quantized (fp8*, *per_token_head and nvfp4 all are): with 128 heads "
            f"the Blackwell sparse tail must be FLASHINFER_MLA_SPARSE, FLASHMLA_SPARSE; got {got[-2:]}"
        )
    for kv in ("auto", "bfloat16"):
        got = lab.backend_priorities(True, B200, num_heads=128, kv_cache_dtype=kv)
        assert got[-2:] == ["FLASHMLA_SPARSE", "FLASHINFER_MLA_SPARSE"], (
            f"kv_cache_dtype={kv!r} is not quantized: with 128 heads FLASHMLA_SPARSE stays first; got {got[-2:]}"
        )


def test_reasons_follow_validate_configuration():
    rule = lab.RULES["FLASHMLA"]
    got = lab.invalid_reasons(rule, _cfg(head_size=64, dtype="float16"), L4)
    want = ["head_size not supported", "non-MLA not supported", "compute capability not supported",
            "FlashMLA Dense is only supported on Hopper devices."]
    assert got == want, (
        f"FLASHMLA for a head-64 fp16 model on L4: expected {want}, got {got}. Check each condition in "
        f"validate_configuration's order: head size, dtype, kv dtype, block size, MLA, sinks, sparse, "
        f"capability, then the backend's combination check"
    )
    assert lab.invalid_reasons(lab.RULES["FLASH_ATTN"], _cfg(head_size=128), H100) == [], (
        "FLASH_ATTN must accept a bf16 head-128 model on H100 (no reasons)"
    )
    got = lab.invalid_reasons(lab.RULES["FLASH_ATTN"], _cfg(head_size=64, has_sink=True), A100)
    assert got == ["attention sinks not supported", "sink not supported on compute capability < 9.0"], (
        f"FA on A100 with sinks fails twice (supports_sink, then supports_combination); got {got}"
    )


def test_default_choice_matrix():
    llama = _cfg(head_size=128)
    cases = [
        (llama, A100, "FLASH_ATTN", "FA is first in the chain and valid on Ampere"),
        (llama, H100, "FLASH_ATTN", "FA (FA3 kernels) on Hopper"),
        (llama, B200, "FLASHINFER", "Blackwell puts FlashInfer first"),
        (_cfg(head_size=64, dtype="float16"), T4, "FLASHINFER", "FA needs cc >= 8.0; FlashInfer runs from 7.5"),
        (_cfg(head_size=80, dtype="float16"), T4, "TRITON_ATTN", "FlashInfer only has head sizes 64/128/256/512"),
        (_cfg(head_size=64, dtype="float32"), H100, "TRITON_ATTN", "FA and FlashInfer are fp16/bf16 only"),
        (_cfg(head_size=64, has_sink=True), A100, "TRITON_ATTN", "sinks need FA3 (cc 9) or FlashInfer on SM100"),
        (_cfg(head_size=64, has_sink=True), H100, "FLASH_ATTN", "FA3 supports sinks on Hopper"),
        (_cfg(head_size=128, kv_cache_dtype="fp8"), A100, "FLASHINFER", "fp8 KV in FA needs FA3 on Hopper"),
        (_cfg(head_size=128, kv_cache_dtype="fp8"), H100, "FLASH_ATTN", "FA3 reads fp8 KV on Hopper"),
        (_cfg(head_size=576, use_mla=True), H100, "FLASH_ATTN_MLA", "first MLA choice off Blackwell, cc 9 only"),
        (_cfg(head_size=576, use_mla=True), B200, "FLASHINFER_MLA", "first MLA choice on Blackwell"),
        (_cfg(head_size=576, use_mla=True), L4, "TRITON_MLA", "no FlashMLA below Hopper: Triton MLA"),
    ]
    for cfg, cap, want, why in cases:
        got = lab.select_backend(cfg, cap)
        assert got == want, f"{cfg} on cc {cap}: expected {want} ({why}), got {got}"


def test_override_is_used_or_rejected_never_replaced():
    llama = _cfg(head_size=128)
    got = lab.select_backend(llama, H100, override="TRITON_ATTN")
    assert got == "TRITON_ATTN", f"a valid override must win over the priority chain, got {got}"
    with pytest.raises(ValueError, match="non-MLA not supported"):
        lab.select_backend(_cfg(head_size=64, dtype="float16"), L4, override="FLASHMLA")
    with pytest.raises(ValueError, match="ImportError"):
        lab.select_backend(llama, H100, override="FLASH_ATTN", unavailable=frozenset({"FLASH_ATTN"}))


def test_missing_wheels_fall_through_the_chain():
    llama = _cfg(head_size=128)
    got = lab.select_backend(llama, H100, unavailable=frozenset({"FLASH_ATTN"}))
    assert got == "FLASHINFER", f"without the FA wheel the next candidate, FLASHINFER, should win; got {got}"
    got = lab.select_backend(llama, H100, unavailable=frozenset({"FLASH_ATTN", "FLASHINFER"}))
    assert got == "TRITON_ATTN", f"without FA and FlashInfer, TRITON_ATTN (what this CPU box sees); got {got}"
    with pytest.raises(ValueError, match="No valid attention backend"):
        lab.select_backend(_cfg(head_size=128, block_size=8), H100)


# --- cross-checks against the real vLLM 0.22.1 code ---------------------------------------

@pytest.fixture(scope="module")
def real_vllm():
    """Import vllm.platforms.cuda on a CPU box: its compiled-op imports are stubbed for the import only."""
    added = []
    for name in ("vllm._C", "vllm._C_stable_libtorch"):
        if name not in sys.modules:
            try:
                importlib.import_module(name)
            except ImportError:                       # no libcuda here: the ops are not needed to choose
                sys.modules[name] = types.ModuleType(name)
                added.append(name)
    try:
        cuda = importlib.import_module("vllm.platforms.cuda")
    finally:
        for name in added:
            sys.modules.pop(name, None)
    backend = importlib.import_module("vllm.v1.attention.backend")
    interface = importlib.import_module("vllm.platforms.interface")
    return cuda, backend, interface


@pytest.mark.upstream
def test_priorities_match_real_vllm(real_vllm):
    cuda, _, interface = real_vllm
    for cap in ((7, 5), (8, 0), (8, 6), (8, 9), (9, 0), (10, 0), (12, 0)):
        for use_mla in (False, True):
            for num_heads, kv in ((None, None), (16, "auto"), (128, "auto"), (128, "fp8"),
                                 (128, "int8_per_token_head"), (128, "nvfp4")):
                real = [b.name for b in cuda._get_backend_priorities(use_mla, interface.DeviceCapability(*cap),
                                                                      num_heads, kv)]
                mine = lab.backend_priorities(use_mla, cap, num_heads, kv)
                assert mine == real, (
                    f"use_mla={use_mla} cc={cap} num_heads={num_heads} kv={kv}: vLLM's "
                    f"_get_backend_priorities returns {real}, yours returns {mine}"
                )


@pytest.mark.upstream
def test_reasons_match_real_base_class(real_vllm):
    """Feed the rule table to a real AttentionBackend subclass; its validate_configuration must agree."""
    _, backend, interface = real_vllm
    import torch

    def real_class(rule, cap):
        class Fake(backend.AttentionBackend):
            supported_dtypes = [getattr(torch, d) for d in rule.dtypes]

            @classmethod
            def supports_head_size(cls, h):
                return rule.head_size_ok(h)

            @classmethod
            def supports_kv_cache_dtype(cls, kv):
                return kv is None or rule.kv_cache_dtype_ok(kv, cap)

            @staticmethod
            def get_supported_kernel_block_sizes():
                return list(rule.kernel_block_sizes)

            @classmethod
            def is_mla(cls):
                return rule.is_mla

            @classmethod
            def is_sparse(cls):
                return rule.is_sparse

            @classmethod
            def supports_sink(cls):
                return rule.sink_ok(cap)

            @classmethod
            def supports_compute_capability(cls, c):
                return rule.capability_ok(cap)

            @classmethod
            def supports_combination(cls, head_size, dtype, kv_cache_dtype, block_size, use_mla, has_sink,
                                     use_sparse, device_capability):
                return rule.combination(lab.SelectorConfig(head_size, str(dtype).split(".")[-1], kv_cache_dtype,
                                                           block_size, use_mla, has_sink, use_sparse), cap)
        return Fake

    cfgs = [_cfg(head_size=128), _cfg(head_size=64, dtype="float16", has_sink=True),
            _cfg(head_size=80, dtype="float32", kv_cache_dtype="fp8", block_size=8),
            _cfg(head_size=576, use_mla=True, block_size=32), _cfg(head_size=576, use_mla=True, use_sparse=True)]
    for name, rule in lab.RULES.items():
        for cap in ((7, 5), (8, 0), (9, 0), (10, 0)):
            for cfg in cfgs:
                real = real_class(rule, cap).validate_configuration(
                    head_size=cfg.head_size, dtype=getattr(torch, cfg.dtype), kv_cache_dtype=cfg.kv_cache_dtype,
                    block_size=cfg.block_size, use_mla=cfg.use_mla, has_sink=cfg.has_sink,
                    use_sparse=cfg.use_sparse, use_mm_prefix=False, use_per_head_quant_scales=False,
                    device_capability=interface.DeviceCapability(*cap), attn_type="decoder")
                mine = lab.invalid_reasons(rule, cfg, cap)
                assert mine == real, f"{name} on {cap} for {cfg}: vLLM's validate_configuration says {real}, you say {mine}"
