"""Phase 10 in the engine: the forward goes through an executor; TP=2 equals TP=1; shutdown and dead workers."""

import importlib.util
import os
import subprocess
import sys
import threading
import time

import pytest

from mini_vllm import LLMEngine, ParallelConfig, SamplingParams, create_engine_config
from mini_vllm.executor import MultiprocExecutor, UniProcExecutor, WorkerDiedError

needs_torch = pytest.mark.skipif(
    importlib.util.find_spec("torch") is None,
    reason="torch not installed: pip install -e '.[torch]' (worker processes talk over torch.distributed/gloo)",
)
PROMPTS = ["tensor parallel", "ab", "the quick brown fox " * 3]
MIXED = [
    SamplingParams(max_tokens=12, temperature=0, ignore_eos=True),
    SamplingParams(max_tokens=12, temperature=1.0, top_k=40, seed=3, repetition_penalty=1.2),
    SamplingParams(max_tokens=12, temperature=0.8, bad_words_token_ids=[[32]]),
]


def tokens(outputs):
    return [o.token_ids for o in outputs]


@pytest.mark.parametrize(
    ("args", "error", "match"),
    [
        (dict(tensor_parallel_size=0), ValueError, "tensor_parallel_size must be >= 1"),
        (dict(tensor_parallel_size=True), TypeError, "tensor_parallel_size must be an int"),
        (dict(distributed_executor_backend="ray"), ValueError, "one of .'uni', 'mp'. or None"),
        (dict(tensor_parallel_size=2, distributed_executor_backend="uni"), ValueError, "needs distributed_executor_"),
    ],
)
def test_parallel_config_refuses_bad_settings(args, error, match):
    with pytest.raises(error, match=match):
        ParallelConfig(**args)
    with pytest.raises(error, match=match):
        LLMEngine(**args)


def test_the_backend_defaults_by_tp_size():
    assert ParallelConfig().distributed_executor_backend == "uni"
    assert ParallelConfig(tensor_parallel_size=4).distributed_executor_backend == "mp"
    cfg = create_engine_config(tensor_parallel_size=2, block_size=4)
    assert cfg.parallel_config == ParallelConfig(2, "mp") and cfg.cache_config.block_size == 4


def test_an_uneven_vocabulary_split_is_refused_before_any_process_starts():
    with pytest.raises(ValueError, match="does not split over 3 ranks"):
        LLMEngine(tensor_parallel_size=3)


def test_every_forward_goes_through_the_executor():
    engine = LLMEngine()
    assert isinstance(engine.model_executor, UniProcExecutor) and engine.model is engine.model_executor
    calls = []
    execute = engine.model_executor.execute_model

    def spy(scheduler_output):
        calls.append(sorted(scheduler_output.num_scheduled_tokens))
        return execute(scheduler_output)

    engine.model_executor.execute_model = spy
    engine.add_request("hello", SamplingParams(max_tokens=3, temperature=0, ignore_eos=True))
    engine.add_request("hi", SamplingParams(max_tokens=2, temperature=0, ignore_eos=True))
    steps = 0
    while engine.has_unfinished_requests():
        engine.step()
        steps += 1
    assert calls == [["req-0", "req-1"]] * 2 + [["req-0"]] and steps == 3, (
        "each step with scheduled requests calls executor.execute_model(scheduler_output) exactly once"
    )
    assert engine.collectives_per_step == [0, 0, 0], "TP=1 issues no collective"


def test_shutdown_stops_the_engine_and_is_idempotent():
    with LLMEngine() as engine:
        engine.generate(["hi"], SamplingParams(max_tokens=2))
    assert engine.model_executor.is_shut_down, "leaving the with-block shuts the executor down"
    engine.shutdown()  # idempotent
    for call in (engine.step, lambda: engine.add_request("x"), lambda: engine.generate(["x"])):
        with pytest.raises(RuntimeError, match="engine is shut down"):
            call()


# -- real worker processes -------------------------------------------------------------------------
@pytest.mark.slow
@needs_torch
def test_tp2_engine_generates_the_tp1_tokens_with_one_gather_per_step():
    want = tokens(LLMEngine(seed=7).generate(PROMPTS, MIXED))
    with LLMEngine(seed=7, tensor_parallel_size=2) as engine:
        assert isinstance(engine.model_executor, MultiprocExecutor)
        procs = engine.model_executor.processes
        assert len({p.pid for p in procs}) == 2 and all(p.is_alive() for p in procs)
        got = tokens(engine.generate(PROMPTS, MIXED))
        assert got == want, "TP=2 must generate the TP=1 tokens exactly (greedy, seeded, penalised, banned)"
        steps = engine.collectives_per_step
        assert steps and set(steps) == {1}, f"one all-gather per step at TP=2, got {steps}"
    assert [p.exitcode for p in procs] == [0, 0], "shutdown lets every worker exit 0"


@pytest.mark.slow
@needs_torch
def test_mp_backend_at_tp1_equals_uni():
    want = tokens(LLMEngine().generate(PROMPTS, MIXED[0]))
    with LLMEngine(distributed_executor_backend="mp") as engine:
        assert tokens(engine.generate(PROMPTS, MIXED[0])) == want
        assert set(engine.collectives_per_step) == {0}, "one rank gathers nothing"


@pytest.mark.slow
@needs_torch
def test_a_dead_worker_is_an_engine_error_not_a_hang():
    engine = LLMEngine(tensor_parallel_size=2)
    procs = engine.model_executor.processes
    engine.add_request("hello there", SamplingParams(max_tokens=20, temperature=0, ignore_eos=True))
    engine.step()
    procs[1].kill()
    procs[1].join(timeout=10)
    result = {}

    def step():
        try:
            engine.step()
            result["error"] = None
        except Exception as exc:  # noqa: BLE001 - the test inspects it
            result["error"] = exc

    t = threading.Thread(target=step, daemon=True)
    t.start()
    t.join(timeout=60)
    assert not t.is_alive(), "step() hung on a dead worker: wait on the worker sentinels, not only the pipes"
    assert isinstance(result["error"], WorkerDiedError) and "rank 1" in str(result["error"])
    assert not any(p.is_alive() for p in procs), "the surviving rank is stopped too"
    with pytest.raises(RuntimeError, match="engine is shut down"):
        engine.step()


@pytest.mark.slow
@needs_torch
def test_no_worker_outlives_an_engine_that_was_never_shut_down():
    code = (
        "from mini_vllm import LLMEngine\n"
        "e = LLMEngine(tensor_parallel_size=2)\n"
        "e.generate(['x'])\n"
        "print(' '.join(str(p.pid) for p in e.model_executor.processes), flush=True)\n"
    )
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=root)
    assert out.returncode == 0, out.stderr
    pids = [int(p) for p in out.stdout.split()]
    assert len(pids) == 2
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and any(os.path.exists(f"/proc/{p}") for p in pids):
        time.sleep(0.1)
    alive = [p for p in pids if os.path.exists(f"/proc/{p}")]
    assert not alive, f"workers {alive} outlived their engine's process: reap them at exit"
