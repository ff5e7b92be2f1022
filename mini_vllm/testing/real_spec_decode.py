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

``run_real_spec_trace`` drives the real ``Scheduler`` (built with an n-gram
``SpeculativeConfig``) through a ``spec_traces`` trace: the verifier is the real
``RejectionSampler`` or the plain greedy rule, the drafter the real ``NgramProposer`` or mini's
(proven equal to it in ``test_spec_decode.py``), so a fast test can skip numba's compile.
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
from .spec_traces import VOCAB, SpecStepRecord, SpecTraceConfig, greedy_verify, periodic_target
from .traces import FAKE_EOS, Arrival, SchedConfig

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    import torch
    from vllm.config import SpeculativeConfig
    from vllm.sampling_params import SamplingParams as VllmSamplingParams
    from vllm.v1.core.sched.output import SchedulerOutput as VllmSchedulerOutput
    from vllm.v1.outputs import DraftTokenIds, ModelRunnerOutput
    from vllm.v1.request import Request as VllmRequest
    from vllm.v1.sample.logits_processor import LogitsProcessors
    from vllm.v1.sample.metadata import SamplingMetadata
    from vllm.v1.sample.rejection_sampler import PLACEHOLDER_TOKEN_ID, RejectionSampler
    from vllm.v1.sample.rejection_sampler import rejection_sample as _vllm_rejection_sample
    from vllm.v1.sample.sampler import Sampler as VllmSampler
    from vllm.v1.spec_decode.metadata import SpecDecodeMetadata
    from vllm.v1.spec_decode.ngram_proposer import NgramProposer as VllmNgramProposer

__all__ = [
    "PLACEHOLDER_TOKEN_ID",
    "RejectionSampler",
    "make_ngram_proposer",
    "rejection_sample",
    "run_real_spec_trace",
    "torch_randomness",
]


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


def sampling_metadata(
    temperatures: list[float], device: torch.device | None = None, top_k: int | None = None, top_p: float | None = None
) -> SamplingMetadata:
    """Temperature metadata (0 means greedy for that request); ``top_k`` / ``top_p``, when given,
    apply to every row (``mini_vllm.bench`` uses them; the spec-decode tests do not)."""
    batch = len(temperatures)
    greedy = [t == 0 for t in temperatures]
    return SamplingMetadata(
        temperature=torch.tensor(temperatures, dtype=torch.float32, device=device),
        all_greedy=all(greedy), all_random=not any(greedy),
        top_p=None if top_p is None else torch.full((batch,), top_p, dtype=torch.float32, device=device),
        top_k=None if top_k is None else torch.full((batch,), top_k, dtype=torch.int32, device=device), generators={}, max_num_logprobs=None, no_penalties=True,
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


def real_verify(targets, ctxs, drafts) -> list[list[int]]:
    """The real ``RejectionSampler`` (greedy) on one-hot-ish target logits, laid out as the runner does:
    each request's draft positions, then its bonus position."""
    if not any(drafts):
        return [[t(c)] for t, c in zip(targets, ctxs)]
    rows, target_idx, bonus_idx = [], [], []
    for t, c, d in zip(targets, ctxs, drafts):
        for j in range(len(d) + 1):
            (target_idx if j < len(d) else bonus_idx).append(len(rows))
            row = np.full(VOCAB, -10.0, dtype=np.float32)
            row[t([*c, *d[:j]])] = 10.0
            rows.append(row)
    meta = SpecDecodeMetadata.make_dummy([list(d) for d in drafts], device())
    meta.target_logits_indices = torch.tensor(target_idx, dtype=torch.int32)
    meta.bonus_logits_indices = torch.tensor(bonus_idx, dtype=torch.int32)
    logits = torch.from_numpy(np.stack(rows))
    out = RejectionSampler(VllmSampler())(meta, None, logits, sampling_metadata([0.0] * len(drafts)))
    return RejectionSampler.parse_output(out.sampled_token_ids, VOCAB)[0]


def _python_verify(targets, ctxs, drafts) -> list[list[int]]:
    return [greedy_verify(t, c, d) for t, c, d in zip(targets, ctxs, drafts)]


def run_real_spec_trace(
    config: SpecTraceConfig, trace: list[Arrival], *, real_proposer: bool = False, real_sampler: bool = False,
    max_steps: int = 2000,
) -> list[SpecStepRecord]:
    """The real ``Scheduler`` with speculation, one ``SpecStepRecord`` per step (see ``spec_traces``)."""
    from ..spec_decode import NgramProposer as MiniNgramProposer

    sc = config.sched
    vllm_config = real_vllm.make_vllm_config(sc)
    if config.num_speculative_tokens:
        vllm_config.speculative_config = SpeculativeConfig(
            target_model_config=vllm_config.model_config,
            target_parallel_config=vllm_config.parallel_config,
            method="ngram",
            num_speculative_tokens=config.num_speculative_tokens,
            prompt_lookup_min=config.prompt_lookup_min,
            prompt_lookup_max=config.prompt_lookup_max,
        )
    sched = real_vllm.rv.make_scheduler(vllm_config, log_stats=True)
    hasher = real_vllm.rv.make_block_hasher(vllm_config)
    if not config.num_speculative_tokens:
        proposer = None
    elif real_proposer:
        proposer = VllmNgramProposer(vllm_config)
    else:
        proposer = MiniNgramProposer(
            config.num_speculative_tokens, config.prompt_lookup_min, config.prompt_lookup_max, sc.max_model_len
        )
    verify = real_verify if real_sampler else _python_verify
    kv = sched.kv_cache_manager
    arrivals = sorted(trace, key=lambda a: a.step)
    targets, requests = {}, {}
    records: list[SpecStepRecord] = []
    step = 0
    while arrivals or sched.has_unfinished_requests():
        while arrivals and arrivals[0].step <= step:
            a = arrivals.pop(0)
            params = VllmSamplingParams(max_tokens=a.max_tokens, ignore_eos=a.eos_at is None)
            if a.eos_at is not None:
                params.update_from_generation_config({}, eos_token_id=FAKE_EOS)
            r = VllmRequest(request_id=a.request_id, prompt_token_ids=list(a.prompt_token_ids),
                            sampling_params=params, pooling_params=None, block_hasher=hasher)
            sched.add_request(r)
            requests[a.request_id] = r
            targets[a.request_id] = periodic_target(len(a.prompt_token_ids), a.eos_at)
        out: VllmSchedulerOutput = sched.schedule()
        req_ids = list(out.num_scheduled_tokens)
        spec = {rid: list(d) for rid, d in out.scheduled_spec_decode_tokens.items()}
        due = [rid for rid in req_ids if not requests[rid].is_prefill_chunk]
        emitted = dict(zip(due, verify(
            [targets[rid] for rid in due], [list(requests[rid].all_token_ids) for rid in due],
            [spec.get(rid, []) for rid in due],
        )))
        before = {rid: requests[rid].num_output_tokens for rid in req_ids}
        runner_output = ModelRunnerOutput(
            req_ids=req_ids, req_id_to_index={rid: i for i, rid in enumerate(req_ids)},
            sampled_token_ids=[emitted.get(rid, []) for rid in req_ids],
        )
        engine_outputs = sched.update_from_output(out, runner_output)
        finished, stats = [], None
        for eco in engine_outputs.values():
            for o in eco.outputs:
                if o.finish_reason is not None:
                    finished.append((o.request_id, str(o.finish_reason)))
            if eco.scheduler_stats is not None:
                stats = eco.scheduler_stats.spec_decoding_stats
        alive = [rid for rid in due if not requests[rid].is_finished()]
        if alive and proposer is not None:
            counts = np.array([requests[rid].num_tokens for rid in alive], dtype=np.int32)
            rows = np.zeros((len(alive), sc.max_model_len), dtype=np.int32)
            for i, rid in enumerate(alive):
                rows[i, : counts[i]] = list(requests[rid].all_token_ids)
            drafts = proposer.propose([[1]] * len(alive), counts, rows)
            sched.update_draft_token_ids(DraftTokenIds(alive, [list(d) for d in drafts]))
        records.append(SpecStepRecord(
            num_scheduled_tokens=dict(out.num_scheduled_tokens),
            spec_tokens=spec,
            generated={rid: list(requests[rid].output_token_ids[n:]) for rid, n in before.items()},
            num_emitted={rid: len(e) for rid, e in emitted.items()},
            num_computed_tokens={rid: r.num_computed_tokens for rid, r in requests.items() if not r.is_finished()},
            finished=finished,
            preempted=set(out.preempted_req_ids or ()),
            block_ids={r.request_id: list(kv.get_block_ids(r.request_id)[0]) for r in sched.running},
            num_free_blocks=kv.block_pool.get_num_free_blocks(),
            spec_stats=None if stats is None else (
                stats.num_drafts, stats.num_draft_tokens, stats.num_accepted_tokens,
                tuple(stats.num_accepted_tokens_per_pos),
            ),
        ))
        step += 1
        if step > max_steps:
            raise RuntimeError("spec trace did not finish on the real scheduler")
    return records
