"""Every public entry point rejects malformed input with a clear error and changes nothing."""

import numpy as np
import pytest

from mini_vllm import (
    BlockPool,
    ByteTokenizer,
    CacheConfig,
    KVCacheManager,
    LLMEngine,
    Request,
    RequestStatus,
    Sampler,
    SamplingParams,
    Scheduler,
    SchedulerConfig,
    ToyModel,
    VllmConfig,
)

BAD = (ValueError, TypeError)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"temperature": -0.1},
        {"temperature": float("nan")},
        {"temperature": "hot"},
        {"top_p": 0.0},
        {"top_p": 1.5},
        {"top_p": float("nan")},
        {"max_tokens": 0},
        {"max_tokens": -3},
        {"max_tokens": 2.0},
        {"max_tokens": True},
        {"top_k": 1.5},
        {"seed": -1},
        {"seed": "x"},
        {"ignore_eos": "yes"},
        {"stop_token_ids": "abc"},
        {"stop_token_ids": [-1]},
        {"stop_token_ids": [1.0]},
    ],
)
def test_sampling_params_validation(kwargs):
    with pytest.raises(BAD):
        SamplingParams(**kwargs)


def test_sampling_params_are_frozen():
    p = SamplingParams()
    with pytest.raises(AttributeError):
        p.temperature = -1.0  # type: ignore[misc]


def test_tokenizer_model_sampler():
    with pytest.raises(TypeError):
        ByteTokenizer().encode(b"bytes")
    with pytest.raises(ValueError):
        ToyModel(vocab_size=1)
    with pytest.raises(TypeError):
        Sampler().sample(np.zeros(4), {"temperature": 0})
    with pytest.raises(TypeError):
        Sampler().sample(np.zeros(4), SamplingParams(), generator=42)


@pytest.mark.parametrize(
    "args",
    [("", [1]), ("r", []), ("r", "hello"), ("r", [1, -2]), ("r", [1, 2.5]), ("r", [1], {"max_tokens": 3})],
)
def test_request_validation(args):
    with pytest.raises(BAD):
        Request(*args)


def pool_state(pool: BlockPool):
    return (
        [(b.ref_cnt, b.block_hash) for b in pool.blocks],
        [b.block_id for b in pool.free_block_queue.get_all_free_blocks()],
        pool.cached_block_hash_to_block.to_dict(),
    )


def test_block_pool_rejects_and_stays_put():
    for bad in (0, -1, "3", 2.0, True):
        with pytest.raises(BAD):
            BlockPool(bad)
    pool = BlockPool(4)
    held = pool.get_new_blocks(2)
    pool.cache_full_blocks(held[:1], [b"h"])
    before = pool_state(pool)
    for call in (
        lambda: pool.get_new_blocks(-1),
        lambda: pool.get_new_blocks(5),
        lambda: pool.free_blocks([held[1], held[1]]),  # the second one is a double free
        lambda: pool.free_blocks([pool.null_block]),
        lambda: pool.touch([held[0], pool.null_block]),
        lambda: pool.cache_full_blocks(held, [b"a"]),
        lambda: pool.cache_full_blocks(held[:1], [b"z"]),  # already cached
    ):
        with pytest.raises(BAD):
            call()
        assert pool_state(pool) == before


def test_kv_cache_manager_rejects_and_stays_put():
    with pytest.raises(TypeError, match="CacheConfig"):
        KVCacheManager(8, 4)  # type: ignore[arg-type]
    kv = KVCacheManager(CacheConfig(block_size=4, num_gpu_blocks=8))
    r = Request("a", list(range(6)))
    before = pool_state(kv.block_pool)
    for call in (
        lambda: kv.allocate_slots(r, 0),
        lambda: kv.allocate_slots(r, 7),  # more tokens than the request has
        lambda: kv.allocate_slots(r, 2, 4, []),  # 4 hit tokens but no hit blocks
        lambda: kv.allocate_slots("a", 2),
        lambda: kv.get_computed_blocks("a"),
    ):
        with pytest.raises(BAD):
            call()
        assert pool_state(kv.block_pool) == before and kv.req_to_blocks == {}


def sched_state(s: Scheduler):
    return (
        sorted(s.requests),
        [r.request_id for r in s.waiting],
        [r.request_id for r in s.running],
        pool_state(s.kv_cache_manager.block_pool),
        [(r.num_computed_tokens, r.num_tokens, r.status) for r in s.requests.values()],
    )


def test_scheduler_rejects_and_stays_put():
    with pytest.raises(TypeError):
        Scheduler("config")  # type: ignore[arg-type]
    s = Scheduler(VllmConfig(CacheConfig(block_size=4, num_gpu_blocks=8), SchedulerConfig(max_model_len=28)))
    s.add_request(Request("a", [1, 2, 3], SamplingParams(max_tokens=2)))
    out = s.schedule()
    before = sched_state(s)
    finished = Request("f", [1])
    finished.status = RequestStatus.FINISHED_STOPPED
    for call in (
        lambda: s.add_request(Request("a", [1])),  # duplicate id
        lambda: s.add_request(finished),  # not fresh
        lambda: s.add_request(Request("long", list(range(28)))),  # no room to generate
        lambda: s.add_request("a"),
        lambda: s.finish_requests(["a", "nope"]),  # unknown id: nothing is aborted
        lambda: s.finish_requests("a", RequestStatus.RUNNING),
        lambda: s.update_from_output(out, {}),  # a caught up: it needs a token
        lambda: s.update_from_output(out, {"a": 1, "ghost": 2}),
        lambda: s.update_from_output(out, {"a": -1}),
    ):
        with pytest.raises(BAD):
            call()
        assert sched_state(s) == before
    assert s.update_from_output(out, {"a": 1}) == [], "the pending output is still usable after the errors"


def engine_state(e: LLMEngine):
    return sched_state(e.scheduler), e._next_index, dict(e._prompts)


def test_engine_rejects_and_stays_put():
    for kwargs in (
        {"num_gpu_blocks": 1},
        {"block_size": 0},
        {"max_num_seqs": 0},
        {"seed": -1},
        {"max_model_len": 1},
        {"num_gpu_blocks": 5, "block_size": 4, "max_model_len": 17},
        {"enable_prefix_caching": "yes"},
        {"num_blocks": 8},
    ):
        with pytest.raises(BAD):
            LLMEngine(**kwargs)
    e = LLMEngine(num_gpu_blocks=5, block_size=4)  # max_model_len 16
    e.add_request("ok", request_id="taken")
    before = engine_state(e)
    for call in (
        lambda: e.add_request(""),
        lambda: e.add_request([]),
        lambda: e.add_request("x" * 16),  # prompt == max_model_len: no room for one output token
        lambda: e.add_request([1, 300]),
        lambda: e.add_request([1, 2.0]),
        lambda: e.add_request(42),
        lambda: e.add_request("hi", {"max_tokens": 3}),
        lambda: e.add_request("hi", request_id="taken"),
        lambda: e.add_request("hi", request_id=""),
        lambda: e.generate(["fine", ""]),  # one bad prompt: nothing is queued
        lambda: e.generate([1, 2, 3]),  # a bare token list is ambiguous
        lambda: e.generate(["a", "b"], [SamplingParams()]),
        lambda: e.abort_request("nope"),
    ):
        with pytest.raises(BAD):
            call()
        assert engine_state(e) == before
