"""Lab 02 tests: the platform vLLM resolves with and without the plugin, what CpuPlatform changes,
and the CPU's KV blocks, each checked against the real vLLM 0.22.1 (tier 1; one tier-2 test)."""

from __future__ import annotations

import os
import sys

import pytest

from course.runtime import lab_module

lab = lab_module(__file__)  # solution.py by default; LAB_IMPL=starter grades starter.py

GiB = 1 << 30
UNSPECIFIED = "vllm.platforms.interface.UnspecifiedPlatform"


def test_env_without_plugin_keeps_everything_else():
    plug = lab.PLUGIN_DIR
    env = {"PYTHONPATH": os.pathsep.join(["/a", plug, "/b", plug]), "HOME": "/h", "CUDA_VISIBLE_DEVICES": "0"}
    saved = dict(env)
    out = lab.env_without_plugin(env)
    assert out["PYTHONPATH"] == os.pathsep.join(["/a", "/b"]), (
        f"remove the plugin folder (every copy) and keep the other entries in order, got {out['PYTHONPATH']!r}"
    )
    assert out["CUDA_VISIBLE_DEVICES"] == "", "the child must see no GPU: CUDA_VISIBLE_DEVICES=''"
    assert out["HOME"] == "/h" and env == saved, "copy the environment; never edit the one you were given"
    assert lab.env_without_plugin({"PYTHONPATH": plug})["PYTHONPATH"] == ""


@pytest.mark.upstream
def test_the_standard_wheel_resolves_unspecified_without_the_plugin():
    probe = lab.probe_platform(lab.env_without_plugin(os.environ))
    assert probe["qualname"] == UNSPECIFIED, (
        f"without the course plugin the standard wheel on a GPU-less Linux box must resolve {UNSPECIFIED}, "
        f"got {probe['qualname']} (is the plugin folder still on PYTHONPATH?)"
    )
    assert set(probe["builtins"]) == {"tpu", "cuda", "rocm", "xpu", "cpu"}
    assert all(v is None for v in probe["builtins"].values()), (
        f"no built-in plugin activates: {probe['builtins']}"
    )
    assert not lab.cpu_plugin_activates(probe["version"], probe["sys_platform"]), (
        f"version {probe['version']!r} on {probe['sys_platform']}: the CPU rule must say no, as vLLM did"
    )
    import vllm.platforms

    here = type(vllm.platforms.current_platform).__name__  # this process has the course plugin
    assert here == "CpuPlatform", f"with the course plugin vLLM resolves CpuPlatform, got {here}"


@pytest.mark.upstream
def test_cpu_rule_matches_vllms(monkeypatch):
    import importlib.metadata

    import vllm.platforms as vp

    for version in ("0.22.1", "0.22.1+cpu", "0.22.1.dev3+gcpu", "0.22.1+cu129", "0.22.1+rocm"):
        for platform in ("linux", "darwin", "win32"):
            monkeypatch.setattr(importlib.metadata, "version", lambda name, v=version: v)
            monkeypatch.setattr(sys, "platform", platform)
            want = vp.cpu_platform_plugin() is not None
            got = lab.cpu_plugin_activates(version, platform)
            monkeypatch.undo()
            assert got == want, (
                f"version {version!r} on {platform}: vLLM's CPU plugin says {want}, yours {got}"
            )


EXPECTED_CHANGES = {
    "async_scheduling": (True, False),
    "block_size": (16, 128),
    "cudagraph_capture_sizes": (None, []),
    "distributed_executor_backend": ("uni", "mp"),
    "worker_cls": ("auto", "vllm.v1.worker.cpu_worker.CPUWorker"),
}


@pytest.mark.upstream
def test_cpu_platform_changes_the_config():
    from vllm.platforms.cpu import CpuPlatform
    from vllm.platforms.interface import UnspecifiedPlatform

    for gib in (4, 1):
        before = lab.snapshot(lab.config_under(UnspecifiedPlatform, kv_space_gib=gib))
        after = lab.snapshot(lab.config_under(CpuPlatform, kv_space_gib=gib))
        changes = lab.config_changes(before, after)
        want = {**EXPECTED_CHANGES, "kv_cache_memory_bytes": (None, gib * GiB)}
        assert changes == want, f"VLLM_CPU_KVCACHE_SPACE={gib}: expected {want}, got {changes}"
    pinned = lab.snapshot(lab.config_under(CpuPlatform, kv_space_gib=None, block_size=16))
    assert pinned["block_size"] == 16, "a block size the user chose is kept; only the default becomes 128"
    assert pinned["kv_cache_memory_bytes"] is None, "no VLLM_CPU_KVCACHE_SPACE: no absolute KV budget"
    assert "VLLM_CPU_KVCACHE_SPACE" not in os.environ, "config_under must restore the environment"


def test_config_changes():
    got = lab.config_changes({"a": 1, "b": 2, "c": None}, {"a": 1, "b": 3, "d": 4})
    assert got == {"b": (2, 3), "d": (None, 4)}, f"only keys whose values differ, missing = None; got {got}"
    assert list(lab.config_changes({"z": 1, "y": 1}, {"z": 2, "y": 2})) == ["y", "z"], "keys sorted"


@pytest.mark.upstream
def test_kv_blocks_match_vllms_arithmetic():
    import torch
    from vllm.v1.core.kv_cache_utils import get_num_blocks
    from vllm.v1.kv_cache_interface import FullAttentionSpec

    from course.runtime import real_vllm

    vc = real_vllm.make_vllm_config()
    vc.cache_config.num_gpu_blocks_override = None
    for layers, kv_heads, head_dim, dtype in (
        (24, 2, 64, torch.bfloat16),
        (2, 2, 64, torch.float32),
        (32, 8, 128, torch.float16),
    ):
        for block_size in (16, 32, 128):
            for space in (4 * GiB, GiB + 12345, 3 * GiB // 7):
                per_tok = lab.kv_bytes_per_token(layers, kv_heads, head_dim, dtype.itemsize)
                page = FullAttentionSpec(
                    block_size=block_size, num_kv_heads=kv_heads, head_size=head_dim, dtype=dtype
                ).page_size_bytes
                want = get_num_blocks(vc, layers, space, page)
                got = lab.cpu_num_blocks(space, block_size, per_tok)
                assert got == want, (
                    f"{layers} layers x {kv_heads} KV heads x {head_dim} ({dtype}), block {block_size}, "
                    f"{space} bytes: vLLM makes {want} blocks, you {got}"
                )


def test_the_reported_figures_resolved_by_computing():
    q = lab.QWEN25_05B
    per_tok = lab.kv_bytes_per_token(q["num_hidden_layers"], q["num_key_value_heads"], 64, 2)
    assert per_tok == 12 * 1024, f"Qwen2.5-0.5B in bf16 keeps 12 KiB of KV per token, got {per_tok}"
    assert lab.cpu_num_blocks(4 * GiB, 16, per_tok) == 21845
    assert lab.cpu_num_blocks(4 * GiB, 128, per_tok) == 2730, "CpuPlatform's default block size is 128"
    assert lab.num_params(q) == 494_032_768, "Qwen2.5-0.5B has 494,032,768 parameters (tied head)"
    assert lab.num_params({**q, "tie_word_embeddings": False}) == 494_032_768 + 151936 * 896
    bound = lab.decode_tok_s_bound(2 * lab.num_params(q), 50e9)
    assert 50 < bound < 51, f"50 GB/s over 0.988 GB of bf16 weights allows ~50.6 tok/s, got {bound:.2f}"


@pytest.mark.engine
def test_the_cpu_build_resolves_cpu_platform_by_itself():
    from course.runtime import engine

    run = engine.run_job("platform")
    assert run.result["platform"] == "CpuPlatform", run.result
    version = run.result["distribution"]
    assert not lab.cpu_plugin_activates(version, "linux"), f"{version!r} alone names no CPU build"
    # vllm-cpu's one change to vllm/platforms/__init__.py: no "vllm" distribution, so it reads
    # "vllm-cpu"'s version and appends "+cpu" before the rule runs.
    assert lab.cpu_plugin_activates(version + "+cpu", "linux"), (
        f"{version + '+cpu'!r} is what the vllm-cpu build feeds the rule: it must say yes"
    )
