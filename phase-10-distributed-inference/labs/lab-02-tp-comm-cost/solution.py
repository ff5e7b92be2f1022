"""Lab 10-02 reference: the bill for tensor parallelism's all-reduces, from a ring cost model.

A ring all-reduce over N ranks is a reduce-scatter then an all-gather: 2(N-1) sequential hops,
each moving 1/N of the payload. Time = bytes on the wire / bandwidth + hops × per-hop latency.
Every link figure here is a datasheet or rule-of-thumb number, so every time this lab prints is
*predicted* by that formula, not measured.
"""

from __future__ import annotations

import math
from typing import NamedTuple


class Link(NamedTuple):
    name: str
    bandwidth_bytes_per_s: float  # one direction, per rank
    latency_s: float  # per hop


# Predicted figures only. NVLink 4 on H100 SXM: 900 GB/s total, 450 GB/s each way (NVIDIA H100
# datasheet); ~3 µs per hop for a small message. 10 GbE: 1.25 GB/s, ~50 µs per hop through the
# kernel TCP stack. InfiniBand NDR: 400 Gb/s = 50 GB/s, 2-5 µs (RDMA; the
# high end here).
LINKS = {
    "nvlink": Link("NVLink 4 (H100 SXM)", 450e9, 3e-6),
    "infiniband": Link("InfiniBand NDR 400 Gb/s", 50e9, 5e-6),
    "ethernet": Link("10 GbE", 1.25e9, 50e-6),
}

DECODE_STEP_S = 8e-3  # a decode step of an 8B model at batch 1 on one GPU (Phase 00 lab 04's roofline)
HIDDEN_8B, LAYERS_8B = 4096, 32


def _positive(name: str, value: float, allow_zero: bool = False) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
        raise ValueError(f"{name} must be a number, got {value!r}")
    if value < 0 or (value == 0 and not allow_zero):
        raise ValueError(f"{name} must be {'>= 0' if allow_zero else '> 0'}, got {value}")


def _ranks(num_ranks: int) -> None:
    if isinstance(num_ranks, bool) or not isinstance(num_ranks, int) or num_ranks < 1:
        raise ValueError(f"num_ranks must be an int >= 1, got {num_ranks!r}")


def allreduce_payload_bytes(batch_tokens: int, hidden: int, dtype_bytes: int = 2) -> int:
    """Bytes one all-reduce sums: one activation row (``hidden`` values) per token in the step."""
    for name, v in (("batch_tokens", batch_tokens), ("hidden", hidden), ("dtype_bytes", dtype_bytes)):
        _positive(name, v, allow_zero=name == "batch_tokens")
    return batch_tokens * hidden * dtype_bytes


def ring_allreduce_traffic_per_rank(payload_bytes: float, num_ranks: int) -> float:
    """Bytes each rank sends in a ring all-reduce: ``2 (N - 1) / N × payload`` (0 when alone)."""
    _positive("payload_bytes", payload_bytes, allow_zero=True)
    _ranks(num_ranks)
    return 2 * (num_ranks - 1) * payload_bytes / num_ranks


def allreduce_time_s(payload_bytes: float, num_ranks: int, link: Link) -> float:
    """Predicted time of one ring all-reduce: traffic / bandwidth + ``2 (N - 1)`` hop latencies."""
    _positive("bandwidth", link.bandwidth_bytes_per_s)
    _positive("latency", link.latency_s, allow_zero=True)
    traffic = ring_allreduce_traffic_per_rank(payload_bytes, num_ranks)
    return traffic / link.bandwidth_bytes_per_s + 2 * (num_ranks - 1) * link.latency_s


def tp_comm_time_per_step(
    batch_tokens: int,
    num_ranks: int,
    link: Link,
    hidden: int = HIDDEN_8B,
    num_layers: int = LAYERS_8B,
    dtype_bytes: int = 2,
    allreduces_per_layer: int = 2,
    embedding_allreduces: int = 1,
) -> float:
    """All-reduce time of one forward step: ``num_layers × allreduces_per_layer + embedding_allreduces``.

    Two per layer: the attention output projection and the MLP down projection (each the row
    half of a column → row pair). One more for the vocabulary-parallel embedding: each rank looks
    up only the ids in its shard and the sum fills in the rest. A 32-layer model: 2 × 32 + 1 = 65.
    """
    _positive("num_layers", num_layers)
    _positive("allreduces_per_layer", allreduces_per_layer, allow_zero=True)
    _positive("embedding_allreduces", embedding_allreduces, allow_zero=True)
    payload = allreduce_payload_bytes(batch_tokens, hidden, dtype_bytes)
    count = num_layers * allreduces_per_layer + embedding_allreduces
    return count * allreduce_time_s(payload, num_ranks, link)


def comm_fraction(compute_s: float, comm_s: float) -> float:
    """Share of a step spent communicating, with no overlap: ``comm / (compute + comm)``."""
    _positive("compute_s", compute_s, allow_zero=True)
    _positive("comm_s", comm_s, allow_zero=True)
    if compute_s + comm_s == 0:
        raise ValueError("a step with no compute and no communication has no fraction")
    return comm_s / (compute_s + comm_s)


def latency_bandwidth_crossover_tokens(num_ranks: int, link: Link, hidden: int = HIDDEN_8B,
                                       dtype_bytes: int = 2) -> int:
    """Smallest batch (tokens, at least 1) whose bandwidth term is at least its latency term.

    The bandwidth term of ``k`` tokens is ``ring_allreduce_traffic_per_rank(payload of k tokens) /
    bandwidth``; the latency term is ``2 (N − 1) × latency``. ``ValueError`` for one rank.
    """
    _ranks(num_ranks)
    if num_ranks == 1:
        raise ValueError("one rank has no communication, so no crossover")
    latency = 2 * (num_ranks - 1) * link.latency_s

    def bandwidth_term(tokens: int) -> float:
        payload = allreduce_payload_bytes(tokens, hidden, dtype_bytes)
        return ring_allreduce_traffic_per_rank(payload, num_ranks) / link.bandwidth_bytes_per_s

    tokens = max(1, math.ceil(latency / bandwidth_term(1)))
    while tokens > 1 and bandwidth_term(tokens - 1) >= latency:  # a float ceiling can land one off
        tokens -= 1
    while bandwidth_term(tokens) < latency:
        tokens += 1
    return tokens


def main() -> None:
    decode, prefill = allreduce_payload_bytes(1, HIDDEN_8B), allreduce_payload_bytes(2048, HIDDEN_8B)
    print(f"8B model (hidden {HIDDEN_8B}, {LAYERS_8B} layers, bf16): payload per all-reduce")
    print(f"  decode, 1 token: {decode:,} B   prefill chunk, 2048 tokens: {prefill:,} B")
    print(f"  {LAYERS_8B} layers x 2 all-reduces + 1 (the embedding) = {LAYERS_8B * 2 + 1} all-reduces per step")
    print("ring traffic per rank, in payloads: " + "  ".join(
        f"N={n}: {ring_allreduce_traffic_per_rank(1, n):.3f}" for n in (1, 2, 4, 8, 64)))
    print(f"\nPREDICTED decode step at batch 1 (compute {DECODE_STEP_S * 1e3:.0f} ms, no overlap):")
    print("link                     | TP | comm/step ms | latency part ms | fraction | prefill-2048 comm/step ms")
    for key in ("nvlink", "infiniband", "ethernet"):
        link = LINKS[key]
        for n in (2, 4, 8):
            comm = tp_comm_time_per_step(1, n, link)
            lat = (LAYERS_8B * 2 + 1) * 2 * (n - 1) * link.latency_s
            print(f"{link.name:<24} | {n:>2} | {comm * 1e3:>12.3f} | {lat * 1e3:>15.3f} |"
                  f" {comm_fraction(DECODE_STEP_S, comm):>8.1%} | {tp_comm_time_per_step(2048, n, link) * 1e3:>9.2f}")
    eth = LINKS["ethernet"]
    comm2 = tp_comm_time_per_step(1, 2, eth)
    print(f"10 GbE, TP=2, if compute halves to {DECODE_STEP_S / 2 * 1e3:.0f} ms: "
          f"{comm_fraction(DECODE_STEP_S / 2, comm2):.1%}")
    print("\nwhich knob helps one all-reduce more (TP=2, 10 GbE)?")
    for label, payload in (("decode 1 token", decode), ("prefill 2048 tokens", prefill)):
        base = allreduce_time_s(payload, 2, eth)
        half_lat = allreduce_time_s(payload, 2, eth._replace(latency_s=eth.latency_s / 2))
        dbl_bw = allreduce_time_s(payload, 2, eth._replace(bandwidth_bytes_per_s=eth.bandwidth_bytes_per_s * 2))
        print(f"  {label:<20}: {base * 1e6:>9.1f} us | halve latency {half_lat * 1e6:>9.1f} us |"
              f" double bandwidth {dbl_bw * 1e6:>9.1f} us")
    print("\nbatch (tokens) where bandwidth starts to dominate, TP=2 / TP=8:")
    for key in ("nvlink", "infiniband", "ethernet"):
        a, b = (latency_bandwidth_crossover_tokens(n, LINKS[key]) for n in (2, 8))
        print(f"  {LINKS[key].name:<24}: {a:>5} / {b:>5}")


if __name__ == "__main__":
    main()
