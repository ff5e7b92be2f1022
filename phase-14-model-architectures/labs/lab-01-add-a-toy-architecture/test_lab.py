"""Lab 14-01 spec: a new architecture behind mini_vllm's model contract, registered, served unchanged."""

import numpy as np
import pytest

from course.runtime import lab_module
from mini_vllm.engine import LLMEngine
from mini_vllm.model import ToyModel
from mini_vllm.models.registry import ModelRegistry, _ModelRegistry
from mini_vllm.sampling_params import SamplingParams

lab = lab_module(__file__)  # solution.py by default; LAB_IMPL=starter grades starter.py

CONFIG = {"architectures": ["BigramForCausalLM"], "vocab_size": 257, "hidden_size": 16, "seed": 7}
PROMPTS = [
    "The engine",
    "Paged attention reads blocks",
    "a",
    "Chunked prefill splits a long prompt into steps",
]
GREEDY = SamplingParams(max_tokens=10, temperature=0.0)


def _registry():
    """A private copy of mini_vllm's registry, so the global one is left as it was."""
    reg = _ModelRegistry(ModelRegistry.models)
    lab.register(reg)
    return reg


def _engine(model, **kwargs):
    engine = LLMEngine(num_gpu_blocks=128, **kwargs)
    lab.install_model(engine, model)
    return engine


def _ids(outputs):
    return [o.outputs[0].token_ids for o in outputs]


def _greedy_chain(model, last, n):
    out = []
    for _ in range(n):
        logits = model.compute_logits(model.forward(np.array([last]), np.array([0]), [], None))
        last = int(np.argmax(logits[0]))
        out.append(last)
    return out


# --------------------------------------------------------------------------- the registry
def test_registry_resolves_and_inspects_the_new_architecture():
    reg = _registry()
    assert "BigramForCausalLM" in reg.get_supported_archs()
    cls, arch = reg.resolve_model_cls(["NotRegisteredForCausalLM", "BigramForCausalLM"])
    assert arch == "BigramForCausalLM" and cls.__name__ == "BigramForCausalLM"
    info = reg.inspect_model_cls("BigramForCausalLM")
    assert info.is_text_generation_model and info.is_attention_free, (
        f"a bigram keeps no KV cache: inherit IsAttentionFree, and keep the whole contract; got {info}"
    )
    model = lab.build_model(CONFIG, reg)
    assert type(model) is cls and model.get_kv_cache_spec().num_layers == 0
    with pytest.raises(ValueError, match="not supported"):
        lab.build_model({"architectures": ["NotRegisteredForCausalLM"]}, reg)


# --------------------------------------------------------------------------- the spec's five tests
def test_new_architecture_serves_through_the_unchanged_engine():
    model = lab.build_model(CONFIG, _registry())
    params = [
        GREEDY,
        SamplingParams(max_tokens=3, temperature=0.0),
        GREEDY,
        SamplingParams(max_tokens=1, temperature=0.0),
    ]
    outs = _engine(model, max_num_seqs=2).generate(
        PROMPTS, params
    )  # 4 prompts, 2 at a time: batching and queueing
    for prompt, sp, out in zip(PROMPTS, params, outs):
        want = _greedy_chain(model, out.prompt_token_ids[-1], sp.max_tokens)
        got = out.outputs[0].token_ids
        assert got == want and out.outputs[0].finish_reason == "length", (
            f"{prompt!r}: greedy under a bigram is the argmax chain from the prompt's last token, {want}; the engine "
            f"produced {got}. Each scheduled request's logits row must come from its own last token"
        )


def test_it_really_is_a_different_model():
    model = lab.build_model(CONFIG, _registry())
    toy = ToyModel(vocab_size=257, seed=0)
    tokens, positions = np.arange(0, 257, 16), np.arange(17) * 3
    ours = model.compute_logits(model.forward(tokens, positions, [], None))
    assert ours.shape == (17, 257)
    assert not np.allclose(ours, toy.forward(tokens, positions)), (
        "these are ToyModel's logits: write the bigram"
    )
    assert np.array_equal(ours, model.compute_logits(model.forward(tokens, positions * 0 + 5, [], None))), (
        "a bigram ignores positions: the same tokens at other positions must give the same logits"
    )
    default = _ids(LLMEngine(num_gpu_blocks=128).generate(PROMPTS, GREEDY))
    assert _ids(_engine(model).generate(PROMPTS, GREEDY)) != default, "the engine still serves the toy model"


def test_determinism_across_engine_instances():
    reg = _registry()
    sampled = SamplingParams(max_tokens=8, temperature=1.0)
    a = _ids(_engine(lab.build_model(CONFIG, reg), seed=3).generate(PROMPTS, sampled))
    b = _ids(_engine(lab.build_model(dict(CONFIG), reg), seed=3).generate(PROMPTS, sampled))
    assert a == b, (
        "two engines, two models from the same config and seed, the same sampling seed: the same tokens"
    )
    c = _ids(_engine(lab.build_model(dict(CONFIG, seed=8), reg), seed=3).generate(PROMPTS, sampled))
    assert c != a, "the model's seed draws its weights: another seed is another model"


def test_engine_invariants_hold_for_the_new_model():
    model = lab.build_model(CONFIG, _registry())
    whole = _ids(_engine(model).generate(PROMPTS, GREEDY))
    chunked = _ids(
        _engine(model, long_prefill_token_threshold=4, max_num_batched_tokens=8).generate(PROMPTS, GREEDY)
    )
    assert chunked == whole, (
        "chunked prefill (4 tokens per chunk, 8 per step) changed the output: only the last chunk of a prompt may "
        "produce a token, and its logits row must be that request's"
    )


class _Tripwire:
    """Every attribute but the serving contract (forward, compute_logits) raises."""

    ALLOWED = ("forward", "compute_logits")

    def __init__(self, model):
        object.__setattr__(self, "_model", model)

    def __getattr__(self, name):
        if name in _Tripwire.ALLOWED:
            return getattr(object.__getattribute__(self, "_model"), name)
        raise AssertionError(
            f"the engine touched model.{name}: serving may use only forward and compute_logits"
        )


def test_engine_touches_only_the_contract():
    model = lab.build_model(CONFIG, _registry())
    want = _ids(_engine(model).generate(PROMPTS, GREEDY))
    got = _ids(_engine(_Tripwire(model)).generate(PROMPTS, GREEDY))
    assert got == want


# --------------------------------------------------------------------------- loud failures
def test_wrong_batch_size_fails_loudly():
    class Short:
        def forward(self, input_ids, positions, kv_caches, attn_metadata):
            return np.zeros((max(len(input_ids) - 1, 0), 4))

        def compute_logits(self, hidden):
            return np.zeros((hidden.shape[0], 257))

    engine = _engine(Short())
    with pytest.raises(ValueError, match="one row per request"):
        engine.generate(["ab", "cd"], GREEDY)


def test_load_weights_by_name_and_shape():
    model = lab.build_model(CONFIG, _registry())
    rng = np.random.default_rng(0)
    e, w = rng.standard_normal((257, 16)), rng.standard_normal((257, 16))
    assert model.load_weights([("embed_tokens.weight", e), ("lm_head.weight", w)]) == {
        "embed_tokens.weight",
        "lm_head.weight",
    }
    tokens = np.array([3, 200])
    assert np.allclose(model.compute_logits(model.forward(tokens, tokens, [], None)), e[tokens] @ w.T)
    with pytest.raises(ValueError, match="model.layers.0"):
        model.load_weights([("model.layers.0.mlp.up_proj.weight", e)])
    with pytest.raises(ValueError, match="shape"):
        model.load_weights([("lm_head.weight", w[:, :8])])
