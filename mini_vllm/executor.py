"""Executors: how one engine step reaches one worker, or N worker processes in lockstep.

Mirrors ``vllm/v1/executor/`` (``abstract.py`` — ``Executor``; ``uniproc_executor.py`` —
``UniProcExecutor``; ``multiproc_executor.py`` — ``MultiprocExecutor`` and ``WorkerProc``) and
the worker (``vllm/v1/worker/gpu_worker.py`` — ``Worker``, which owns a ``GPUModelRunner``,
``model_runner.py``). Each step the engine calls ``execute_model(scheduler_output)`` then
``sample_tokens(grammar_output)`` (with speculation, then ``take_draft_token_ids()``); the
executor makes the same call on every rank and returns rank 0's answer. A worker builds its model with ``models.get_model`` (``ToyForCausalLM`` unless
``VllmConfig.model_config`` names a checkpoint); at TP > 1 it keeps ``VocabParallelToyModel``, the
toy's output projection split over the vocabulary (``ParallelLMHead`` +
``LogitsProcessor._gather_logits``): one all-gather per forward, equal to TP=1 bit for bit.
``forward(last_tokens, positions)`` answers ``ToyModel.forward``'s contract through the workers
(beam search and Phase 01's lab use it; a checkpoint's model needs its KV and refuses).

Failures never hang: the driver waits on every worker's pipe *and* process sentinel, so a dead
worker becomes ``WorkerDiedError`` (naming the rank) and a silent one ``TimeoutError``; either
way the whole group is stopped. ``tp_mlp_rank`` is one rank's share of the column → row MLP
block (Phase 10 lab 01).

Left out: the shared-memory broadcast queue (a pipe per worker), async scheduling and futures,
pipeline parallelism, Ray, memory profiling, devices (CPU and gloo only). torch is imported only
inside worker processes.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import tempfile
import time
import weakref
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from multiprocessing.connection import wait
from typing import Any

import numpy as np

from .config import ModelConfig, VllmConfig, create_engine_config
from .model import POSITION_PERIOD, ToyModel
from .model_runner import GPUModelRunner
from .outputs import ModelRunnerOutput

DEFAULT_VOCAB_PADDING_SIZE = 64  # upstream pads vocabularies to a multiple of 64 before sharding


class WorkerDiedError(RuntimeError):
    """A worker process exited while the executor still needed it."""


def pad_vocab_size(vocab_size: int, pad_to: int = DEFAULT_VOCAB_PADDING_SIZE) -> int:
    """Round ``vocab_size`` up to a multiple of ``pad_to`` (257 → 320)."""
    return -(-vocab_size // pad_to) * pad_to


def vocab_shard(vocab_size: int, tp_size: int, rank: int) -> tuple[int, int, int]:
    """``(start, end, width)`` of ``rank``'s vocabulary shard: real ids ``[start, end)``, padded width.

    The vocabulary is padded to a multiple of 64, then cut into ``tp_size`` equal shards of
    ``width`` ids; the last ones may hold padding only (``start == end``). 257 ids at TP=2: padded
    to 320, rank 0 holds ids 0..159 and rank 1 ids 160..256 plus 63 padding columns.
    """
    _check_tp(tp_size)
    if not 0 <= rank < tp_size:
        raise ValueError(f"rank must lie in [0, {tp_size}), got {rank}")
    padded = pad_vocab_size(vocab_size)
    if padded % tp_size:
        raise ValueError(f"the padded vocabulary ({padded}) does not split over {tp_size} ranks")
    width = padded // tp_size
    start = min(rank * width, vocab_size)
    return start, min(start + width, vocab_size), width


def _check_tp(tp_size: object) -> None:
    if isinstance(tp_size, bool) or not isinstance(tp_size, int) or tp_size < 1:
        raise ValueError(f"tensor_parallel_size must be an int >= 1, got {tp_size!r}")


def toy_model_config(vocab_size: int = 257, seed: int = 0) -> ModelConfig:
    """The default model: ``ToyForCausalLM`` (no checkpoint, no weights; ``seed`` picks the tables)."""
    return ModelConfig(hf_config={"architectures": ["ToyForCausalLM"], "vocab_size": vocab_size, "seed": seed,
                                  "eos_token_id": vocab_size - 1})


class VocabParallelToyModel:
    """``ToyForCausalLM`` with its output projection cut over the vocabulary (TP > 1).

    The toy's logits are a matmul with a one-hot hidden state; the hidden state is kept as the
    indices of its two hot entries, ``(token, position)``, so ``forward`` is free and
    ``compute_logits`` is three table lookups on this rank's columns, then the all-gather.
    """

    is_attention_free = True

    def __init__(self, rank: int, world_size: int, full: ToyModel,
                 all_gather: Callable[[np.ndarray], np.ndarray] | None = None) -> None:
        if world_size > 1 and all_gather is None:
            raise ValueError("a worker in a group of more than one needs an all_gather")
        self.rank, self.world_size, self.vocab_size = rank, world_size, full.vocab_size
        self.start, self.end, self.width = vocab_shard(full.vocab_size, world_size, rank)
        pad = self.width - (self.end - self.start)
        cols = slice(self.start, self.end)  # weights "loaded"; keep only this rank's columns
        self.token_table = np.pad(full.token_table[:, cols], ((0, 0), (0, pad)))
        self.position_table = np.pad(full.position_table[:, cols], ((0, 0), (0, pad)))
        self.bias = np.pad(full.bias[cols], (0, pad))
        self._all_gather = all_gather
        self.num_collectives = 0  # issued by this rank since it started

    def forward(self, input_ids: np.ndarray, positions: np.ndarray, kv_caches: Any = None,
                attn_metadata: Any = None) -> np.ndarray:
        """The hidden states ``[T, 2]``: each token with its position (no KV is read or written)."""
        return np.stack([np.asarray(input_ids), np.asarray(positions)], axis=1).astype(np.int64)

    def compute_logits(self, hidden_states: np.ndarray) -> np.ndarray:
        """Shard logits, then all-gather: every rank gets the full ``[N, vocab]`` logits."""
        tokens, pos = hidden_states[:, 0], hidden_states[:, 1] % POSITION_PERIOD
        local = self.token_table[tokens] + self.position_table[pos] + self.bias
        assert self._all_gather is not None
        local = self._all_gather(local)  # [N, width * world]
        self.num_collectives += 1
        return local[:, : self.vocab_size]

    def get_kv_cache_spec(self) -> Any:
        from .attention import KVCacheSpec

        return KVCacheSpec(num_layers=0, num_kv_heads=0, head_size=0)


class Worker:
    """One rank: its model (or its shard of it) and the ``GPUModelRunner`` that feeds it and samples."""

    def __init__(
        self,
        rank: int,
        world_size: int,
        vocab_size: int = 257,
        seed: int = 0,
        all_gather: Callable[[np.ndarray], np.ndarray] | None = None,
        vllm_config: VllmConfig | None = None,
    ) -> None:
        if world_size > 1 and all_gather is None:
            raise ValueError("a worker in a group of more than one needs an all_gather")
        from .models import get_model
        from .platforms import get_current_platform, resolve_obj_by_qualname

        vllm_config = vllm_config or create_engine_config()
        model_config = vllm_config.model_config or toy_model_config(vocab_size, seed)
        self.rank, self.world_size, self.vocab_size = rank, world_size, model_config.vocab_size
        model = get_model(model_config)  # registry by architecture, then the checkpoint's weights
        # The platform picks the attention backend and what runs the forward (phase 17).
        platform = get_current_platform()
        self.attn_backend = resolve_obj_by_qualname(platform.get_attn_backend_cls(
            None, model.get_kv_cache_spec().head_size, model_config.dtype))
        model = platform.load_model(model, self.attn_backend)
        if world_size > 1:
            if model_config.architectures[0] != "ToyForCausalLM":
                raise ValueError(f"{model_config.architectures[0]} cannot be sharded: mini_vllm shards only the toy model")
            model = VocabParallelToyModel(rank, world_size, model.model, all_gather)
        self.model = model
        self.start, self.end, self.width = vocab_shard(self.vocab_size, world_size, rank)
        self.model_runner = GPUModelRunner(vllm_config, model, model_config.eos_token_id)
        self.model_runner.initialize_kv_cache()

    @property
    def num_collectives(self) -> int:
        return getattr(self.model, "num_collectives", 0)

    def execute_model(self, scheduler_output: Any) -> None:
        """Update the batch and run the forward (every rank: the gather needs them all)."""
        return self.model_runner.execute_model(scheduler_output)

    def sample_tokens(self, grammar_output: Any) -> ModelRunnerOutput | None:
        """Every rank samples the same tokens from the same logits; only rank 0's are returned."""
        output = self.model_runner.sample_tokens(grammar_output)
        return output if self.rank == 0 else None

    def take_draft_token_ids(self) -> Any:
        """The drafts this rank's runner proposed after its last ``sample_tokens`` (or None)."""
        return self.model_runner.take_draft_token_ids()

    def logits_at(self, last_tokens: np.ndarray, positions: np.ndarray) -> tuple[np.ndarray | None, int]:
        """``ToyModel.forward``'s logits at (token, position) pairs; rank 0's, with the collectives issued.

        Only a model that reads no KV cache can answer from a token and its position alone.
        """
        if not getattr(self.model, "is_attention_free", False):
            raise ValueError(f"{type(self.model).__name__} needs its KV context: forward(last_tokens, positions) "
                             "is the toy model's contract")
        before = self.num_collectives
        hidden = self.model.forward(np.asarray(last_tokens), np.asarray(positions))
        logits = self.model.compute_logits(hidden)
        return (logits if self.rank == 0 else None), self.num_collectives - before

    def describe(self) -> dict[str, int]:
        return {"rank": self.rank, "world_size": self.world_size, "start": self.start, "end": self.end,
                "width": self.width, "pid": os.getpid()}


class Executor(ABC):
    """What the engine calls. Subclasses decide where the workers live."""

    tensor_parallel_size: int
    vocab_size: int
    eos_token_id: int

    def __init__(self, vocab_size: int, tensor_parallel_size: int) -> None:
        _check_tp(tensor_parallel_size)
        if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size < 2:
            raise ValueError(f"vocab_size must be an int >= 2, got {vocab_size!r}")
        self.vocab_size, self.eos_token_id = vocab_size, vocab_size - 1
        self.tensor_parallel_size = tensor_parallel_size
        self.collectives_per_step: list[int] = []  # one entry per execute_model/forward call
        self.is_shut_down = False

    @abstractmethod
    def collective_rpc(self, method: str, args: Sequence[Any] = (), kwargs: dict | None = None) -> list[Any]:
        """Call ``Worker.<method>(*args, **kwargs)`` on every rank; one result per rank, rank order."""

    @abstractmethod
    def shutdown(self) -> None:
        """Stop the workers. Idempotent."""

    def forward(self, last_tokens: np.ndarray, positions: np.ndarray) -> np.ndarray:
        """``ToyModel.forward``'s contract, computed by the workers."""
        if self.is_shut_down:
            raise RuntimeError("the executor is shut down; build a new one")
        tokens, pos = np.asarray(last_tokens), np.asarray(positions)
        if tokens.ndim != 1 or pos.ndim != 1 or tokens.shape != pos.shape:
            raise ValueError(f"last_tokens and positions must be 1-D and the same length, got {tokens.shape} "
                             f"and {pos.shape}")
        if tokens.size and (not np.issubdtype(tokens.dtype, np.integer) or not np.issubdtype(pos.dtype, np.integer)):
            raise TypeError("last_tokens and positions must be integer arrays")
        if tokens.size and (tokens.min() < 0 or tokens.max() >= self.vocab_size or pos.min() < 0):
            raise ValueError(f"token ids must lie in [0, {self.vocab_size}) and positions must be >= 0")
        tokens, pos = tokens.astype(np.int64), pos.astype(np.int64)
        if tokens.size == 0:  # nothing scheduled: no worker call, no collective
            self.collectives_per_step.append(0)
            return np.zeros((0, self.vocab_size))
        results = self.collective_rpc("logits_at", (tokens, pos))
        logits, n = results[0]
        self.collectives_per_step.append(n)
        return logits

    def execute_model(self, scheduler_output: Any) -> None:
        """Every rank updates its batch and runs the forward; the logits stay on the workers."""
        self.collective_rpc("execute_model", (scheduler_output,))

    def sample_tokens(self, grammar_output: Any) -> ModelRunnerOutput:
        """Every rank samples; rank 0's tokens come back (an empty output when nothing ran)."""
        output = self.collective_rpc("sample_tokens", (grammar_output,))[0]
        if output.req_ids:  # a forward ran this step
            self.collectives_per_step.append(output.num_collectives)
        return output

    def take_draft_token_ids(self) -> Any:
        """Every rank proposed the same drafts after sampling; rank 0's come back (None: none)."""
        return self.collective_rpc("take_draft_token_ids")[0]

    def __enter__(self) -> Executor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()


class UniProcExecutor(Executor):
    """One worker, in this process: TP=1, no collectives."""

    def __init__(self, vocab_size: int = 257, tensor_parallel_size: int = 1, seed: int = 0,
                 vllm_config: VllmConfig | None = None) -> None:
        super().__init__(vocab_size, tensor_parallel_size)
        if tensor_parallel_size != 1:
            raise ValueError(f"UniProcExecutor runs one worker; use MultiprocExecutor for tp={tensor_parallel_size}")
        self.worker = Worker(0, 1, vocab_size, seed, vllm_config=vllm_config)
        self.driver_worker = self.worker

    def collective_rpc(self, method: str, args: Sequence[Any] = (), kwargs: dict | None = None) -> list[Any]:
        if self.is_shut_down:
            raise RuntimeError("the executor is shut down; build a new one")
        return [_call(self.worker, method, args, kwargs)]

    def shutdown(self) -> None:
        self.is_shut_down = True


def _call(worker: Worker, method: str, args: Sequence[Any], kwargs: dict | None) -> Any:
    if method.startswith("_") or not callable(getattr(worker, method, None)):
        raise ValueError(f"Worker has no public method {method!r}")
    return getattr(worker, method)(*args, **(kwargs or {}))


def _worker_main(conn: Any, rank: int, world: int, init_method: str, vocab_size: int, seed: int,
                 timeout_s: float, vllm_config: VllmConfig | None = None) -> None:
    """A worker process: join the gloo group, then answer calls until told to stop."""
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=world,
                            timeout=timedelta(seconds=timeout_s))

    def all_gather(local: np.ndarray) -> np.ndarray:
        t = torch.from_numpy(np.ascontiguousarray(local))
        parts = [torch.empty_like(t) for _ in range(world)]
        dist.all_gather(parts, t)
        return torch.cat(parts, dim=-1).numpy()

    worker = Worker(rank, world, vocab_size, seed, all_gather, vllm_config)
    conn.send(("ok", None))
    code = 0
    try:
        while True:
            try:
                method, args, kwargs = conn.recv()
            except EOFError:
                break  # the driver went away
            if method == "shutdown":
                conn.send(("ok", None))
                break
            try:
                conn.send(("ok", _call(worker, method, args, kwargs)))
            except Exception as exc:  # report, keep serving
                conn.send(("error", f"{type(exc).__name__}: {exc}"))
    except BaseException:  # the pipe itself broke: say why, then exit non-zero
        import traceback

        traceback.print_exc()
        code = 1
    finally:
        conn.close()
    # Leave at once: tearing the gloo group down at interpreter exit waits seconds on its peers
    # (or forever on a dead one). The driver has its reply; there is nothing left to flush.
    os._exit(code)


def _mp_context() -> Any:
    """A fresh-process start method: never a plain fork of a parent that may hold torch threads.

    forkserver (POSIX) forks each worker from a clean server that imported torch once, so a second
    executor starts in a fraction of a second; spawn elsewhere. Upstream forks by default and
    switches to spawn once CUDA is initialised in the parent.
    """
    if "forkserver" in mp.get_all_start_methods():
        ctx = mp.get_context("forkserver")
        ctx.set_forkserver_preload(["torch", "torch.distributed", "mini_vllm.executor"])
        return ctx
    return mp.get_context("spawn")


def _reap(procs: list[Any]) -> None:
    for p in procs:
        if p.is_alive():
            p.kill()
    for p in procs:
        p.join(timeout=5)


class MultiprocExecutor(Executor):
    """``tensor_parallel_size`` worker processes (forkserver or spawn), one gloo group, one pipe each."""

    def __init__(self, vocab_size: int = 257, tensor_parallel_size: int = 2, seed: int = 0,
                 timeout_s: float = 60.0, vllm_config: VllmConfig | None = None) -> None:
        super().__init__(vocab_size, tensor_parallel_size)
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        self.timeout_s = timeout_s
        ctx = _mp_context()
        self._tmp = tempfile.TemporaryDirectory(prefix="mini_vllm_gloo_")
        init_method = "file://" + os.path.join(self._tmp.name, "rendezvous")
        self._conns, self._procs = [], []
        for rank in range(tensor_parallel_size):
            parent, child = ctx.Pipe()
            p = ctx.Process(target=_worker_main, name=f"mini_vllm_Worker_TP{rank}", daemon=True,
                            args=(child, rank, tensor_parallel_size, init_method, vocab_size, seed, timeout_s,
                                  vllm_config))
            p.start()
            child.close()
            self._conns.append(parent)
            self._procs.append(p)
        self._finalizer = weakref.finalize(self, _reap, list(self._procs))
        self._gather("startup", range(tensor_parallel_size))  # every rank joined the group

    @property
    def processes(self) -> list[Any]:
        return list(self._procs)

    def collective_rpc(self, method: str, args: Sequence[Any] = (), kwargs: dict | None = None) -> list[Any]:
        if self.is_shut_down:
            raise RuntimeError("the executor is shut down; build a new one")
        for rank, conn in enumerate(self._conns):
            try:
                conn.send((method, tuple(args), kwargs))
            except (BrokenPipeError, OSError):
                self._die(rank, method)
        return self._gather(method, range(self.tensor_parallel_size))

    def _gather(self, method: str, ranks: range) -> list[Any]:
        """Wait for one reply per rank; a dead rank or a silent group raises instead of hanging."""
        results: list[Any] = [None] * len(ranks)
        errors: list[str] = []
        pending = set(ranks)
        deadline = time.monotonic() + self.timeout_s
        while pending:
            remaining = deadline - time.monotonic()
            handles = [self._conns[r] for r in pending] + [self._procs[r].sentinel for r in pending]
            ready = wait(handles, timeout=max(remaining, 0))
            if not ready:
                self.shutdown(force=True)
                raise TimeoutError(f"{method!r}: no reply from ranks {sorted(pending)} within {self.timeout_s} s; "
                                   "the executor has been shut down")
            for rank in sorted(pending):
                conn = self._conns[rank]
                if conn.poll():
                    try:
                        status, payload = conn.recv()
                    except (EOFError, OSError):
                        self._die(rank, method)
                    pending.discard(rank)
                    if status == "error":
                        errors.append(f"rank {rank}: {payload}")
                    results[rank] = payload
                elif self._procs[rank].sentinel in ready:
                    self._die(rank, method)
        if errors:
            raise RuntimeError(f"{method!r} failed on the workers: " + "; ".join(errors))
        return results

    def _die(self, rank: int, method: str) -> None:
        proc = self._procs[rank]
        proc.join(timeout=1)
        code = proc.exitcode
        self.shutdown(force=True)
        raise WorkerDiedError(
            f"worker rank {rank} (pid {proc.pid}) died with exit code {code} during {method!r}; "
            f"a TP group cannot go on without every rank, so the executor has been shut down"
        )

    def shutdown(self, force: bool = False) -> None:
        if self.is_shut_down:
            return
        self.is_shut_down = True
        if not force:
            for conn, proc in zip(self._conns, self._procs):
                if proc.is_alive():
                    try:
                        conn.send(("shutdown", (), None))
                    except (BrokenPipeError, OSError):
                        pass
            for proc in self._procs:
                proc.join(timeout=10)
        _reap(self._procs)  # kills whatever is left
        for conn in self._conns:
            conn.close()
        self._finalizer.detach()
        self._tmp.cleanup()


def make_executor(vocab_size: int = 257, tensor_parallel_size: int = 1, seed: int = 0,
                  backend: str | None = None, vllm_config: VllmConfig | None = None) -> Executor:
    """The executor class follows ``backend`` (``ParallelConfig.distributed_executor_backend``), as
    upstream's ``Executor.get_class`` does; ``None`` picks ``"uni"`` at TP=1 and ``"mp"`` above it.
    ``vllm_config`` sizes each worker's runner (its persistent batch and block table)."""
    _check_tp(tensor_parallel_size)
    if backend is None:
        backend = "uni" if tensor_parallel_size == 1 else "mp"
    if backend == "uni":
        return UniProcExecutor(vocab_size, tensor_parallel_size, seed, vllm_config)
    if backend == "mp":
        vocab_shard(vocab_size, tensor_parallel_size, 0)  # refuse an uneven split before starting processes
        return MultiprocExecutor(vocab_size, tensor_parallel_size, seed, vllm_config=vllm_config)
    raise ValueError(f"unknown executor backend {backend!r}; expected 'uni' or 'mp'")


# -- the column → row pattern of every transformer block, one rank's share ------------------------
def shard_range(n: int, tp_size: int, rank: int) -> slice:
    """Rank ``rank``'s equal slice of an axis of length ``n`` (``n % tp_size == 0``, ``0 <= rank < tp_size``)."""
    _check_tp(tp_size)
    if not 0 <= rank < tp_size:
        raise ValueError(f"rank must lie in [0, {tp_size}), got {rank}")
    if n % tp_size:
        raise ValueError(f"an axis of {n} does not split over {tp_size} ranks; TP needs n % tp_size == 0")
    chunk = n // tp_size
    return slice(rank * chunk, (rank + 1) * chunk)


def tp_mlp_rank(
    x: np.ndarray,
    w1: np.ndarray,
    w2: np.ndarray,
    rank: int,
    tp_size: int,
    all_reduce: Callable[[np.ndarray], np.ndarray],
) -> tuple[np.ndarray, int]:
    """Rank ``rank``'s part of ``relu(x @ w1.T) @ w2.T``, finished by one ``all_reduce`` (sum).

    Weights are full and in torch's ``(out, in)`` layout: ``w1`` is ``(inter, hidden)``,
    ``w2`` is ``(hidden, inter)``. The rank keeps rows ``s`` of ``w1`` (column parallel: its slice
    of the intermediate features, never gathered), applies the elementwise ReLU to its slice, and
    multiplies by columns ``s`` of ``w2`` (row parallel): a full-shaped partial sum. Returns the
    reduced output and the number of all-reduces issued (always 1).
    """
    s = shard_range(w1.shape[0], tp_size, rank)
    h = np.maximum(x @ w1[s].T, 0)
    return all_reduce(h @ w2[:, s].T), 1
