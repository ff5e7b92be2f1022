"""Lab 10-02 tests: payload, ring traffic, and what TP's all-reduces cost per step on each link."""

import math

import pytest

from course.runtime import lab_module

lab = lab_module(__file__)   # solution.py by default; LAB_IMPL=starter grades starter.py



def link(bandwidth, latency):
    return lab.Link("test link", bandwidth, latency)


ETH = (1.25e9, 50e-6)  # 10 GbE
NVL = (450e9, 3e-6)  # NVLink 4, one direction


def test_payload_is_one_activation_row_per_token():
    assert lab.allreduce_payload_bytes(1, 4096) == 8192, "decode: 1 token x 4096 hidden x 2 bytes (bf16) = 8 KiB"
    assert lab.allreduce_payload_bytes(2048, 4096) == 16_777_216, "a 2048-token prefill chunk: 2048 x 4096 x 2 = 16 MiB"
    assert lab.allreduce_payload_bytes(3, 8192, dtype_bytes=4) == 3 * 8192 * 4, "every factor counts: tokens, hidden, dtype"
    assert lab.allreduce_payload_bytes(0, 4096) == 0, "an empty step sums nothing"


def test_ring_traffic_formula():
    assert lab.ring_allreduce_traffic_per_rank(8192, 1) == 0, "a rank alone sends nothing"
    assert lab.ring_allreduce_traffic_per_rank(8192, 2) == 8192, "N=2: 2(N-1)/N = exactly one payload per rank"
    assert lab.ring_allreduce_traffic_per_rank(8192, 8) == 14336, "N=8: 2 x 7/8 = 1.75 payloads"
    big = lab.ring_allreduce_traffic_per_rank(1.0, 1024)
    assert 1.99 < big < 2.0, f"per-rank traffic tends to 2 payloads as N grows (reduce-scatter + all-gather), got {big}"


def test_decode_step_comm_on_nvlink_is_noise():
    comm = lab.tp_comm_time_per_step(1, 2, link(*NVL))
    assert math.isclose(comm, 65 * (8192 / 450e9 + 2 * 3e-6), rel_tol=1e-12), (
        f"65 all-reduces (2 per layer x 32 + the embedding's) x (8 KiB / 450 GB/s + 2 hops x 3 us), got {comm}"
    )
    layers_only = lab.tp_comm_time_per_step(1, 2, link(*NVL), embedding_allreduces=0)
    assert math.isclose(layers_only, 64 * (8192 / 450e9 + 2 * 3e-6), rel_tol=1e-12), (
        f"embedding_allreduces=0 leaves the layers' 64, got {layers_only}"
    )
    assert comm < 1e-3, f"TP=2 decode comm on NVLink should be well under 1 ms, got {comm * 1e3:.3f} ms"
    assert lab.comm_fraction(8e-3, comm) < 0.10, "under 10% of an 8 ms decode step"


def test_decode_step_comm_on_ethernet_is_fatal():
    latency_only = lab.tp_comm_time_per_step(1, 2, link(1e30, 50e-6))
    assert math.isclose(latency_only, 65 * 2 * 50e-6, rel_tol=1e-9), (
        f"latency alone: 65 all-reduces x 2(N-1) = 2 hops x 50 us = 6.5 ms, got {latency_only * 1e3:.3f} ms"
    )
    comm = lab.tp_comm_time_per_step(1, 2, link(*ETH))
    assert lab.comm_fraction(8e-3, comm) > 0.40, f"10 GbE TP=2 should eat > 40% of the step, got {comm * 1e3:.2f} ms"


def test_latency_dominates_small_payloads():
    payload = lab.allreduce_payload_bytes(1, 4096)
    base = lab.allreduce_time_s(payload, 2, link(*ETH))
    half_latency = lab.allreduce_time_s(payload, 2, link(ETH[0], ETH[1] / 2))
    double_bw = lab.allreduce_time_s(payload, 2, link(ETH[0] * 2, ETH[1]))
    assert half_latency < double_bw < base, "decode: halving latency must help more than doubling bandwidth"


def test_prefill_payloads_shift_the_balance_to_bandwidth():
    payload = lab.allreduce_payload_bytes(2048, 4096)
    for bw, lat in (ETH, NVL):
        half_latency = lab.allreduce_time_s(payload, 2, link(bw, lat / 2))
        double_bw = lab.allreduce_time_s(payload, 2, link(bw * 2, lat))
        assert double_bw < half_latency, f"prefill ({bw:.3g} B/s): doubling bandwidth must beat halving latency"


def test_more_ranks_more_overhead():
    for bw, lat in (ETH, NVL):
        times = [lab.tp_comm_time_per_step(1, n, link(bw, lat)) for n in (2, 4, 8)]
        assert times[0] < times[1] < times[2], f"TP=8 must cost more than TP=4 and TP=2, got {times}"
    assert lab.tp_comm_time_per_step(1, 1, link(*ETH)) == 0, "TP=1 has no all-reduce at all"


def test_comm_fraction_is_share_of_the_whole_step():
    assert lab.comm_fraction(1.0, 1.0) == 0.5, "comm / (compute + comm), not comm / compute"
    assert lab.comm_fraction(0.0, 2.0) == 1.0 and lab.comm_fraction(3.0, 0.0) == 0.0


def test_every_parameter_scales_the_bill():
    base = lab.tp_comm_time_per_step(16, 2, link(*ETH), hidden=4096, num_layers=32, dtype_bytes=2)
    lat = 65 * 2 * ETH[1]  # 2 x 32 layers + the embedding's, 2 hops each
    bw_part = base - lat
    for kwargs, factor in [({"hidden": 8192}, 2), ({"dtype_bytes": 4}, 2)]:
        got = lab.tp_comm_time_per_step(16, 2, link(*ETH), **kwargs) - lat
        assert math.isclose(got, factor * bw_part, rel_tol=1e-9), f"{kwargs} doubles the bandwidth part only"
    one = base / 65  # one all-reduce of this payload
    assert math.isclose(lab.tp_comm_time_per_step(16, 2, link(*ETH), num_layers=80), 161 * one, rel_tol=1e-12)
    assert math.isclose(lab.tp_comm_time_per_step(16, 2, link(*ETH), allreduces_per_layer=1), 33 * one, rel_tol=1e-12)
    assert math.isclose(lab.tp_comm_time_per_step(16, 2, link(*ETH), allreduces_per_layer=0), one, rel_tol=1e-12), (
        "no per-layer all-reduces still leaves the embedding's one"
    )
    assert lab.tp_comm_time_per_step(16, 2, link(*ETH), allreduces_per_layer=0, embedding_allreduces=0) == 0


def test_latency_bandwidth_crossover_is_exact():
    def bandwidth_term(tokens, n, bw):  # same operations, same order, as the docstring's definition
        return 2 * (n - 1) * (tokens * 4096 * 2) / n / bw

    for n in (2, 4, 8):
        for bw, lat in (ETH, NVL):
            k = lab.latency_bandwidth_crossover_tokens(n, link(bw, lat))
            latency = 2 * (n - 1) * lat
            assert bandwidth_term(k, n, bw) >= latency > bandwidth_term(k - 1, n, bw), (
                f"N={n}: {k} tokens is not the first batch whose bandwidth term reaches the latency term"
            )
    assert lab.latency_bandwidth_crossover_tokens(2, link(*ETH)) == 16, "10 GbE TP=2: 100 us x 1.25 GB/s / 8 KiB = 15.3"
    got = lab.latency_bandwidth_crossover_tokens(2, link(2.4576e9, 5e-6))
    assert got == 3, (
        f"an exact boundary: 3 tokens x 8 KiB / 2.4576 GB/s = 10 us = 2 hops x 5 us, so 3 tokens, got {got}: "
        "math.ceil of the float ratio lands on 4 here; check the candidate and the one below it"
    )
    assert lab.latency_bandwidth_crossover_tokens(2, link(1.0, 4.0), hidden=1, dtype_bytes=1) == 8, (
        "latency 8 s = 8 tokens x 1 s each; 8, not 9"
    )
    got = lab.latency_bandwidth_crossover_tokens(4, link(*NVL)._replace(latency_s=0.0))
    assert got == 1, f"with zero latency the first real batch (1 token) already reaches it; a batch of {got} tokens is not one"


def test_extreme_values():
    assert lab.allreduce_time_s(0, 8, link(*NVL)) == 14 * 3e-6, "an empty payload still pays every hop"
    huge = lab.allreduce_time_s(2**50, 2, link(*NVL))
    assert math.isfinite(huge) and huge > 2**50 / 450e9


def test_every_promised_error():
    good = link(*ETH)
    for bad in (0, -1, 2.5, True):
        with pytest.raises(ValueError, match="num_ranks"):
            lab.ring_allreduce_traffic_per_rank(1, bad)
    with pytest.raises(ValueError, match="batch_tokens"):
        lab.allreduce_payload_bytes(-1, 4096)
    with pytest.raises(ValueError, match="hidden"):
        lab.allreduce_payload_bytes(1, 0)
    with pytest.raises(ValueError, match="bandwidth"):
        lab.allreduce_time_s(1, 2, link(0.0, 1e-6))
    with pytest.raises(ValueError, match="latency"):
        lab.allreduce_time_s(1, 2, link(1e9, -1e-6))
    with pytest.raises(ValueError, match="num_layers"):
        lab.tp_comm_time_per_step(1, 2, good, num_layers=0)
    with pytest.raises(ValueError, match="no fraction"):
        lab.comm_fraction(0, 0)
    with pytest.raises(ValueError, match="compute_s"):
        lab.comm_fraction(-1, 1)
    with pytest.raises(ValueError, match="crossover"):
        lab.latency_bandwidth_crossover_tokens(1, good)
