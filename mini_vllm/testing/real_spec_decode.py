"""The real vLLM 0.22.1 ``NgramProposer`` and ``rejection_sample`` on a CPU, for differential tests.

Used by ``mini_vllm/test_spec_decode.py`` and the Phase 08 labs. Importing this module imports
torch and vllm (seconds) and sets ``CUDA_VISIBLE_DEVICES=""`` when no NVIDIA driver is visible,
so the rejection sampler's Triton kernels run under ``TRITON_INTERPRET=1``. The n-gram proposer
is upstream's numba code; its first call compiles (about a second).

``rejection_sample`` below calls the real function with a hand-built ``SamplingMetadata``
(temperature only: no penalties, no top-k/top-p). Its random numbers come from torch's global
generator in a fixed order (the uniforms first, then one row of Exp(1) noise per request), so
``torch_randomness(seed, ...)`` reproduces them exactly and mini's ``rejection_sample`` can be
fed the same draws.
"""

from __future__ import annotations

import os
from pathlib import Path

if not (Path("/dev/nvidiactl").exists() or Path("/proc/driver/nvidia").exists()):
    os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
    os.environ.setdefault("TRITON_INTERPRET", "1")

import warnings

import numpy as np

from . import real_vllm  # noqa: F401  (the CPU recipe: env, logging, the stub architecture)
from .traces import SchedConfig

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    import torch
    from vllm.config import SpeculativeConfig
    from vllm.v1.sample.logits_processor import LogitsProcessors
    from vllm.v1.sample.metadata import SamplingMetadata
    from vllm.v1.sample.rejection_sampler import PLACEHOLDER_TOKEN_ID, RejectionSampler
    from vllm.v1.sample.rejection_sampler import rejection_sample as _vllm_rejection_sample
    from vllm.v1.spec_decode.ngram_proposer import NgramProposer as VllmNgramProposer

__all__ = ["PLACEHOLDER_TOKEN_ID", "RejectionSampler", "make_ngram_proposer", "rejection_sample", "torch_randomness"]


def make_ngram_proposer(
    num_speculative_tokens: int, prompt_lookup_min: int, prompt_lookup_max: int,
    max_model_len: int = 128, max_num_seqs: int = 8,
) -> VllmNgramProposer:
    """The real ``NgramProposer``, built from a ``VllmConfig`` with an n-gram ``SpeculativeConfig``."""
    config = SchedConfig(num_gpu_blocks=64, max_model_len=max_model_len, max_num_seqs=max_num_seqs)
    vllm_config = real_vllm.make_vllm_config(config)
    vllm_config.speculative_config = SpeculativeConfig(
        target_model_config=vllm_config.model_config,
        target_parallel_config=vllm_config.parallel_config,
        method="ngram",
        num_speculative_tokens=num_speculative_tokens,
        prompt_lookup_min=prompt_lookup_min,
        prompt_lookup_max=prompt_lookup_max,
    )
    return VllmNgramProposer(vllm_config)


def sampling_metadata(temperatures: list[float], device: torch.device | None = None) -> SamplingMetadata:
    """Temperature-only metadata: 0 means greedy for that request."""
    batch = len(temperatures)
    greedy = [t == 0 for t in temperatures]
    return SamplingMetadata(
        temperature=torch.tensor(temperatures, dtype=torch.float32, device=device),
        all_greedy=all(greedy), all_random=not any(greedy),
        top_p=None, top_k=None, generators={}, max_num_logprobs=None, no_penalties=True,
        prompt_token_ids=None, frequency_penalties=torch.zeros(batch), presence_penalties=torch.zeros(batch),
        repetition_penalties=torch.ones(batch), output_token_ids=[[] for _ in range(batch)],
        allowed_token_ids_mask=None, bad_words_token_ids={}, logitsprocs=LogitsProcessors(),
    )


def device() -> torch.device:
    """Where the kernels run: the GPU when there is one, else the CPU under the Triton interpreter."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def rejection_sample(
    draft_token_ids, num_draft_tokens, draft_probs, target_logits, bonus_token_ids, temperatures, seed: int = 0,
) -> np.ndarray:
    """Upstream ``rejection_sample`` on numpy inputs; returns the [B, max_spec_len + 1] int32 rows.

    ``target_logits`` must already be divided by the temperature (upstream's
    ``apply_sampling_constraints`` does that before calling it). Seeds torch's global generator.
    """
    counts = [int(n) for n in num_draft_tokens]
    dev = device()

    def tensor(x, dtype):
        return torch.as_tensor(np.asarray(x), dtype=dtype).contiguous().to(dev)

    metadata = sampling_metadata(list(temperatures), dev)
    torch.manual_seed(seed)
    out = _vllm_rejection_sample(
        tensor(draft_token_ids, torch.int32),
        counts,
        max(counts, default=0),
        tensor(np.cumsum(counts), torch.int32),
        None if draft_probs is None else tensor(draft_probs, torch.float32),
        tensor(target_logits, torch.float32),
        tensor(np.asarray(bonus_token_ids).reshape(-1, 1), torch.int32),
        metadata,
    )
    return out.cpu().numpy()


def torch_randomness(seed: int, num_tokens: int, batch: int, vocab: int) -> tuple[np.ndarray, np.ndarray]:
    """The uniforms and Exp(1) rows that ``rejection_sample(..., seed)`` draws on its random path."""
    torch.manual_seed(seed)
    uniforms = torch.rand((num_tokens,), dtype=torch.float64, device=device())
    exponentials = torch.empty((batch, vocab), dtype=torch.float32, device=device()).exponential_()
    return uniforms.cpu().numpy(), exponentials.cpu().numpy().astype(np.float64)
