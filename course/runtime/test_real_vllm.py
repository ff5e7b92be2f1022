"""Tier 1: the real vLLM's components in the course venv, wired by ``course.runtime.cpu_env``."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from course.runtime import cpu_env

NO_CUDA = not cpu_env.has_cuda()
needs_no_cuda = pytest.mark.skipif(not NO_CUDA, reason="gpu box: the CPU wiring is off by design")


@pytest.fixture(scope="module")
def rv():
    from course.runtime import real_vllm  # imports torch and vllm: seconds, once

    return real_vllm


def test_tier1_env_without_cuda_sets_all_three_and_keeps_user_values():
    env = cpu_env.apply_env({"PYTHONPATH": "/somewhere", "TRITON_INTERPRET": "0"}, cuda=False)
    assert env["CUDA_VISIBLE_DEVICES"] == "", "set-and-empty is what keeps vLLM's real Triton (not the placeholder)"
    assert env["TORCHDYNAMO_DISABLE"] == "1"
    assert env["TRITON_INTERPRET"] == "0", "a value the user already set must win"
    assert env["PYTHONPATH"].split(os.pathsep) == [str(cpu_env.PLUGIN_DIR), "/somewhere"], (
        "child processes find the platform plugin through PYTHONPATH, ahead of what was there"
    )
    again = cpu_env.apply_env(dict(env), cuda=False)
    assert again["PYTHONPATH"] == env["PYTHONPATH"], "applying twice must not stack the plugin path"
    assert cpu_env.strip_env(dict(env)) == {"TORCHDYNAMO_DISABLE": "1", "PYTHONPATH": "/somewhere"}, (
        "strip_env removes exactly the CPU wiring (for the tier-2 venv), keeping the rest"
    )


def test_tier1_env_with_cuda_touches_neither_devices_nor_platform():
    env = cpu_env.apply_env({}, cuda=True)
    assert env == {"TORCHDYNAMO_DISABLE": "1"}, f"on a GPU box only dynamo is switched off, got {env}"


@needs_no_cuda
def test_this_process_is_wired_before_vllm():
    assert os.environ.get("CUDA_VISIBLE_DEVICES") == "" and os.environ.get("TRITON_INTERPRET") == "1", (
        "the root conftest must apply course.runtime.cpu_env before anything imports vllm"
    )
    assert str(cpu_env.PLUGIN_DIR) in sys.path


@needs_no_cuda
@pytest.mark.upstream
def test_platform_plugin_selects_cpu_platform(rv):
    from vllm.platforms import current_platform, resolve_current_platform_cls_qualname

    assert resolve_current_platform_cls_qualname() == "vllm.platforms.cpu.CpuPlatform", (
        "vLLM should find the course_cpu entry point in vllm_cpu_plugin/*.dist-info on sys.path"
    )
    assert current_platform.is_cpu() and not current_platform.is_pin_memory_available()


@needs_no_cuda
@pytest.mark.upstream
def test_upstream_triton_kernel_is_real_and_interpreted(rv):
    """vLLM's own ``expand_kernel`` runs in Triton's interpreter, not as the no-op placeholder."""
    import torch
    from triton.runtime.interpreter import InterpretedFunction
    from vllm.triton_utils import HAS_TRITON
    from vllm.v1.sample import rejection_sampler as rs

    assert HAS_TRITON, "vllm.triton_utils fell back to its TritonPlaceholder: CUDA_VISIBLE_DEVICES was not ''"
    assert isinstance(rs.expand_kernel, InterpretedFunction), (
        f"expected the interpreter's kernel object, got {type(rs.expand_kernel).__name__}"
    )
    x = torch.tensor([7, 0, 9, 4], dtype=torch.int32)
    cu = torch.tensor([2, 5, 5, 8], dtype=torch.int32)  # 2, 3, 0 and 3 tokens: an empty request too
    out = rs.expand_batch_to_tokens(x, cu, 8, replace_from=0, replace_to=-1)
    assert out.tolist() == [7, 7, -1, -1, -1, 4, 4, 4], f"expand_kernel computed {out.tolist()}"


@needs_no_cuda
def test_interpreter_takes_a_bool_argument_as_one_bit(rv):
    """Triton 3.7's interpreter (the 3.12 venv's, pinned by torch's CUDA build) typed a bool as int1
    over an int32 array and raised; after importing real_vllm every Triton here converts it."""
    import numpy as np
    from triton import language as tl
    from triton.runtime import interpreter

    for flag in (True, False):
        t = interpreter._implicit_cvt(flag)
        assert t.dtype == tl.int1 and t.handle.data.dtype == np.bool_, (
            f"a Python {flag} must reach the kernel as a one-bit boolean, got {t.dtype} over {t.handle.data.dtype}"
        )
        assert bool(t.handle.data[0]) is flag
    assert interpreter._implicit_cvt(7).dtype == tl.int32, "ints keep their own conversion"


def test_plugin_is_found_by_a_fresh_interpreter():
    """A child started with apply_env's environment sees the wiring and finds the plugin's entry point
    (what a check-labs child or a learner's script gets); the resolution itself is tested above."""
    if not NO_CUDA:
        pytest.skip("gpu box: the plugin stays off when CUDA is present")
    code = (
        "import os; from importlib.metadata import entry_points;"
        "eps = [e for e in entry_points(group='vllm.platform_plugins') if e.name == 'course_cpu'];"
        "print(repr(os.environ['CUDA_VISIBLE_DEVICES']), os.environ['TRITON_INTERPRET'], [e.load()() for e in eps])"
    )
    clean = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "CUDA_VISIBLE_DEVICES", "TRITON_INTERPRET")}
    env = cpu_env.apply_env(clean, cuda=False)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60, check=False)
    assert out.stdout.split() == ["''", "1", "['vllm.platforms.cpu.CpuPlatform']"], out.stdout + out.stderr[-2000:]


@pytest.mark.upstream
def test_builders_make_a_working_scheduler(rv):
    config = rv.make_vllm_config(block_size=4, num_gpu_blocks=9, max_num_batched_tokens=8, max_num_seqs=2)
    assert config.cache_config.block_size == 4, "a block size the test chose must survive the CPU platform's defaults"
    sched = rv.make_scheduler(config)
    hasher = rv.make_block_hasher(config)
    req = rv.make_request("r0", list(range(10, 20)), max_tokens=2, block_hasher=hasher)
    sched.add_request(req)
    out = sched.schedule()
    assert dict(out.num_scheduled_tokens) == {"r0": 8}, "10 prompt tokens over a budget of 8: the first chunk is 8"
    assert len(req.block_hashes) == 2, "two full blocks of 4 are hashed for prefix caching"
    with pytest.raises(TypeError, match="not both"):
        rv.make_scheduler(config, block_size=8)


@pytest.mark.upstream
def test_tokenizer_has_the_special_tokens(rv):
    tok = rv.make_tokenizer()
    ids = tok.encode("<think>hi</think><tool_call>{}</tool_call><|python_tag|>", add_special_tokens=False)
    for special in ("<think>", "</think>", "<tool_call>", "</tool_call>", "<|python_tag|>"):
        assert tok.convert_tokens_to_ids(special) in ids, f"{special} must be one token of the tiny vocabulary"
    text = "The scheduler decides which requests run."
    assert tok.decode(tok.encode(text, add_special_tokens=False)) == text, "byte-level BPE round-trips text"
    assert len(tok) == 512


@needs_no_cuda
@pytest.mark.upstream
def test_unpinned_h2d_is_scoped(rv):
    import torch
    from vllm.utils import torch_utils

    before = torch_utils.async_tensor_h2d.__defaults__
    if before == (True,):  # a CPU-only torch rejects pinned memory: what LoRA's convert_mapping hits
        with pytest.raises(RuntimeError):
            torch_utils.async_tensor_h2d([1, 2], torch.int32, "cpu")
    with rv.unpinned_h2d():
        t = torch_utils.async_tensor_h2d([1, 2], torch.int32, "cpu")
        assert t.tolist() == [1, 2] and not t.is_pinned()
    assert torch_utils.async_tensor_h2d.__defaults__ == before, "the default must be restored on exit"
