"""Differential tests: the same logits through mini's sampler stages and vLLM 0.22.1's.

Upstream runs in float32 and mini in float64, so the comparisons are of *which tokens survive*
(exact) and of processed logits (to float32 precision). The logits are random normals drawn
from fixed seeds: no two are close enough for the precision gap to flip a cut.
"""

import os
from types import SimpleNamespace

import numpy as np
import pytest

from mini_vllm import Sampler, SamplingParams
from mini_vllm.sampler import (
    apply_bad_words,
    apply_logit_bias,
    apply_min_p,
    apply_min_tokens,
    apply_penalties,
    apply_top_k_top_p,
    token_counts,
)

pytestmark = pytest.mark.upstream

B, V = 6, 40


@pytest.fixture(scope="module")
def up():
    for key, value in (("CUDA_VISIBLE_DEVICES", ""), ("TRITON_INTERPRET", "1"), ("TORCHDYNAMO_DISABLE", "1")):
        os.environ.setdefault(key, value)
    import torch
    from vllm.sampling_params import SamplingParams as VSP
    from vllm.v1.sample.logits_processor.builtin import (
        LogitBiasLogitsProcessor,
        MinPLogitsProcessor,
        MinTokensLogitsProcessor,
    )
    from vllm.v1.sample.logits_processor.interface import BatchUpdate
    from vllm.v1.sample.ops import bad_words, penalties, topk_topp_sampler

    return SimpleNamespace(
        torch=torch,
        VSP=VSP,
        BatchUpdate=BatchUpdate,
        bad_words=bad_words,
        penalties=penalties,
        topk=topk_topp_sampler,
        MinP=MinPLogitsProcessor,
        Bias=LogitBiasLogitsProcessor,
        MinTokens=MinTokensLogitsProcessor,
    )


@pytest.fixture(autouse=True)
def no_pinned_memory(up, monkeypatch):
    """With the CUDA wheel on a CPU box, vLLM's platform is not the CPU one and
    ``is_pin_memory_available()`` says True; ``apply_all_penalties`` would then pin a tensor
    and raise. Scoped to this module's tests."""
    monkeypatch.setattr(up.penalties, "is_pin_memory_available", lambda: False)


def logits_for(seed, rows=B, vocab=V):
    return np.random.default_rng(seed).normal(0.0, 2.0, (rows, vocab)).astype(np.float32).astype(np.float64)


def builtin(up, cls, params, outputs=None):
    """One of upstream's built-in processors, fed a batch whose row i holds params[i]."""
    config = SimpleNamespace(scheduler_config=SimpleNamespace(max_num_seqs=len(params)))
    proc = cls(config, up.torch.device("cpu"), False)
    outputs = outputs or [[] for _ in params]
    added = [(i, sp, [], outputs[i]) for i, sp in enumerate(params)]
    proc.update_state(up.BatchUpdate(batch_size=len(params), removed=[], added=added, moved=[]))
    return proc


@pytest.mark.parametrize("seed", range(3))
def test_top_k_top_p_keep_the_same_tokens_as_apply_top_k_top_p_pytorch(up, seed):
    x = logits_for(seed)
    k = np.array([1, 3, V, 7, 20, V])
    p = np.array([1.0, 0.9, 0.5, 0.3, 0.95, 1.0])
    t = up.torch.tensor(x, dtype=up.torch.float32)
    theirs = up.topk.apply_top_k_top_p_pytorch(
        t.clone(), up.torch.tensor(k), up.torch.tensor(p, dtype=up.torch.float32)
    )
    ours = apply_top_k_top_p(x, k, p) > 0
    np.testing.assert_array_equal(ours, np.isfinite(theirs.numpy()))
    only = up.topk.apply_top_k_only(t.clone(), up.torch.tensor(k))
    np.testing.assert_array_equal(apply_top_k_top_p(x, k, np.ones(B)) > 0, np.isfinite(only.numpy()))


def test_top_k_ties_and_an_exact_top_p_boundary_match(up):
    x = np.log(np.array([[0.125, 0.5, 0.125, 0.25], [0.25, 0.25, 0.25, 0.25]]))
    x[1] = [3.0, 1.0, 1.0, 0.0]  # k=2 ties at the cut: three survive
    k, p = np.array([4, 2]), np.array([0.75, 1.0])
    t = up.torch.tensor(x, dtype=up.torch.float32)
    theirs = up.topk.apply_top_k_top_p_pytorch(
        t, up.torch.tensor(k), up.torch.tensor(p, dtype=up.torch.float32)
    )
    np.testing.assert_array_equal(apply_top_k_top_p(x, k, p) > 0, np.isfinite(theirs.numpy()))


def test_penalties_match_apply_all_penalties(up):
    x = logits_for(10)
    rng = np.random.default_rng(11)
    outputs = [rng.integers(0, V, int(rng.integers(0, 12))).tolist() for _ in range(B)]
    prompts = [rng.integers(0, V, int(rng.integers(1, 9))).tolist() for _ in range(B)]
    presence = np.array([0.0, 0.5, -1.0, 2.0, 0.0, 1.5])
    frequency = np.array([0.0, 0.3, 0.0, -0.7, 2.0, 1.0])
    repetition = np.array([1.0, 1.3, 0.8, 2.0, 1.0, 1.7])
    torch = up.torch
    width = max(map(len, prompts))
    prompt_t = torch.tensor([ids + [V] * (width - len(ids)) for ids in prompts])
    theirs = up.penalties.apply_all_penalties(
        torch.tensor(x, dtype=torch.float32),
        prompt_t,
        torch.tensor(presence, dtype=torch.float32),
        torch.tensor(frequency, dtype=torch.float32),
        torch.tensor(repetition, dtype=torch.float32),
        outputs,
    )
    ours = apply_penalties(
        x.copy(), token_counts(prompts, V) > 0, token_counts(outputs, V), presence, frequency, repetition
    )
    np.testing.assert_allclose(ours, theirs.numpy(), rtol=1e-6, atol=1e-5)


def test_bad_words_match_apply_bad_words(up):
    x = logits_for(20, rows=3)
    words = {0: [[5], [1, 2, 3]], 2: [[7, 8], [9, 7, 8, 4]]}
    past = [[9, 1, 2], [1, 2], [3, 9, 7, 8]]
    t = up.torch.tensor(x, dtype=up.torch.float32)
    up.bad_words.apply_bad_words(t, words, past)
    np.testing.assert_array_equal(np.isfinite(apply_bad_words(x.copy(), words, past)), np.isfinite(t.numpy()))


def test_min_p_logit_bias_and_min_tokens_match_the_builtin_processors(up):
    torch = up.torch
    x = logits_for(30)
    min_p = [0.0, 0.1, 0.5, 0.9, 0.02, 1.0]
    proc = builtin(up, up.MinP, [up.VSP(min_p=m) for m in min_p])
    theirs = proc.apply(torch.tensor(x, dtype=torch.float32))
    np.testing.assert_array_equal(
        np.isfinite(apply_min_p(x.copy(), np.array(min_p))), np.isfinite(theirs.numpy())
    )

    biases = [None, {3: 5.0, 9: -2.5}, None, {0: 100.0}, {39: -100.0, 1: 0.25}, None]
    proc = builtin(up, up.Bias, [up.VSP(logit_bias=b) for b in biases])
    theirs = proc.apply(torch.tensor(x, dtype=torch.float32))
    ours = apply_logit_bias(x.copy(), {i: tuple(b.items()) for i, b in enumerate(biases) if b})
    np.testing.assert_allclose(ours, theirs.numpy(), rtol=1e-6, atol=1e-5)

    outputs = [[], [1], [1, 2], [], [4, 4, 4], [0]]
    params = [
        up.VSP(min_tokens=m, stop_token_ids=s)
        for m, s in [(2, [3]), (2, [5, 6]), (2, [7]), (0, [8]), (4, [9]), (1, [10])]
    ]
    proc = builtin(up, up.MinTokens, params, outputs)
    theirs = proc.apply(torch.tensor(x, dtype=torch.float32))
    rows = [i for i, sp in enumerate(params) if len(outputs[i]) < sp.min_tokens]
    ours = apply_min_tokens(x.copy(), rows, [params[i].stop_token_ids for i in rows])
    np.testing.assert_array_equal(np.isfinite(ours), np.isfinite(theirs.numpy()))


def test_greedy_rows_see_the_same_processed_logits(up):
    """The whole pre-split chain, mini's Sampler against upstream's ops in upstream's order."""
    torch = up.torch
    x = logits_for(40, rows=3)
    outputs = [[2, 2, 5], [7], []]
    prompts = [[1, 2], [3], [4, 4]]
    mini = [
        SamplingParams(temperature=0, repetition_penalty=1.5, frequency_penalty=0.5, logit_bias={5: 3.0}),
        SamplingParams(
            temperature=0,
            presence_penalty=1.0,
            bad_words_token_ids=[[7, 9]],
            min_tokens=3,
            stop_token_ids=[0],
            max_tokens=8,
        ),
        SamplingParams(temperature=0, allowed_token_ids=range(0, 40, 3)),
    ]
    ours = Sampler().apply_logits_processors(x.copy(), mini, outputs, prompts)
    t = torch.tensor(x, dtype=torch.float32)
    banned = torch.zeros(3, V, dtype=torch.bool)  # upstream's allowed_token_ids_mask: True = banned
    banned[2] = True
    banned[2, list(range(0, 40, 3))] = False
    t.masked_fill_(banned, float("-inf"))
    up.bad_words.apply_bad_words(t, {1: [[7, 9]]}, outputs)
    t = builtin(
        up,
        up.MinTokens,
        [up.VSP(min_tokens=sp.min_tokens, stop_token_ids=list(sp.stop_token_ids)) for sp in mini],
        outputs,
    ).apply(t)
    t = builtin(up, up.Bias, [up.VSP(logit_bias=dict(sp.logit_bias or {})) for sp in mini]).apply(t)
    t = up.penalties.apply_all_penalties(
        t,
        torch.tensor([[1, 2], [3, V], [4, 4]]),
        torch.tensor([0.0, 1.0, 0.0]),
        torch.tensor([0.5, 0.0, 0.0]),
        torch.tensor([1.5, 1.0, 1.0]),
        outputs,
    )
    np.testing.assert_allclose(ours, t.numpy(), rtol=1e-6, atol=1e-5)
    assert Sampler().sample_batch(x, mini, [None] * 3, outputs, prompts) == t.argmax(dim=1).tolist()
