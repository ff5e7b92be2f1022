"""Drive the real vLLM 0.22.1 ``BlockPool`` and ``Scheduler`` on a CPU, without a model.

Used by mini's differential tests and benchmark, and by the course labs that read the real
engine (Phase 01 lab-02, Phase 02 lab-05, Phase 03 lab-06). Importing *this* module imports
torch and vllm (seconds); ``import mini_vllm`` never does.

Recipe (see ``shared/ref/real-vllm-on-cpu.md``): a model directory holding only the
``config.json`` of a tiny Llama (no weights, no tokenizer) → ``ModelConfig`` /
``SchedulerConfig`` / ``CacheConfig`` / ``VllmConfig`` with a CPU ``DeviceConfig`` → one
full-attention ``KVCacheConfig`` of ``num_gpu_blocks`` blocks → ``Scheduler``. The model runner
is faked: each step every request that caught up "samples" ``traces.fake_token``, and a
request still mid chunked prefill gets ``[]``, exactly what the real runner returns.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from functools import lru_cache
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("PYTHONHASHSEED", "0")  # NONE_HASH is derived from it: stable hashes
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")  # keep stdout clean for generated blocks
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import warnings

with warnings.catch_warnings():  # import-time noise: requests' chardet warning, torch.jit deprecations
    warnings.simplefilter("ignore")
    import torch
    from torch import nn
    from vllm import ModelRegistry
    from vllm.config import (
        CacheConfig,
        DeviceConfig,
        ModelConfig,
        SchedulerConfig,
        VllmConfig,
    )
    from vllm.sampling_params import SamplingParams as VllmSamplingParams
    from vllm.utils.hashing import get_hash_fn_by_name
    from vllm.v1.core.block_pool import BlockPool as VllmBlockPool
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.core.sched.output import SchedulerOutput as VllmSchedulerOutput
    from vllm.v1.core.sched.scheduler import Scheduler as VllmScheduler
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.outputs import ModelRunnerOutput
    from vllm.v1.request import Request as VllmRequest
    from vllm.v1.request import RequestStatus
    from vllm.v1.structured_output import StructuredOutputManager

from .traces import FAKE_EOS, Event, SchedConfig, StepRecord, fake_token, split_trace

for _name in ("vllm", "transformers"):
    logging.getLogger(_name).setLevel(logging.ERROR)

NUM_LAYERS = 2
ARCH = "MiniVllmStubForCausalLM"


class MiniVllmStubForCausalLM(nn.Module):
    """Never built or run: it only answers ModelConfig's "is this a text-generation model?".

    Registering a class that lives in this process keeps vLLM from inspecting a real
    architecture in a subprocess (a second multi-second import, and llama.py needs einops,
    which the CPU recipe does not install).
    """

    def __init__(self, *, vllm_config: Any, prefix: str = "") -> None:
        super().__init__()

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        raise NotImplementedError

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError


if ARCH not in ModelRegistry.get_supported_archs():
    ModelRegistry.register_model(ARCH, MiniVllmStubForCausalLM)

__all__ = [
    "RealScheduler",
    "VllmBlockPool",
    "VllmRequest",
    "VllmScheduler",
    "make_block_pool",
    "model_dir",
    "run_trace",
]


@lru_cache(maxsize=1)
def model_dir() -> str:
    """A temp dir with the config.json of a tiny Llama (vocab 512, 2 layers): all vLLM needs.

    ``model_type`` is llama (so transformers parses it as a ``LlamaConfig``); the architecture
    is the stub registered above."""
    path = Path(tempfile.mkdtemp(prefix="mini_vllm_tiny_llama_"))
    atexit.register(shutil.rmtree, path, True)
    config = {
        "architectures": [ARCH],
        "model_type": "llama",
        "vocab_size": 512,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": NUM_LAYERS,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 2048,
        "rms_norm_eps": 1e-6,
        "torch_dtype": "float32",
        "bos_token_id": 1,
        "eos_token_id": 2,
    }
    (path / "config.json").write_text(json.dumps(config))
    return str(path)


def make_block_pool(num_gpu_blocks: int, enable_caching: bool = True, block_size: int = 16) -> VllmBlockPool:
    """The real ``BlockPool`` (block 0 becomes its null block, as in mini)."""
    return VllmBlockPool(
        num_gpu_blocks=num_gpu_blocks, enable_caching=enable_caching, hash_block_size=block_size
    )


def make_vllm_config(config: SchedConfig) -> VllmConfig:
    model_config = ModelConfig(
        model=model_dir(),
        skip_tokenizer_init=True,
        dtype="float32",
        max_model_len=config.max_model_len,
        seed=0,
    )
    scheduler_config = SchedulerConfig(
        max_num_seqs=config.max_num_seqs,
        max_num_batched_tokens=config.max_num_batched_tokens,
        max_model_len=config.max_model_len,
        long_prefill_token_threshold=config.long_prefill_token_threshold,
        enable_chunked_prefill=config.enable_chunked_prefill,
        is_encoder_decoder=False,
        async_scheduling=False,
    )
    cache_config = CacheConfig(
        block_size=config.block_size, enable_prefix_caching=config.enable_prefix_caching
    )
    cache_config.num_gpu_blocks = config.num_gpu_blocks
    return VllmConfig(
        model_config=model_config,
        scheduler_config=scheduler_config,
        cache_config=cache_config,
        device_config=DeviceConfig(device="cpu"),
    )


class RealScheduler:
    """The real ``Scheduler`` + ``KVCacheManager`` with a fake model runner."""

    def __init__(self, config: SchedConfig) -> None:
        self.config = config
        vllm_config = make_vllm_config(config)
        spec = FullAttentionSpec(
            block_size=config.block_size, num_kv_heads=2, head_size=16, dtype=torch.float32
        )
        kv_cache_config = KVCacheConfig(
            num_blocks=config.num_gpu_blocks,
            kv_cache_tensors=[],
            kv_cache_groups=[
                KVCacheGroupSpec(layer_names=[f"layer.{i}" for i in range(NUM_LAYERS)], kv_cache_spec=spec)
            ],
        )
        self.scheduler = VllmScheduler(
            vllm_config=vllm_config,
            kv_cache_config=kv_cache_config,
            structured_output_manager=StructuredOutputManager(vllm_config),
            block_size=config.block_size,
            log_stats=True,
        )
        hash_fn = get_hash_fn_by_name(vllm_config.cache_config.prefix_caching_hash_algo)
        init_none_hash(hash_fn)
        self.block_hasher = get_request_block_hasher(config.block_size, hash_fn)
        self.eos_at: dict[str, int | None] = {}

    @property
    def kv_cache_manager(self) -> Any:
        return self.scheduler.kv_cache_manager

    def add_request(
        self, request_id: str, prompt_token_ids: list[int], max_tokens: int, eos_at: int | None = None
    ) -> VllmRequest:
        """Queue a request; with ``eos_at=k`` its ``k``-th output is ``FAKE_EOS`` and stops it."""
        params = VllmSamplingParams(max_tokens=max_tokens, ignore_eos=eos_at is None)
        if eos_at is not None:
            params.update_from_generation_config({}, eos_token_id=FAKE_EOS)
        self.eos_at[request_id] = eos_at
        request = VllmRequest(
            request_id=request_id,
            prompt_token_ids=list(prompt_token_ids),
            sampling_params=params,
            pooling_params=None,
            block_hasher=self.block_hasher,
        )
        self.scheduler.add_request(request)
        return request

    def fake_model_runner_output(self, out: VllmSchedulerOutput) -> ModelRunnerOutput:
        """One token per request that caught up, ``[]`` for one still mid chunked prefill."""
        req_ids = list(out.num_scheduled_tokens)
        sampled = []
        for rid in req_ids:
            request = self.scheduler.requests[rid]
            if request.is_prefill_chunk:
                sampled.append([])
            else:
                sampled.append([fake_token(rid, request.num_output_tokens, self.eos_at.get(rid))])
        return ModelRunnerOutput(
            req_ids=req_ids,
            req_id_to_index={rid: i for i, rid in enumerate(req_ids)},
            sampled_token_ids=sampled,
        )

    def step(
        self, timings: list[float] | None = None, clock: Callable[[], float] = time.perf_counter
    ) -> StepRecord:
        """``schedule()`` → fake runner → ``update_from_output()``; what happened, as a StepRecord.

        ``timings`` receives the seconds of ``schedule()`` + ``update_from_output()`` alone."""
        sched = self.scheduler
        t0 = clock()
        out = sched.schedule()
        t1 = clock()
        runner_output = self.fake_model_runner_output(out)
        t2 = clock()
        engine_outputs = sched.update_from_output(out, runner_output)
        if timings is not None:
            timings.append(t1 - t0 + clock() - t2)
        finished: list[tuple[str, str]] = []
        stats = None
        for eco in engine_outputs.values():
            for o in eco.outputs:
                if o.finish_reason is not None:
                    finished.append((o.request_id, str(o.finish_reason)))
            if eco.scheduler_stats is not None:
                stats = eco.scheduler_stats.prefix_cache_stats
        kv = sched.kv_cache_manager
        prefix = (0, 0, 0, 0, 0, 0)
        if stats is not None:
            prefix = (
                stats.requests,
                stats.queries,
                stats.hits,
                stats.preempted_requests,
                stats.preempted_queries,
                stats.preempted_hits,
            )
        return StepRecord(
            num_scheduled_tokens=dict(out.num_scheduled_tokens),
            preempted=set(out.preempted_req_ids or ()),
            finished=finished,
            block_ids={r.request_id: list(kv.get_block_ids(r.request_id)[0]) for r in sched.running},
            num_free_blocks=kv.block_pool.get_num_free_blocks(),
            prefix_cache=prefix,
        )


def run_trace(
    config: SchedConfig,
    trace: list[Event],
    max_steps: int = 10_000,
    *,
    timings: list[float] | None = None,
    clock: Callable[[], float] = time.perf_counter,
) -> list[StepRecord]:
    """Drive the real Scheduler through ``trace``; one StepRecord per ``schedule()``.

    Same event rules as ``traces.run_mini_trace``: arrivals, then aborts (one id per
    ``finish_requests`` call, live ids only), then the step."""
    real = RealScheduler(config)
    sched = real.scheduler
    arrivals, aborts = split_trace(trace)
    records: list[StepRecord] = []
    step = 0
    while arrivals or aborts or sched.has_unfinished_requests():
        while arrivals and arrivals[0].step <= step:
            a = arrivals.pop(0)
            real.add_request(a.request_id, list(a.prompt_token_ids), a.max_tokens, a.eos_at)
        aborted: list[str] = []
        t_abort = clock()
        while aborts and aborts[0].step <= step:
            for rid in aborts.pop(0).request_ids:
                if rid in sched.requests and not sched.requests[rid].is_finished():
                    sched.finish_requests(rid, RequestStatus.FINISHED_ABORTED)
                    aborted.append(rid)
        t_abort = clock() - t_abort
        record = real.step(timings, clock)
        if timings is not None:
            timings[-1] += t_abort
        record.aborted = aborted
        records.append(record)
        step += 1
        if step > max_steps:
            raise RuntimeError("trace did not finish on the real scheduler")
    return records
