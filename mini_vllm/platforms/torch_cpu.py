"""``TorchCpuPlatform``: the same models, their forward and paged attention on torch CPU tensors.

The second backend behind the seam, as upstream's CPU backend is a second backend behind
vllm/platforms/interface.py:252 — Platform.get_attn_backend_cls. ``load_model`` wraps a numpy
``LlamaForCausalLM`` in ``TorchLlamaForCausalLM``: the parameters become torch tensors sharing the
numpy memory (``torch.from_numpy``, no copy), each layer runs in torch float32, and attention goes
through ``TorchSDPABackend``: the cache write by slot, then per request a gather of its blocks and
``torch.nn.functional.scaled_dot_product_attention`` with a bottom-right causal mask. The KV cache
stays the numpy tensors the runner allocated (torch views them), so the block pool, connectors and
tests read the same bytes. Greedy tokens equal the numpy platform's (``test_platforms.py``).

An attention-free model (the toy: a lookup table) runs unchanged; any other class (Mixtral's
experts, pooling adapters) is refused by name. torch is imported when the platform is built: a
machine without torch gets a ``RuntimeError`` saying so, never a half-working platform.
Left out: bf16/fp16 (float32 only, like the numpy models), threads and NUMA binding, oneDNN GEMMs,
upstream's C++ ``cpu_attention_with_kv_cache`` kernel.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .interface import Platform, PlatformEnum


def _torch():
    try:
        import torch
    except ImportError as exc:
        raise RuntimeError(
            f"the torch platform needs torch, which does not import here ({exc}); "
            "install torch or use MINI_VLLM_PLATFORM=numpy"
        ) from None
    return torch


class TorchSDPABackend:
    """Paged attention on torch tensors; the KV cache may be numpy (viewed) or torch."""

    name = "TORCH_SDPA"

    @staticmethod
    def _as_tensor(x: Any):
        torch = _torch()
        return torch.from_numpy(x) if isinstance(x, np.ndarray) else x

    @staticmethod
    def reshape_and_cache(key, value, kv_cache, slot_mapping) -> None:
        cache = TorchSDPABackend._as_tensor(kv_cache)
        _, num_blocks, block_size, _, _ = cache.shape
        slots = TorchSDPABackend._as_tensor(np.asarray(slot_mapping, dtype=np.int64))
        if slots.numel() and (int(slots.min()) < -1 or int(slots.max()) >= num_blocks * block_size):
            raise ValueError(f"a slot lies outside the cache's {num_blocks * block_size} slots (-1 = skip)")
        keep = (slots >= 0).nonzero().flatten()
        s = slots[keep]
        cache[0, s // block_size, s % block_size] = key[keep]
        cache[1, s // block_size, s % block_size] = value[keep]

    @staticmethod
    def forward(query, kv_cache, md, scale: float):
        torch = _torch()
        cache = TorchSDPABackend._as_tensor(kv_cache)
        _, _, block_size, num_kv_heads, head_size = cache.shape
        num_heads = query.shape[1]
        group = num_heads // num_kv_heads
        out = torch.zeros_like(query)
        for r in range(int(md.seq_lens.shape[0])):
            start, end = int(md.query_start_loc[r]), int(md.query_start_loc[r + 1])
            seq_len, q_len = int(md.seq_lens[r]), end - start
            if q_len == 0:
                continue
            blocks = torch.from_numpy(
                np.asarray(md.block_table[r, : -(-seq_len // block_size)], dtype=np.int64)
            )
            k = cache[0, blocks].reshape(-1, num_kv_heads, head_size)[:seq_len]
            v = cache[1, blocks].reshape(-1, num_kv_heads, head_size)[:seq_len]
            k = k.repeat_interleave(group, dim=1).transpose(0, 1)  # [Hq, S, D]
            v = v.repeat_interleave(group, dim=1).transpose(0, 1)
            q = query[start:end].transpose(0, 1)  # [Hq, q_len, D]
            q_pos = torch.arange(seq_len - q_len, seq_len)
            mask = torch.arange(seq_len)[None, :] <= q_pos[:, None]  # bottom-right causal
            o = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
            out[start:end] = o.transpose(0, 1)
        return out


class TorchLlamaForCausalLM:
    """A numpy ``LlamaForCausalLM``'s forward, in torch: same parameters, same numbers to rounding."""

    def __init__(self, model: Any, attn_backend: Any) -> None:
        torch = _torch()
        self.model, self.attn = model, attn_backend
        self.params = {name: torch.from_numpy(p) for name, p in model.params.items()}
        self.inv_freq = torch.from_numpy(model.inv_freq)

    def __getattr__(self, name: str) -> Any:  # everything but the forward is the model's own
        return getattr(self.model, name)

    def _rms_norm(self, x, weight):
        torch = _torch()
        return x * torch.rsqrt((x * x).mean(dim=-1, keepdim=True) + self.model.eps) * weight

    def _rope(self, x, positions):
        torch = _torch()
        freqs = positions.to(torch.float32)[:, None] * self.inv_freq[None, :]
        emb = torch.cat([freqs, freqs], dim=-1)
        half = x.shape[-1] // 2
        rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
        return x * emb.cos()[:, None, :] + rotated * emb.sin()[:, None, :]

    def forward(self, input_ids, positions, kv_caches, attn_metadata) -> np.ndarray:
        torch = _torch()
        m, p = self.model, self.params
        ids = np.asarray(input_ids)
        if ids.size and (ids.min() < 0 or ids.max() >= m.vocab_size):
            raise ValueError(f"token ids must lie in [0, {m.vocab_size}), got {ids.min()}..{ids.max()}")
        if len(kv_caches) != m.num_layers:
            raise ValueError(
                f"expected {m.num_layers} KV cache tensors (one per layer), got {len(kv_caches)}"
            )
        pos = torch.from_numpy(np.asarray(positions, dtype=np.int64))
        t = ids.shape[0]
        with torch.no_grad():
            h = p["model.embed_tokens.weight"][torch.from_numpy(ids.astype(np.int64))]
            for n in range(m.num_layers):
                pre = f"model.layers.{n}"
                x = self._rms_norm(h, p[f"{pre}.input_layernorm.weight"])
                qkv = x @ p[f"{pre}.self_attn.qkv_proj.weight"].T
                q, k, v = torch.split(qkv, [m.q_size, m.kv_size, m.kv_size], dim=-1)
                q = self._rope(q.reshape(t, m.num_heads, m.head_dim), pos)
                k = self._rope(k.reshape(t, m.num_kv_heads, m.head_dim), pos)
                self.attn.reshape_and_cache(
                    k, v.reshape(t, m.num_kv_heads, m.head_dim), kv_caches[n], attn_metadata.slot_mapping
                )
                a = self.attn.forward(q, kv_caches[n], attn_metadata, m.scale)
                h = h + a.reshape(t, m.q_size) @ p[f"{pre}.self_attn.o_proj.weight"].T
                x = self._rms_norm(h, p[f"{pre}.post_attention_layernorm.weight"])
                gate_up = x @ p[f"{pre}.mlp.gate_up_proj.weight"].T
                gate, up = gate_up[:, : m.intermediate_size], gate_up[:, m.intermediate_size :]
                h = h + (torch.nn.functional.silu(gate) * up) @ p[f"{pre}.mlp.down_proj.weight"].T
            return self._rms_norm(h, p["model.norm.weight"]).numpy()

    def compute_logits(self, hidden_states) -> np.ndarray:
        torch = _torch()
        m = self.model
        head = self.params["model.embed_tokens.weight" if m.tie_word_embeddings else "lm_head.weight"]
        with torch.no_grad():
            return (torch.from_numpy(np.asarray(hidden_states, dtype=np.float32)) @ head.T).numpy()


class TorchCpuPlatform(Platform):
    _enum = PlatformEnum.CPU
    device_name = "torch-cpu"
    device_type = "cpu"
    dispatch_key = "CPU"
    dist_backend = "gloo"
    supported_dtypes = ("float32",)

    def __init__(self) -> None:
        _torch()  # refuse now, with the reason, if torch is missing

    @classmethod
    def get_attn_backend_cls(cls, selected_backend: str | None, head_size: int, dtype: str) -> str:
        if selected_backend not in (None, TorchSDPABackend.name):
            raise ValueError(
                f"attention backend {selected_backend!r} does not run on the torch-cpu platform; "
                f"it has {TorchSDPABackend.name!r}"
            )
        return "mini_vllm.platforms.torch_cpu.TorchSDPABackend"

    def load_model(self, model: Any, attn_backend: Any) -> Any:
        from ..models.llama import LlamaForCausalLM

        if getattr(model, "is_attention_free", False):
            return model  # a lookup table: nothing to move, nothing to attend
        if type(model) is LlamaForCausalLM:
            return TorchLlamaForCausalLM(model, attn_backend)
        raise ValueError(
            f"the torch-cpu platform runs LlamaForCausalLM and attention-free models, not "
            f"{type(model).__name__}; use MINI_VLLM_PLATFORM=numpy"
        )
