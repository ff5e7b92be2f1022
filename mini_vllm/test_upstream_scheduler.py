"""Differential test: the same request traces through mini's and vLLM 0.22.1's Scheduler.

Each step both sides must agree on ``num_scheduled_tokens`` (who ran, how many tokens, in
which order), the preempted ids, the finished ids and reasons in finish order, every running
request's block table, the number of free blocks, and the prefix-cache hit counters.

What mini leaves out (async scheduling, spec decode, structured output, several KV groups,
connectors, PRIORITY policy) is switched off on the real side too: ``async_scheduling=False``,
one full-attention group, FCFS. Two deliberate differences are not visible in these records
and are pinned elsewhere: mini advances ``num_computed_tokens`` in ``update_from_output``
(upstream: at the end of ``schedule()``), and mini's prefix-cache index keeps one block per
hash (``test_duplicate_hash_*`` below and in test_upstream_block_pool.py).
"""

import importlib
import random

import pytest

from mini_vllm.testing.traces import Abort, Arrival, SchedConfig, assert_same_records, run_mini_trace

pytestmark = pytest.mark.upstream


@pytest.fixture(scope="module")
def real():
    return importlib.import_module("mini_vllm.testing.real_vllm")


def tokens(n, salt=0):
    return tuple((i * 7 + salt) % 250 for i in range(n))


def assert_same(real, config, trace):
    want = real.run_trace(config, trace)
    assert_same_records(want, run_mini_trace(config, trace))
    return want


def test_chunked_prefill(real):
    config = SchedConfig(num_gpu_blocks=64, max_num_batched_tokens=32)
    steps = assert_same(real, config, [Arrival(0, "a", tokens(100), 4)])
    assert [s.num_scheduled_tokens["a"] for s in steps] == [32, 32, 32, 4, 1, 1, 1]


def test_chunked_prefill_with_threshold_and_a_decode(real):
    config = SchedConfig(num_gpu_blocks=64, max_num_batched_tokens=40, long_prefill_token_threshold=12)
    assert_same(
        real,
        config,
        [
            Arrival(0, "a", tokens(5), 20),
            Arrival(2, "b", tokens(90, 1), 3),
            Arrival(3, "c", tokens(30, 2), 3),
        ],
    )


def test_shared_prefix_arriving_together(real):
    shared = tokens(64)
    trace = [Arrival(0, f"r{i}", shared + tokens(8, 100 + i), 4) for i in range(4)]
    steps = assert_same(real, SchedConfig(num_gpu_blocks=64, max_num_batched_tokens=512), trace)
    assert steps[0].prefix_cache[:3] == (4, 288, 192), (
        "3 followers hit the 64-token prefix cached at allocation"
    )


def test_shared_prefix_arriving_apart(real):
    shared = tokens(64)
    trace = [Arrival(3 * i, f"r{i}", shared + tokens(8, 100 + i), 4) for i in range(4)]
    steps = assert_same(real, SchedConfig(num_gpu_blocks=64, max_num_batched_tokens=512), trace)
    assert sum(s.prefix_cache[2] for s in steps) == 3 * 64


def test_preemption_under_memory_pressure(real):
    config = SchedConfig(num_gpu_blocks=12, block_size=4, max_num_batched_tokens=16, max_model_len=40)
    steps = assert_same(real, config, [Arrival(0, f"r{i}", tokens(10, i), 20) for i in range(4)])
    assert sum(len(s.preempted) for s in steps) >= 2, "the trace must really preempt"
    assert sum(s.prefix_cache[5] for s in steps) > 0, "re-admitted requests recover cached blocks"


def test_mixed_trace(real):
    shared = tokens(40, 9)
    trace = [
        Arrival(0, "long", tokens(150), 6),
        Arrival(0, "s1", shared + tokens(5, 1), 12),
        Arrival(1, "s2", shared + tokens(7, 2), 12),
        Arrival(4, "tiny", tokens(2, 3), 30),
        Arrival(6, "s3", shared + tokens(3, 4), 8),
        Arrival(9, "dup", tokens(150), 3),
    ]
    config = SchedConfig(
        num_gpu_blocks=24,
        block_size=8,
        max_num_seqs=3,
        max_num_batched_tokens=48,
        long_prefill_token_threshold=20,
        max_model_len=180,
    )
    steps = assert_same(real, config, trace)
    assert any(s.preempted for s in steps) and sum(s.prefix_cache[2] for s in steps) > 0


@pytest.mark.parametrize("seed", range(8))
def test_random_traces(real, seed):
    rng = random.Random(seed)
    block_size = rng.choice([4, 8, 16])
    num_blocks = rng.randint(8, 40)
    max_model_len = min((num_blocks - 1) * block_size, 200)
    max_num_seqs = rng.randint(1, 6)
    config = SchedConfig(
        num_gpu_blocks=num_blocks,
        block_size=block_size,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=rng.randint(max_num_seqs, 64),
        long_prefill_token_threshold=rng.choice([0, 0, 5, 12]),
        enable_prefix_caching=rng.random() < 0.75,
        max_model_len=max_model_len,
    )
    base = tokens(60, rng.randint(0, 5))
    trace = []
    for i in range(rng.randint(2, 8)):
        n = rng.randint(1, min(60, max_model_len - 2))
        prompt = base[:n] if rng.random() < 0.5 else tokens(n, 10 + i)
        trace.append(
            Arrival(
                rng.randint(0, 10), f"q{i}", prompt, rng.randint(1, max(1, min(30, max_model_len - n - 1)))
            )
        )
    assert_same(real, config, trace)


def test_duplicate_hash_copy_serves_after_the_first_is_evicted(real):
    """Identical 32-token prompts, block 16: the follower hits 1 block (cap = 31 tokens) and
    fills a second block identical to the leader's. Both copies are indexed; after the leader's
    copy is evicted, the follower's copy still serves the hash."""
    config = SchedConfig(num_gpu_blocks=6, block_size=16, max_num_batched_tokens=64, max_model_len=80)
    prompt = tokens(32)
    trace = [
        Arrival(0, "leader", prompt, 1),
        Arrival(0, "follower", prompt, 1),
        Arrival(2, "filler", tokens(33, 77), 1),  # 3 blocks: evicts the leader's copy (LRU)
        Arrival(4, "again", prompt + (5,), 1),
    ]
    steps = assert_same(real, config, trace)
    assert steps[4].num_scheduled_tokens == {"again": 1}, "both prompt blocks hit, one via the copy"


def test_duplicate_hash_chunked_prefill_under_eviction(real):
    """Two requests prefill a shared prefix in 4-token chunks at the same time, so both fill
    identical blocks; preemption then evicts one copy. The re-admitted request hits 12 cached
    tokens at step 7 through the surviving copies (a one-block-per-hash index would find 8)."""
    config = SchedConfig(
        num_gpu_blocks=6,
        block_size=4,
        max_num_seqs=4,
        max_num_batched_tokens=8,
        long_prefill_token_threshold=4,
        max_model_len=20,
    )
    t = tokens(20)
    trace = [Arrival(1, "B", t[:14], 4), Arrival(2, "A", t[:15], 3)]
    steps = assert_same(real, config, trace)
    assert any(s.preempted for s in steps), "the trace must preempt"
    assert steps[7].prefix_cache[5] == 12, f"step 7 re-admission hits 12 tokens, got {steps[7].prefix_cache}"


def test_eos_on_the_first_token(real):
    """A request whose first sampled token is EOS stops in its prefill step, frees its blocks
    at once, and the one behind it is admitted the next step."""
    config = SchedConfig(
        num_gpu_blocks=5, block_size=4, max_num_seqs=1, max_num_batched_tokens=16, max_model_len=16
    )
    steps = assert_same(
        real, config, [Arrival(0, "a", tokens(9), 5, eos_at=0), Arrival(0, "b", tokens(9, 3), 2, eos_at=1)]
    )
    assert steps[0].finished == [("a", "stop")] and steps[2].finished == [("b", "stop")]


def test_aborts_mid_flight_one_id_at_a_time(real):
    """Aborts of a running request mid chunked prefill, a preempted one, a waiting one and an
    already finished id (skipped), one id per call."""
    shared = tokens(24)
    trace = [
        Arrival(0, "a", shared + tokens(6, 1), 6),
        Arrival(0, "b", shared + tokens(5, 2), 8),
        Arrival(1, "c", tokens(20, 3), 4),
        Arrival(2, "d", shared + tokens(3, 4), 5),
        Abort(2, ("b",)),
        Abort(4, ("d", "c")),
        Abort(6, ("a", "zz")),
    ]
    config = SchedConfig(
        num_gpu_blocks=12,
        block_size=4,
        max_num_seqs=4,
        max_num_batched_tokens=10,
        long_prefill_token_threshold=6,
        max_model_len=44,
    )
    steps = assert_same(real, config, trace)
    assert sum(len(s.aborted) for s in steps) >= 3


def test_without_chunked_prefill(real):
    config = SchedConfig(
        num_gpu_blocks=20,
        block_size=4,
        max_num_seqs=4,
        max_num_batched_tokens=40,
        max_model_len=40,
        enable_chunked_prefill=False,
    )
    trace = [
        Arrival(0, "a", tokens(30), 4),
        Arrival(0, "b", tokens(25, 1), 4),
        Arrival(1, "c", tokens(8, 2), 9),
    ]
    steps = assert_same(real, config, trace)
    assert steps[0].num_scheduled_tokens == {"a": 30}, (
        "b does not fit the rest of the budget and is not chunked"
    )


def family_trace(seed: int) -> tuple[SchedConfig, list]:
    """Shared prefixes prefilled in small chunks at the same time in a pool too small for all of
    them (duplicate-hash blocks, evictions, preemptions), EOS on some first tokens, single-id
    aborts mid-flight, block sizes from 1 to 64."""
    rng = random.Random(1000 + seed)
    block_size = [1, 2, 3, 4, 8, 16, 32, 64][seed % 8]
    max_model_len = rng.choice([2, 3, 4]) * max(block_size, 8)
    num_blocks = -(-max_model_len // block_size) + rng.randint(1, 4)
    max_num_seqs = rng.randint(2, 5)
    config = SchedConfig(
        num_gpu_blocks=num_blocks,
        block_size=block_size,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=rng.randint(max_num_seqs, max_num_seqs + 12),
        long_prefill_token_threshold=rng.choice([1, 2, 3, 4, 7]),
        enable_prefix_caching=seed % 5 != 4,
        max_model_len=max_model_len,
    )
    base = tokens(max_model_len, seed)
    trace: list = []
    n = rng.randint(3, 7)
    for i in range(n):
        plen = rng.randint(1, max_model_len - 1)
        prompt = base[:plen] if rng.random() < 0.7 else tokens(plen, 50 + i)
        eos_at = 0 if rng.random() < 0.2 else (rng.randint(1, 6) if rng.random() < 0.2 else None)
        trace.append(
            Arrival(rng.randint(0, 4), f"f{i}", prompt, rng.randint(1, max_model_len - plen), eos_at)
        )
    for _ in range(rng.randint(0, 3)):
        trace.append(Abort(rng.randint(1, 12), (f"f{rng.randrange(n)}",)))
    return config, trace


@pytest.mark.parametrize("seed", range(16))
def test_trace_families(real, seed):
    config, trace = family_trace(seed)
    assert_same(real, config, trace)
