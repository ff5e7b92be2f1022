"""MUTANT: the merge averages each split's acc/l instead of weighting by exp(m_i - m*) * l_i.

Lab 03-04 — flash-decoding in Triton: a split-KV paged decode kernel and its merge (reference).

Decode attention for a batch of sequences, one new query token each, over a paged KV cache:

    q            [B, H, D]                       one query row per sequence and head
    k_cache      [num_blocks, block_size, H_kv, D]   vLLM's NHD layout (per layer, K half)
    v_cache      [num_blocks, block_size, H_kv, D]
    block_tables [B, max_blocks_per_seq] int32   logical block -> physical block
    seq_lens     [B] int32                       valid tokens per sequence

Kernel 1 (`_split_kv_kernel`, grid B x H x S) gives every (sequence, head) S programs; program s
streams its own key range through the block table, TILE tokens at a time, folds each tile's softmax
summary into a running one (online softmax, one tile per step) and writes the summary (m, l, acc)
— *unnormalised* — to scratch. Kernel 2 (`_merge_kernel`, grid B x H) rescales the S
summaries to their common max and divides once. With S = 1 the pair degenerates to the single-pass
kernel of Phase 02 (one program per sequence and head).

GQA: query head h reads KV head h // (H // H_kv).
"""

from __future__ import annotations

import math
import os

import torch

if not torch.cuda.is_available():               # no GPU: run the kernels in Triton's CPU interpreter
    os.environ.setdefault("TRITON_INTERPRET", "1")

import triton  # noqa: E402  (imported after TRITON_INTERPRET is decided)
import triton.language as tl  # noqa: E402


def split_bounds(seq_len: int, num_splits: int) -> list[tuple[int, int]]:
    """Token range [start, end) of each split: equal chunks of ceil(seq_len / S); trailing ones may be empty."""
    per = -(-seq_len // num_splits)
    return [(min(s * per, seq_len), min((s + 1) * per, seq_len)) for s in range(num_splits)]


@triton.jit
def _fold(m, l, acc, m_t, l_t, acc_t):
    """Combine two softmax summaries (max, sum of exp(s - max), unnormalised sum of exp(s - max)·v).

    The same rule the merge applies across splits (lab 03's ``merge_partials``), used here inside
    kernel 1 to add one tile's summary to the running one. An empty summary (m = -inf) weighs 0.
    """
    top = tl.maximum(m, m_t)
    keep = tl.exp(m - top)
    take = tl.exp(m_t - top)
    return top, l * keep + l_t * take, acc * keep + acc_t * take


@triton.jit
def _split_kv_kernel(
    Q, K, V, BlockTables, SeqLens, PartM, PartL, PartAcc,
    sm_scale,
    stride_qb, stride_qh,
    stride_kn, stride_kt, stride_kh,
    stride_vn, stride_vt, stride_vh,
    stride_bt,
    stride_mb, stride_mh,
    stride_ab, stride_ah, stride_as,
    GROUP: tl.constexpr, BLOCK_SIZE: tl.constexpr, HEAD_DIM: tl.constexpr,
    NUM_SPLITS: tl.constexpr, TILE: tl.constexpr,
):
    b = tl.program_id(0)
    h = tl.program_id(1)
    s = tl.program_id(2)

    # Tokens [lo, hi) of sequence b: split_bounds(n, NUM_SPLITS)[s], computed on the device.
    n = tl.load(SeqLens + b)
    chunk = tl.cdiv(n, NUM_SPLITS)
    lo = tl.minimum(s * chunk, n)
    hi = tl.minimum(lo + chunk, n)

    dim = tl.arange(0, HEAD_DIM)
    q = tl.load(Q + b * stride_qb + h * stride_qh + dim).to(tl.float32) * sm_scale   # once, not per score
    kv_head = h // GROUP                              # consecutive query heads share one KV head
    k_head = K + kv_head * stride_kh
    v_head = V + kv_head * stride_vh
    table = BlockTables + b * stride_bt

    # The summary of the tokens seen so far; it starts empty, and stays empty for an empty split.
    m = -float("inf")
    l = 0.0
    acc = tl.zeros([HEAD_DIM], dtype=tl.float32)
    for i in range(tl.cdiv(hi - lo, TILE)):
        pos = lo + i * TILE + tl.arange(0, TILE)      # positions in the sequence, possibly across pages
        live = pos < hi                                # the split's last tile is ragged
        logical = pos // BLOCK_SIZE
        page = tl.load(table + logical, mask=live, other=0).to(tl.int64)   # each token: its own page id
        rows = page * stride_kn + (pos - logical * BLOCK_SIZE) * stride_kt
        k = tl.load(k_head + rows[:, None] + dim[None, :], mask=live[:, None], other=0.0).to(tl.float32)
        rows = page * stride_vn + (pos - logical * BLOCK_SIZE) * stride_vt
        v = tl.load(v_head + rows[:, None] + dim[None, :], mask=live[:, None], other=0.0).to(tl.float32)

        # This tile's own summary, then fold it in: a tile is just a very small split.
        logits = tl.where(live, tl.sum(k * q[None, :], axis=1), -float("inf"))
        m_t = tl.max(logits, axis=0)                  # finite: a tile holds at least one live token
        e = tl.exp(logits - m_t)                      # exactly 0 on dead rows
        m, l, acc = _fold(m, l, acc, m_t, tl.sum(e, axis=0), tl.sum(e[:, None] * v, axis=0))

    tl.store(PartM + b * stride_mb + h * stride_mh + s, m)
    tl.store(PartL + b * stride_mb + h * stride_mh + s, l)
    tl.store(PartAcc + b * stride_ab + h * stride_ah + s * stride_as + dim, acc)   # NOT divided by l


@triton.jit
def _merge_kernel(
    PartM, PartL, PartAcc, Out,
    stride_mb, stride_mh,
    stride_ab, stride_ah, stride_as,
    stride_ob, stride_oh,
    HEAD_DIM: tl.constexpr, NUM_SPLITS: tl.constexpr, SPLITS_POW2: tl.constexpr,
):
    b = tl.program_id(0)
    h = tl.program_id(1)
    offs_s = tl.arange(0, SPLITS_POW2)
    offs_d = tl.arange(0, HEAD_DIM)
    in_range = offs_s < NUM_SPLITS
    m = tl.load(PartM + b * stride_mb + h * stride_mh + offs_s, mask=in_range, other=-float("inf"))
    l = tl.load(PartL + b * stride_mb + h * stride_mh + offs_s, mask=in_range, other=0.0)
    acc = tl.load(PartAcc + b * stride_ab + h * stride_ah + offs_s[:, None] * stride_as + offs_d[None, :],
                  mask=in_range[:, None], other=0.0)
    m_star = tl.max(m, axis=0)
    w = tl.where(m > -float("inf"), tl.exp(m - m_star), 0.0)   # empty splits weigh nothing
    nonempty = tl.where(l > 0, 1.0, 0.0)
    out = tl.sum(nonempty[:, None] * acc / tl.where(l > 0, l, 1.0)[:, None], axis=0) / tl.sum(nonempty, axis=0)
    tl.store(Out + b * stride_ob + h * stride_oh + offs_d, out)


def split_kv_partials(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                      block_tables: torch.Tensor, seq_lens: torch.Tensor, num_splits: int,
                      tile: int | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Launch kernel 1. Returns float32 (part_m [B,H,S], part_l [B,H,S], part_acc [B,H,S,D])."""
    B, H, D = q.shape
    block_size, H_kv = k_cache.shape[1], k_cache.shape[2]
    tile = tile or max(block_size, 64)       # 64 tokens = four 16-token pages per iteration
    part_m = torch.empty((B, H, num_splits), dtype=torch.float32, device=q.device)
    part_l = torch.empty_like(part_m)
    part_acc = torch.empty((B, H, num_splits, D), dtype=torch.float32, device=q.device)
    _split_kv_kernel[(B, H, num_splits)](
        q, k_cache, v_cache, block_tables, seq_lens, part_m, part_l, part_acc,
        1.0 / math.sqrt(D),
        q.stride(0), q.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        block_tables.stride(0),
        part_m.stride(0), part_m.stride(1),
        part_acc.stride(0), part_acc.stride(1), part_acc.stride(2),
        GROUP=H // H_kv, BLOCK_SIZE=block_size, HEAD_DIM=D, NUM_SPLITS=num_splits, TILE=tile,
    )
    return part_m, part_l, part_acc


def merge_partials_triton(part_m: torch.Tensor, part_l: torch.Tensor, part_acc: torch.Tensor) -> torch.Tensor:
    """Launch kernel 2: one program per (sequence, head) merges its S summaries. Returns float32 [B,H,D]."""
    B, H, S, D = part_acc.shape
    out = torch.empty((B, H, D), dtype=torch.float32, device=part_acc.device)
    _merge_kernel[(B, H)](
        part_m, part_l, part_acc, out,
        part_m.stride(0), part_m.stride(1),
        part_acc.stride(0), part_acc.stride(1), part_acc.stride(2),
        out.stride(0), out.stride(1),
        HEAD_DIM=D, NUM_SPLITS=S, SPLITS_POW2=triton.next_power_of_2(S),
    )
    return out


def flash_decode(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
                 seq_lens: torch.Tensor, num_splits: int, tile: int | None = None) -> torch.Tensor:
    """Split-KV decode: kernel 1 then kernel 2. Output has q's dtype, shape [B, H, D]."""
    parts = split_kv_partials(q, k_cache, v_cache, block_tables, seq_lens, num_splits, tile)
    return merge_partials_triton(*parts).to(q.dtype)


def choose_num_splits(batch: int, num_heads: int, max_seq_len: int, num_sms: int,
                      min_tokens_per_split: int = 256, max_splits: int = 64) -> int:
    """How many splits to give each (sequence, head): keep doubling S while the grid B*H*S is
    smaller than the number of SMs, each split would still hold >= min_tokens_per_split tokens,
    and S < max_splits. Large batches and short contexts get S = 1."""
    s = 1
    while (batch * num_heads * s < num_sms and -(-max_seq_len // (2 * s)) >= min_tokens_per_split
           and s < max_splits):
        s *= 2
    return s


# --- provided: the oracle and the work meter ------------------------------------------------

def reference_decode(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                     block_tables: torch.Tensor, seq_lens: torch.Tensor) -> torch.Tensor:
    """Plain torch decode attention (float32 math): gather each sequence's tokens, softmax, weight V."""
    B, H, D = q.shape
    block_size, H_kv = k_cache.shape[1], k_cache.shape[2]
    out = torch.empty((B, H, D), dtype=torch.float32, device=q.device)
    for b in range(B):
        n = int(seq_lens[b])
        tok = torch.arange(n, device=q.device)
        pages = block_tables[b, tok // block_size].long()
        k = k_cache[pages, tok % block_size].float().repeat_interleave(H // H_kv, dim=1)   # [n, H, D]
        v = v_cache[pages, tok % block_size].float().repeat_interleave(H // H_kv, dim=1)
        scores = torch.einsum("hd,nhd->hn", q[b].float(), k) / math.sqrt(D)
        out[b] = torch.einsum("hn,nhd->hd", torch.softmax(scores, dim=-1), v)
    return out.to(q.dtype)


def decode_bytes(seq_lens: list[int], num_heads: int, num_kv_heads: int, head_dim: int,
                 elem_bytes: int, num_splits: int, block_size: int) -> int:
    """Bytes a split-KV decode step must move through HBM (the roofline numerator).

    K and V rows once each, the query in and the output out, block-table entries, and (when S > 1)
    the float32 partials written by kernel 1 and read back by kernel 2.
    """
    B = len(seq_lens)
    kv = 2 * sum(seq_lens) * num_kv_heads * head_dim * elem_bytes
    q_out = 2 * B * num_heads * head_dim * elem_bytes
    table = 4 * sum(-(-n // block_size) for n in seq_lens)
    partials = 0 if num_splits == 1 else 2 * 4 * B * num_heads * num_splits * (head_dim + 2)
    return kv + q_out + table + partials


def main() -> None:
    torch.manual_seed(0)
    B, H, H_kv, D, block_size, num_blocks = 2, 4, 2, 16, 4, 12
    seq_lens = torch.tensor([7, 13], dtype=torch.int32)
    block_tables = torch.stack([torch.randperm(num_blocks)[:4] for _ in range(B)]).to(torch.int32)
    q = torch.randn(B, H, D)
    k_cache, v_cache = torch.randn(num_blocks, block_size, H_kv, D), torch.randn(num_blocks, block_size, H_kv, D)
    ref = reference_decode(q, k_cache, v_cache, block_tables, seq_lens)
    print(f"B={B} H={H} H_kv={H_kv} D={D} block_size={block_size} seq_lens={seq_lens.tolist()}")
    for s in (1, 2, 3, 5):
        out = flash_decode(q, k_cache, v_cache, block_tables, seq_lens, s, tile=8)
        ranges = split_bounds(7, s)
        print(f"  S={s}: splits of seq 0 = {ranges}  max|out - reference| < 1e-5: "
              f"{bool((out - ref).abs().max() < 1e-5)}")
    print("choose_num_splits on a 132-SM GPU, H=32:")
    for batch, seq in ((1, 32768), (4, 32768), (16, 4096), (64, 4096), (1, 256)):
        s = choose_num_splits(batch, 32, seq, 132)
        print(f"  batch={batch:3d} seq_len={seq:6d} -> S={s:2d}  programs={batch * 32 * s}")


if __name__ == "__main__":
    main()
