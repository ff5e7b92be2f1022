"""Lab 14-01 — add an architecture: write it, register it, serve it (reference solution).

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
        self.config = dict(config)
        self.vocab_size = int(config.get("vocab_size", 257))
        self.hidden_size = int(config.get("hidden_size", 16))
        rng = np.random.default_rng(int(config.get("seed", 0)))
        self.params = {
            "embed_tokens.weight": rng.standard_normal((self.vocab_size, self.hidden_size)),
            "lm_head.weight": rng.standard_normal((self.vocab_size, self.hidden_size)),
        }

    def forward(self, input_ids, positions, kv_caches=None, attn_metadata=None) -> np.ndarray:
        """``[T, hidden]``: the embedding row of each token (positions are unused)."""
        ids, pos = np.asarray(input_ids), np.asarray(positions)
        if ids.ndim != 1 or pos.shape != ids.shape:
            raise ValueError(
                f"input_ids and positions must be 1-D and the same length, got {ids.shape} and {pos.shape}"
            )
        if ids.size and (ids.min() < 0 or ids.max() >= self.vocab_size):
            raise ValueError(f"token ids must lie in [0, {self.vocab_size})")
        return self.params["embed_tokens.weight"][ids.astype(np.int64)]

    def compute_logits(self, hidden_states: np.ndarray) -> np.ndarray:
        hidden = np.asarray(hidden_states)
        if hidden.ndim != 2 or hidden.shape[1] != self.hidden_size:
            raise ValueError(f"hidden states must be [N, {self.hidden_size}], got {hidden.shape}")
        return hidden @ self.params["lm_head.weight"].T

    def load_weights(self, weights) -> set[str]:
        loaded = set()
        for name, tensor in weights:
            if name not in self.params:
                raise ValueError(
                    f"checkpoint tensor {name!r} has no parameter; the model has {sorted(self.params)}"
                )
            array = np.asarray(tensor, dtype=np.float64)
            if array.shape != self.params[name].shape:
                raise ValueError(
                    f"{name}: checkpoint shape {array.shape} != parameter shape {self.params[name].shape}"
                )
            self.params[name] = array.copy()
            loaded.add(name)
        return loaded

    def get_kv_cache_spec(self) -> KVCacheSpec:
        return KVCacheSpec(num_layers=0, num_kv_heads=0, head_size=0, dtype=np.float32)


def register(registry) -> None:
    """Register ``BigramForCausalLM`` under ``ARCH`` in ``registry`` (mini_vllm's ``ModelRegistry``)."""
    registry.register_model(ARCH, BigramForCausalLM)


def build_model(config: dict[str, Any], registry):
    """The model ``config["architectures"]`` names, resolved through ``registry`` and built from
    ``config`` (``ValueError`` from the registry for an architecture nobody registered)."""
    model_cls, _ = registry.resolve_model_cls(config["architectures"])
    return model_cls(config)


class ContractModel:
    """Wraps one contract model for the engine's runner. The runner calls ``forward`` on every
    scheduled token, flattened, then ``compute_logits`` on the rows it samples from (one per
    request); this wrapper passes both through and refuses a ``forward`` that does not return one
    row per token or logits that are not one row of ``vocab_size`` per row asked for."""

    def __init__(self, model, vocab_size: int) -> None:
        self._model, self.vocab_size = model, vocab_size

    def forward(self, input_ids, positions, kv_caches, attn_metadata):
        hidden = np.asarray(self._model.forward(input_ids, positions, kv_caches, attn_metadata))
        if hidden.ndim != 2 or hidden.shape[0] != len(input_ids):
            raise ValueError(
                f"forward returned hidden states of shape {hidden.shape} for {len(input_ids)} scheduled "
                f"tokens; the engine needs one row per token (then one row per request, in order)"
            )
        return hidden

    def compute_logits(self, hidden_states):
        logits = np.asarray(self._model.compute_logits(hidden_states))
        if logits.shape != (len(hidden_states), self.vocab_size):
            raise ValueError(
                f"the model returned logits of shape {logits.shape} for {len(hidden_states)} rows; "
                f"the engine needs ({len(hidden_states)}, {self.vocab_size}): one row per request, in order"
            )
        return logits

    def get_kv_cache_spec(self) -> KVCacheSpec:
        return KVCacheSpec(num_layers=0, num_kv_heads=0, head_size=0, dtype=np.float32)


def install_model(engine, model) -> None:
    """Serve ``model`` from now on: the engine's model runner (``GPUModelRunner``, owned by the
    executor's one worker) gets a ``ContractModel`` over ``model`` with the engine's vocabulary in
    place of the toy. Call it before any request; the engine's code does not change."""
    runner = engine.model_executor.driver_worker.model_runner
    runner.model = ContractModel(model, engine.model_executor.vocab_size)

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
