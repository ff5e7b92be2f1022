"""Lab 14-02 — checkpoint names to fused parameters (reference solution).

A Hugging Face Llama checkpoint stores every projection as its own tensor: ``q_proj``, ``k_proj``,
``v_proj``, ``gate_proj``, ``up_proj``. vLLM runs two of the groups as one matmul each, so it keeps
one fused parameter per group and copies each checkpoint tensor into its rows while loading:

    qkv_proj.weight      rows [0, nh·hd)            <- q_proj    shard "q"
                         rows [nh·hd, (nh+nkv)·hd)  <- k_proj    shard "k"
                         rows [(nh+nkv)·hd, end)    <- v_proj    shard "v"
    gate_up_proj.weight  first half                 <- gate_proj shard 0
                         second half                <- up_proj   shard 1

Under grouped-query attention ``nkv < nh``, so the k and v blocks are narrower than q. Every
other tensor (embeddings, norms, ``o_proj``, ``down_proj``, ``lm_head``) maps to itself.

Three functions: ``map_weight_name`` (the table lookup), ``qkv_slices`` (where each shard lives)
and ``load_stacked`` (the copy, with the checks that make a wrong checkpoint fail loudly).
"""

from __future__ import annotations

import numpy as np

# (param_name, weight_name, shard_id): the shape of upstream llama.py's stacked_params_mapping.
STACKED_PARAMS: list[tuple[str, str, str | int]] = [
    ("qkv_proj", "q_proj", "q"),
    ("qkv_proj", "k_proj", "k"),
    ("qkv_proj", "v_proj", "v"),
    ("gate_up_proj", "gate_proj", 0),
    ("gate_up_proj", "up_proj", 1),
]


def map_weight_name(name: str) -> tuple[str, str | int | None]:
    """``(parameter name, shard id)`` for a checkpoint tensor name.

    A name with a dotted segment equal to a table row's ``weight_name`` has that one segment
    rewritten to the row's ``param_name`` and gets the row's shard id; everything else maps to
    itself with shard ``None``. Only whole segments match: ``gate_up_proj`` is not ``up_proj``."""
    segments = name.split(".")
    for param_name, weight_name, shard_id in STACKED_PARAMS:
        if weight_name in segments:
            i = segments.index(weight_name)
            return ".".join(segments[:i] + [param_name] + segments[i + 1 :]), shard_id
    return name, None


def qkv_slices(num_heads: int, num_kv_heads: int, head_dim: int) -> dict[str, slice]:
    """Rows of each shard in the fused ``qkv_proj`` weight: q, then k, then v.

    ``ValueError`` unless all three are positive ints and ``num_heads`` is a multiple of
    ``num_kv_heads`` (each KV head serves a whole group of query heads)."""
    for what, v in (("num_heads", num_heads), ("num_kv_heads", num_kv_heads), ("head_dim", head_dim)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v <= 0:
            raise ValueError(f"{what} must be a positive int, got {v!r}")
    if num_heads % num_kv_heads:
        raise ValueError(f"num_heads {num_heads} is not a multiple of num_kv_heads {num_kv_heads}")
    q, kv = num_heads * head_dim, num_kv_heads * head_dim
    return {"q": slice(0, q), "k": slice(q, q + kv), "v": slice(q + kv, q + 2 * kv)}


def load_stacked(
    fused: np.ndarray, shard: np.ndarray, shard_id, num_heads: int, num_kv_heads: int, head_dim: int
) -> None:
    """Copy ``shard`` into its rows of ``fused``, in place.

    ``shard_id`` ``"q"``/``"k"``/``"v"``: ``fused`` is a ``qkv_proj`` weight, which must have
    ``(num_heads + 2·num_kv_heads)·head_dim`` rows; ``0``/``1``: ``fused`` is a ``gate_up_proj``
    weight and the shard fills its first or second half. The shard must have exactly the shape
    of its slot (no broadcasting). Raises ``ValueError`` naming both shapes, and ``KeyError`` for
    an unknown shard id; ``fused`` is untouched when anything is refused."""
    if fused.ndim != 2:
        raise ValueError(f"fused weight must be 2-D (rows, in_features), got shape {fused.shape}")
    if shard_id in ("q", "k", "v"):
        slices = qkv_slices(num_heads, num_kv_heads, head_dim)
        want_rows = slices["v"].stop
        if fused.shape[0] != want_rows:
            raise ValueError(
                f"fused qkv weight has shape {fused.shape}, but {num_heads} q heads + 2 x {num_kv_heads} kv heads "
                f"of {head_dim} need {want_rows} rows"
            )
        rows = slices[shard_id]
    elif shard_id in (0, 1) and not isinstance(shard_id, bool):
        if fused.shape[0] % 2:
            raise ValueError(
                f"fused gate_up weight has shape {fused.shape}: an odd row count cannot hold two halves"
            )
        half = fused.shape[0] // 2
        rows = slice(shard_id * half, (shard_id + 1) * half)
    else:
        raise KeyError(f"unknown shard id {shard_id!r}: expected 'q', 'k', 'v', 0 or 1")
    slot = fused[rows]
    if shard.shape != slot.shape:
        raise ValueError(
            f"shard {shard_id!r} has shape {shard.shape}, but its slot in the fused weight {fused.shape} "
            f"is rows {rows.start}:{rows.stop}, shape {slot.shape}"
        )
    fused[rows] = shard


def load_checkpoint(
    params: dict[str, np.ndarray], checkpoint, num_heads: int, num_kv_heads: int, head_dim: int
) -> set[str]:
    """Provided: load ``(name, tensor)`` pairs into ``params`` with the three functions above.

    Returns the parameter names written. A checkpoint name that maps to no parameter is a
    ``KeyError`` naming it: the load-time error a missing table row produces upstream."""
    written: set[str] = set()
    for name, tensor in checkpoint:
        target, shard_id = map_weight_name(name)
        if target not in params:
            raise KeyError(f"checkpoint tensor {name!r} maps to {target!r}, which the model does not have")
        tensor = np.asarray(tensor)
        if shard_id is None:
            if params[target].shape != tensor.shape:
                raise ValueError(
                    f"{name}: checkpoint shape {tensor.shape} != parameter shape {params[target].shape}"
                )
            params[target][...] = tensor
        else:
            load_stacked(params[target], tensor, shard_id, num_heads, num_kv_heads, head_dim)
        written.add(target)
    return written


def main() -> None:
    nh, nkv, hd, hidden = 8, 2, 16, 128
    print(f"Llama-shaped layer: {nh} q heads, {nkv} kv heads, head_dim {hd}, hidden {hidden}")
    for name in (
        "model.layers.3.self_attn.q_proj.weight",
        "model.layers.3.self_attn.k_proj.weight",
        "model.layers.3.self_attn.v_proj.weight",
        "model.layers.3.mlp.gate_proj.weight",
        "model.layers.3.mlp.up_proj.weight",
        "model.layers.3.mlp.down_proj.weight",
        "model.layers.3.input_layernorm.weight",
    ):
        print(f"  {name:42} -> {map_weight_name(name)[0]:45} shard {map_weight_name(name)[1]!r}")
    s = qkv_slices(nh, nkv, hd)
    print("  fused qkv rows: " + ", ".join(f"{k} {v.start}:{v.stop}" for k, v in s.items()))
    rng = np.random.default_rng(0)
    wq, wk, wv = (rng.standard_normal((r, hidden)) for r in (nh * hd, nkv * hd, nkv * hd))
    fused = np.zeros(((nh + 2 * nkv) * hd, hidden))
    for sid, w in (("q", wq), ("k", wk), ("v", wv)):
        load_stacked(fused, w, sid, nh, nkv, hd)
    x = rng.standard_normal((5, hidden))
    y = x @ fused.T
    err = max(np.abs(y[:, s[k]] - x @ w.T).max() for k, w in (("q", wq), ("k", wk), ("v", wv)))
    print(f"  one matmul with the fused weight, sliced, vs three matmuls: max error {err:.1e}")
    try:
        load_stacked(fused, rng.standard_normal((nh * hd, hidden)), "k", nh, nkv, hd)
    except ValueError as e:
        print(f"  a k_proj sized for MHA: ValueError: {e}")


if __name__ == "__main__":
    main()
