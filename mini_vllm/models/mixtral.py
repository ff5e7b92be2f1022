"""A numpy ``MixtralForCausalLM``: Llama's attention with a sparse mixture of experts as its MLP.

Mirrors vllm/model_executor/models/mixtral.py:77 — MixtralMoE: a router (``gate``, a plain
``[num_experts, hidden]`` matrix) scores every expert for every token, and
vllm/model_executor/layers/fused_moe/router/fused_topk_router.py:69 — fused_topk picks the
``num_experts_per_tok`` best. Mixtral builds its ``FusedMoE`` with ``renormalize=True``
(vllm/model_executor/models/mixtral.py:138): softmax over all experts, keep the top k, divide
by their sum, as Hugging Face's ``MixtralTopKRouter`` does. Each chosen expert is a SiLU MLP;
the token's output is the weighted sum. The experts are stored fused, as ``FusedMoE`` stores
them: ``w13_weight [E, 2I, H]`` (rows ``0:I`` are the checkpoint's ``w1``, the gate; rows
``I:2I`` its ``w3``, the up projection; vllm/model_executor/layers/fused_moe/layer.py:717 —
FusedMoE._load_w13) and ``w2_weight [E, H, I]`` (the down projection). ``load_weights`` maps
``block_sparse_moe.experts.{e}.w{1,2,3}.weight`` onto them with the table
vllm/model_executor/layers/fused_moe/layer.py:1325 — FusedMoE.make_expert_params_mapping builds
(vllm/model_executor/models/mixtral.py:367 — MixtralModel.get_expert_mapping), and q/k/v onto
``qkv_proj`` as Llama does (vllm/model_executor/models/mixtral.py:379 — MixtralModel.load_weights).

Left out: expert and tensor parallelism, EPLB's redundant experts, the fused Triton kernel (a
loop over experts here), quantized experts, router jitter, sliding-window attention.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .llama import LlamaForCausalLM, as_config_dict, silu


def fused_topk(gating_output: np.ndarray, topk: int, renormalize: bool) -> tuple[np.ndarray, np.ndarray]:
    """``(topk_weights [T, k] float32, topk_ids [T, k] int64)`` from router logits ``[T, E]``.

    Softmax over every expert first, then the ``topk`` largest probabilities (largest first,
    ties to the lower expert id);
    with ``renormalize`` they are divided by their sum so each token's weights add up to 1.
    """
    logits = np.asarray(gating_output, dtype=np.float32)
    if logits.ndim != 2 or not 1 <= topk <= logits.shape[1]:
        raise ValueError(f"need logits [T, E] and 1 <= topk <= E, got {logits.shape} and topk={topk}")
    shifted = np.exp(logits - logits.max(axis=-1, keepdims=True))
    probs = shifted / shifted.sum(axis=-1, keepdims=True)
    ids = np.argsort(-probs, axis=-1, kind="stable")[:, :topk]
    weights = np.take_along_axis(probs, ids, axis=-1)
    if renormalize:
        weights = weights / weights.sum(axis=-1, keepdims=True)
    return weights.astype(np.float32), ids.astype(np.int64)


def fused_experts(
    hidden: np.ndarray, w13: np.ndarray, w2: np.ndarray, topk_weights: np.ndarray, topk_ids: np.ndarray
) -> np.ndarray:
    """Each token through its chosen experts, outputs summed with the routing weights."""
    inter = w2.shape[2]
    out = np.zeros_like(hidden, dtype=np.float32)
    for e in np.unique(topk_ids):
        tokens, slot = np.nonzero(topk_ids == e)  # every (token, k) pair routed to expert e
        gate_up = hidden[tokens] @ w13[e].T
        act = silu(gate_up[:, :inter]) * gate_up[:, inter:]
        out[tokens] += topk_weights[tokens, slot][:, None] * (act @ w2[e].T)
    return out


def make_expert_params_mapping(num_experts: int) -> list[tuple[str, str, int, str]]:
    """``(param_name, weight_name, expert_id, shard_id)`` rows: checkpoint ``w1``/``w3`` → ``w13_``, ``w2`` → ``w2_``."""
    return [
        ("experts.w13_" if shard in ("w1", "w3") else "experts.w2_", f"experts.{e}.{shard}.", e, shard)
        for e in range(num_experts)
        for shard in ("w1", "w2", "w3")
    ]


class MixtralForCausalLM(LlamaForCausalLM):
    """Mixtral in numpy: ``LlamaForCausalLM`` with ``block_sparse_moe`` in place of ``mlp``."""

    def __init__(self, config: Any) -> None:
        cfg = as_config_dict(config)
        self.num_experts = int(cfg["num_local_experts"])
        self.top_k = int(cfg["num_experts_per_tok"])
        if not 1 <= self.top_k <= self.num_experts:
            raise ValueError(
                f"num_experts_per_tok {self.top_k} must lie in [1, num_local_experts={self.num_experts}]"
            )
        if cfg.get("sliding_window") is not None:
            raise ValueError("sliding_window is not supported by mini_vllm's Mixtral (set it to null)")
        super().__init__(cfg)
        self.expert_params_mapping = make_expert_params_mapping(self.num_experts)

    def _mlp_shapes(self, layer_prefix: str) -> dict[str, tuple[int, ...]]:
        h, i, e = self.hidden_size, self.intermediate_size, self.num_experts
        p = f"{layer_prefix}.block_sparse_moe"
        return {
            f"{p}.gate.weight": (e, h),
            f"{p}.experts.w13_weight": (e, 2 * i, h),
            f"{p}.experts.w2_weight": (e, h, i),
        }

    def _mlp(self, n: int, x) -> np.ndarray:
        p = f"model.layers.{n}.block_sparse_moe"
        router_logits = x @ self.params[f"{p}.gate.weight"].T
        weights, ids = fused_topk(router_logits, self.top_k, renormalize=True)
        w13, w2 = self.params[f"{p}.experts.w13_weight"], self.params[f"{p}.experts.w2_weight"]
        return fused_experts(x, w13, w2, weights, ids)

    # ------------------------------------------------------------------ weights
    def _expert_slot(self, hf_name: str) -> tuple[str, int, str] | None:
        """``(fused parameter, expert, shard)`` a checkpoint expert tensor fills, or None."""
        for param_name, weight_name, expert_id, shard in self.expert_params_mapping:
            if weight_name in hf_name:
                return hf_name.replace(weight_name, param_name), expert_id, shard
        return None

    def load_weights(self, weights) -> set[str]:
        """Llama's mapping plus the experts: ``w1``/``w3`` into halves of ``w13``, ``w2`` into ``w2``."""
        loaded: set[str] = set()
        for hf_name, tensor in weights:
            slot = self._expert_slot(hf_name)
            if slot is None:
                loaded |= super().load_weights([(hf_name, tensor)])
                continue
            name, expert, shard = slot
            if name not in self.params:
                raise ValueError(f"checkpoint tensor {hf_name!r} has no parameter {name!r} in this model")
            i = self.intermediate_size
            rows = {"w1": slice(0, i), "w3": slice(i, 2 * i), "w2": slice(None)}[shard]
            target = self.params[name][expert, rows]
            array = np.asarray(tensor, dtype=np.float32)
            if array.shape != target.shape:
                raise ValueError(
                    f"checkpoint tensor {hf_name!r} has shape {array.shape}, expected {target.shape}"
                )
            self.params[name][expert, rows] = array
            got = self._loaded_shards.setdefault(name, set())
            got.add((expert, shard))
            if len(got) == self.num_experts * (2 if shard != "w2" else 1):
                loaded.add(name)
        return loaded

    def missing_checkpoint_tensors(self, loaded: set[str]) -> list[str]:
        missing = []
        for name in self.params:
            if name in loaded:
                continue
            if ".experts." not in name:
                missing += super().missing_checkpoint_tensors(loaded | (set(self.params) - {name}))
                continue
            got = self._loaded_shards.get(name, set())
            for param_name, weight_name, expert, shard in self.expert_params_mapping:
                if name.endswith(param_name + "weight") and (expert, shard) not in got:
                    missing.append(name.replace(param_name, weight_name))
        return missing
