"""Differential tests: mini_vllm.lora against vLLM 0.22.1's LoRA pieces, on CPU.

* ``apply_batched`` equals ``PunicaWrapperCPU.add_lora_linear`` on the same token → slot mapping,
  when an empty slot is all zeros (a slot that has never held an adapter, as the buffers are
  allocated; a slot freed later keeps its old weights upstream).
* The index −1 defect of the CPU torch ops at the pin, pinned as today's behaviour: with every
  slot occupied, base tokens (slot index −1) receive the *last* slot's delta, because
  ``bgmv_shrink``/``bgmv_expand`` gather ``weights[lora_indices]`` and −1 wraps around. The
  Triton kernels skip −1 rows. Upstream PRs vllm#48421 / #49656 propose the masked fix; when the
  pin moves past a fix, ``test_cpu_ops_give_base_rows_the_last_slot`` must be flipped.
* ``admit_waiting`` makes the same admission decisions as the real ``Scheduler`` built with a
  ``LoRAConfig`` when adapters outnumber ``max_loras``, and so does mini's own ``Scheduler``
  (which calls the same rule in its waiting loop): step by step, the same requests with the same
  token counts in the same order, under token-budget pressure and with chunked prefill.
"""

import random

import numpy as np
import pytest

from mini_vllm.lora import BASE, LoRAAdapter, LoRASlotManager, admit_waiting, apply_batched

# Neither the torch ops behind PunicaWrapperCPU nor the Scheduler use Triton kernels or
# torch.compile, so no CUDA_VISIBLE_DEVICES / TORCHDYNAMO_DISABLE is set here: setting them in a
# test module would change the whole pytest session (and hide the GPU on a GPU box).

pytestmark = pytest.mark.upstream

D_IN, D_OUT, RANK = 16, 24, 4
TOL = dict(rtol=1e-5, atol=1e-5)  # add_lora_linear's shrink buffer is float32 whatever the inputs


@pytest.fixture(scope="module")
def punica():
    """(PunicaWrapperCPU, LoRAMapping, torch) with async_tensor_h2d's pin_memory default off.

    Its default is bound to True at import; torch's CPU build refuses pinned memory.
    """
    import torch
    import vllm.utils.torch_utils as tu
    from vllm.lora.layers.utils import LoRAMapping
    from vllm.lora.punica_wrapper.punica_cpu import PunicaWrapperCPU

    saved = tu.async_tensor_h2d.__defaults__
    tu.async_tensor_h2d.__defaults__ = (False,)
    yield PunicaWrapperCPU, LoRAMapping, torch
    tu.async_tensor_h2d.__defaults__ = saved


def run_punica(punica, manager, ids, x, is_prefill):
    """vLLM's add_lora_linear on the manager's slots; an empty slot is all zeros, as a never-used slot is."""
    PunicaWrapperCPU, LoRAMapping, torch = punica
    n = manager.max_loras
    A = torch.zeros(n, 1, RANK, D_IN, dtype=torch.float64)
    B = torch.zeros(n, 1, D_OUT, RANK, dtype=torch.float64)
    for s, adapter in enumerate(manager.slots):
        if adapter is not None:
            A[s, 0] = torch.from_numpy(adapter.A * adapter.scaling)  # one scale per layer upstream: fold ours into A
            B[s, 0] = torch.from_numpy(adapter.B)
    mapping = tuple(0 if i is None else i for i in ids)  # 0 = base in the per-token mapping
    pw = PunicaWrapperCPU(max_num_batched_tokens=64, max_batches=8, device="cpu")
    pw.update_metadata(
        LoRAMapping(index_mapping=mapping, prompt_mapping=mapping, is_prefill=is_prefill),
        lora_index_to_id=list(manager.lora_index_to_id), max_loras=n, vocab_size=512,
    )
    y = torch.zeros(len(ids), D_OUT, dtype=torch.float64)
    pw.add_lora_linear(y, torch.from_numpy(x), (A,), (B,), scale=1.0, output_slices=(D_OUT,))
    return pw.token_lora_indices[: len(ids)].tolist(), y.numpy()


def manager_with(lora_ids, max_loras):
    m = LoRASlotManager(max_loras)
    for lora_id in lora_ids:
        m.activate_adapter(lora_id, LoRAAdapter.random(D_IN, D_OUT, RANK, seed=lora_id, alpha=8))
    return m


IDS = [None, 11, 22, 11, None, 22, 22, None]


@pytest.mark.parametrize("is_prefill", [False, True], ids=["decode", "prefill"])
def test_apply_batched_equals_punica_cpu_with_an_empty_zeroed_slot(punica, is_prefill):
    m = manager_with([11, 22], max_loras=3)  # slot 2 stays empty
    x = np.random.default_rng(0).standard_normal((len(IDS), D_IN))
    idx = m.token_lora_indices(IDS)
    vllm_idx, y = run_punica(punica, m, IDS, x, is_prefill)
    assert vllm_idx == idx.tolist(), "same token → slot mapping as convert_mapping (−1 for base)"
    np.testing.assert_allclose(apply_batched(x, idx, m.slots, out=np.zeros_like(y)), y, **TOL)


@pytest.mark.parametrize("is_prefill", [False, True], ids=["decode", "prefill"])
def test_cpu_ops_give_base_rows_the_last_slot(punica, is_prefill):
    """TODAY'S UPSTREAM BEHAVIOUR AT THE PIN (a defect, not a spec): index −1 wraps to the last slot."""
    m = manager_with([11, 22, 33], max_loras=3)  # every slot occupied
    x = np.random.default_rng(1).standard_normal((len(IDS), D_IN))
    idx = m.token_lora_indices(IDS)
    _, y = run_punica(punica, m, IDS, x, is_prefill)
    ours = apply_batched(x, idx, m.slots, out=np.zeros_like(y))
    lora_rows = idx != BASE
    np.testing.assert_allclose(y[lora_rows], ours[lora_rows], **TOL)
    assert not ours[~lora_rows].any(), "mini_vllm leaves base rows untouched"
    last = apply_batched(x[~lora_rows], np.full((~lora_rows).sum(), 2), m.slots)
    np.testing.assert_allclose(y[~lora_rows], last, **TOL,
                               err_msg="at the pin, base rows get slot 2's delta (weights[-1]); "
                                       "if this fails, upstream fixed #48421/#49656: flip this test")


@pytest.fixture(scope="module")
def lora_scheduler_factory():
    from vllm.config import LoRAConfig
    from vllm.lora.request import LoRARequest as VllmLoRARequest
    from vllm.sampling_params import SamplingParams

    import mini_vllm.testing.real_vllm as R
    from mini_vllm.testing.traces import SchedConfig

    def build(max_loras, budget=1024, max_num_seqs=16):
        config = SchedConfig(num_gpu_blocks=256, max_num_batched_tokens=budget, max_num_seqs=max_num_seqs)
        vllm_config = R.make_vllm_config(config)
        vllm_config.lora_config = LoRAConfig(max_loras=max_loras, max_lora_rank=8)
        real = R.RealScheduler.__new__(R.RealScheduler)
        original = R.make_vllm_config
        R.make_vllm_config = lambda _c: vllm_config
        try:
            real.__init__(config)
        finally:
            R.make_vllm_config = original
        assert real.scheduler.lora_config is not None

        def add(rid, lora_id, max_tokens):
            lora = None if lora_id is None else VllmLoRARequest(f"a{lora_id}", lora_id, "/adapters/a")
            real.scheduler.add_request(R.VllmRequest(
                request_id=rid, prompt_token_ids=[5, 6, 7, 8],
                sampling_params=SamplingParams(max_tokens=max_tokens, ignore_eos=True),
                pooling_params=None, block_hasher=real.block_hasher, lora_request=lora))
        return real, add

    return build


def lora_of(request):
    return None if request.lora_request is None else request.lora_request.lora_int_id


@pytest.mark.parametrize("max_loras", [1, 2, 3])
def test_real_scheduler_admits_what_admit_waiting_admits(lora_scheduler_factory, max_loras):
    rng = random.Random(max_loras)
    real, add = lora_scheduler_factory(max_loras)
    sched = real.scheduler
    arrivals = [(rng.randrange(6), f"r{i}", rng.choice([None, 1, 2, 3, 4, 5]), rng.randint(1, 4)) for i in range(18)]
    skips = 0
    for step in range(60):
        for t, rid, lora_id, n in arrivals:
            if t == step:
                add(rid, lora_id, n)
        running = {lora_of(r) for r in sched.running} - {None}
        queue = list(sched.skipped_waiting) + list(sched.waiting)  # FCFS walk order
        want = {queue[i].request_id for i in admit_waiting(running, [lora_of(r) for r in queue], max_loras)}
        skips += len(queue) - len(want)
        before = {r.request_id for r in sched.running}
        record = real.step()
        got = set(record.num_scheduled_tokens) - before
        assert got == want, f"step {step}, max_loras={max_loras}: vLLM admitted {sorted(got)}, rule says {sorted(want)}"
        if step > 6 and not sched.has_unfinished_requests():
            break
    else:
        pytest.fail("trace not finished after 60 steps")
    assert skips > 0, "the trace must make adapters outnumber slots at least once"


def test_real_scheduler_on_the_guide_queue(lora_scheduler_factory):
    """The guide's example: adapters [1, base, 2, 3, 1, base, 3, 4], max_loras=2 → two steps."""
    real, add = lora_scheduler_factory(2)
    for i, lora_id in enumerate([1, None, 2, 3, 1, None, 3, 4]):
        add(f"r{i}", lora_id, 1)
    first = set(real.step().num_scheduled_tokens)
    second = set(real.step().num_scheduled_tokens)
    assert first == {"r0", "r1", "r2", "r4", "r5"}, f"step 1 admitted {sorted(first)}"
    assert second == {"r3", "r6", "r7"}, f"step 2 admitted {sorted(second)}"
    assert admit_waiting(set(), [1, None, 2, 3, 1, None, 3, 4], 2) == [0, 1, 2, 4, 5]


@pytest.mark.parametrize("max_loras, budget", [(1, 1024), (2, 1024), (3, 1024), (2, 12)],
                         ids=["1-slot", "2-slots", "3-slots", "2-slots-budget-12"])
def test_mini_scheduler_makes_the_real_schedulers_lora_decisions(lora_scheduler_factory, max_loras, budget):
    import dataclasses

    from mini_vllm.config import LoRAConfig
    from mini_vllm.lora import LoRARequest
    from mini_vllm.request import Request
    from mini_vllm.sampling_params import SamplingParams
    from mini_vllm.scheduler import Scheduler
    from mini_vllm.testing.traces import SchedConfig

    rng = random.Random(100 + max_loras + budget)
    seats = min(16, budget)  # vLLM requires max_num_batched_tokens >= max_num_seqs
    real, _ = lora_scheduler_factory(max_loras, budget, seats)
    config = SchedConfig(num_gpu_blocks=256, max_num_batched_tokens=budget, max_num_seqs=seats)
    mini = Scheduler(dataclasses.replace(config.to_vllm_config(), lora_config=LoRAConfig(max_loras=max_loras)))
    from vllm.lora.request import LoRARequest as VllmLoRARequest
    from vllm.sampling_params import SamplingParams as VllmSamplingParams

    import mini_vllm.testing.real_vllm as R

    arrivals = [(rng.randrange(8), f"r{i}", rng.choice([None, 1, 2, 3, 4, 5]), rng.randint(1, 4),
                 [rng.randrange(3, 250) for _ in range(rng.randint(2, 9))]) for i in range(24)]
    skipped_somewhere = full_budget = False
    for step in range(200):
        for t, rid, lora_id, n, prompt in arrivals:
            if t == step:
                lora = None if lora_id is None else VllmLoRARequest(f"a{lora_id}", lora_id, "/adapters/a")
                real.scheduler.add_request(R.VllmRequest(
                    request_id=rid, prompt_token_ids=list(prompt),
                    sampling_params=VllmSamplingParams(max_tokens=n, ignore_eos=True),
                    pooling_params=None, block_hasher=real.block_hasher, lora_request=lora))
                mini.add_request(Request(rid, list(prompt), SamplingParams(max_tokens=n, ignore_eos=True),
                                         block_hasher=mini.kv_cache_manager.block_hasher,
                                         lora_request=None if lora_id is None else LoRARequest(f"a{lora_id}", lora_id)))
        skipped_somewhere |= bool(real.scheduler.skipped_waiting)
        want = list(real.step().num_scheduled_tokens.items())
        full_budget |= sum(n for _, n in want) == budget
        out = mini.schedule()
        got = list(out.num_scheduled_tokens.items())
        assert got == want, f"step {step}, max_loras={max_loras}, budget {budget}: vLLM scheduled {want}, mini {got}"
        mini.update_from_output(out, {r.request_id: 40 for r in out.scheduled_requests
                                      if Scheduler.needs_sample(r, out.num_scheduled_tokens[r.request_id])})
        if step > 8 and not real.scheduler.has_unfinished_requests():
            assert not mini.has_unfinished_requests(), "vLLM finished every request, mini did not"
            break
    else:
        pytest.fail("trace not finished after 200 steps")
    assert skipped_somewhere, "the trace must make adapters outnumber slots at least once (a skipped request)"
    assert full_budget == (budget == 12), "the small budget must be exhausted in some step (and 1024 never)"


# -- prefix caching under LoRA: the adapter is part of every block's hash -------------------------


@pytest.fixture(scope="module")
def real_traces():
    import mini_vllm.testing.real_vllm as R

    return R


def test_one_prompt_under_two_adapters_shares_no_block(real_traces):
    """The same 20-token prompt under adapter 1, then adapter 2 (block size 16): vLLM computes the
    second request's 20 tokens from scratch; KV made under adapter 1 is not adapter 2's KV."""
    from mini_vllm.testing.traces import Arrival, SchedConfig, assert_same_records, run_mini_trace

    prompt = tuple(range(40, 60))
    config = SchedConfig(num_gpu_blocks=33, max_loras=2)
    trace = [Arrival(0, "a", prompt, 3, lora_id=1), Arrival(4, "b", prompt, 3, lora_id=2),
             Arrival(8, "c", prompt, 3, lora_id=1), Arrival(12, "d", prompt, 3)]
    want = real_traces.run_trace(config, trace)
    got = run_mini_trace(config, trace)
    first = {rid: (i, n) for i, s in enumerate(got) for rid, n in s.num_scheduled_tokens.items() if rid not in
             {r for t in got[:i] for r in t.num_scheduled_tokens}}
    assert first["b"] == (4, 20), f"adapter 2 reused adapter 1's block: b was first scheduled {first['b'][1]} tokens"
    assert first["c"] == (8, 4), f"c (adapter 1 again) must hit a's 16-token block, got {first['c'][1]} new tokens"
    assert first["d"] == (12, 20), f"the base model reused an adapter's block: d got {first['d'][1]} new tokens"
    assert_same_records(want, got)


def lora_trace(seed: int):
    """Multi-block prompts drawn from three shared bases under adapters 1-3 and the base model,
    some salted, in a pool small enough to preempt; ``max_loras`` 1-3."""
    from mini_vllm.testing.traces import Abort, Arrival, SchedConfig

    rng = random.Random(7000 + seed)
    block_size = rng.choice([2, 4, 8, 16])
    max_model_len = 8 * block_size
    max_num_seqs = rng.randint(2, 6)
    config = SchedConfig(
        num_gpu_blocks=rng.randint(9, 20),
        block_size=block_size,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=rng.randint(max_num_seqs + 4, 6 * block_size),
        long_prefill_token_threshold=rng.choice([0, 0, block_size + 1]),
        max_model_len=max_model_len,
        max_loras=rng.randint(1, 3),
    )
    bases = [tuple(rng.randrange(3, 250) for _ in range(max_model_len)) for _ in range(3)]
    trace: list = []
    n = rng.randint(6, 12)
    for i in range(n):
        plen = rng.randint(2 * block_size, 5 * block_size) + rng.randrange(block_size)
        prompt = rng.choice(bases)[:plen]
        trace.append(Arrival(rng.randint(0, 8), f"l{i}", prompt, rng.randint(1, max_model_len - plen - 1),
                             lora_id=rng.choice([None, 1, 2, 3]), cache_salt=rng.choice([None, None, None, "t1"])))
    for _ in range(rng.randint(0, 2)):
        trace.append(Abort(rng.randint(2, 14), (f"l{rng.randrange(n)}",)))
    return config, trace


@pytest.mark.parametrize("seed", range(12))
def test_lora_prefix_cache_traces_match_the_real_scheduler(real_traces, seed):
    """Random LoRA traces with prefix caching on, multi-block prompts shared across adapters, salts,
    preemption and aborts: the same step records as the real ``Scheduler`` with a ``LoRAConfig``.
    Seeds 4 and 10 preempt while a request skipped for ``max_loras`` waits: they diverged when
    mini put skipped requests back at the front of its one queue (upstream: ``skipped_waiting``)."""
    from mini_vllm.testing.traces import assert_same_records, run_mini_trace

    config, trace = lora_trace(seed)
    want = real_traces.run_trace(config, trace)
    assert_same_records(want, run_mini_trace(config, trace))
    if seed in (4, 10):
        assert any(s.preempted for s in want), "the trace must preempt"
