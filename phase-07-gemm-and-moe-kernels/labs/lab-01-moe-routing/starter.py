"""Lab 07-01 — the MoE forward: routing, the permute trick, grouped experts (starter: write the six functions).

An MoE layer replaces one dense MLP with ``E`` small expert MLPs and a router. For a batch of
``T`` tokens ``x`` of shape ``(T, d)``:

1. router:     ``logits = x @ W_gate.T``                     ``W_gate`` is ``(E, d)`` → ``(T, E)``
2. top-k:      the k best experts per token; weights = softmax over those k logits only
3. permute:    flatten the ``(T, k)`` assignment into ``T·k`` rows and sort them by expert
4. grouped:    one matmul pair per expert, on that expert's contiguous block of rows
5. un-permute: scatter every row back to the token it came from ...
6. combine:    ... weighted by its gate weight, summing the k contributions of each token

Steps 3 and 5 change the order of the work, never the arithmetic: the grouped forward must equal
the token-by-token reference. An expert here is ``relu(x @ W1) @ W2`` with ``W1: (d, f)`` and
``W2: (f, d)`` (real models use SwiGLU with three matrices; the routing is identical).
"""

from __future__ import annotations

import sys

import numpy as np

Expert = tuple[np.ndarray, np.ndarray]  # (W1 of shape (d, f), W2 of shape (f, d))


# --------------------------------------------------------------------------- provided fixture
def make_moe(num_experts: int = 8, hidden: int = 16, ffn: int = 32, seed: int = 0) -> tuple[np.ndarray, list[Expert]]:
    """A seeded toy MoE layer: the router matrix ``W_gate (E, d)`` and ``E`` experts ``(W1, W2)``."""
    rng = np.random.default_rng(seed)
    w_gate = rng.standard_normal((num_experts, hidden))
    experts = [
        (rng.standard_normal((hidden, ffn)) / np.sqrt(hidden), rng.standard_normal((ffn, hidden)) / np.sqrt(ffn))
        for _ in range(num_experts)
    ]
    return w_gate, experts


# --------------------------------------------------------------------------- the lab
def route(x: np.ndarray, W_gate: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Top-k routing. Returns ``(topk_ids, topk_weights)``, both of shape ``(T, k)``.

    ``logits = x @ W_gate.T``; ``topk_ids[t]`` lists token t's k highest-scoring experts, best
    first (ties go to the lower expert id); ``topk_weights[t]`` is the softmax over those k
    logits only (select, then normalise), so every row sums to 1.
    """
    raise NotImplementedError(
        "route: score every expert (x @ W_gate.T), keep each token's k best (a stable sort of the NEGATED scores keeps "
        "best-first order and sends ties to the lower id; np.take_along_axis fetches the chosen logits), then "
        "softmax over just those k logits, not over all E"
    )


def expert_mlp(x: np.ndarray, W1: np.ndarray, W2: np.ndarray) -> np.ndarray:
    """One expert on a block of rows: ``relu(x @ W1) @ W2`` (shape in = shape out = ``(n, d)``)."""
    raise NotImplementedError(
        "expert_mlp: two matmuls with a ReLU between them; the ReLU is an elementwise max against zero"
    )


def moe_forward_reference(x: np.ndarray, experts: list[Expert], topk_ids: np.ndarray,
                          topk_weights: np.ndarray) -> np.ndarray:
    """The oracle: for every token, for each of its k experts, run that expert on that one row
    and add ``weight · output``. ``T·k`` tiny expert calls, token-major order."""
    raise NotImplementedError(
        "moe_forward_reference: two plain loops, over tokens and over each token's k slots; run that slot's expert on "
        "the single row (keep it 2-D: x[t:t+1]) and add the output, scaled by the slot's gate weight, to the token's row"
    )


def permute(x: np.ndarray, topk_ids: np.ndarray, num_experts: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Group the ``T·k`` (token, expert) assignments by expert.

    Flatten ``topk_ids`` to ``T·k`` entries (flat index ``i`` is token ``i // k``, slot ``i % k``)
    and stable-sort them by expert id. Returns:

    * ``x_sorted`` ``(T·k, d)``: the token row of every assignment, in sorted order;
    * ``order`` ``(T·k,)``: ``order[r]`` is the flat index that landed in sorted row ``r``;
    * ``expert_offsets`` ``(E + 1,)``: expert ``e`` owns sorted rows
      ``expert_offsets[e]:expert_offsets[e + 1]`` (a prefix sum of the per-expert counts,
      starting at 0; vLLM calls it ``expert_first_token_offset``).
    """
    raise NotImplementedError(
        "permute: flatten topk_ids to T*k expert ids, find the order that sorts them (stable, so each expert's rows "
        "stay in token order), count rows per expert for the offsets (they start at 0), and remember that flat "
        "index i belongs to token i // k, not to token i"
    )


def unpermute(y_sorted: np.ndarray, order: np.ndarray, topk_weights: np.ndarray, num_tokens: int) -> np.ndarray:
    """Undo ``permute`` and combine: sorted row ``r`` belongs to token ``order[r] // k`` with gate
    weight ``topk_weights.flat[order[r]]``; every token sums its k weighted rows.

    Each token appears k times in ``order // k``, so the scatter must *accumulate* repeated
    indices (``np.add.at``); ``out[idx] += ...`` keeps only one of them.
    """
    raise NotImplementedError(
        "unpermute: sorted row r came from flat index order[r]; scale it by that flat index's gate weight and add it "
        "to its token's row. Every token receives k rows, so the scatter has repeated destinations: use an "
        "accumulating scatter (numpy has one in np.add), not out[idx] += ..."
    )


def moe_forward_grouped(x: np.ndarray, experts: list[Expert], topk_ids: np.ndarray,
                        topk_weights: np.ndarray) -> np.ndarray:
    """Expert-major forward: permute, one ``expert_mlp`` call per expert that received rows
    (on its whole contiguous block), then un-permute and combine. Must equal the reference."""
    raise NotImplementedError(
        "moe_forward_grouped: permute, then one expert_mlp call per expert on its whole contiguous block of rows "
        "(an expert with no rows gets no call), then unpermute"
    )


# --------------------------------------------------------------------------- what you should see
MIXTRAL = dict(hidden=4096, ffn=14336, layers=32, experts=8, top_k=2, heads=32, kv_heads=8, head_dim=128, vocab=32000)


def _arithmetic() -> None:
    """Parameter arithmetic of Mixtral-8x7B from its config shapes (no learner code involved)."""
    m = MIXTRAL
    per_expert = 3 * m["hidden"] * m["ffn"]  # SwiGLU: gate, up, down
    experts_all = per_expert * m["experts"] * m["layers"]
    experts_active = per_expert * m["top_k"] * m["layers"]
    q_o = 2 * m["hidden"] * m["heads"] * m["head_dim"]
    k_v = 2 * m["hidden"] * m["kv_heads"] * m["head_dim"]
    attention = (q_o + k_v) * m["layers"]
    router = m["hidden"] * m["experts"] * m["layers"]
    embed = 2 * m["vocab"] * m["hidden"]  # input embedding + LM head (untied)
    total = experts_all + attention + router + embed
    active = experts_active + attention + router + embed
    print("Mixtral-8x7B from its config (hidden 4096, ffn 14336, 32 layers, 8 experts, top-2)")
    print(f"  one expert, one layer       : {per_expert:,} params (3 x 4096 x 14336)")
    print(f"  all experts, all layers     : {experts_all / 1e9:.2f} B")
    print(f"  attention + router + embed  : {(attention + router + embed) / 1e9:.2f} B")
    print(f"  total parameters            : {total / 1e9:.1f} B")
    print(f"  active per token (2 experts): {active / 1e9:.1f} B  ({total / active:.1f}x fewer than total)")
    print(f"  expert FLOPs per token      : {2 * experts_active / 1e9:.1f} GFLOP with top-2,"
          f" vs {2 * experts_all / 1e9:.1f} GFLOP if every token used all 8")


def main() -> None:
    if "--arithmetic" in sys.argv:
        _arithmetic()
        return
    T, k, E = 12, 2, 8
    w_gate, experts = make_moe(num_experts=E, hidden=16, ffn=32, seed=0)
    x = np.random.default_rng(1).standard_normal((T, 16))
    topk_ids, topk_weights = route(x, w_gate, k)
    print(f"T={T} tokens, d=16, E={E} experts, top-{k}: {T * k} (token, expert) assignments")
    for t in range(3):
        ids = ", ".join(str(int(e)) for e in topk_ids[t])
        ws = ", ".join(f"{w:.3f}" for w in topk_weights[t])
        print(f"  token {t}: experts [{ids}]  weights [{ws}]")
    print(f"  every row of weights sums to 1: {bool(np.allclose(topk_weights.sum(axis=1), 1.0))}")
    x_sorted, order, offsets = permute(x, topk_ids, E)
    counts = np.diff(offsets)
    print(f"tokens per expert     : {counts.tolist()}  (sum {int(counts.sum())})")
    print(f"expert_offsets        : {offsets.tolist()}")
    print(f"sorted rows, expert id: {topk_ids.reshape(-1)[order].tolist()}")
    ref = moe_forward_reference(x, experts, topk_ids, topk_weights)
    grp = moe_forward_grouped(x, experts, topk_ids, topk_weights)
    print(f"grouped == reference (max |diff| < 1e-12): {bool(np.max(np.abs(grp - ref)) < 1e-12)}")
    back = unpermute(x_sorted, order, topk_weights, T)
    print(f"unpermute(permute(x)) == x               : {bool(np.allclose(back, x))}")
    print(f"expert_mlp calls: reference {T * k} (one per assignment), grouped {int(np.count_nonzero(counts))}"
          f" (one per expert that got rows)")


if __name__ == "__main__":
    main()
