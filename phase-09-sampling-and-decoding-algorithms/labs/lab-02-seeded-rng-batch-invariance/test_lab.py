"""Lab 09-02: per-request generators, batch invariance, and vLLM 0.22.1's CPU seed bug (#51226)."""

import os

import numpy as np
import pytest

from course.runtime import lab_module
from mini_vllm import Sampler, SamplingParams

lab = lab_module(__file__)  # solution.py by default; LAB_IMPL=starter grades starter.py

V = 32
ROW = np.random.default_rng(0).normal(size=(1, V))  # the seeded request's logits, every step
OTHERS = np.random.default_rng(1).normal(size=(5, V))


def stream(sampler, params, companions=0, steps=10, rid="mine"):
    """The tokens of request ``rid`` over ``steps`` steps, batched behind ``companions`` unseeded rows."""
    others = [(f"other{j}", SamplingParams(temperature=1.3)) for j in range(companions)]
    batch = np.vstack([OTHERS[:companions], ROW])
    return [sampler.step(batch, [*others, (rid, params)])[-1] for _ in range(steps)]


def test_same_seed_reproduces_across_instances():
    a = stream(lab.SeededSampler(engine_seed=0), SamplingParams(seed=7))
    b = stream(lab.SeededSampler(engine_seed=99), SamplingParams(seed=7))
    assert a == b, "two engines (different engine seeds) must give a seed-7 request the same tokens"


def test_seed_zero_is_a_seed():
    alone = stream(lab.SeededSampler(engine_seed=0), SamplingParams(seed=0))
    batched = stream(lab.SeededSampler(engine_seed=5), SamplingParams(seed=0), companions=2)
    assert batched == alone, (
        "seed=0 drew different tokens with another engine seed and companions: only seed=None means "
        "unseeded (test `params.seed is None`, not `not params.seed`)"
    )


def test_different_seeds_diverge():
    a = stream(lab.SeededSampler(), SamplingParams(seed=7))
    b = stream(lab.SeededSampler(), SamplingParams(seed=8))
    assert a != b, "seeds 7 and 8 gave the same 10 tokens: is the seed used to build the generator?"


@pytest.mark.parametrize("companions", [1, 2, 5])
def test_batch_invariance(companions):
    alone = stream(lab.SeededSampler(), SamplingParams(seed=7, top_k=10, top_p=0.9))
    batched = stream(lab.SeededSampler(), SamplingParams(seed=7, top_k=10, top_p=0.9), companions)
    assert batched == alone, (
        f"behind {companions} unseeded rows the seeded request drew {batched}, alone {alone}: "
        "a seeded row must draw from its own generator, never the engine's"
    )


def test_shared_rng_breaks_batch_invariance():
    alone = stream(lab.SharedRNGSampler(), SamplingParams(seed=7))
    batched = stream(lab.SharedRNGSampler(), SamplingParams(seed=7), 2)
    assert alone != batched, "the shared-generator design should depend on the batch: that is the bug"


def test_greedy_ignores_seed_and_rng_state():
    s = lab.SeededSampler()
    state = s.engine_rng.bit_generator.state
    a = stream(s, SamplingParams(temperature=0, seed=1), 3)
    b = stream(lab.SeededSampler(engine_seed=5), SamplingParams(temperature=0, seed=2))
    assert a == b == [int(np.argmax(ROW))] * 10, "a greedy row is the argmax whatever its seed"
    g = s.generator_for("mine", SamplingParams(temperature=0, seed=1))
    assert g.bit_generator.state == np.random.default_rng(1).bit_generator.state, (
        "greedy rows must not advance their generator"
    )
    assert s.engine_rng.bit_generator.state != state, (
        "the unseeded companions do draw from the engine's generator"
    )


def test_request_stream_is_stateful_not_reset():
    s = lab.SeededSampler()
    toks = stream(s, SamplingParams(seed=7), steps=10)
    assert len(set(toks)) > 1, f"a seeded request drew {toks}: is its generator re-created every step?"
    g = np.random.default_rng(7)
    want = [Sampler().sample_batch(ROW, [SamplingParams(seed=7)], [g])[0] for _ in range(10)]
    assert toks == want, f"drew {toks}; one np.random.default_rng(seed), made once and kept, gives {want}"
    assert s.generator_for("mine", SamplingParams(seed=7)) is s.generator_for(
        "mine", SamplingParams(seed=7)
    ), "the same request must get the same generator object every step"


def test_two_requests_with_one_seed_get_their_own_streams():
    s = lab.SeededSampler()
    sp = SamplingParams(seed=7)
    pair = [s.step(np.vstack([ROW, ROW]), [("a", sp), ("b", sp)]) for _ in range(10)]
    alone = stream(lab.SeededSampler(), sp)
    assert [p[0] for p in pair] == [p[1] for p in pair] == alone, (
        "two requests sharing a seed each own a generator (keyed by request id, not by seed)"
    )


def test_finish_forgets_the_generator():
    s = lab.SeededSampler()
    first = stream(s, SamplingParams(seed=7), steps=3)
    s.finish("mine")
    assert stream(s, SamplingParams(seed=7), steps=3) == first, "a new request with the old id starts fresh"


# The real vLLM 0.22.1 sampler on CPU --------------------------------------------------------


@pytest.fixture(scope="module")
def ops():
    for key, value in (("CUDA_VISIBLE_DEVICES", ""), ("VLLM_LOGGING_LEVEL", "WARNING")):
        os.environ.setdefault(key, value)
    from vllm.v1.sample.ops import topk_topp_sampler

    with pytest.MonkeyPatch.context() as mp:  # run the compiled fast path eagerly: no 35 s compile
        fn = topk_topp_sampler.compiled_random_sample
        mp.setattr(topk_topp_sampler, "compiled_random_sample", getattr(fn, "_torchdynamo_orig_callable", fn))
        yield topk_topp_sampler


@pytest.mark.upstream
def test_vllm_forward_cpu_loses_the_seed_in_a_mixed_batch(ops):
    shipped = ops.TopKTopPSampler.forward_cpu
    alone = lab.seeded_draws(shipped)
    assert alone == lab.seeded_draws(ops.TopKTopPSampler.forward_native), "alone, both paths honour the seed"
    assert lab.seeded_draws(shipped, companions=1) != alone, "the defect at the pin: one unseeded companion"


@pytest.mark.upstream
def test_seeded_draws_keeps_one_generator_across_steps(ops):
    import torch

    # the reference: one torch.Generator seeded 7, made once and advanced by every step
    sampler = ops.TopKTopPSampler("raw_logprobs")
    gen = torch.Generator().manual_seed(7)
    want = [
        int(ops.TopKTopPSampler.forward_native(sampler, torch.zeros(1, 16), {0: gen}, None, None)[0][0])
        for _ in range(8)
    ]
    got = lab.seeded_draws(ops.TopKTopPSampler.forward_native)
    assert got == want, (
        f"seeded_draws drew {got} for seed 7 over 8 steps; one torch.Generator().manual_seed(7), made "
        f"before the loop and kept across steps, draws {want} (a generator re-made every step redraws its first token)"
    )


@pytest.mark.upstream
@pytest.mark.parametrize("companions", [1, 3])
def test_fixed_forward_cpu_is_batch_invariant(ops, companions):
    alone = lab.seeded_draws(ops.TopKTopPSampler.forward_native)
    got = lab.seeded_draws(lab.fixed_forward_cpu, companions=companions)
    assert got == alone, (
        f"with {companions} unseeded companions your forward_cpu drew {got}, alone {alone}: take the compiled "
        "shortcut only when no row has a generator, and give each seeded row its own noise"
    )


@pytest.mark.upstream
def test_fixed_forward_cpu_keeps_the_fast_path_and_the_top_k(ops):
    import torch

    sampler = ops.TopKTopPSampler("raw_logprobs")
    logits = torch.tensor([[2.0, 1.5, 1.0, 0.5]] * 3)  # ids 2 and 3: 35% of the mass
    torch.manual_seed(0)
    want = ops.compiled_random_sample(logits.clone())
    torch.manual_seed(0)
    got, _ = lab.fixed_forward_cpu(sampler, logits.clone(), {}, None, None)
    assert got.tolist() == want.tolist(), "with no generators the compiled draw must run as before"
    tokens = set()
    for s in range(30):
        out, _ = lab.fixed_forward_cpu(
            sampler, logits.clone(), {1: torch.Generator().manual_seed(s)}, torch.tensor([2, 2, 2]), None
        )
        tokens |= set(out.tolist())
    assert tokens <= {0, 1}, "top-k=2 must still be applied before the draw"


@pytest.mark.upstream
@pytest.mark.parametrize("mode", ["raw_logprobs", "raw_logits", "processed_logits", "processed_logprobs"])
def test_fixed_forward_cpu_returns_what_forward_cpu_returns_for_logprobs(ops, mode):
    import torch

    # the second output is what the engine turns into logprobs: the fix changes the draw, never that
    sampler = ops.TopKTopPSampler(mode)
    logits = torch.tensor([[2.0, 1.5, 1.0, 0.5], [0.1, 0.9, 0.3, 0.2], [1.0, 1.0, 2.0, 0.0]])
    k = torch.tensor([2, 3, 4])  # top-k changes the processed logits: -inf outside each row's k best
    gen = {0: torch.Generator().manual_seed(1)}
    _, want = ops.TopKTopPSampler.forward_cpu(sampler, logits.clone(), gen, k, None)
    _, got = lab.fixed_forward_cpu(sampler, logits.clone(), {0: torch.Generator().manual_seed(1)}, k, None)
    if want is None:
        assert got is None, f"logprobs_mode={mode!r}: forward_cpu returns None for the logprobs, got {got}"
    else:
        assert got is not None and torch.equal(got, want), (
            f"logprobs_mode={mode!r}: your second output is {got}, forward_cpu's is {want}; keep both "
            f"processed_* branches (the top-k/top-p-filtered logits, or their log_softmax)"
        )


def test_unseeded_requests_with_one_prompt_draw_different_tokens():
    s = lab.SeededSampler(engine_seed=3)
    unseeded = SamplingParams()
    pairs = [s.step(np.vstack([ROW, ROW]), [("a", unseeded), ("b", unseeded)]) for _ in range(10)]
    a, b = [p[0] for p in pairs], [p[1] for p in pairs]
    assert a != b, (
        f"two unseeded requests with the same logits drew the same 10 tokens {a}: an unseeded row "
        "draws from the engine's one advancing generator, not a fresh stream of its own from a fixed seed"
    )
