"""Lab 02 (starter): how the real vLLM chose its CPU platform here, and what that choice changed.

Three questions answered on the real objects (vLLM 0.22.1, the course venv, tier 1):
why the standard wheel on a machine without a GPU resolves ``UnspecifiedPlatform`` (a child
process without the course plugin), what ``CpuPlatform.check_and_update_config`` changes in a
``VllmConfig``, and how many KV blocks a CPU gets from ``VLLM_CPU_KVCACHE_SPACE``, checked against
vLLM's own arithmetic. ``python solution.py`` prints the README's figures.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Mapping
from contextlib import contextmanager
from typing import Any

from course.runtime import cpu_env

os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")  # keep vLLM's log lines off stdout

GiB = 1 << 30
PLUGIN_DIR = str(cpu_env.PLUGIN_DIR)

# What the child prints: the resolved class path, each built-in plugin's answer, the version.
PROBE = """
import json, sys
import vllm.platforms as vp
from importlib.metadata import version
print(json.dumps({
    "qualname": vp.resolve_current_platform_cls_qualname(),
    "builtins": {name: f() for name, f in vp.builtin_platform_plugins.items()},
    "version": version("vllm"),
    "sys_platform": sys.platform,
}))
"""

# Qwen2.5-0.5B-Instruct's config.json (the model lab 02 of the original course runs).
QWEN25_05B = {
    "hidden_size": 896,
    "intermediate_size": 4864,
    "num_hidden_layers": 24,
    "num_attention_heads": 14,
    "num_key_value_heads": 2,
    "vocab_size": 151936,
    "tie_word_embeddings": True,
}


# -- 1. which platform, and why -------------------------------------------------------------------
def env_without_plugin(env: Mapping[str, str]) -> dict[str, str]:
    """A copy of ``env`` for a child that sees the standard wheel alone.

    The course plugin's folder leaves ``PYTHONPATH`` (every other entry stays, in order);
    ``CUDA_VISIBLE_DEVICES`` is set to ``""`` so no GPU is probed. ``env`` is not modified.
    """
    raise NotImplementedError(
        "copy env; drop every PLUGIN_DIR entry of PYTHONPATH (keep the rest, in order); set "
        "CUDA_VISIBLE_DEVICES=''"
    )


def probe_platform(env: Mapping[str, str]) -> dict[str, Any]:
    """Run ``PROBE`` in a fresh interpreter with ``env``; its JSON answer as a dict."""
    done = subprocess.run(
        [sys.executable, "-c", PROBE], env=dict(env), capture_output=True, text=True, timeout=120
    )
    if done.returncode != 0:
        raise RuntimeError(f"the probe failed ({done.returncode}): {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def cpu_plugin_activates(version: str, sys_platform: str) -> bool:
    """vLLM's built-in CPU rule: the installed version names a CPU build, or the machine is macOS."""
    raise NotImplementedError(
        "read vllm/platforms/__init__.py's cpu_platform_plugin: when does it return a class path?"
    )


# -- 2. what CpuPlatform changes ------------------------------------------------------------------
@contextmanager
def current_platform_as(platform: Any):
    """Make ``platform`` vLLM's ``current_platform`` inside the block (the config reads it)."""
    import vllm.platforms as vp

    saved = vp._current_platform
    vp._current_platform = platform
    try:
        yield platform
    finally:
        vp._current_platform = saved


def config_under(platform_cls: type, kv_space_gib: int | None = None, block_size: int | None = None):
    """A real ``VllmConfig`` for the course's tiny model, built while ``platform_cls`` is current.

    ``kv_space_gib`` sets ``VLLM_CPU_KVCACHE_SPACE`` for the build (None: unset); ``block_size``
    None leaves the block size to the platform.
    """
    from vllm.config import CacheConfig, DeviceConfig, ModelConfig, VllmConfig

    from course.runtime import real_vllm

    saved = os.environ.pop("VLLM_CPU_KVCACHE_SPACE", None)
    if kv_space_gib is not None:
        os.environ["VLLM_CPU_KVCACHE_SPACE"] = str(kv_space_gib)
    try:
        with current_platform_as(platform_cls()):
            model = ModelConfig(
                model=real_vllm.model_dir(),
                skip_tokenizer_init=True,
                dtype="float32",
                max_model_len=512,
                seed=0,
            )
            cache = CacheConfig() if block_size is None else CacheConfig(block_size=block_size)
            return VllmConfig(
                model_config=model, cache_config=cache, device_config=DeviceConfig(device="cpu")
            )
    finally:
        os.environ.pop("VLLM_CPU_KVCACHE_SPACE", None)
        if saved is not None:
            os.environ["VLLM_CPU_KVCACHE_SPACE"] = saved


def snapshot(vllm_config: Any) -> dict[str, Any]:
    """The settings a platform may change, read from where vLLM keeps them."""
    raise NotImplementedError(
        "read block_size and kv_cache_memory_bytes (cache_config), async_scheduling "
        "(scheduler_config), distributed_executor_backend and worker_cls (parallel_config), "
        "cudagraph_capture_sizes (compilation_config)"
    )


def config_changes(before: Mapping[str, Any], after: Mapping[str, Any]) -> dict[str, tuple[Any, Any]]:
    """``{key: (before, after)}`` for every key whose value differs (keys of both, sorted)."""
    raise NotImplementedError(
        "{key: (before.get(key), after.get(key))} for the keys of both whose values differ, sorted"
    )


# -- 3. the numbers the original lab reported ------------------------------------------------------
def kv_bytes_per_token(num_layers: int, num_kv_heads: int, head_dim: int, dtype_bytes: int) -> int:
    """K and V, every layer: ``2 * layers * kv_heads * head_dim * dtype_bytes``."""
    raise NotImplementedError("K and V for every layer: 2 * layers * kv_heads * head_dim * dtype_bytes")


def cpu_num_blocks(kv_space_bytes: int, block_size: int, bytes_per_token: int) -> int:
    """Whole blocks that fit: ``kv_space // (block_size * bytes_per_token)``."""
    raise NotImplementedError("whole blocks only: floor division by one block's bytes")


def num_params(cfg: Mapping[str, Any]) -> int:
    """Parameters of a Qwen2-shaped model (q/k/v biases, gated MLP, two norms per layer, tied head)."""
    raise NotImplementedError(
        "embeddings + per layer (q with bias, k and v with bias, o, gate/up/down, two norms) + "
        "final norm (+ an untied head)"
    )


def decode_tok_s_bound(weight_bytes: int, bandwidth_bytes_per_s: float) -> float:
    """Single-stream decode reads every weight once per token: at most ``bandwidth / weight_bytes``."""
    raise NotImplementedError("each decoded token reads every weight once: bandwidth / weight_bytes")


def main() -> None:
    probe = probe_platform(env_without_plugin(os.environ))
    print(f"standard wheel, no plugin: {probe['qualname']}")
    print(f"  built-in plugins: {probe['builtins']}")
    print(
        f"  version {probe['version']!r} on {probe['sys_platform']}: cpu rule says "
        f"{cpu_plugin_activates(probe['version'], probe['sys_platform'])}"
    )
    from vllm.platforms import current_platform
    from vllm.platforms.cpu import CpuPlatform
    from vllm.platforms.interface import UnspecifiedPlatform

    print(f"with the course plugin on sys.path: {type(current_platform).__name__}")
    print(f"  attention backend: {CpuPlatform.get_attn_backend_cls(None, _selector())}")
    print(f"  dist_backend {CpuPlatform.dist_backend!r}, pin memory {CpuPlatform.is_pin_memory_available()}")
    before = snapshot(config_under(UnspecifiedPlatform, kv_space_gib=4))
    after = snapshot(config_under(CpuPlatform, kv_space_gib=4))
    print("CpuPlatform.check_and_update_config, VLLM_CPU_KVCACHE_SPACE=4:")
    for key, (a, b) in config_changes(before, after).items():
        print(f"  {key:<30} {a!r:<12} -> {b!r}")
    q = QWEN25_05B
    per_tok = kv_bytes_per_token(
        q["num_hidden_layers"], q["num_key_value_heads"], q["hidden_size"] // q["num_attention_heads"], 2
    )
    print(f"Qwen2.5-0.5B bf16 KV: {per_tok} B/token ({per_tok / 1024:g} KiB)")
    for bs in (16, 128):
        print(f"  4 GiB, block_size {bs:>3}: {cpu_num_blocks(4 * GiB, bs, per_tok):,} blocks")
    print(
        f"  the reported 13,107 blocks at block_size 16 imply {4 * GiB / (13107 * 16) / 1024:.1f} KiB/token"
    )
    params = num_params(q)
    weights = 2 * params
    print(f"Qwen2.5-0.5B: {params:,} parameters, {weights / 1e9:.3f} GB in bf16")
    print(
        f"  decode bound at 50 GB/s: {decode_tok_s_bound(weights, 50e9):.1f} tok/s; "
        f"9 tok/s means {9 * weights / 1e9:.1f} GB/s effective"
    )


def _selector():
    """The selector config vLLM passes ``get_attn_backend_cls`` for a plain decoder (float32, 64-dim heads)."""
    import torch
    from vllm.v1.attention.selector import AttentionSelectorConfig

    return AttentionSelectorConfig(head_size=64, dtype=torch.float32, kv_cache_dtype="auto", block_size=16)


if __name__ == "__main__":
    cpu_env.apply()
    main()
