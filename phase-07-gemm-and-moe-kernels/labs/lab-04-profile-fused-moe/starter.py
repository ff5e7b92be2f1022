"""Lab 07-04 — profile an MoE layer: where the FLOPs and the launches go (starter; the CPU path).

``TorchMoE`` is a small, seeded MoE layer with vLLM's weight layout: ``w13 (E, 2f, d)`` holds each
expert's gate and up projections stacked (``w13_weight`` in vLLM), ``w2 (E, d, f)`` its down
projection (``w2_weight``), and the expert is SwiGLU: ``(silu(x·gateᵀ) * (x·upᵀ))·w2ᵀ``.

It has two forwards that compute the same thing:

* ``forward_naive`` (provided): one (token, expert) pair at a time, two matmuls per assignment;
* ``forward_grouped`` (yours): the lab-01 recipe, router → top-k → permute → one matmul pair
  per expert on its contiguous rows → un-permute and combine.

Every step runs inside a ``record_function`` label (``moe/router``, ``moe/topk``,
``moe/permute``, ``moe/experts``, ``moe/combine``; each expert's matmuls inside
``moe/expert/<e>``), so a profile can be read by step. ``summarize_profile`` turns the profiler's
events into per-label counts: how often the label ran, which ATen ops ran under it, how many
matmuls and how many matmul FLOPs. Those counts are deterministic; times are not, and no test
looks at them.
"""

from __future__ import annotations

from collections import Counter
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch.profiler import record_function

REGIONS = ("moe/router", "moe/topk", "moe/permute", "moe/experts", "moe/combine")
EXPERT_LABEL = "moe/expert/"          # + expert id, nested inside moe/experts
MATMUL_OPS = ("aten::mm", "aten::addmm", "aten::bmm")   # the leaf GEMM ops (aten::matmul only wraps them)


class RegionStats(NamedTuple):
    calls: int          # how many times the label was entered
    ops: Counter        # ATen op name -> count, for ops whose innermost moe/ label is this one
    matmuls: int        # how many of those ops are GEMMs (MATMUL_OPS)
    flops: int          # FLOPs the profiler attributes to those GEMMs


# --------------------------------------------------------------------------- provided: the layer
class TorchMoE(torch.nn.Module):
    """A seeded MoE layer: router ``gate_weight (E, d)``, experts ``w13 (E, 2f, d)``, ``w2 (E, d, f)``."""

    def __init__(self, hidden: int = 32, intermediate: int = 64, num_experts: int = 8, top_k: int = 2,
                 seed: int = 0) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.hidden, self.intermediate, self.num_experts, self.top_k = hidden, intermediate, num_experts, top_k
        self.gate_weight = torch.randn(num_experts, hidden, generator=g) / hidden ** 0.5
        self.w13 = torch.randn(num_experts, 2 * intermediate, hidden, generator=g) / hidden ** 0.5
        self.w2 = torch.randn(num_experts, hidden, intermediate, generator=g) / intermediate ** 0.5

    def expert(self, e: int, rows: torch.Tensor) -> torch.Tensor:
        """Expert ``e`` (SwiGLU) on a block of rows: exactly two matmuls, inside ``moe/expert/<e>``."""
        with record_function(f"{EXPERT_LABEL}{e}"):
            gate_up = rows @ self.w13[e].T
            f = self.intermediate
            return (F.silu(gate_up[:, :f]) * gate_up[:, f:]) @ self.w2[e].T

    def forward_naive(self, x: torch.Tensor) -> torch.Tensor:
        """Token-major: the expert matmuls run once per (token, slot) on a single row."""
        with record_function("moe/router"):
            logits = x @ self.gate_weight.T
        with record_function("moe/topk"):
            vals, ids = torch.topk(logits, self.top_k, dim=-1)
            weights = torch.softmax(vals, dim=-1)
        with record_function("moe/permute"):
            pass                                   # nothing to group: every assignment runs alone
        with record_function("moe/experts"):
            rows = [[self.expert(int(ids[t, j]), x[t:t + 1]) for j in range(self.top_k)] for t in range(x.shape[0])]
        with record_function("moe/combine"):
            out = torch.zeros_like(x)
            for t, per_slot in enumerate(rows):
                for j, y in enumerate(per_slot):
                    out[t] += weights[t, j] * y[0]
        return out

    # ----------------------------------------------------------------------- the lab, part 1
    def forward_grouped(self, x: torch.Tensor) -> torch.Tensor:
        """Expert-major forward with one labelled region per step (see REGIONS).

        router: ``logits = x @ gate_weight.T``; top-k: ``torch.topk`` then softmax over the k
        values; permute: stable ``argsort`` of the flat expert ids, ``bincount`` for the counts,
        gather ``x[order // k]``; experts: ``self.expert(e, block)`` once per expert that got
        rows; combine: put every row back at its flat position, multiply by its gate weight and
        sum each token's k rows.
        """
        raise NotImplementedError(
            "forward_grouped: the router and top-k regions are the same as forward_naive's. Then lab 01's recipe in "
            "torch, each step in its own record_function label: sort the flat expert ids (stably) and count them, "
            "gather each assignment's token row (flat id i is token i // k), call self.expert once per expert "
            "that got rows, and in the combine put every output row back at its flat position before weighting "
            "and summing each token's k rows"
        )

    def forward(self, x: torch.Tensor, mode: str = "grouped") -> torch.Tensor:
        return self.forward_grouped(x) if mode == "grouped" else self.forward_naive(x)


# --------------------------------------------------------------------------- provided: profiling
def profile_forward(layer: TorchMoE, x: torch.Tensor, mode: str = "grouped"):
    """One warm-up call, then one profiled call. Returns the profiler's list of events.

    ``torch.autograd.profiler.profile`` is the engine under ``torch.profiler.profile`` (which adds
    schedules, CUDA activities and trace export, and imports the inductor config on entry, several
    seconds on a small machine); on CPU it records the same ATen events.
    """
    with torch.no_grad():
        layer(x, mode)
        with torch.autograd.profiler.profile(with_flops=True, record_shapes=True) as prof:
            layer(x, mode)
    return prof.function_events


def region_totals(summary: dict[str, RegionStats]) -> dict[str, RegionStats]:
    """Fold every ``moe/expert/<e>`` label into ``moe/experts`` (calls of the parent region kept)."""
    out: dict[str, RegionStats] = {}
    for name, s in summary.items():
        key = "moe/experts" if name.startswith(EXPERT_LABEL) else name
        prev = out.get(key)
        if prev is None:
            out[key] = RegionStats(s.calls if key == name else 0, Counter(s.ops), s.matmuls, s.flops)
        else:
            calls = prev.calls + (s.calls if key == name else 0)
            out[key] = RegionStats(calls, prev.ops + s.ops, prev.matmuls + s.matmuls, prev.flops + s.flops)
    return out


# --------------------------------------------------------------------------- the lab, part 2
def summarize_profile(events) -> dict[str, RegionStats]:
    """Per-label statistics of a profile.

    Labels are the events whose name starts with ``moe/``; ``calls`` counts them. Every other
    event is an ATen op: walk up its ``cpu_parent`` chain to the nearest ``moe/`` label (the
    innermost one) and count it there; ops under no label are ignored. ``matmuls`` counts the
    ops named in ``MATMUL_OPS`` and ``flops`` sums their ``.flops``.
    """
    raise NotImplementedError(
        "summarize_profile: a 'moe/' event is one call of its label; any other event is an op, charged to the "
        "NEAREST 'moe/' label among its ancestors (follow cpu_parent upwards; ops with no such ancestor are "
        "ignored). Only the leaf GEMMs in MATMUL_OPS count as matmuls and contribute their .flops"
    )


# --------------------------------------------------------------------------- what you should see
SHOWN_OPS = ("aten::mm", "aten::topk", "aten::softmax", "aten::argsort", "aten::bincount", "aten::index",
             "aten::silu", "aten::cat", "aten::index_put_", "aten::mul", "aten::sum", "aten::add_")


def main() -> None:
    import sys

    T, d, f, E, k = 16, 32, 64, 8, 2
    layer = TorchMoE(hidden=d, intermediate=f, num_experts=E, top_k=k, seed=0)
    x = torch.randn(T, d, generator=torch.Generator().manual_seed(1))
    if "--table" in sys.argv:        # the profiler's own table, with (machine-dependent) times
        for mode in ("grouped", "naive"):
            print(f"--- {mode} ---")
            print(profile_forward(layer, x, mode).key_averages().table(sort_by="self_cpu_time_total", row_limit=15))
        return
    with torch.no_grad():
        ids = torch.topk(x @ layer.gate_weight.T, k, dim=-1).indices
        same = torch.allclose(layer(x, "grouped"), layer(x, "naive"), atol=1e-5)
    counts = torch.bincount(ids.reshape(-1), minlength=E).tolist()
    print(f"TorchMoE: T={T} tokens, hidden {d}, intermediate {f}, {E} experts, top-{k};"
          f" w13 {tuple(layer.w13.shape)}, w2 {tuple(layer.w2.shape)}")
    print(f"tokens per expert: {counts}; grouped output == naive output: {same}")
    runs = {mode: summarize_profile(profile_forward(layer, x, mode)) for mode in ("grouped", "naive")}
    totals = {mode: region_totals(s) for mode, s in runs.items()}
    print(
        f"{'region':<12} | {'grouped: calls':>14} {'GEMMs':>6} {'GEMM FLOPs':>11} | "
        f"{'naive: calls':>12} {'GEMMs':>6} {'GEMM FLOPs':>11}"
    )
    for r in REGIONS:
        g, n = totals["grouped"][r], totals["naive"][r]
        print(f"{r:<12} | {g.calls:>14} {g.matmuls:>6} {g.flops:>11,} | {n.calls:>12} {n.matmuls:>6} {n.flops:>11,}")
    per_e = {mode: [s.get(f"{EXPERT_LABEL}{e}") for e in range(E)] for mode, s in runs.items()}
    print("expert labels, GEMMs per expert: grouped "
          + str([p.matmuls if p else 0 for p in per_e["grouped"]])
          + ", naive " + str([p.matmuls if p else 0 for p in per_e["naive"]]))
    total = sum(t.flops for t in totals["grouped"].values())
    print("GEMM FLOP share (grouped): " + ", ".join(
        f"{r.split('/')[1]} {totals['grouped'][r].flops / total:.1%}" for r in REGIONS if totals["grouped"][r].flops))
    print("ATen ops seen per region (grouped):")
    for r in REGIONS:
        seen = sorted(op for op in totals["grouped"][r].ops if op in SHOWN_OPS)
        print(f"  {r:<12}: {', '.join(seen) if seen else '(none)'}")
    D, FF = 4096, 14336
    router, experts = 2 * D * 8, 2 * k * 3 * D * FF
    print(f"Mixtral-8x7B scale, per token: router {router:,} FLOPs, experts {experts:,} FLOPs"
          f" -> router share {router / (router + experts):.4%}")


if __name__ == "__main__":
    main()
