"""Differential test: speculative decoding through mini's and vLLM 0.22.1's Scheduler, step by step.

The real side is the real ``Scheduler`` built with an n-gram ``SpeculativeConfig``, verified by
the real ``RejectionSampler`` (its greedy path, Triton kernels under the interpreter) and
drafted by mini's ``NgramProposer``, which test_spec_decode.py proves equal to the real one
(the slow test here drives the real one too: numba compiles it on the first call, seconds).
Each step both sides must agree on the scheduled tokens (drafts included, in order), the
scheduled drafts, the tokens each request kept, ``num_computed_tokens`` after the rollback,
finished ids and reasons, preemptions, block tables, free blocks and the spec-decode stats.
"""

import importlib

import pytest

from mini_vllm.testing.spec_traces import (
    PERIODIC_TRACE,
    SpecTraceConfig,
    run_mini_spec_trace,
    spec_trace_family,
)
from mini_vllm.testing.traces import SchedConfig

pytestmark = pytest.mark.upstream


@pytest.fixture(scope="module")
def real():
    return importlib.import_module("mini_vllm.testing.real_spec_decode")


def assert_same(want, got):
    for i, (r, m) in enumerate(zip(want, got)):
        for field in ("num_scheduled_tokens", "spec_tokens", "generated", "num_computed_tokens", "finished",
                      "preempted", "block_ids", "num_free_blocks", "spec_stats"):
            a, b = getattr(r, field), getattr(m, field)
            if field == "num_scheduled_tokens":
                a, b = list(a.items()), list(b.items())  # order matters too
            assert a == b, f"step {i}: {field} differs — vLLM {a}, mini {b}"
    assert len(want) == len(got), f"vLLM took {len(want)} steps, mini {len(got)}"


def outputs(records):
    out: dict[str, list[int]] = {}
    for s in records:
        for rid, toks in s.generated.items():
            out.setdefault(rid, []).extend(toks)
    return out


PERIODIC = PERIODIC_TRACE  # 2 requests x 40 tokens of the periodic target
SCHED = SchedConfig(num_gpu_blocks=64, block_size=4, max_model_len=128)


def periodic_runs(real, real_proposer):
    base_cfg = SpecTraceConfig(SCHED, num_speculative_tokens=0)
    spec_cfg = SpecTraceConfig(SCHED, num_speculative_tokens=5, prompt_lookup_min=2, prompt_lookup_max=4)
    base = real.run_real_spec_trace(base_cfg, PERIODIC)
    spec = real.run_real_spec_trace(spec_cfg, PERIODIC, real_sampler=True, real_proposer=real_proposer)
    assert_same(base, run_mini_spec_trace(base_cfg, PERIODIC))
    assert_same(spec, run_mini_spec_trace(spec_cfg, PERIODIC))
    return base, spec


def test_periodic_target_halves_the_steps_like_vllm(real):
    base, spec = periodic_runs(real, real_proposer=False)
    assert (len(base), len(spec)) == (40, 20), "2 requests x 40 tokens: 40 steps without drafts, 20 with"
    assert outputs(spec) == outputs(base), "speculation must not change greedy output"
    drafted = sum(s.spec_stats[1] for s in spec if s.spec_stats)
    accepted = sum(s.spec_stats[2] for s in spec if s.spec_stats)
    assert (drafted, accepted) == (120, 48), "72 drafts rejected and rolled back, on both sides alike"


@pytest.mark.slow  # the real NgramProposer: numba compiles it on the first call (1-7 s)
@pytest.mark.filterwarnings("ignore::numba.core.errors.NumbaPendingDeprecationWarning")
def test_periodic_target_with_the_real_ngram_proposer(real):
    base, spec = periodic_runs(real, real_proposer=True)
    assert (len(base), len(spec)) == (40, 20) and outputs(spec) == outputs(base)


@pytest.mark.parametrize("seed", range(12))
def test_spec_trace_families(real, seed):
    config, trace = spec_trace_family(seed)
    assert_same(real.run_real_spec_trace(config, trace), run_mini_spec_trace(config, trace))
