"""Configuration: validated once, in the config objects, with vLLM's rules and messages."""

import pytest

from mini_vllm import (
    CacheConfig,
    LLMEngine,
    Request,
    SamplingParams,
    Scheduler,
    SchedulerConfig,
    VllmConfig,
    create_engine_config,
)


@pytest.mark.parametrize(
    ("make", "error"),
    [
        (lambda: CacheConfig(block_size=0), ValueError),
        (lambda: CacheConfig(block_size=2.0), TypeError),
        (lambda: CacheConfig(num_gpu_blocks=1), ValueError),  # only the null block
        (lambda: CacheConfig(num_gpu_blocks=True), TypeError),
        (lambda: CacheConfig(enable_prefix_caching="yes"), TypeError),
        (lambda: SchedulerConfig(max_num_seqs=0), ValueError),
        (lambda: SchedulerConfig(max_num_batched_tokens=0), ValueError),
        (lambda: SchedulerConfig(long_prefill_token_threshold=-1), ValueError),
        (lambda: SchedulerConfig(max_model_len=1), ValueError),
        (lambda: SchedulerConfig(enable_chunked_prefill=1), TypeError),
        (lambda: SchedulerConfig(max_num_encoder_input_tokens=-1), ValueError),
        (lambda: SchedulerConfig(encoder_cache_size=-1), ValueError),
        (lambda: SchedulerConfig(encoder_cache_size=1.5), TypeError),
        (lambda: SchedulerConfig(disable_chunked_mm_input=0), TypeError),
        (lambda: VllmConfig(cache_config=SchedulerConfig()), TypeError),
        (lambda: create_engine_config(num_blocks=8), TypeError),
    ],
)
def test_bad_settings_are_refused_at_construction(make, error):
    with pytest.raises(error):
        make()


def test_max_model_len_defaults_to_the_pool_and_may_not_exceed_it():
    assert VllmConfig(CacheConfig(block_size=4, num_gpu_blocks=5)).max_model_len == 16, "4 usable blocks x 4"
    with pytest.raises(ValueError, match=r"max seq len \(17\).*estimated maximum model length is 16"):
        VllmConfig(CacheConfig(block_size=4, num_gpu_blocks=5), SchedulerConfig(max_model_len=17))


def test_without_chunked_prefill_the_budget_must_hold_max_model_len():
    with pytest.raises(
        ValueError, match=r"max_num_batched_tokens \(32\) is smaller than max_model_len \(40\)"
    ):
        SchedulerConfig(max_num_batched_tokens=32, max_model_len=40, enable_chunked_prefill=False)
    with pytest.raises(ValueError, match="smaller than max_model_len"):  # the default max_model_len too
        VllmConfig(
            CacheConfig(block_size=4, num_gpu_blocks=11),
            SchedulerConfig(max_num_batched_tokens=32, enable_chunked_prefill=False),
        )
    SchedulerConfig(max_num_batched_tokens=32, max_model_len=40)  # chunked prefill on: fine


def test_a_budget_below_the_seat_count_is_accepted_and_bounds_the_batch():
    """A deliberate difference: vLLM refuses max_num_batched_tokens < max_num_seqs. Mini accepts
    it (course labs use budgets of 8 with the default 128 seats); the budget then limits how
    many requests one step can serve."""
    sched = Scheduler(VllmConfig(scheduler_config=SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=2)))
    for i in range(4):
        sched.add_request(Request(f"r{i}", [i + 1], SamplingParams(max_tokens=3, ignore_eos=True)))
    out = sched.schedule()
    assert out.num_scheduled_tokens == {"r0": 1, "r1": 1}, "two tokens of budget serve two one-token prompts"


def test_every_component_reads_one_config():
    engine = LLMEngine(num_gpu_blocks=9, block_size=4, max_num_seqs=3, long_prefill_token_threshold=5)
    sched = engine.scheduler
    assert sched.vllm_config is engine.vllm_config and sched.cache_config.num_gpu_blocks == 9
    assert (sched.max_num_running_reqs, sched.max_num_scheduled_tokens, sched.max_model_len) == (3, 2048, 32)
    assert sched.kv_cache_manager.block_size == 4 and sched.kv_cache_manager.max_model_len == 32
    assert sched.kv_cache_manager.block_pool.num_gpu_blocks == 9
    with pytest.raises(TypeError, match="either a VllmConfig or engine arguments"):
        LLMEngine(engine.vllm_config, block_size=4)
