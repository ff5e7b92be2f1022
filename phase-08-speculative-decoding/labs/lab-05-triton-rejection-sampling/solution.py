"""Lab 08-05 — the random-path rejection kernel in Triton (reference).

One program per request walks that request's drafts in order. Draft ``j`` (token ``x``) is
accepted when ``p(x) / q(x) >= u_j``: ``p`` is the target's distribution at that position, ``q``
the drafter's, ``u_j`` a uniform draw in [0, 1). A draft with ``q(x) = 0`` is rejected (the ratio
is undefined; vLLM rejects it rather than divide by zero). On the first rejection the program
writes the *recovered* token in that slot and stops: either a token the caller already sampled,
or one drawn here from the residual ``max(p - q, 0)`` (normalised) with the exponential race
``argmax_v max(p_v - q_v, 0) / E_v``, ``E_v ~ Exp(1)``: the race picks ``v`` with probability
proportional to its residual, so no normalisation and no cumulative sum are needed. When every
draft is accepted, the target's own *bonus* token goes in the slot after the last draft. Every
other slot keeps the placeholder ``-1``.

Unlike vLLM, which samples a recovered token for *every* draft position in a kernel of its own
and then walks the drafts, this kernel reads the two probability rows only at the one position
that needs them (the first rejection), so at most one pair of vocabulary rows per request.
"""

from __future__ import annotations

import os

import numpy as np
import torch

if not torch.cuda.is_available():               # no GPU: run the kernel in Triton's CPU interpreter
    os.environ.setdefault("TRITON_INTERPRET", "1")

import triton  # noqa: E402  (imported after TRITON_INTERPRET is decided)
import triton.language as tl  # noqa: E402

PLACEHOLDER = -1        # vLLM's PLACEHOLDER_TOKEN_ID: "nothing emitted in this slot"
BLOCK_V = 1024          # vocabulary tile of the residual race (GPU); tests pass smaller tiles


@triton.jit
def rejection_random_kernel(
    Out, stride_out,                     # [batch, max_spec_len + 1] int32, pre-filled with the placeholder
    CuNumDrafts,                         # [batch] int32: cumulative draft counts (request r owns cu[r-1]..cu[r])
    DraftIds,                            # [num_tokens] int32
    DraftProbs, stride_qt, stride_qv,    # q: [num_tokens, vocab], any strides
    TargetProbs, stride_pt, stride_pv,   # p: [num_tokens, vocab], any strides
    BonusIds,                            # [batch] int32
    Recovered,                           # [num_tokens] int32, read only when HAS_RECOVERED
    Uniforms,                            # [num_tokens] float64
    InvExp, stride_er,                   # [batch, vocab] float32 1 / Exp(1), read only when not HAS_RECOVERED
    vocab_size,
    HAS_RECOVERED: tl.constexpr,
    BLOCK_V: tl.constexpr,
):
    req = tl.program_id(0)
    start = 0
    if req > 0:
        start = tl.load(CuNumDrafts + req - 1)
    end = tl.load(CuNumDrafts + req)
    num_drafts = end - start
    out_row = Out + req.to(tl.int64) * stride_out

    rejected = False
    for pos in range(num_drafts):
        if not rejected:
            t = (start + pos).to(tl.int64)          # row of this draft in the flattened [num_tokens, vocab] tensors
            x = tl.load(DraftIds + t)
            q_x = tl.load(DraftProbs + t * stride_qt + x.to(tl.int64) * stride_qv)
            p_x = tl.load(TargetProbs + t * stride_pt + x.to(tl.int64) * stride_pv)
            u = tl.load(Uniforms + t)
            token = x
            accepted = q_x > 0                      # a draft the drafter gave no mass is rejected...
            if accepted:
                accepted = p_x / q_x >= u           # ...and never divided by
            if not accepted:
                rejected = True
                if HAS_RECOVERED:
                    token = tl.load(Recovered + t)
                else:
                    best = -float("inf")
                    best_id = 0
                    for v0 in range(0, vocab_size, BLOCK_V):
                        offs = v0 + tl.arange(0, BLOCK_V)
                        inside = offs < vocab_size
                        p_row = tl.load(TargetProbs + t * stride_pt + offs.to(tl.int64) * stride_pv, mask=inside, other=0.0)
                        q_row = tl.load(DraftProbs + t * stride_qt + offs.to(tl.int64) * stride_qv, mask=inside, other=0.0)
                        inv_e = tl.load(InvExp + req.to(tl.int64) * stride_er + offs, mask=inside, other=0.0)
                        score = tl.maximum(p_row - q_row, 0.0) * inv_e
                        tile_best, tile_id = tl.max(score, axis=0, return_indices=True)
                        if tile_best > best:                # strict: on a tie the earlier tile keeps it
                            best = tile_best
                            best_id = v0 + tile_id
                    token = best_id.to(tl.int32)
            tl.store(out_row + pos, token)
    if not rejected:
        tl.store(out_row + num_drafts, tl.load(BonusIds + req))


def rejection_sample_random(
    draft_token_ids: torch.Tensor,
    num_draft_tokens: list[int],
    draft_probs: torch.Tensor,
    target_probs: torch.Tensor,
    bonus_token_ids: torch.Tensor,
    uniform_probs: torch.Tensor,
    recovered_token_ids: torch.Tensor | None = None,
    inv_exponentials: torch.Tensor | None = None,
    max_spec_len: int | None = None,
    block_v: int = BLOCK_V,
) -> torch.Tensor:
    """Launch ``rejection_random_kernel``, one program per request; returns ``[batch, max_spec_len + 1]`` int32.

    ``draft_token_ids`` [num_tokens], ``draft_probs`` / ``target_probs`` [num_tokens, vocab] (any
    strides), ``bonus_token_ids`` [batch], ``uniform_probs`` [num_tokens] (float64, as vLLM draws
    them). Give exactly one of ``recovered_token_ids`` [num_tokens] (tokens already drawn from the
    residual) or ``inv_exponentials`` [batch, vocab] (``1 / E`` with ``E ~ Exp(1)``, one row per
    request, as vLLM's ``sample_recovered_tokens`` makes them): the kernel then draws the
    recovered token itself. ``ValueError`` on mismatched shapes, a negative draft count, or both
    or neither of the two.
    """
    counts = [int(n) for n in num_draft_tokens]
    batch = len(counts)
    num_tokens = sum(counts)
    if any(n < 0 for n in counts):
        raise ValueError(f"draft counts must be >= 0, got {counts}")
    if (recovered_token_ids is None) == (inv_exponentials is None):
        raise ValueError("give exactly one of recovered_token_ids and inv_exponentials")
    if draft_probs.ndim != 2 or draft_probs.shape != target_probs.shape or draft_probs.shape[0] != num_tokens:
        raise ValueError(
            f"draft_probs and target_probs must both be [num_tokens={num_tokens}, vocab], "
            f"got {tuple(draft_probs.shape)} and {tuple(target_probs.shape)}"
        )
    if draft_token_ids.shape != (num_tokens,) or uniform_probs.shape != (num_tokens,):
        raise ValueError(f"draft_token_ids and uniform_probs must have num_tokens={num_tokens} entries")
    if bonus_token_ids.numel() != batch:
        raise ValueError(f"one bonus token per request: {batch} expected, got {bonus_token_ids.numel()}")
    vocab = draft_probs.shape[1]
    if inv_exponentials is not None and inv_exponentials.shape != (batch, vocab):
        raise ValueError(f"inv_exponentials must be [batch={batch}, vocab={vocab}], got {tuple(inv_exponentials.shape)}")
    width = (max(counts, default=0) if max_spec_len is None else max_spec_len) + 1
    device = target_probs.device
    out = torch.full((batch, width), PLACEHOLDER, dtype=torch.int32, device=device)
    if batch == 0:
        return out
    cu = torch.tensor(np.cumsum(counts), dtype=torch.int32, device=device)
    has_rec = recovered_token_ids is not None
    rec = recovered_token_ids.to(torch.int32).contiguous() if has_rec else out
    inv_e = inv_exponentials.to(torch.float32).contiguous() if not has_rec else target_probs
    rejection_random_kernel[(batch,)](
        out, out.stride(0), cu, draft_token_ids.to(torch.int32).contiguous(),
        draft_probs, draft_probs.stride(0), draft_probs.stride(1),
        target_probs, target_probs.stride(0), target_probs.stride(1),
        bonus_token_ids.reshape(-1).to(torch.int32).contiguous(), rec,
        uniform_probs.to(torch.float64).contiguous(), inv_e, inv_e.stride(0) if not has_rec else 0,
        vocab, HAS_RECOVERED=has_rec, BLOCK_V=block_v,
    )
    return out


# --------------------------------------------------------------------------- part 2: what the kernel reads
def predicted_bytes(out: np.ndarray, num_draft_tokens: list[int], vocab_size: int, recovered_given: bool) -> int:
    """Bytes ``rejection_random_kernel`` moves for the output rows ``out`` it produced.

    Per request: the two cumulative counts (2 × 4 B); per draft it *looked at* (the accepted ones
    and the first rejected one) the draft id (4 B), the uniform (8 B), ``p(x)`` and ``q(x)``
    (4 B each) and the token it stores (4 B); if a draft was rejected, either the given recovered
    id (4 B) or the residual race's three float32 rows, ``p``, ``q`` and ``1/E`` (3 × 4·vocab B);
    if none was, the bonus id (4 B read, 4 B written).
    """
    out = np.asarray(out)
    total = 0
    for row, n in zip(out, num_draft_tokens):
        emitted = int((row != PLACEHOLDER).sum())    # accepted drafts + (recovered or bonus)
        total += 8
        if emitted == n + 1:                          # every draft accepted: the bonus was read and stored
            total += n * (4 + 8 + 4 + 4 + 4) + 4 + 4
        else:                                         # rejected at slot emitted - 1
            total += emitted * (4 + 8 + 4 + 4 + 4)
            total += 4 if recovered_given else 3 * 4 * vocab_size
    return total


def main() -> None:
    rng = np.random.default_rng(0)
    counts, vocab = [3, 0, 2, 4], 8
    n = sum(counts)
    p = rng.dirichlet(np.ones(vocab), n)
    q = rng.dirichlet(np.ones(vocab), n)
    drafts = np.array([rng.choice(vocab, p=row) for row in q])
    u = rng.random(n)
    inv_e = 1.0 / rng.exponential(size=(len(counts), vocab))
    out = rejection_sample_random(
        torch.tensor(drafts), counts, torch.tensor(q, dtype=torch.float32), torch.tensor(p, dtype=torch.float32),
        torch.tensor([100, 101, 102, 103]), torch.tensor(u), inv_exponentials=torch.tensor(inv_e, dtype=torch.float32),
    ).numpy()
    start = 0
    for r, k in enumerate(counts):
        ratio = [f"{p[start + j, drafts[start + j]] / q[start + j, drafts[start + j]]:.2f}" for j in range(k)]
        uj = [f"{x:.2f}" for x in u[start:start + k]]
        print(f"request {r}: drafts {drafts[start:start + k].tolist()}  p/q {ratio}  u {uj}  -> {out[r].tolist()}")
        start += k
    print(f"bytes read+written (residual race in the kernel, vocab {vocab}): {predicted_bytes(out, counts, vocab, False)}")


if __name__ == "__main__":
    main()
