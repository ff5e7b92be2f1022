import math

import pytest

from course.runtime import lab_module, use_lab

lab = lab_module(__file__)  # solution.py by default; LAB_IMPL=starter grades starter.py

PER_TOKEN_8B = 131_072  # Phase 00 lab 02: 2 x 32 layers x 8 KV heads x 128 dims x 2 bytes
PREFILL_8B_2048 = 0.205  # seconds, the worked example's prefill (2 x 8e9 x 2048 FLOPs at 160 TFLOP/s)


def test_payload_is_real_freight():
    assert lab.kv_payload_bytes(2048, PER_TOKEN_8B) == 268_435_456, "2,048 tokens x 128 KiB = 256 MiB exactly"
    assert lab.kv_payload_bytes(1, PER_TOKEN_8B) == PER_TOKEN_8B
    assert lab.kv_payload_bytes(0, PER_TOKEN_8B) == 0, "an empty prompt ships nothing"
    assert lab.kv_payload_bytes(2031, 12_288) == 24_956_928, "Qwen2.5-0.5B: 2,031 x 12 KiB"
    for bad in ((-1, PER_TOKEN_8B), (10, 0)):
        with pytest.raises(ValueError):
            lab.kv_payload_bytes(*bad)


def test_link_speed_is_the_whole_story():
    payload = 268_435_456
    fast, slow = lab.transfer_seconds(payload, 200), lab.transfer_seconds(payload, 10)
    assert fast == pytest.approx(0.010737, rel=1e-4), (
        f"256 MiB on 200 Gb/s should take 10.7 ms, got {fast * 1e3:.2f} ms: links are quoted in bits, x8"
    )
    assert slow == pytest.approx(0.214748, rel=1e-4), (
        f"256 MiB on 10 GbE should take 214.7 ms, got {slow * 1e3:.1f} ms"
    )
    assert slow / fast == pytest.approx(20.0), "the same payload: time scales exactly with 1 / bandwidth"
    assert lab.transfer_seconds(1_000_000_000, 8) == pytest.approx(1.0), (
        "1 GB on 8 Gb/s is exactly 1 s (decimal G)"
    )
    with pytest.raises(ValueError):
        lab.transfer_seconds(payload, 0)


def test_interference_math_is_phase3_lab05():
    """The decode-latency-spikes lab (Phase 03 lab 03) measured A's worst shared step as 33 tokens at
    threshold 32 (its 1 decode token + a 32-token chunk): in time units that is this function."""
    spikes = use_lab("phase-03/lab-03-decode-latency-spikes").run_collision(32)
    per_token = PREFILL_8B_2048 / 2048
    assert max(spikes.costs) == 33
    worst = lab.colocated_itl_worst(1 * per_token, 32 * per_token)
    assert worst == pytest.approx(max(spikes.costs) * per_token), (
        "worst ITL = the decode step + the chunk it carries"
    )
    assert lab.colocated_itl_worst(0.010, 0.025) == pytest.approx(0.035), "10 ms step + 25 ms chunk = 35 ms"
    assert lab.colocated_itl_worst(0.010, 0.0) == pytest.approx(0.010), "no chunk, no spike"


def test_ttft_penalty_fractions():
    payload = lab.kv_payload_bytes(2048, PER_TOKEN_8B)
    fast = lab.disagg_ttft_penalty(lab.transfer_seconds(payload, 200), PREFILL_8B_2048)
    slow = lab.disagg_ttft_penalty(lab.transfer_seconds(payload, 10), PREFILL_8B_2048)
    assert 0.05 < fast < 0.06, f"200 Gb/s should add about 5.2 % to TTFT, got {fast:.1%}"
    assert slow > 1.0, f"10 GbE should more than double TTFT (about 105 %), got {slow:.1%}"
    short = lab.kv_payload_bytes(512, PER_TOKEN_8B)
    ratio = lab.disagg_ttft_penalty(lab.transfer_seconds(short, 200), PREFILL_8B_2048 / 4)
    assert ratio == pytest.approx(fast), (
        "both scale linearly with prompt length: the ratio is the same at 512 tokens"
    )
    with pytest.raises(ValueError):
        lab.disagg_ttft_penalty(0.01, 0.0)


def test_the_decision_both_ways():
    payload = lab.kv_payload_bytes(2048, PER_TOKEN_8B)
    fast, slow = lab.transfer_seconds(payload, 200), lab.transfer_seconds(payload, 10)
    assert lab.disagg_wins(fast, PREFILL_8B_2048, 0.010, 0.025), "fast wire + 3.5x interference: split"
    assert not lab.disagg_wins(slow, PREFILL_8B_2048, 0.010, 0.025), (
        "10 GbE: the toll (105 %) outweighs the win"
    )
    assert not lab.disagg_wins(fast, PREFILL_8B_2048, 0.010, 0.002), "1.2x interference is not worth a split"
    # the bounds are inclusive, and each threshold is a real parameter
    assert lab.disagg_wins(0.0205, 0.205, 0.010, 0.010), "exactly 10 % penalty and exactly 2x gain: split"
    assert not lab.disagg_wins(0.0206, 0.205, 0.010, 0.010), "just over 10 %: stay"
    assert not lab.disagg_wins(0.0, 0.205, 0.010, 0.0099), "just under 2x: stay"
    assert lab.disagg_wins(slow, PREFILL_8B_2048, 0.010, 0.025, max_ttft_penalty=1.1), (
        "a looser toll budget flips it"
    )
    assert not lab.disagg_wins(fast, PREFILL_8B_2048, 0.010, 0.025, min_itl_gain=4.0), (
        "a stricter gain flips it"
    )


def test_payload_scales_with_model_not_just_prompt():
    per_70b = lab.model_kv_bytes_per_token(lab.LLAMA_3_70B)
    assert per_70b == 327_680 and per_70b / PER_TOKEN_8B == 2.5, (
        "70B: 80 layers instead of 32, same GQA: 2.5x"
    )
    assert lab.model_kv_bytes_per_token(lab.QWEN2_5_0_5B) == 12_288, (
        "Qwen2.5-0.5B: 2 x 24 x 2 x 64 x 2 = 12 KiB"
    )
    assert lab.MLA_BYTES_PER_TOKEN == 70_272, "DeepSeek-V3 MLA: 61 x (512 + 64) x 2 bytes, about 69 KiB"
    # the ratio has to be re-run per model: at 70B both the freight (x2.5) and the prefill (x8.75) grow
    t70 = lab.transfer_seconds(lab.kv_payload_bytes(2048, per_70b), 200)
    p70 = lab.prefill_seconds(70e9, 2048, 160e12)
    p8 = lab.prefill_seconds(8e9, 2048, 160e12)
    assert p8 == pytest.approx(PREFILL_8B_2048, rel=1e-3)
    assert lab.disagg_ttft_penalty(t70, p70) == pytest.approx(0.0150, abs=5e-4), (
        "70B on 200 Gb/s: about 1.5 %"
    )
    assert math.isclose(
        lab.disagg_ttft_penalty(t70, p70) * 70 / 8 / 2.5,
        lab.disagg_ttft_penalty(lab.transfer_seconds(lab.kv_payload_bytes(2048, PER_TOKEN_8B), 200), p8),
        rel_tol=1e-9,
    )
