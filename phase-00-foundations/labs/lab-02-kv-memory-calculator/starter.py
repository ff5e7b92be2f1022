"""Lab 00-02 — the KV-cache memory calculator (starter: write the three functions).

Three small functions turn a model's shape into the number that decides how many users one
GPU can serve:

* ``kv_bytes_per_token``: bytes of K and V that one token leaves behind, over all layers;
* ``kv_bytes_per_seq``: the same for a whole sequence of ``seq_len`` tokens;
* ``max_concurrent_seqs``: how many such sequences fit in the HBM left after the weights.

Units: every argument and result is in **bytes** (plain integers). Helpers below convert to
GiB (2**30 bytes) and GB (10**9 bytes) for printing only.
"""

from __future__ import annotations

from dataclasses import dataclass

KiB, MiB, GiB = 2**10, 2**20, 2**30
GB = 10**9


def _positive(**kw: float) -> None:
    for name, value in kw.items():
        if value <= 0:
            raise ValueError(f"{name} must be > 0, got {value}")


# --------------------------------------------------------------------------- the lab
def kv_bytes_per_token(num_layers: int, num_kv_heads: int, head_dim: int, dtype_bytes: float) -> int:
    """Bytes of KV cache one token occupies: 2 (K and V) x layers x KV heads x head_dim x dtype bytes.

    ``num_kv_heads`` is the number of *key/value* heads (8 for Llama-3-8B under GQA), not the
    number of query heads. ``dtype_bytes`` may be fractional (0.5 for a 4-bit cache).
    """
    raise NotImplementedError(
        "kv_bytes_per_token: call _positive(...) on the four inputs, then return "
        "int(2 * num_layers * num_kv_heads * head_dim * dtype_bytes) (the 2 is K plus V)"
    )


def kv_bytes_per_seq(
    num_layers: int, num_kv_heads: int, head_dim: int, dtype_bytes: float, seq_len: int
) -> int:
    """Bytes of KV cache one sequence of ``seq_len`` tokens holds for its whole lifetime."""
    raise NotImplementedError(
        "kv_bytes_per_seq: check seq_len > 0 with _positive(seq_len=seq_len), then multiply "
        "kv_bytes_per_token(...) by seq_len"
    )


def max_concurrent_seqs(
    gpu_bytes: int,
    weight_bytes: int,
    num_layers: int,
    num_kv_heads: int,
    head_dim: int,
    dtype_bytes: float,
    seq_len: int,
) -> int:
    """Whole sequences of ``seq_len`` tokens that fit in ``gpu_bytes - weight_bytes``.

    Integer floor (half a conversation is no use), and 0 when the weights leave no room.
    """
    raise NotImplementedError(
        "max_concurrent_seqs: free = gpu_bytes - weight_bytes; return 0 if free <= 0, else "
        "free // kv_bytes_per_seq(...) (integer floor: whole sequences only)"
    )


# --------------------------------------------------------------------------- what you should see
@dataclass(frozen=True)
class ModelShape:
    """The numbers of a model that size its KV cache (phase 02's real-vLLM blocks lab reuses it)."""

    name: str
    num_layers: int
    num_kv_heads: int
    head_dim: int
    n_params: float = 0.0
    dtype_bytes: int = 2  # fp16 / bf16


LLAMA_3_2_3B = ModelShape("Llama-3.2-3B", 28, 8, 128, 3.2e9)
LLAMA_3_8B = ModelShape("Llama-3-8B", 32, 8, 128, 8.0e9)
LLAMA_3_70B = ModelShape("Llama-3-70B", 80, 8, 128, 70e9)


def main() -> None:
    m = LLAMA_3_8B
    shape = (m.num_layers, m.num_kv_heads, m.head_dim)
    per_tok = kv_bytes_per_token(*shape, 2)
    per_seq = kv_bytes_per_seq(*shape, 2, 2048)
    print("Llama-3-8B, fp16 KV (32 layers, 8 KV heads, head_dim 128, 2 bytes)")
    print(f"  per token          : {per_tok:,} B = {per_tok // KiB} KiB")
    print(f"  per 2,048-token seq: {per_seq:,} B = {per_seq // MiB} MiB = {per_seq / GB:.3f} GB")
    print(f"  as a share of 16 GiB of weights: {per_seq / (16 * GiB):.2%}")
    print()
    print("How many 2,048-token conversations fit? GPU 24, weights 16 (GiB or GB):")
    n_gib = max_concurrent_seqs(24 * GiB, 16 * GiB, *shape, 2, 2048)
    n_gb = max_concurrent_seqs(24 * GB, 16 * GB, *shape, 2, 2048)
    print(f"  read as GiB: (24 GiB - 16 GiB) // 256 MiB = {n_gib}")
    print(f"  read as GB : (24e9 - 16e9) // {per_seq:,} = {n_gb}  (exact quotient {8 * GB / per_seq:.2f})")
    print(f"  fp8 KV (1 byte)  : {max_concurrent_seqs(24 * GiB, 16 * GiB, *shape, 1, 2048)}")
    print(f"  8,192-token seqs : {max_concurrent_seqs(24 * GiB, 16 * GiB, *shape, 2, 8192)}"
          f"   (each {kv_bytes_per_seq(*shape, 2, 8192) // GiB} GiB)")
    mha = kv_bytes_per_token(m.num_layers, 32, m.head_dim, 2)
    print(f"  if it were MHA (32 KV heads): {mha // KiB} KiB/token -> "
          f"{max_concurrent_seqs(24 * GiB, 16 * GiB, m.num_layers, 32, m.head_dim, 2, 2048)} sequences")
    print()
    print("Per-token and per-sequence KV on an 80 GiB GPU (weights in bf16)")
    print(f"{'model':<14}{'KV dtype':>9}{'KiB/tok':>9}{'ctx':>8}{'GiB/seq':>9}{'weights GiB':>12}{'seqs':>6}")
    for model in (LLAMA_3_2_3B, LLAMA_3_8B, LLAMA_3_70B):
        s = (model.num_layers, model.num_kv_heads, model.head_dim)
        weights = int(model.n_params * 2)
        for dtype_name, b in (("fp16", 2), ("fp8", 1)):
            for ctx in (2048, 8192, 131072):
                seq = kv_bytes_per_seq(*s, b, ctx)
                n = max_concurrent_seqs(80 * GiB, weights, *s, b, ctx)
                print(f"{model.name:<14}{dtype_name:>9}{kv_bytes_per_token(*s, b) / KiB:>9.0f}{ctx:>8}"
                      f"{seq / GiB:>9.2f}{weights / GiB:>12.1f}{n:>6}")


if __name__ == "__main__":
    main()
