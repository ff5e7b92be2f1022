"""Lab 14-03 — trace weight loading: predict where every checkpoint tensor lands, then find out (reference).

Lab 02 wrote the mapping. This lab reads it off a real load. Four questions, one function each:

* ``checkpoint_names(cfg)``: which tensors does a Llama checkpoint hold? (Llama-3-8B: 291.)
* ``predict_rows(cfg, tp_size, tp_rank)``: for each of them, which vLLM parameter and which rows
  of it does it fill on this rank?
* ``trace(params, checkpoint)``: after a real load, where did each tensor actually go? Found by
  content: the rows of the mapped parameter that equal the tensor.
* ``model_card(qkv_shape, gate_up_shape, head_dim)``: the config, read back from two shapes.

``coverage(cfg)`` answers how much of a checkpoint the five-row stacking table routes, by count and
by bytes. ``cfg`` is a dict with Hugging Face's key names (``hidden_size``, ``num_attention_heads``,
``num_key_value_heads``, ``head_dim``, ``intermediate_size``, ``num_hidden_layers``,
``vocab_size``, ``tie_word_embeddings``). A ``Row`` is ``(checkpoint name, param name, shard id,
start, stop)``: the rows ``[start, stop)`` of the param, on this rank, that the tensor fills.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from course.runtime import use_lab

mapping = use_lab("phase-14/lab-02-weight-mapping")  # map_weight_name, qkv_slices, STACKED_PARAMS

LAYER_TENSORS = [
    "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
    "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj", "input_layernorm", "post_attention_layernorm",
]  # fmt: skip

LLAMA_3_8B = dict(hidden_size=4096, num_attention_heads=32, num_key_value_heads=8, head_dim=128,
                  intermediate_size=14336, num_hidden_layers=32, vocab_size=128256, tie_word_embeddings=False)  # fmt: skip


class Row(NamedTuple):
    checkpoint: str
    param: str
    shard: str | int | None
    start: int
    stop: int


def _hd(cfg) -> int:
    return cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]


def checkpoint_names(cfg) -> list[str]:
    """Tensor names of a Hugging Face Llama checkpoint, in the order: embedding, layer by layer
    (the nine tensors of ``LAYER_TENSORS``, each ``.weight``), final norm, ``lm_head`` unless tied."""
    names = ["model.embed_tokens.weight"]
    for i in range(cfg["num_hidden_layers"]):
        names += [f"model.layers.{i}.{t}.weight" for t in LAYER_TENSORS]
    names.append("model.norm.weight")
    if not cfg.get("tie_word_embeddings", False):
        names.append("lm_head.weight")
    return names


def _rows_per_rank(cfg, tp_size: int) -> dict:
    nh, nkv, hd, inter = (
        cfg["num_attention_heads"],
        cfg["num_key_value_heads"],
        _hd(cfg),
        cfg["intermediate_size"],
    )
    if nh % tp_size or inter % tp_size or (nkv % tp_size and tp_size % nkv):
        raise ValueError(
            f"tp_size {tp_size} must divide num_heads {nh} and intermediate_size {inter}, and "
            f"num_kv_heads {nkv} must divide or be divided by it"
        )
    # fewer KV heads than ranks: each rank keeps one KV head, replicated across tp_size / nkv ranks
    return {"q": nh // tp_size * hd, "kv": max(1, nkv // tp_size) * hd, "inter": inter // tp_size}


def predict_rows(cfg, tp_size: int = 1, tp_rank: int = 0) -> list[Row]:
    """Where each checkpoint tensor lands on rank ``tp_rank`` of ``tp_size``: one ``Row`` per name of
    ``checkpoint_names``, in that order. Unfused tensors fill rows ``[0, rows)`` of themselves
    (column-parallel ones, like ``embed_tokens`` and ``lm_head``, their rank's share; ``o_proj`` and
    ``down_proj`` split their columns, so all their rows). ``ValueError`` for a TP size the heads or
    the intermediate size cannot be split by, or a rank outside ``[0, tp_size)``."""
    if not 0 <= tp_rank < tp_size:
        raise ValueError(f"tp_rank {tp_rank} is not in [0, {tp_size})")
    r = _rows_per_rank(cfg, tp_size)
    q, kv, inter = r["q"], r["kv"], r["inter"]
    vocab = -(-cfg["vocab_size"] // tp_size)
    hidden = cfg["hidden_size"]
    fused_rows = {
        "q": (0, q),
        "k": (q, q + kv),
        "v": (q + kv, q + 2 * kv),
        0: (0, inter),
        1: (inter, 2 * inter),
    }
    own_rows = {"embed_tokens": vocab, "lm_head": vocab, "o_proj": hidden, "down_proj": hidden}
    rows = []
    for name in checkpoint_names(cfg):
        param, shard = mapping.map_weight_name(name)
        if shard is not None:
            start, stop = fused_rows[shard]
        else:
            module = name.split(".")[-2]
            start, stop = 0, own_rows.get(module, hidden)  # the norms: hidden_size rows (a vector)
        rows.append(Row(name, param, shard, start, stop))
    return rows


def trace(params: dict[str, np.ndarray], checkpoint: dict[str, np.ndarray]) -> list[Row]:
    """Where each checkpoint tensor actually went, found by content, one ``Row`` per checkpoint name
    in the checkpoint's order: the tensor's target parameter (lab 02's mapping) and the first row
    ``start`` at which ``param[start : start + len(tensor)]`` equals the tensor exactly.
    ``LookupError`` naming the tensor when it is nowhere in its parameter."""
    out = []
    for name, tensor in checkpoint.items():
        param_name, shard = mapping.map_weight_name(name)
        if param_name not in params:
            raise LookupError(f"{name}: maps to {param_name!r}, which the model does not have")
        param, tensor = np.asarray(params[param_name]), np.asarray(tensor)
        n = tensor.shape[0]
        found = None
        # candidate starts: rows of the parameter equal to the tensor's first row (vectors: the whole thing)
        if tensor.ndim == 1:
            found = 0 if param.shape == tensor.shape and np.array_equal(param, tensor) else None
        else:
            for s in np.flatnonzero((param == tensor[0]).all(axis=1)):
                if s + n <= param.shape[0] and np.array_equal(param[s : s + n], tensor):
                    found = int(s)
                    break
        if found is None:
            raise LookupError(
                f"{name} ({tensor.shape}) is not in {param_name} {param.shape}: it was not loaded there"
            )
        out.append(Row(name, param_name, shard, found, found + n))
    return out


def model_card(qkv_shape, gate_up_shape, head_dim: int) -> dict:
    """The attention and MLP config read back from the fused shapes (TP 1), assuming
    ``num_heads · head_dim == hidden_size``: ``hidden_size``, ``num_heads``, ``num_kv_heads``,
    ``intermediate_size`` and ``ffn_ratio``. ``ValueError`` when the shapes cannot come from one config."""
    rows, hidden = qkv_shape
    if hidden % head_dim or gate_up_shape[1] != hidden or gate_up_shape[0] % 2:
        raise ValueError(
            f"qkv {tuple(qkv_shape)} and gate_up {tuple(gate_up_shape)} with head_dim {head_dim} "
            "do not describe one Llama layer"
        )
    nh = hidden // head_dim
    kv_rows = rows - hidden
    if kv_rows <= 0 or kv_rows % (2 * head_dim) or nh % (kv_rows // (2 * head_dim)):
        raise ValueError(
            f"qkv rows {rows} - hidden {hidden} = {kv_rows} is not 2 x a whole number of kv heads "
            f"of {head_dim} dividing {nh} query heads"
        )
    inter = gate_up_shape[0] // 2
    return dict(hidden_size=hidden, num_heads=nh, num_kv_heads=kv_rows // (2 * head_dim),
                intermediate_size=inter, ffn_ratio=inter / hidden)  # fmt: skip


def _shape(cfg, name) -> tuple[int, ...]:
    h, hd, inter, v = cfg["hidden_size"], _hd(cfg), cfg["intermediate_size"], cfg["vocab_size"]
    nh, nkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    leaf = name.split(".")[-2]
    return {"embed_tokens": (v, h), "lm_head": (v, h), "q_proj": (nh * hd, h), "k_proj": (nkv * hd, h),
            "v_proj": (nkv * hd, h), "o_proj": (h, nh * hd), "gate_proj": (inter, h), "up_proj": (inter, h),
            "down_proj": (h, inter)}.get(leaf, (h,))  # fmt: skip


def coverage(cfg) -> dict:
    """How much of the checkpoint the stacking table routes: ``tensors``, ``stacked`` (count), their
    ratio ``by_count``, ``by_bytes`` over the whole checkpoint, and ``by_bytes_per_layer`` (one
    decoder layer only)."""
    names = checkpoint_names(cfg)
    sizes = {n: int(np.prod(_shape(cfg, n))) for n in names}
    stacked = [n for n in names if mapping.map_weight_name(n)[1] is not None]
    layer0 = [n for n in names if n.startswith("model.layers.0.")]
    return dict(
        tensors=len(names), stacked=len(stacked), by_count=len(stacked) / len(names),
        by_bytes=sum(sizes[n] for n in stacked) / sum(sizes.values()),
        by_bytes_per_layer=sum(sizes[n] for n in layer0 if n in stacked) / sum(sizes[n] for n in layer0),
    )  # fmt: skip


def main() -> None:
    cfg = LLAMA_3_8B
    names = checkpoint_names(cfg)
    print(f"Llama-3-8B checkpoint: {len(names)} tensors ({cfg['num_hidden_layers']} layers x 9 + 3)")
    print(f"{'checkpoint tensor':47} {'vLLM parameter':45} {'shard':>5} {'rows':>11}")
    for row in predict_rows(cfg):
        if row.checkpoint.startswith("model.layers.0."):
            shard = "-" if row.shard is None else str(row.shard)
            print(f"{row.checkpoint:47} {row.param:45} {shard:>5} {f'{row.start}:{row.stop}':>11}")
    c = coverage(cfg)
    print(
        f"the five stacked rows route {c['stacked']} of {c['tensors']} tensors ({c['by_count']:.0%} by count), "
        f"{c['by_bytes']:.0%} of the bytes ({c['by_bytes_per_layer']:.0%} of one layer's)"
    )
    nh, hd, inter, h = 32, 128, 14336, 4096
    for tp in (1, 2, 4, 8, 16):
        stops = {}
        for x in predict_rows(cfg, tp_size=tp):
            if x.checkpoint.startswith("model.layers.0."):
                stops[x.param.split(".")[-2]] = max(stops.get(x.param.split(".")[-2], 0), x.stop)
        print(
            f"  tp {tp:>2}: qkv_proj.weight per rank ({stops['qkv_proj']}, {h}), "
            f"gate_up_proj.weight ({stops['gate_up_proj']}, {h})"
        )
    mha = (3 * nh * hd, h)
    print(
        f"model card from (6144, 4096) and (28672, 4096), head_dim 128: {model_card((6144, h), (2 * inter, h), hd)}"
    )
    print(
        f"the same for an MHA layer, qkv {mha}: {model_card(mha, (2 * inter, h), hd)['num_kv_heads']} kv heads"
    )


if __name__ == "__main__":
    main()
