"""Lab 10-03 starter: the pipeline bubble, counted on a grid and derived as a formula.

``p`` stages (one GPU each, a contiguous range of layers) and ``m`` microbatches. Every
microbatch takes one tick per stage, in stage order, and a stage works on one microbatch at a
time. Microbatch b is at stage s at tick ``s + b``; the grid is ``p × (p + m − 1)`` cells, of
which ``m · p`` do work. Stuck? ``python -m course hint 10-03`` shows code-level hints.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _check(num_stages: int, num_microbatches: int) -> None:
    for name, v in (("num_stages", num_stages), ("num_microbatches", num_microbatches)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be an int >= 1, got {v!r}")


def pipeline_total_ticks(num_stages: int, num_microbatches: int) -> int:
    """Ticks from the first microbatch entering stage 0 to the last leaving stage p − 1."""
    raise NotImplementedError(
        'pipeline_total_ticks: _check the inputs, then the last microbatch enters stage 0 at tick m-1 and '
        'needs p ticks: p + m - 1'
    )


def bubble_fraction(num_stages: int, num_microbatches: int) -> float:
    """Idle share of the ``p × ticks`` grid: ``(p − 1) / (p + m − 1)``."""
    raise NotImplementedError(
        'bubble_fraction: _check, then 1 - useful / capacity: count the stage-ticks that do work and the '
        'stage-ticks the whole run occupies (hint 1)'
    )


def simulate_schedule(num_stages: int, num_microbatches: int) -> list[list[int | None]]:
    """The grid: ``grid[stage][tick]`` is the microbatch that stage runs at that tick, or None (idle)."""
    raise NotImplementedError(
        'simulate_schedule: a p x pipeline_total_ticks(p, m) grid of None; microbatch b sits at stage s at tick s + b'
    )


def min_microbatches_for_bubble(num_stages: int, budget: float) -> int:
    """The smallest m with ``bubble_fraction(num_stages, m) <= budget``.

    Algebra gives ``m >= (p − 1)(1 / budget − 1)``; a float ceiling of that can land one off, so
    the answer is checked against ``bubble_fraction`` itself. ``ValueError`` for a budget outside
    ``[0, 1]``, or 0 with more than one stage (no finite m reaches it).
    """
    raise NotImplementedError(
        "min_microbatches_for_bubble: validate the budget (ValueError outside [0, 1]; budget 0 with p > "
        "1 is 'never' met), solve bubble_fraction(p, m) <= budget for m, then confirm with bubble_fraction "
        "itself, since a rounded-up float can land one off (hint 2)"
    )


def pipeline_time(stage_times: Sequence[float], num_microbatches: int) -> float:
    """Finish time when stage s takes ``stage_times[s]`` per microbatch (each stage waits for its input).

    A stage starts microbatch b when it has finished b − 1 and the previous stage has finished b.
    """
    raise NotImplementedError(
        'pipeline_time: validate stage_times (non-empty, all > 0); for each microbatch walk the stages: '
        'done[s] = max(done[s], ready) + t; ready = done[s]; return done[-1]'
    )


# -- the same straggler rule in expert parallelism: the busiest rank sets the step ----------------
def _check_eplb(expert_loads: Sequence[float], num_slots: int, num_ranks: int = 1) -> None:
    if not expert_loads or any(isinstance(x, bool) or not isinstance(x, (int, float)) or not x >= 0
                               for x in expert_loads):
        raise ValueError(f"expert_loads must be a non-empty list of loads >= 0, got {expert_loads!r}")
    for name, v in (("num_slots", num_slots), ("num_ranks", num_ranks)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be an int >= 1, got {v!r}")
    if num_slots < len(expert_loads):
        raise ValueError(f"{num_slots} slots cannot hold {len(expert_loads)} experts: every expert needs one")
    if num_slots % num_ranks:
        raise ValueError(f"{num_slots} slots do not split evenly over {num_ranks} ranks")


def eplb_replica_counts(expert_loads: Sequence[float], num_slots: int) -> list[int]:
    """Replicas per expert when ``num_slots`` expert slots hold ``len(expert_loads)`` experts.

    Every expert gets one slot; each spare slot then goes, one at a time, to the expert whose load
    per replica (``load / replicas``) is highest now, the lowest index on a tie. A replica serves
    an equal share of its expert's tokens.
    """
    raise NotImplementedError(
        "call _check_eplb; start every count at 1; for each spare slot add a replica to the expert with the "
        "highest load / count (first one on a tie)"
    )


def eplb_rank_loads(expert_loads: Sequence[float], num_slots: int, num_ranks: int) -> list[float]:
    """Load of each rank after replicating (``eplb_replica_counts``) and packing the replicas.

    Each rank holds ``num_slots / num_ranks`` replicas. Replicas are placed heaviest first
    (``load / replicas`` each), every one on the rank with the least load so far among the ranks
    that still have a free slot, the lowest index on a tie.
    """
    raise NotImplementedError(
        "call _check_eplb; list every replica's load (load / count, count times per expert), heaviest first; "
        "put each on the least-loaded rank that still has a free slot (num_slots // num_ranks per rank)"
    )


def render(grid: list[list[int | None]]) -> str:
    """ASCII picture of a schedule: one row per stage, ``.`` for idle."""
    rows = []
    for s, row in enumerate(grid):
        cells = " ".join("." if b is None else str(b + 1) for b in row)
        rows.append(f"  GPU{s} | {cells}")
    return "\n".join(rows)


def plot(path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    ms = list(range(1, 129))
    for p in (2, 4, 8, 16):
        ax.plot(ms, [100 * bubble_fraction(p, m) for m in ms], label=f"p = {p} stages")
    ax.axhline(10, color="gray", lw=0.8, ls="--")
    ax.text(128, 11, "10% budget", ha="right", color="gray")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("microbatches in flight (m)")
    ax.set_ylabel("bubble: idle share of the grid (%)")
    ax.set_title("Pipeline bubble (p − 1) / (p + m − 1)")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, metadata={"Software": None})
    plt.close(fig)


def main() -> None:
    if "--plot" in sys.argv:
        plot(HERE / "bubble.png")
        print("wrote bubble.png")
        return
    print("p = 2 stages, m = 4 microbatches (1..4 = microbatch, . = idle):")
    print(render(simulate_schedule(2, 4)))
    print(f"  ticks {pipeline_total_ticks(2, 4)}, bubble {bubble_fraction(2, 4):.1%} = 1/5")
    print("p = 4, m = 1 (no microbatching):")
    print(render(simulate_schedule(4, 1)))
    print(f"  ticks {pipeline_total_ticks(4, 1)}, bubble {bubble_fraction(4, 1):.0%}")
    print("\nbubble by p (rows) and m (columns):")
    cols = (1, 2, 4, 8, 16, 64)
    print("   p | " + " | ".join(f"m={m:<4}" for m in cols))
    for p in (2, 4, 8, 16):
        print(f"  {p:>2} | " + " | ".join(f"{bubble_fraction(p, m):6.1%}" for m in cols))
    print("\nfewest microbatches for a bubble budget:")
    for p, budget in ((2, 0.10), (4, 0.10), (8, 0.10), (16, 0.10), (8, 0.25)):
        print(f"  p={p:>2}, budget {budget:.1%}: m = {min_microbatches_for_bubble(p, budget)}")
    exact = bubble_fraction(2, 48)  # 1/49, met exactly by m = 48
    naive = math.ceil((2 - 1) * (1 / exact - 1))
    print(f"  p= 2, budget 1/49 (the bubble at m=48): m = {min_microbatches_for_bubble(2, exact)}"
          f" (a bare float ceiling says {naive})")
    print("\na straggler sets the clock (4 stages, 16 microbatches, time per microbatch):")
    for times in ((1, 1, 1, 1), (1, 2, 1, 1), (1.5, 1.5, 0.5, 0.5)):
        balanced = pipeline_time((sum(times) / 4,) * 4, 16)
        print(f"  stages {times}: finish at {pipeline_time(times, 16):g} (balanced would be {balanced:g})")

    loads = [90, 10, 10, 10, 40, 10, 20, 10]
    print(f"\nexpert parallelism: 8 experts with loads {loads} on 4 ranks")
    static = [sum(loads[2 * r:2 * r + 2]) for r in range(4)]
    print(f"  no replication (2 experts per rank): rank loads {static}, busiest {max(static)}")
    for slots in (8, 12, 16):
        counts, per_rank = eplb_replica_counts(loads, slots), eplb_rank_loads(loads, slots, 4)
        print(f"  EPLB with {slots:>2} slots: replicas {counts}, rank loads {[round(x, 2) for x in per_rank]},"
              f" busiest {max(per_rank):g} (ideal {sum(loads) / 4:g})")


if __name__ == "__main__":
    main()
