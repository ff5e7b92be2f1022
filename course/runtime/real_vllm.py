"""The small real-vLLM objects every tier-1 test and lab needs, built one way.

Importing this module wires the CPU environment (``course.runtime.cpu_env``) and then imports
torch and vllm (seconds). What it builds, all from the pinned vLLM 0.22.1 classes:

* ``model_dir()`` — a directory holding a tiny Llama's ``config.json`` and tokenizer (no
  weights). Its architecture is a stub registered in vLLM's ``ModelRegistry`` from this
  process, so ``ModelConfig`` never inspects a real model class in a subprocess.
* ``make_vllm_config(...)`` — ``ModelConfig`` + ``SchedulerConfig`` + ``CacheConfig`` +
  ``VllmConfig`` with a CPU ``DeviceConfig``; every knob a scheduler test varies is a keyword.
* ``make_kv_cache_config(...)`` / ``make_scheduler(...)`` — one full-attention KV-cache group
  and the real ``Scheduler`` (with its ``KVCacheManager`` and ``BlockPool``) over it.
* ``make_block_hasher(...)`` / ``make_request(...)`` — prefix hashing, EngineCore's job
  upstream, and a ``Request`` that uses it.
* ``make_tokenizer()`` — vLLM's own tokenizer loader on the tiny model's byte-level BPE.
* ``unpinned_h2d()`` — a context manager for the one pinned-memory default a CPU-only torch
  rejects (see its docstring).

Under ``TRITON_INTERPRET=1`` it also mends one interpreter bug of Triton 3.7 (the release the
CUDA build of torch 2.13 pins, so the one a Python 3.12 venv gets): a Python ``bool`` passed to a
kernel became an int32 array typed ``int1`` and failed with "numpy data itemsize (32 bits) exceeds
dtype primitive_bitwidth (1 bits)". Triton 3.9 converts it as a one-bit boolean, which is what
``_mend_interpreter_bools`` teaches 3.7 to do; on a Triton that already does, it changes nothing.
"""

from __future__ import annotations

from course.runtime import cpu_env

cpu_env.apply()

import atexit
import contextlib
import logging
import os
import shutil
import tempfile
import warnings
from collections.abc import Callable, Iterator
from functools import lru_cache
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("PYTHONHASHSEED", "0")  # NONE_HASH is derived from it: stable block hashes
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")  # keep stdout clean for generated blocks
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

with warnings.catch_warnings():  # import-time noise: requests' chardet warning, torch.jit deprecations
    warnings.simplefilter("ignore")
    import torch
    from torch import nn
    from vllm import ModelRegistry
    from vllm.config import CacheConfig, DeviceConfig, ModelConfig, SchedulerConfig, VllmConfig
    from vllm.sampling_params import SamplingParams
    from vllm.utils.hashing import get_hash_fn_by_name
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.request import Request
    from vllm.v1.structured_output import StructuredOutputManager

from course.runtime import tiny_model

for _name in ("vllm", "transformers"):
    logging.getLogger(_name).setLevel(logging.ERROR)


def _mend_interpreter_bools() -> bool:
    """Make Triton's interpreter take a ``bool`` kernel argument as int1 (see the module docstring).

    Returns True when it had to patch, False when Triton already converts bools (or when the
    interpreter is off or Triton is absent).
    """
    if os.environ.get("TRITON_INTERPRET") != "1":
        return False
    try:
        import numpy as np
        from triton import language as tl
        from triton.runtime import interpreter
    except ImportError:
        return False
    original = interpreter._implicit_cvt
    try:
        original(True)
        return False  # this Triton handles bools already
    except ValueError:
        pass

    def implicit_cvt(arg: Any) -> Any:
        if isinstance(arg, bool):
            handle = interpreter.TensorHandle(np.array([arg], dtype=np.bool_), tl.int1)
            return tl.tensor(handle, tl.int1)
        return original(arg)

    interpreter._implicit_cvt = implicit_cvt
    return True


_mend_interpreter_bools()

STUB_ARCH = "CourseStubForCausalLM"
NUM_LAYERS = 2
NUM_KV_HEADS = 2
HEAD_SIZE = 16  # only sizes the KV-cache spec; no attention runs in tier 1


class CourseStubForCausalLM(nn.Module):
    """Never built or run: it only answers ModelConfig's "is this a text-generation model?"."""

    def __init__(self, *, vllm_config: Any, prefix: str = "") -> None:
        super().__init__()

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        raise NotImplementedError

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError


if STUB_ARCH not in ModelRegistry.get_supported_archs():
    ModelRegistry.register_model(STUB_ARCH, CourseStubForCausalLM)


@lru_cache(maxsize=1)
def model_dir() -> str:
    """A temp dir with the tiny Llama's config.json (stub architecture, 2 layers) and tokenizer."""
    path = Path(tempfile.mkdtemp(prefix="course_tiny_llama_"))
    atexit.register(shutil.rmtree, path, True)
    tiny_model.write_config(path, architectures=[STUB_ARCH], num_hidden_layers=NUM_LAYERS)
    tiny_model.write_tokenizer(path)
    return str(path)


def make_vllm_config(
    *,
    max_model_len: int = 512,
    block_size: int = 16,
    num_gpu_blocks: int = 257,
    max_num_seqs: int = 128,
    max_num_batched_tokens: int = 2048,
    long_prefill_token_threshold: int = 0,
    enable_prefix_caching: bool = True,
    enable_chunked_prefill: bool = True,
    tokenizer: bool = False,
    **vllm_config_kwargs: Any,
) -> VllmConfig:
    """A ``VllmConfig`` for the tiny model on a CPU; extra keywords go to ``VllmConfig`` itself
    (``speculative_config=``, ``lora_config=``, ``structured_outputs_config=``, ...)."""
    model_config = ModelConfig(
        model=model_dir(), skip_tokenizer_init=not tokenizer, dtype="float32", max_model_len=max_model_len, seed=0
    )
    scheduler_config = SchedulerConfig(
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        max_model_len=max_model_len,
        long_prefill_token_threshold=long_prefill_token_threshold,
        enable_chunked_prefill=enable_chunked_prefill,
        is_encoder_decoder=False,
        async_scheduling=False,
    )
    cache_config = CacheConfig(block_size=block_size, enable_prefix_caching=enable_prefix_caching)
    cache_config.num_gpu_blocks = num_gpu_blocks  # the Scheduler asserts it is set
    return VllmConfig(
        model_config=model_config,
        scheduler_config=scheduler_config,
        cache_config=cache_config,
        device_config=DeviceConfig(device="cpu"),
        **vllm_config_kwargs,
    )


def make_kv_cache_config(vllm_config: VllmConfig) -> KVCacheConfig:
    """One full-attention group over every layer, ``cache_config.num_gpu_blocks`` blocks, no tensors."""
    cache = vllm_config.cache_config
    spec = FullAttentionSpec(
        block_size=cache.block_size, num_kv_heads=NUM_KV_HEADS, head_size=HEAD_SIZE, dtype=torch.float32
    )
    group = KVCacheGroupSpec(layer_names=[f"layer.{i}" for i in range(NUM_LAYERS)], kv_cache_spec=spec)
    return KVCacheConfig(num_blocks=cache.num_gpu_blocks, kv_cache_tensors=[], kv_cache_groups=[group])


def make_scheduler(vllm_config: VllmConfig | None = None, *, log_stats: bool = True, **config_kwargs: Any) -> Scheduler:
    """The real ``Scheduler`` for ``vllm_config`` (or for ``make_vllm_config(**config_kwargs)``)."""
    if vllm_config is None:
        vllm_config = make_vllm_config(**config_kwargs)
    elif config_kwargs:
        raise TypeError(f"pass either a vllm_config or config keywords, not both: {sorted(config_kwargs)}")
    return Scheduler(
        vllm_config=vllm_config,
        kv_cache_config=make_kv_cache_config(vllm_config),
        structured_output_manager=StructuredOutputManager(vllm_config),
        block_size=vllm_config.cache_config.block_size,
        log_stats=log_stats,
    )


def make_block_hasher(vllm_config: VllmConfig) -> Callable[[Request], list[Any]]:
    """Prefix hashing as EngineCore sets it up: the configured hash function, seeded NONE_HASH."""
    hash_fn = get_hash_fn_by_name(vllm_config.cache_config.prefix_caching_hash_algo)
    init_none_hash(hash_fn)
    return get_request_block_hasher(vllm_config.cache_config.block_size, hash_fn)


def make_request(
    request_id: str,
    prompt_token_ids: list[int],
    *,
    max_tokens: int,
    block_hasher: Callable[[Request], list[Any]] | None = None,
    **sampling_kwargs: Any,
) -> Request:
    """A ``Request`` that generates exactly ``max_tokens`` tokens (``ignore_eos``) unless told otherwise."""
    sampling_kwargs.setdefault("ignore_eos", True)
    return Request(
        request_id=request_id,
        prompt_token_ids=list(prompt_token_ids),
        sampling_params=SamplingParams(max_tokens=max_tokens, **sampling_kwargs),
        pooling_params=None,
        block_hasher=block_hasher,
    )


@lru_cache(maxsize=1)
def make_tokenizer() -> Any:
    """vLLM's tokenizer (``vllm.tokenizers.get_tokenizer``) for the tiny model's byte-level BPE."""
    from vllm.tokenizers import get_tokenizer

    return get_tokenizer(model_dir())


@contextlib.contextmanager
def unpinned_h2d() -> Iterator[None]:
    """Within the block, ``vllm.utils.torch_utils.async_tensor_h2d`` defaults to unpinned memory.

    Its ``pin_memory`` default is ``PIN_MEMORY``, computed once at import (True on any Linux
    that is not WSL), not ``is_pin_memory_available()``; a CPU-only torch then raises
    "pin_memory=True requires a CUDA or other accelerator backend". LoRA's ``convert_mapping``
    calls it without the argument. Tests that drive LoRA wrap that code in this context manager;
    nothing patches it globally, so every other test sees upstream's behaviour.
    """
    from vllm.utils import torch_utils

    fn = torch_utils.async_tensor_h2d
    saved = fn.__defaults__
    fn.__defaults__ = (False,)
    try:
        yield
    finally:
        fn.__defaults__ = saved
