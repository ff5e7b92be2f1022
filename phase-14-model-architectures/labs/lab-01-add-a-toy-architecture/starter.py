"""Lab 14-01 starter — add an architecture: write it, register it, serve it.

``BigramForCausalLM`` is the smallest model that is really a model: an embedding ``E`` (vocab x
hidden) and an output head ``W`` (vocab x hidden), so the next-token logits are ``E[token] @ W.T``
and depend on the last token only. Positions are accepted and ignored. It keeps mini_vllm's model
contract (``mini_vllm/models/interfaces.py``)::

    __init__(config)                                              config: the dict of a config.json
    forward(input_ids, positions, kv_caches, attn_metadata) -> hidden [T, hidden_size]
    compute_logits(hidden_states) -> logits [T, vocab]
    load_weights(weights) -> set of parameter names loaded
    get_kv_cache_spec() -> KVCacheSpec                            no attention: 0 layers

``register`` puts it in a ``ModelRegistry`` under ``"BigramForCausalLM"``; ``build_model`` resolves
a config's ``architectures`` through the registry and builds the class, as vLLM's loader does.
``install_model`` serves any contract model through a live ``LLMEngine``: the engine's model
runner gets a ``ContractModel`` that calls only ``forward`` and ``compute_logits`` and checks their
shapes. The engine's code does not change.
Grade with: LAB_IMPL=starter .venv/bin/python -m pytest phase-14-model-architectures/labs/lab-01-add-a-toy-architecture -q
"""

from __future__ import annotations

from typing import Any

import numpy as np

from mini_vllm.models.interfaces import IsAttentionFree, KVCacheSpec

ARCH = "BigramForCausalLM"


class BigramForCausalLM(IsAttentionFree):
    """Config keys: ``vocab_size`` (default 257), ``hidden_size`` (default 16), ``seed`` (default 0).
    Weights are drawn from ``numpy.random.default_rng(seed)`` (``E`` first, then ``W``, standard
    normal, float64) until ``load_weights`` replaces them."""

    def __init__(self, config: dict[str, Any]) -> None:
        raise NotImplementedError(
            "BigramForCausalLM.__init__: read vocab_size (257), hidden_size (16) and seed (0) from "
            "the config; draw embed_tokens.weight then lm_head.weight, each (vocab, hidden), from "
            "np.random.default_rng(seed)"
        )

    def forward(self, input_ids, positions, kv_caches=None, attn_metadata=None) -> np.ndarray:
        raise NotImplementedError(
            "forward: check 1-D ids and positions of one length and ids in range; return the embedding rows"
        )

    def compute_logits(self, hidden_states: np.ndarray) -> np.ndarray:
        raise NotImplementedError("compute_logits: check [N, hidden]; hidden @ lm_head.T")

    def load_weights(self, weights) -> set[str]:
        raise NotImplementedError(
            "load_weights: copy each (name, tensor) into its parameter; ValueError for an unknown "
            "name or a wrong shape; return the names loaded"
        )

    def get_kv_cache_spec(self) -> KVCacheSpec:
        raise NotImplementedError("get_kv_cache_spec: no attention layers, so KVCacheSpec with 0 layers")


def register(registry) -> None:
    raise NotImplementedError("register: registry.register_model(ARCH, BigramForCausalLM)")


def build_model(config: dict[str, Any], registry):
    """The model ``config["architectures"]`` names, resolved through ``registry`` and built from
    ``config`` (``ValueError`` from the registry for an architecture nobody registered)."""
    raise NotImplementedError(
        "build_model: registry.resolve_model_cls(config['architectures']) gives (class, arch); build "
        "the class from the config"
    )


class ContractModel:
    """Wraps one contract model for the engine's runner. The runner calls ``forward`` on every
    scheduled token, flattened, then ``compute_logits`` on the rows it samples from (one per
    request); this wrapper passes both through and refuses a ``forward`` that does not return one
    row per token or logits that are not one row of ``vocab_size`` per row asked for."""

    def __init__(self, model, vocab_size: int) -> None:
        self._model, self.vocab_size = model, vocab_size

    def forward(self, input_ids, positions, kv_caches, attn_metadata):
        raise NotImplementedError(
            "ContractModel.forward: call the wrapped model's forward; refuse (ValueError) anything "
            "but a 2-D array with one row per scheduled token"
        )

    def compute_logits(self, hidden_states):
        raise NotImplementedError(
            "ContractModel.compute_logits: call the wrapped model's compute_logits; refuse "
            "(ValueError) any shape but one row of vocab_size per row of hidden_states"
        )

    def get_kv_cache_spec(self) -> KVCacheSpec:
        return KVCacheSpec(num_layers=0, num_kv_heads=0, head_size=0, dtype=np.float32)


def install_model(engine, model) -> None:
    raise NotImplementedError(
        "install_model: the engine's runner is engine.model_executor.driver_worker.model_runner; "
        "give it a ContractModel over the model (vocabulary: engine.model_executor.vocab_size)"
    )

def main() -> None:
    from mini_vllm.engine import LLMEngine
    from mini_vllm.models import ModelRegistry
    from mini_vllm.sampling_params import SamplingParams

    register(ModelRegistry)
    config = {"architectures": ["BigramForCausalLM"], "vocab_size": 257, "hidden_size": 16, "seed": 7}
    model = build_model(config, ModelRegistry)
    info = ModelRegistry.inspect_model_cls(config["architectures"])
    print(
        f"resolved {type(model).__name__}: text generation {info.is_text_generation_model}, "
        f"attention-free {info.is_attention_free}, KV layers {model.get_kv_cache_spec().num_layers}"
    )
    greedy = SamplingParams(max_tokens=12, temperature=0.0)
    prompts = ["The engine", "Paged attention"]
    toy = LLMEngine(num_gpu_blocks=64).generate(prompts, greedy)
    engine = LLMEngine(num_gpu_blocks=64)
    install_model(engine, model)
    outs = engine.generate(prompts, greedy)
    for p, a, b in zip(prompts, toy, outs):
        print(f"  {p!r:18} toy:    {a.outputs[0].token_ids}")
        print(f"  {'':18} bigram: {b.outputs[0].token_ids}")
    tok, chain = outs[1].outputs[0].token_ids[0], []
    for _ in range(6):  # greedy under a bigram: the next token is the argmax of the last token's row
        chain.append(tok)
        tok = int(np.argmax(model.compute_logits(model.forward(np.array([tok]), np.array([0])))[0]))
    print(f"the bigram's greedy chain from {chain[0]}, computed without the engine: {chain}")


if __name__ == "__main__":
    main()
