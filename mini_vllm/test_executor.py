"""The executor: TP=N logits equal TP=1 exactly, collectives are counted, failures never hang."""

import importlib.util

import numpy as np
import pytest

from mini_vllm import LLMEngine, SamplingParams, ToyModel
from mini_vllm.executor import (
    MultiprocExecutor,
    UniProcExecutor,
    Worker,
    WorkerDiedError,
    make_executor,
    pad_vocab_size,
    shard_range,
    tp_mlp_rank,
    vocab_shard,
)

RNG = np.random.default_rng(0)
needs_torch = pytest.mark.skipif(
    importlib.util.find_spec("torch") is None,
    reason="torch not installed: pip install -e '.[torch]' (worker processes talk over torch.distributed/gloo)",
)
TOKENS = RNG.integers(0, 257, size=12)
POSITIONS = RNG.integers(0, 300, size=12)


def simulated_group(tp, vocab=257):
    """TP ranks in one process: all_gather is a concatenation in rank order."""
    shards = {}

    def make_gather(rank):
        def gather(local):
            shards[rank] = local
            if len(shards) < tp:  # an earlier caller: its copy of the result is discarded anyway
                return np.zeros((local.shape[0], local.shape[1] * tp))
            return np.concatenate([shards[r] for r in range(tp)], axis=-1)
        return gather

    return [Worker(r, tp, vocab, all_gather=make_gather(r)) for r in range(tp)]


def test_vocab_padding_and_shards_cover_the_vocabulary():
    assert pad_vocab_size(257) == 320 and pad_vocab_size(256) == 256 and pad_vocab_size(1) == 64
    for vocab, tp in [(257, 1), (257, 2), (257, 4), (257, 5), (1000, 8), (5, 4)]:
        shards = [vocab_shard(vocab, tp, r) for r in range(tp)]
        widths = {w for _, _, w in shards}
        assert len(widths) == 1, f"every rank of a TP group holds the same padded width, got {shards}"
        ids = [i for s, e, _ in shards for i in range(s, e)]
        assert ids == list(range(vocab)), f"shards of {vocab} over {tp} must tile the vocabulary in rank order"
    assert vocab_shard(257, 2, 1) == (160, 257, 160)
    assert vocab_shard(5, 4, 3) == (5, 5, 16), "a rank may hold padding only"


def test_bad_arguments_are_refused():
    for bad in (0, -1, 1.5, True, "2"):
        with pytest.raises(ValueError, match="tensor_parallel_size"):
            make_executor(tensor_parallel_size=bad)
    for bad_rank in (2, -1):  # -1 would give a negative start and a shard of the wrong ids, silently
        with pytest.raises(ValueError, match="rank"):
            vocab_shard(257, 2, bad_rank)
        with pytest.raises(ValueError, match="rank"):
            shard_range(64, 2, bad_rank)
    with pytest.raises(ValueError, match="does not split"):
        vocab_shard(257, 3, 0)
    with pytest.raises(ValueError, match="UniProcExecutor"):
        UniProcExecutor(tensor_parallel_size=2)
    with pytest.raises(ValueError, match="vocab_size"):
        UniProcExecutor(vocab_size=1)
    with pytest.raises(ValueError, match="does not split"):
        shard_range(10, 4, 0)
    with pytest.raises(ValueError, match="all_gather"):
        Worker(0, 2)


def test_uniproc_executor_is_the_toy_model():
    with make_executor() as ex:
        assert isinstance(ex, UniProcExecutor) and ex.vocab_size == 257 and ex.eos_token_id == 256
        got = ex.forward(TOKENS, POSITIONS)
        assert np.array_equal(got, ToyModel().forward(TOKENS, POSITIONS))
        assert ex.collectives_per_step == [0], "TP=1 issues no collective"
        assert ex.collective_rpc("describe")[0]["start"] == 0
    for tokens, positions in ((TOKENS, POSITIONS), (np.array([], dtype=int), np.array([], dtype=int))):
        with pytest.raises(RuntimeError, match="shut down"):  # even an empty step: nothing may look served
            ex.forward(tokens, positions)


def test_every_constructor_argument_reaches_the_model():
    with make_executor(vocab_size=100, seed=1) as ex:
        got = ex.forward(TOKENS % 100, POSITIONS)
    assert np.array_equal(got, ToyModel(vocab_size=100, seed=1).forward(TOKENS % 100, POSITIONS)), (
        "make_executor must pass vocab_size and seed on to the workers' weights"
    )
    assert not np.array_equal(got, ToyModel(vocab_size=100, seed=0).forward(TOKENS % 100, POSITIONS))


def test_bad_inputs_are_refused_before_reaching_the_workers():
    ex = UniProcExecutor()
    with pytest.raises(ValueError, match="same length"):
        ex.forward(TOKENS, POSITIONS[:3])
    with pytest.raises(TypeError, match="integer"):
        ex.forward(TOKENS.astype(float), POSITIONS)
    for bad_tokens, bad_positions in (([257], [0]), ([-1], [0]), ([0], [-1])):  # -1 would wrap around silently
        with pytest.raises(ValueError, match="token ids"):
            ex.forward(np.array(bad_tokens), np.array(bad_positions))
    with pytest.raises(ValueError, match="no public method"):
        ex.collective_rpc("_all_gather")
    assert ex.collectives_per_step == [], "refused calls are not counted as steps"
    assert ex.forward(np.array([], dtype=int), np.array([], dtype=int)).shape == (0, 257)
    assert ex.collectives_per_step == [0], "an empty step reaches no worker and costs no collective"


@pytest.mark.parametrize("tp", [2, 4, 5, 8])
def test_simulated_vocab_parallel_equals_tp1_bit_for_bit(tp):
    workers = simulated_group(tp)
    gathered = [w.logits_at(TOKENS, POSITIONS) for w in reversed(workers)]  # rank 0 gathers last
    logits, n = gathered[-1]
    assert all(out is None for out, _ in gathered[:-1]), "only rank 0 hands logits back to the executor"
    assert n == 1, "one all-gather per step"
    assert logits.shape == (len(TOKENS), 257), "the padding columns are trimmed after the gather"
    assert np.array_equal(logits, ToyModel().forward(TOKENS, POSITIONS)), f"TP={tp} must equal TP=1 bit for bit"


def test_execute_model_then_sample_tokens_reads_the_scheduler_output():
    engine = LLMEngine()
    engine.add_request("hello tensor parallel", SamplingParams(max_tokens=2, temperature=0))
    engine.add_request([1, 2, 3], SamplingParams(max_tokens=2, temperature=0))
    out = engine.scheduler.schedule()
    ex = UniProcExecutor()
    assert ex.execute_model(out) is None, "execute_model keeps the logits on the worker until sample_tokens"
    result = ex.sample_tokens(None)
    assert result.req_ids == [r.request_id for r in out.scheduled_requests]
    want = ToyModel().forward(np.array([ord("l"), 3]), np.array([20, 2])).argmax(axis=1)
    assert result.sampled_token_ids == [[int(t)] for t in want], "greedy tokens come from each last scheduled token"
    assert result.num_collectives == 0 and ex.collectives_per_step == [0]


def test_tp_mlp_rank_sums_to_the_dense_mlp():
    rng = np.random.default_rng(1)
    x, w1, w2 = rng.standard_normal((3, 8)), rng.standard_normal((16, 8)), rng.standard_normal((8, 16))
    dense = np.maximum(x @ w1.T, 0) @ w2.T
    for tp in (1, 2, 4, 8):
        partials = [tp_mlp_rank(x, w1, w2, r, tp, lambda p: p) for r in range(tp)]
        assert all(n == 1 for _, n in partials)
        np.testing.assert_allclose(sum(p for p, _ in partials), dense, rtol=0, atol=1e-12)


def test_a_silent_group_times_out_instead_of_hanging():
    """No process needed: one rank that never answers, whose process never exits."""
    import multiprocessing as mp
    import tempfile
    import weakref

    class Silent:  # a live process that says nothing
        pid, exitcode = 0, None

        def __init__(self, sentinel):
            self.sentinel = sentinel

        def is_alive(self):
            return False

        def join(self, timeout=None):
            pass

    driver_end, _worker_end = mp.Pipe()
    never_r, _never_w = mp.Pipe(duplex=False)
    ex = MultiprocExecutor.__new__(MultiprocExecutor)
    ex.vocab_size, ex.eos_token_id, ex.tensor_parallel_size = 257, 256, 1
    ex.collectives_per_step, ex.is_shut_down, ex.timeout_s = [], False, 0.2
    ex._conns, ex._procs, ex._tmp = [driver_end], [Silent(never_r)], tempfile.TemporaryDirectory()
    ex._finalizer = weakref.finalize(ex, lambda: None)
    with pytest.raises(TimeoutError, match=r"no reply from ranks \[0\] within 0.2 s"):
        ex.collective_rpc("describe")
    assert ex.is_shut_down, "a timed-out group is shut down, not left half-alive"


# -- real worker processes (spawned, gloo) -----------------------------------------------------------
@pytest.fixture(scope="module")
def tp2():
    ex = MultiprocExecutor(tensor_parallel_size=2, timeout_s=60)
    yield ex
    ex.shutdown()


@pytest.mark.slow
@needs_torch
def test_two_processes_give_tp1_logits_with_one_gather_per_step(tp2):
    full = ToyModel().forward(TOKENS, POSITIONS)
    for step in range(3):
        got = tp2.forward(TOKENS[step:], POSITIONS[step:])
        assert np.array_equal(got, full[step:]), "TP=2 must reproduce TP=1 bit for bit"
    assert tp2.collectives_per_step[-3:] == [1, 1, 1], "vocabulary-parallel logits cost one all-gather per step"
    assert tp2.forward(np.array([], dtype=int), np.array([], dtype=int)).shape == (0, 257)
    assert tp2.collectives_per_step[-1] == 0, "an empty step costs no collective"
    info = tp2.collective_rpc("describe")
    assert [(i["rank"], i["start"], i["end"]) for i in info] == [(0, 0, 160), (1, 160, 257)]
    assert len({i["pid"] for i in info}) == 2, "one process per rank"


@pytest.mark.slow
@needs_torch
def test_worker_errors_come_back_and_the_group_keeps_serving(tp2):
    with pytest.raises(RuntimeError, match="rank 0: TypeError"):
        tp2.collective_rpc("describe", (1, 2))
    assert tp2.forward(TOKENS[:2], POSITIONS[:2]).shape == (2, 257)


@pytest.mark.slow
@needs_torch
def test_dead_worker_is_an_error_not_a_hang_and_shutdown_is_clean():
    ex = MultiprocExecutor(tensor_parallel_size=2, timeout_s=30)
    procs = ex.processes
    ex.forward(TOKENS, POSITIONS)
    procs[1].kill()
    procs[1].join(timeout=10)
    with pytest.raises(WorkerDiedError, match="rank 1 .* died"):
        ex.forward(TOKENS, POSITIONS)
    assert ex.is_shut_down and not any(p.is_alive() for p in procs), "the survivors are stopped too"
    with pytest.raises(RuntimeError, match="shut down"):
        ex.forward(TOKENS, POSITIONS)
    ex.shutdown()  # idempotent


@pytest.mark.slow
@needs_torch
def test_shutdown_is_clean(tp2):  # last: it stops the module's executor
    procs = tp2.processes
    tp2.shutdown()
    assert [p.exitcode for p in procs] == [0, 0], "a normal shutdown lets every worker exit 0"
    with pytest.raises(RuntimeError, match="shut down"):
        tp2.collective_rpc("describe")
