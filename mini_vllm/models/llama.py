"""A numpy ``LlamaForCausalLM`` on the paged KV cache.

Mirrors ``vllm/model_executor/models/llama.py``: ``LlamaMLP`` (fused ``gate_up_proj``, SiLU and
multiply, ``down_proj``), ``LlamaAttention`` (fused ``qkv_proj``, RoPE on q and k, the cache write
and paged attention of ``mini_vllm/attention.py``, ``o_proj``), ``LlamaDecoderLayer`` (pre-norm,
two residual adds), ``LlamaModel`` and ``LlamaForCausalLM`` (``compute_logits``, a tied or untied
``lm_head``), with the parameter names vLLM gives them. ``load_weights`` maps Hugging Face
checkpoint names onto the fused parameters with upstream's ``stacked_params_mapping``
(vllm/model_executor/models/llama.py:436 — LlamaModel.load_weights): ``q_proj``/``k_proj``/``v_proj`` are row blocks q, k, v of
``qkv_proj``; ``gate_proj``/``up_proj`` are rows 0 and 1 of ``gate_up_proj``. RMSNorm is
vllm/model_executor/layers/layernorm.py:38 — RMSNorm; RoPE is the "neox" half rotation of
vllm/model_executor/layers/rotary_embedding/common.py:18 — rotate_neox, with
``inv_freq = 1 / rope_theta ** (2i / head_dim)`` computed in float32 as Hugging Face does.

``config`` is the dict parsed from ``config.json`` (``ModelConfig.hf_config``); a transformers
``PretrainedConfig`` is accepted too (its ``to_dict()``). Everything is float32.
Left out: RoPE scaling (llama3, yarn, ...), attention and MLP biases, tensor and pipeline
parallelism, quantized weights, LoRA, embeddings padded for TP, EAGLE auxiliary hidden states.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..attention import AttentionMetadata, KVCacheSpec, paged_attention, reshape_and_cache

# (fused parameter, checkpoint shard, shard id): upstream's LlamaModel.load_weights table.
STACKED_PARAMS_MAPPING = [
    (".qkv_proj", ".q_proj", "q"),
    (".qkv_proj", ".k_proj", "k"),
    (".qkv_proj", ".v_proj", "v"),
    (".gate_up_proj", ".gate_proj", 0),
    (".gate_up_proj", ".up_proj", 1),
]


def as_config_dict(config: Any) -> dict[str, Any]:
    """The config as a plain dict: a dict as is, a ``PretrainedConfig`` through ``to_dict()``."""
    if isinstance(config, dict):
        return config
    if hasattr(config, "to_dict"):
        return config.to_dict()
    raise TypeError(f"config must be the dict of a config.json, got {type(config).__name__}")


def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    """``x / sqrt(mean(x**2) + eps) * weight`` over the last axis."""
    variance = np.mean(x * x, axis=-1, keepdims=True)
    return (x / np.sqrt(variance + np.float32(eps))) * weight


def silu(x: np.ndarray) -> np.ndarray:
    return x / (np.float32(1.0) + np.exp(-x))


def rope_inv_freq(head_dim: int, rope_theta: float) -> np.ndarray:
    """float32 ``1 / theta ** (2i / head_dim)``, i = 0 .. head_dim/2 - 1 (Hugging Face's default rope)."""
    exponent = np.arange(0, head_dim, 2, dtype=np.int64).astype(np.float32) / np.float32(head_dim)
    return (np.float32(1.0) / (np.float32(rope_theta) ** exponent)).astype(np.float32)


def rotate_half(x: np.ndarray) -> np.ndarray:
    """Neox style: the first and second halves of each head are the two coordinates of a pair."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return np.concatenate([-x2, x1], axis=-1)


def apply_rope(x: np.ndarray, positions: np.ndarray, inv_freq: np.ndarray) -> np.ndarray:
    """Rotate ``x`` ``[T, heads, head_dim]`` by each token's position."""
    freqs = positions.astype(np.float32)[:, None] * inv_freq[None, :]  # [T, head_dim/2]
    emb = np.concatenate([freqs, freqs], axis=-1)
    cos, sin = np.cos(emb)[:, None, :], np.sin(emb)[:, None, :]
    return (x * cos + rotate_half(x) * sin).astype(np.float32)


class LlamaForCausalLM:
    """Llama (and every architecture of its shape) in numpy; parameters in ``self.params``."""

    def __init__(self, config: Any) -> None:
        cfg = as_config_dict(config)
        self.config = cfg
        for key in ("attention_bias", "mlp_bias"):
            if cfg.get(key):
                raise ValueError(f"{key}=True is not supported by mini_vllm's Llama")
        if cfg.get("hidden_act", "silu") != "silu":
            raise ValueError(f"hidden_act {cfg.get('hidden_act')!r} is not supported (Llama uses 'silu')")
        rope = cfg.get("rope_scaling") or cfg.get("rope_parameters") or {}
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        if rope_type != "default":
            raise ValueError(
                f"rope_type {rope_type!r} is not supported; mini_vllm implements the default RoPE only"
            )
        self.vocab_size = int(cfg["vocab_size"])
        self.hidden_size = int(cfg["hidden_size"])
        self.intermediate_size = int(cfg["intermediate_size"])
        self.num_layers = int(cfg["num_hidden_layers"])
        self.num_heads = int(cfg["num_attention_heads"])
        self.num_kv_heads = int(cfg.get("num_key_value_heads") or self.num_heads)
        self.head_dim = int(cfg.get("head_dim") or self.hidden_size // self.num_heads)
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_attention_heads {self.num_heads} is not a multiple of num_key_value_heads {self.num_kv_heads}"
            )
        self.eps = float(cfg.get("rms_norm_eps", 1e-6))
        self.tie_word_embeddings = bool(cfg.get("tie_word_embeddings", False))
        rope_theta = rope.get("rope_theta", cfg.get("rope_theta", 10000.0))
        self.inv_freq = rope_inv_freq(self.head_dim, float(rope_theta))
        self.scale = self.head_dim**-0.5
        self.q_size = self.num_heads * self.head_dim
        self.kv_size = self.num_kv_heads * self.head_dim

        h = self.hidden_size
        shapes = {"model.embed_tokens.weight": (self.vocab_size, h), "model.norm.weight": (h,)}
        for n in range(self.num_layers):
            p = f"model.layers.{n}"
            shapes[f"{p}.input_layernorm.weight"] = (h,)
            shapes[f"{p}.self_attn.qkv_proj.weight"] = (self.q_size + 2 * self.kv_size, h)
            shapes[f"{p}.self_attn.o_proj.weight"] = (h, self.q_size)
            shapes[f"{p}.post_attention_layernorm.weight"] = (h,)
            shapes |= self._mlp_shapes(p)
        if not self.tie_word_embeddings:
            shapes["lm_head.weight"] = (self.vocab_size, h)
        self.params = {name: np.zeros(shape, dtype=np.float32) for name, shape in shapes.items()}
        self._loaded_shards: dict[str, set] = {}

    def _mlp_shapes(self, layer_prefix: str) -> dict[str, tuple[int, ...]]:
        """The feed-forward parameters of one layer (``MixtralForCausalLM`` replaces them with experts)."""
        h, i = self.hidden_size, self.intermediate_size
        return {
            f"{layer_prefix}.mlp.gate_up_proj.weight": (2 * i, h),
            f"{layer_prefix}.mlp.down_proj.weight": (h, i),
        }

    # ------------------------------------------------------------------ weights
    def named_parameters(self):
        return iter(self.params.items())

    def _shard_rows(self, param_name: str, shard_id) -> slice:
        """The rows of a fused parameter that one checkpoint tensor fills."""
        if param_name.endswith("qkv_proj.weight"):
            start = {"q": 0, "k": self.q_size, "v": self.q_size + self.kv_size}[shard_id]
            return slice(start, start + (self.q_size if shard_id == "q" else self.kv_size))
        return slice(shard_id * self.intermediate_size, (shard_id + 1) * self.intermediate_size)

    def _stacked(self, param_name: str) -> list[tuple]:
        """The rows of ``STACKED_PARAMS_MAPPING`` that fill ``param_name`` ([] for a plain parameter)."""
        return [row for row in STACKED_PARAMS_MAPPING if param_name.endswith(row[0] + ".weight")]

    def load_weights(self, weights) -> set[str]:
        """Copy ``(hf_name, array)`` pairs into the parameters; return the names now fully loaded.

        A fused parameter counts as loaded once all its shards arrived. An unknown name or a
        wrong shape raises ``ValueError`` naming the checkpoint tensor.
        """
        loaded: set[str] = set()
        for hf_name, tensor in weights:
            if "rotary_emb.inv_freq" in hf_name:  # recomputed from rope_theta, as upstream skips it
                continue
            if self.tie_word_embeddings and hf_name.startswith("lm_head."):
                continue  # tied: the head is embed_tokens (upstream's skip_prefixes)
            array = np.asarray(tensor, dtype=np.float32)
            for fused, shard, shard_id in STACKED_PARAMS_MAPPING:
                if shard not in hf_name:
                    continue
                name = hf_name.replace(shard, fused)
                if name not in self.params:
                    raise ValueError(f"checkpoint tensor {hf_name!r} has no parameter {name!r} in this model")
                rows = self._shard_rows(name, shard_id)
                target = self.params[name][rows]
                if array.shape != target.shape:
                    raise ValueError(
                        f"checkpoint tensor {hf_name!r} has shape {array.shape}, expected {target.shape}"
                    )
                self.params[name][rows] = array
                self._loaded_shards.setdefault(name, set()).add(shard_id)
                if self._loaded_shards[name] == {sid for _, _, sid in self._stacked(name)}:
                    loaded.add(name)
                break
            else:
                if hf_name not in self.params:
                    raise ValueError(f"checkpoint tensor {hf_name!r} is not a parameter of this model")
                if array.shape != self.params[hf_name].shape:
                    raise ValueError(
                        f"checkpoint tensor {hf_name!r} has shape {array.shape}, expected {self.params[hf_name].shape}"
                    )
                self.params[hf_name][...] = array
                loaded.add(hf_name)
        return loaded

    def missing_checkpoint_tensors(self, loaded: set[str]) -> list[str]:
        """The checkpoint names that would fill the parameters not in ``loaded``."""
        missing = []
        for name in self.params:
            if name in loaded:
                continue
            stacked = self._stacked(name)
            if not stacked:
                missing.append(name)
            got = self._loaded_shards.get(name, set())
            missing += [name.replace(fused, shard) for fused, shard, sid in stacked if sid not in got]
        return missing

    # ------------------------------------------------------------------ forward
    def get_kv_cache_spec(self) -> KVCacheSpec:
        return KVCacheSpec(
            num_layers=self.num_layers,
            num_kv_heads=self.num_kv_heads,
            head_size=self.head_dim,
            dtype=np.float32,
        )

    def _attention(self, n: int, x, positions, kv_cache, md: AttentionMetadata) -> np.ndarray:
        p = self.params
        qkv = x @ p[f"model.layers.{n}.self_attn.qkv_proj.weight"].T
        q, k, v = np.split(qkv, [self.q_size, self.q_size + self.kv_size], axis=-1)
        t = x.shape[0]
        q = apply_rope(q.reshape(t, self.num_heads, self.head_dim), positions, self.inv_freq)
        k = apply_rope(k.reshape(t, self.num_kv_heads, self.head_dim), positions, self.inv_freq)
        reshape_and_cache(k, v.reshape(t, self.num_kv_heads, self.head_dim), kv_cache, md.slot_mapping)
        out = paged_attention(q, kv_cache, md, self.scale)
        return out.reshape(t, self.q_size) @ p[f"model.layers.{n}.self_attn.o_proj.weight"].T

    def _mlp(self, n: int, x) -> np.ndarray:
        gate_up = x @ self.params[f"model.layers.{n}.mlp.gate_up_proj.weight"].T
        gate, up = gate_up[:, : self.intermediate_size], gate_up[:, self.intermediate_size :]
        return (silu(gate) * up) @ self.params[f"model.layers.{n}.mlp.down_proj.weight"].T

    def forward(self, input_ids, positions, kv_caches, attn_metadata: AttentionMetadata) -> np.ndarray:
        """Hidden states ``[T, hidden_size]`` float32 after the final norm."""
        ids, pos = np.asarray(input_ids), np.asarray(positions)
        if ids.ndim != 1 or pos.shape != ids.shape:
            raise ValueError(
                f"input_ids and positions must be 1-D and the same length, got {ids.shape} and {pos.shape}"
            )
        if ids.size and (ids.min() < 0 or ids.max() >= self.vocab_size):
            raise ValueError(f"token ids must lie in [0, {self.vocab_size}), got {ids.min()}..{ids.max()}")
        if len(kv_caches) != self.num_layers:
            raise ValueError(
                f"expected {self.num_layers} KV cache tensors (one per layer), got {len(kv_caches)}"
            )
        p = self.params
        h = p["model.embed_tokens.weight"][ids]
        for n in range(self.num_layers):
            x = rms_norm(h, p[f"model.layers.{n}.input_layernorm.weight"], self.eps)
            h = h + self._attention(n, x, pos, kv_caches[n], attn_metadata)
            x = rms_norm(h, p[f"model.layers.{n}.post_attention_layernorm.weight"], self.eps)
            h = h + self._mlp(n, x)
        return rms_norm(h, p["model.norm.weight"], self.eps).astype(np.float32)

    def compute_logits(self, hidden_states: np.ndarray) -> np.ndarray:
        head = self.params["model.embed_tokens.weight" if self.tie_word_embeddings else "lm_head.weight"]
        return (np.asarray(hidden_states, dtype=np.float32) @ head.T).astype(np.float32)


# What the registry serves for ``"LlamaModel"`` checkpoints: the same layers, pooled (``adapters.py``).
from .adapters import as_embedding_model  # noqa: E402 - adapters imports nothing of llama's

LlamaForEmbedding = as_embedding_model(LlamaForCausalLM)
