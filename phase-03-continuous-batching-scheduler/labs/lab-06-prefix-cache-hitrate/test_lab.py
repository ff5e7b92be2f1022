import functools

import pytest

from course.runtime import lab_module

lab = lab_module(__file__)   # solution.py by default; LAB_IMPL=starter grades starter.py


N, SYSTEM, QUESTION, BS = 16, 410, 14, 16
PROMPT_LEN = SYSTEM + QUESTION  # 424


@pytest.fixture(scope="module")
def real_vllm():
    """Import the real vLLM scheduler driver once for the whole module (torch + vllm: seconds)."""
    from mini_vllm.testing import real_vllm

    return real_vllm


@functools.cache
def measured(caching: bool, together: bool = True, shared: bool = True):
    return lab.measure(lab.make_prompts(shared=shared), enable_caching=caching, arrive_together=together)


def test_prediction_counts_whole_blocks_only():
    hits = lab.predict_prefix_hits(lab.make_prompts(), BS)
    assert hits == [0] + [400] * 15, (
        f"the first request finds nothing; each follower hits the 25 full blocks of the 410-token system "
        f"prompt (400 tokens), not 410: the 26th block mixes 10 shared tokens with its own question; got {hits}"
    )
    prefix = list(range(1000, 1130))  # a 130-token shared prefix
    two = [prefix + [1, 2, 3], prefix + [4, 5, 6]]
    got = lab.predict_prefix_hits(two, BS)
    assert got == [0, 128], f"a 130-token shared prefix hits at most 8 blocks = 128 tokens at block size 16, got {got}"


def test_prediction_hits_blocks_of_any_earlier_request():
    a = list(range(2000, 2040))  # 40 tokens: 2 full blocks
    b = list(range(3000, 3040))  # 40 other tokens: 2 other full blocks
    prompts = [a, b, b[:32] + [7, 8, 9]]  # the third shares b's first 2 blocks, not a's
    got = lab.predict_prefix_hits(prompts, BS)
    assert got == [0, 0, 32], (
        f"the third prompt repeats the second one's first 32 tokens, so it hits those 2 blocks (32 tokens): "
        f"every admitted request registers its full blocks, not only the first one; expected [0, 0, 32], got {got}"
    )


def test_prediction_never_covers_the_last_token():
    same = [list(range(500, 564))] * 3  # three identical 64-token prompts = 4 full blocks
    got = lab.predict_prefix_hits(same, BS)
    assert got == [0, 48, 48], (
        f"identical 64-token prompts hit 3 blocks (48 tokens), not 4: the hit stops at num_tokens - 1 = 63 "
        f"tokens, rounded down to whole blocks; got {got}"
    )
    assert lab.hit_rate(0, 0) == 0.0 and lab.hit_rate(6784, 6000) == pytest.approx(6000 / 6784), (
        "hit_rate is hits / queries, and 0.0 when nothing was queried"
    )


@pytest.mark.upstream
def test_real_scheduler_hits_match_the_prediction(real_vllm):
    m = measured(caching=True)
    predicted = lab.predict_prefix_hits(lab.make_prompts(), BS)
    assert m.queries == N * PROMPT_LEN, (
        f"vLLM counts every prompt token of every lookup as a query: 16 x 424 = {N * PROMPT_LEN}, got {m.queries}"
    )
    assert m.hits == sum(predicted) == 6000, (
        f"the real scheduler reports {m.hits} hit tokens, your prediction says {sum(predicted)}: 15 followers x "
        f"25 blocks x 16 = 6000; sum StepRecord.prefix_cache[2] over every step"
    )
    assert lab.hit_rate(m.queries, m.hits) == pytest.approx(6000 / 6784)


@pytest.mark.upstream
def test_caching_off_looks_nothing_up(real_vllm):
    m = measured(caching=False)
    assert (m.queries, m.hits) == (0, 0), (
        f"with prefix caching off, get_computed_blocks returns before recording anything: 0 queries, 0 hits; "
        f"got {(m.queries, m.hits)}"
    )
    assert lab.hit_rate(m.queries, m.hits) == 0.0, "a run with no lookups has a hit rate of 0.0"
    assert m.scheduled_tokens == N * (PROMPT_LEN + 3), (
        f"without caching every request computes 424 prompt tokens + 3 decodes: {N * (PROMPT_LEN + 3)}, "
        f"got {m.scheduled_tokens}"
    )


@pytest.mark.upstream
def test_cache_saves_exactly_the_hit_tokens(real_vllm):
    on, off = measured(caching=True), measured(caching=False)
    assert off.scheduled_tokens - on.scheduled_tokens == on.hits, (
        f"every hit token is a token the scheduler does not hand out: {off.scheduled_tokens} - "
        f"{on.scheduled_tokens} should equal the {on.hits} hits"
    )


@pytest.mark.upstream
def test_arriving_together_hits_like_arriving_apart(real_vllm):
    together, apart = measured(caching=True, together=True), measured(caching=True, together=False)
    assert (together.queries, together.hits) == (apart.queries, apart.hits), (
        f"blocks are cached when they are allocated, so requests admitted in the same step as request 0 hit "
        f"as much as requests arriving later: together {together[:2]}, apart {apart[:2]}"
    )
    assert apart.steps > together.steps, "one arrival per step must take more steps than one batch"


@pytest.mark.upstream
def test_unshared_prompts_hit_nothing(real_vllm):
    m = measured(caching=True, shared=False)
    assert m.hits == 0 and m.queries == N * PROMPT_LEN, (
        f"prompts with unique system parts (a RAG-style unique context) find nothing cached: got {m.hits} hits "
        f"of {m.queries} queries"
    )
    assert lab.predict_prefix_hits(lab.make_prompts(shared=False), BS) == [0] * N, "and the prediction says so"


SMALL_PREFIX = list(range(1000, 1010))  # 10 shared tokens: 2 full blocks of 4 + 2
SMALL = [SMALL_PREFIX + [1, 2], SMALL_PREFIX + [3, 4, 5], SMALL_PREFIX]


def test_prediction_at_block_size_4():
    got = lab.predict_prefix_hits(SMALL, 4)
    assert got == [0, 8, 8], (
        f"at block size 4 the 10 shared tokens are 2 full blocks (8 tokens): the 2nd prompt hits 8 (its 3rd block "
        f"differs), the 3rd (10 tokens, cap (10 - 1) // 4 = 2 blocks) hits 8 too; got {got}: use the block_size "
        f"argument, not the module's BLOCK_SIZE"
    )


@pytest.mark.upstream
def test_real_scheduler_at_block_size_4(real_vllm):
    on = lab.measure(SMALL, enable_caching=True, block_size=4, max_tokens=2, num_gpu_blocks=64)
    off = lab.measure(SMALL, enable_caching=False, block_size=4, max_tokens=2, num_gpu_blocks=64)
    assert (on.queries, on.hits) == (12 + 13 + 10, 16), (
        f"block size 4, max_tokens 2: vLLM must look up 35 prompt tokens and hit 16 (8 + 8); got "
        f"{(on.queries, on.hits)}: pass block_size (and max_tokens) through to the scheduler config"
    )
    assert off.scheduled_tokens - on.scheduled_tokens == on.hits == sum(lab.predict_prefix_hits(SMALL, 4)), (
        f"the saved tokens ({off.scheduled_tokens} - {on.scheduled_tokens}) equal the hits and the prediction"
    )
    assert off.scheduled_tokens == 35 + 3, f"caching off: 35 prompt tokens + 1 decode each = 38, got {off.scheduled_tokens}"


EXACT = list(range(2000, 2032))  # 32 tokens: exactly 2 full blocks of 16
LONGER = EXACT + list(range(5000, 5016))  # the same 32, then 16 more


def test_prediction_registers_the_block_holding_the_last_token():
    got = lab.predict_prefix_hits([EXACT, LONGER], BS)
    assert got == [0, 32], (
        f"a 32-token prompt registers both of its full blocks (registration has no last-token cap; only the "
        f"lookup does), so a 48-token prompt that extends it hits 2 blocks = 32 tokens; expected [0, 32], got {got}"
    )


@pytest.mark.upstream
def test_real_scheduler_arrivals_budget_and_registration(real_vllm):
    ext = lab.measure([EXACT, LONGER], enable_caching=True, max_tokens=2, num_gpu_blocks=64)
    assert ext.hits == 32 == sum(lab.predict_prefix_hits([EXACT, LONGER], BS)), (
        f"vLLM hits {ext.hits} tokens for a prompt extending an earlier 32-token one: the earlier prompt's "
        f"last full block is cached too"
    )
    apart = lab.measure(
        SMALL, enable_caching=True, arrive_together=False, block_size=4, max_tokens=2, num_gpu_blocks=64
    )
    assert apart.steps == 4, (
        f"request i arrives just before step i (q0 before the first step); each needs a prefill step and one "
        f"decode step, so the last (q2, arriving before step 2) finishes in step 3: 4 steps, got {apart.steps}: "
        f"add request i when len(records) >= i, not after i steps"
    )
    tight = lab.measure(
        SMALL, enable_caching=False, block_size=4, max_tokens=2, num_gpu_blocks=64, max_num_batched_tokens=8
    )
    assert tight.scheduled_tokens == 38 and tight.steps >= 5, (
        f"with max_num_batched_tokens=8 the 38 tokens of work need at least ceil(38 / 8) = 5 steps, got "
        f"{tight.steps} steps for {tight.scheduled_tokens} tokens: pass max_num_batched_tokens to the scheduler"
    )
    cramped = lab.measure(SMALL, enable_caching=True, block_size=4, max_tokens=2, num_gpu_blocks=6)
    assert (cramped.queries, cramped.hits) == (45, 24), (
        f"a 6-block pool cannot hold all three requests: vLLM preempts and re-admits, and every re-admission looks "
        f"its tokens up again, so it reports (45 queries, 24 hits) instead of (35, 16); got "
        f"{(cramped.queries, cramped.hits)}: pass num_gpu_blocks to the scheduler config"
    )


# --- the whole engine's own metrics (tier 2) next to the scheduler-only figure ----------------------
def _metric_list():
    from vllm.v1.metrics.reader import Counter, Gauge, Histogram

    def labels(engine):
        return {"model_name": "tiny", "engine": str(engine)}

    return [
        Gauge("vllm:kv_cache_usage_perc", labels(0), 0.25),
        Counter("vllm:prefix_cache_queries", labels(0), 4240),
        Counter("vllm:external_prefix_cache_queries", labels(0), 999),
        Counter("vllm:prefix_cache_hits", labels(0), 3000),
        Counter("vllm:external_prefix_cache_hits", labels(0), 77),
        Histogram("vllm:time_to_first_token_seconds", labels(0), 16, 1.5, {"0.1": 16, "+Inf": 16}),
        Counter("vllm:prefix_cache_queries", labels(1), 2544),
        Counter("vllm:prefix_cache_hits", labels(1), 1800),
    ]


@pytest.mark.upstream
def test_engine_prefix_counters_reads_the_engines_counters(real_vllm):
    got = lab.engine_prefix_counters(_metric_list())
    assert got == (6784, 4800), (
        f"sum vllm:prefix_cache_queries and vllm:prefix_cache_hits over both engines (labels engine=0 and 1), "
        f"ignoring the external_ (KV connector) counters and every other metric: expected (6784, 4800), got {got}"
    )
    assert lab.engine_prefix_counters([m for m in _metric_list() if "prefix" not in m.name]) == (0, 0), (
        "no prefix-cache counters at all: (0, 0)"
    )


@pytest.mark.engine
def test_real_engine_reports_the_scheduler_only_figure():
    """LLM.generate on the tiny model: the engine's counters equal the hand-stepped scheduler's."""
    from course.runtime import engine

    prompts = lab.make_prompts()
    run = engine.run_job(
        "prefix_cache", prompts=prompts, max_tokens=lab.MAX_TOKENS, block_size=BS, max_model_len=1024,
        max_num_seqs=N, max_num_batched_tokens=2048, enable_prefix_caching=True,
    )
    counters = lab.engine_prefix_counters(engine.metrics_from_json(run.result["metrics"]))
    scheduler_only = measured(caching=True)
    assert counters == (scheduler_only.queries, scheduler_only.hits) == (N * PROMPT_LEN, 6000), (
        f"the whole engine counted (queries, hits) = {counters}; the scheduler alone, stepped by hand, counted "
        f"{(scheduler_only.queries, scheduler_only.hits)}: the same KVCacheManager, so they must agree"
    )
    assert run.result["num_cached_tokens"] == lab.predict_prefix_hits(prompts, BS), (
        f"per request, RequestOutput.num_cached_tokens = {run.result['num_cached_tokens']}; your prediction is "
        f"{lab.predict_prefix_hits(prompts, BS)}"
    )
