"""Lab 14-03 starter — trace weight loading: predict where every checkpoint tensor lands, then find out.

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
Grade with: LAB_IMPL=starter .venv/bin/python -m pytest phase-14-model-architectures/labs/lab-03-trace-weight-loading -q
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
    raise NotImplementedError(
        "checkpoint_names: model.embed_tokens.weight, then model.layers.{i}.{t}.weight for each t of "
        "LAYER_TENSORS, then model.norm.weight, then lm_head.weight unless tie_word_embeddings"
    )


def _rows_per_rank(cfg, tp_size: int) -> dict:
    raise NotImplementedError(
        "_rows_per_rank: check the TP size divides the heads and intermediate size (kv heads may "
        "instead divide tp), then q = nh/tp·hd, kv = max(1, nkv/tp)·hd, inter = intermediate/tp rows "
        "per rank"
    )


def predict_rows(cfg, tp_size: int = 1, tp_rank: int = 0) -> list[Row]:
    raise NotImplementedError(
        "predict_rows: check the rank; for each checkpoint name map it with lab 02's map_weight_name;"
        " stacked shards take their rows in the rank's fused param (q, k, v; gate, up); unfused "
        "tensors fill rows [0, rows) of themselves (the vocab splits across ranks, o_proj and "
        "down_proj keep all rows)"
    )


def trace(params: dict[str, np.ndarray], checkpoint: dict[str, np.ndarray]) -> list[Row]:
    raise NotImplementedError(
        "trace: for each checkpoint tensor, its mapped param; candidate starts are the rows equal to "
        "the tensor's first row; the first candidate where the whole block equals the tensor is where"
        " it went (vectors: compare whole); LookupError naming the tensor otherwise"
    )


def model_card(qkv_shape, gate_up_shape, head_dim: int) -> dict:
    raise NotImplementedError(
        "model_card: hidden = qkv columns, num_heads = hidden / head_dim, the remaining rows are k "
        "and v: num_kv_heads = (rows - hidden) / (2·head_dim); intermediate = gate_up rows / 2; "
        "ValueError when the shapes cannot come from one config"
    )


def _shape(cfg, name) -> tuple[int, ...]:
    h, hd, inter, v = cfg["hidden_size"], _hd(cfg), cfg["intermediate_size"], cfg["vocab_size"]
    nh, nkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    leaf = name.split(".")[-2]
    return {"embed_tokens": (v, h), "lm_head": (v, h), "q_proj": (nh * hd, h), "k_proj": (nkv * hd, h),
            "v_proj": (nkv * hd, h), "o_proj": (h, nh * hd), "gate_proj": (inter, h), "up_proj": (inter, h),
            "down_proj": (h, inter)}.get(leaf, (h,))  # fmt: skip


def coverage(cfg) -> dict:
    raise NotImplementedError(
        "coverage: count the checkpoint's tensors and the ones map_weight_name stacks; bytes from "
        "_shape over the whole checkpoint and over layer 0 only"
    )


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
