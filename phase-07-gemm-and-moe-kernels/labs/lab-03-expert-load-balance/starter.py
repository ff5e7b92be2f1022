"""Lab 07-03 — expert load balance: the MoE serving problem (starter: write the six functions).

With expert parallelism (EP) every device holds some of the experts, and an MoE layer finishes
only when the busiest device finishes: the step is a barrier. Counting (token, expert)
assignments is enough to see what skewed routing costs:

* ``expert_loads``   assignments per expert (a histogram of ``topk_ids``);
* ``imbalance``      max load / mean load: how many "fair shares" the hottest expert carries;
* ``ep_step_time``   the busiest device's load (experts placed round-robin, ``e % num_devices``);
* ``parallel_efficiency``  useful work / (devices × step): 1.0 when perfectly balanced;
* ``dropped_tokens`` what a training-style capacity factor would throw away;
* ``expected_active_experts``  how many experts a decode batch touches (their weights are read).

Two seeded routers are provided as fixtures. ``hot_router`` reconstructs the scenario the lab's
numbers come from: 64 tokens, top-2, 8 experts, and every one of the 128 assignment slots goes to
the hot expert with probability 0.6, otherwise to a uniformly random expert (the hot one
included); slots are drawn independently, so a token can land on the hot expert twice.
"""

from __future__ import annotations

import math

import numpy as np


# --------------------------------------------------------------------------- provided fixtures
def uniform_router(num_tokens: int, k: int, num_experts: int, seed: int = 0) -> np.ndarray:
    """Each token picks k *distinct* experts uniformly at random (a well-balanced router)."""
    rng = np.random.default_rng(seed)
    return np.argsort(rng.random((num_tokens, num_experts)), axis=1)[:, :k]


def hot_router(num_tokens: int = 64, k: int = 2, num_experts: int = 8, hot_expert: int = 7,
               p_hot: float = 0.6, seed: int = 42) -> np.ndarray:
    """Every (token, slot) independently: the hot expert with probability ``p_hot``, else uniform
    over all experts. Expected hot share = p_hot + (1 - p_hot) / num_experts (0.65 here)."""
    rng = np.random.default_rng(seed)
    hot = rng.random((num_tokens, k)) < p_hot
    other = rng.integers(0, num_experts, size=(num_tokens, k))
    return np.where(hot, hot_expert, other)


# --------------------------------------------------------------------------- the lab
def expert_loads(topk_ids: np.ndarray, num_experts: int) -> np.ndarray:
    """Assignments per expert, shape ``(num_experts,)``. Every entry of ``topk_ids`` counts once,
    so a token routed to the same expert twice counts twice, and unused experts count 0."""
    raise NotImplementedError(
        "expert_loads: a histogram of every entry of topk_ids (a token that picks the same expert twice counts twice); "
        "make sure experts nobody picked still get a 0 and the result has num_experts entries"
    )


def imbalance(loads: np.ndarray) -> float:
    """Max load over mean load: 1.0 is perfect balance; 5 means the hottest expert does five fair shares."""
    raise NotImplementedError(
        "imbalance: how many 'fair shares' the busiest expert carries; a fair share is the load every expert would "
        "have if the total were spread evenly"
    )


def ep_step_time(loads: np.ndarray, num_devices: int, placement: np.ndarray | None = None) -> float:
    """The busiest device's load. Expert ``e`` lives on ``placement[e]`` (default round-robin,
    ``e % num_devices``); a device's load is the sum of its experts' loads (co-located experts add)."""
    raise NotImplementedError(
        "ep_step_time: default placement puts expert e on device e % num_devices; add up the loads of the experts "
        "that share a device, and remember that the layer is a barrier: everyone waits for the slowest device"
    )


def parallel_efficiency(loads: np.ndarray, num_devices: int, placement: np.ndarray | None = None) -> float:
    """Useful work over paid-for work: ``sum(loads) / (num_devices × ep_step_time)``."""
    raise NotImplementedError(
        "parallel_efficiency: useful work (all assignments) divided by the work the devices are paid for "
        "(every device busy for the whole step)"
    )


def dropped_tokens(loads: np.ndarray, capacity_factor: float) -> int:
    """Assignments a capacity limit would drop. Each expert keeps at most
    ``capacity = floor(capacity_factor × mean load)`` assignments; the overflow is dropped."""
    raise NotImplementedError(
        "dropped_tokens: each expert keeps at most capacity_factor x (mean load) assignments, rounded DOWN to a whole "
        "number; only the part of a load above that is dropped, never the whole expert"
    )


def expected_active_experts(batch: int, k: int, num_experts: int) -> float:
    """Expected number of distinct experts touched by ``batch`` tokens under uniform top-k routing:
    one token misses a given expert with probability ``(E - k) / E``."""
    raise NotImplementedError(
        "expected_active_experts: by linearity, sum over experts the probability that at least one token of the "
        "batch picks it; one token with k distinct uniform picks misses a given expert with probability (E - k) / E"
    )


# --------------------------------------------------------------------------- what you should see
def main() -> None:
    T, K, E, D = 64, 2, 8, 8
    ids = hot_router(T, K, E, hot_expert=7, p_hot=0.6, seed=42)
    loads = expert_loads(ids, E)
    print(f"hot router: {T} tokens x top-{K} = {T * K} assignments over {E} experts;"
          f" expected hot share 0.6 + 0.4/8 = 0.65 -> {0.65 * T * K:.1f} assignments")
    print(f"  seed 42 loads        : {loads.tolist()}  (mean {loads.mean():.0f})")
    print(f"  tokens sent to expert 7 by both slots: {int(np.sum((ids == 7).all(axis=1)))}")
    print(f"  imbalance (max/mean) : {imbalance(loads):.2f}")
    print(f"  EP step on {D} devices: {ep_step_time(loads, D):.0f} vs {loads.sum() / D:.0f} if balanced"
          f" -> {ep_step_time(loads, D) / (loads.sum() / D):.2f}x slower, efficiency {parallel_efficiency(loads, D):.1%}")
    dev4 = np.bincount(np.arange(E) % 4, weights=loads, minlength=4).astype(int)
    print(f"  on 4 devices (round-robin) device loads {dev4.tolist()} -> step {ep_step_time(loads, 4):.0f}")
    for cf in (1.0, 1.25, 2.0, 5.25):
        cap = math.floor(cf * loads.sum() / E)
        print(f"  capacity factor {cf:<4}: capacity {cap:>2} per expert, drops {dropped_tokens(loads, cf):>2} of {T * K}")
    drops = [dropped_tokens(expert_loads(hot_router(seed=s), E), 1.0) for s in range(200)]
    print(f"  cf 1.0 over seeds 0..199: drops min {min(drops)}, mean {np.mean(drops):.1f}, max {max(drops)}")
    print()
    u = expert_loads(uniform_router(800, 2, 8, seed=0), 8)
    print(f"uniform router, 1600 assignments over 8 experts: loads {u.tolist()}, imbalance {imbalance(u):.3f}")
    print("uniform router, top-2 over 64 experts, mean imbalance over 50 seeds:")
    for batch in (8, 64, 512, 4096):
        imb = np.mean([imbalance(expert_loads(uniform_router(batch, 2, 64, seed=s), 64)) for s in range(50)])
        print(f"  batch {batch:>4}: {batch * 2:>5} assignments, {batch * 2 / 64:>6.2f} per expert on average,"
              f" imbalance {imb:5.2f}")
    print()
    print("expected experts touched per step (uniform routing), i.e. expert weights read from HBM:")
    for name, e, k in (("Mixtral-8x7B  (8, top-2)", 8, 2), ("DeepSeek-V3 (256, top-8)", 256, 8)):
        row = ", ".join(f"batch {b}: {expected_active_experts(b, k, e):.1f}" for b in (1, 8, 64, 256))
        print(f"  {name}: {row}")
    print()
    hidden, k, layers = 7168, 8, 58          # DeepSeek-V3: hidden 7168, top-8, 58 of its 61 layers are MoE
    per_copy = hidden * 2                    # one bf16 activation row
    print(f"all-to-all, DeepSeek-V3: one token row = {hidden} x 2 B = {per_copy:,} B; dispatch to {k} experts ="
          f" {k * per_copy:,} B per token per MoE layer (and as much back in the combine);"
          f" x {layers} MoE layers = {2 * k * per_copy * layers / 1e6:.1f} MB per token per forward")


if __name__ == "__main__":
    main()
