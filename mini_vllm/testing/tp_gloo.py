"""Real vLLM process groups on CPU (gloo), and a thread-backed stand-in, for the Phase 10 tests.

``run_ranks(world, job, **kwargs)`` starts one spawned launcher that imports vLLM once and forks
``world`` ranks; each rank joins a real vLLM group (``init_distributed_environment`` +
``initialize_model_parallel`` over gloo), runs ``JOBS[job]`` and sends back a picklable result.
The jobs:

* ``tp_mlp`` — vLLM's real ``ColumnParallelLinear`` / ``RowParallelLinear`` load the same full
  weights through their ``weight_loader`` (each keeps its shard), run ``row(relu(col(x)))`` and
  count the collectives the pair issues. Beside them the same rank runs either
  ``mini_vllm.executor.tp_mlp_rank`` or, with ``impl=<path of a lab file>``, that file's
  ``load_mlp_shard`` + ``mlp_rank_forward`` over a ``GlooGroup`` on the same TP group.
* ``pp_handoff`` — two pipeline stages (``initialize_model_parallel(1, 2)``): each asks
  ``get_pp_indices`` for its layers, stage 0 sends a tensor dict with ``send_tensor_dict`` and
  stage 1 receives it with ``recv_tensor_dict``.

``ThreadGroup`` runs the same per-rank code in one process, one thread per rank, with the sums
done in rank order: what the fast (default-suite) tests and a lab's ``main()`` use. Importing this
module imports nothing heavy; torch and vLLM load inside the ranks.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Any

import numpy as np


class ThreadGroup:
    """``world`` ranks as threads of this process; ``all_reduce`` sums and ``all_gather`` concatenates.

    ``run(fn)`` calls ``fn(rank, group)`` on every rank at once and returns the results in rank
    order. Every collective waits for all ranks (a barrier with a timeout, so a rank that skips
    a collective fails the run instead of hanging it). ``calls`` counts the collectives issued, per
    kind, once per group call (not once per rank); ``bytes`` adds each call's payload, per rank.
    """

    def __init__(self, world: int, timeout_s: float = 10.0) -> None:
        if isinstance(world, bool) or not isinstance(world, int) or world < 1:
            raise ValueError(f"world must be an int >= 1, got {world!r}")
        self.world, self.timeout_s = world, timeout_s
        self.calls = {"all_reduce": 0, "all_gather": 0}
        self.bytes = {"all_reduce": 0, "all_gather": 0}
        self._barrier = threading.Barrier(world, timeout=timeout_s)
        self._slots: list[Any] = [None] * world
        self._local = threading.local()

    def _exchange(self, kind: str, array: np.ndarray) -> list[np.ndarray]:
        rank = self._local.rank
        self._slots[rank] = np.array(array, copy=True)
        self._barrier.wait()
        pieces = list(self._slots)
        if rank == 0:
            self.calls[kind] += 1
            self.bytes[kind] += int(pieces[0].nbytes)
        self._barrier.wait()  # nobody overwrites a slot before every rank has read them all
        shapes = {p.shape for p in pieces}
        if len(shapes) != 1:
            raise ValueError(f"{kind}: ranks contributed different shapes {sorted(shapes)}")
        return pieces

    def all_reduce(self, array: np.ndarray) -> np.ndarray:
        pieces = self._exchange("all_reduce", array)
        total = pieces[0]
        for p in pieces[1:]:  # rank order, like a deterministic reduction
            total = total + p
        return total

    def all_gather(self, array: np.ndarray) -> np.ndarray:
        return np.concatenate(self._exchange("all_gather", array), axis=-1)

    def run(self, fn: Callable[[int, ThreadGroup], Any]) -> list[Any]:
        results: list[Any] = [None] * self.world
        errors: list[BaseException | None] = [None] * self.world

        def body(rank: int) -> None:
            self._local.rank = rank
            try:
                results[rank] = fn(rank, self)
            except BaseException as exc:  # noqa: BLE001 - re-raised below, in the caller's thread
                errors[rank] = exc
                self._barrier.abort()  # release the ranks waiting on this one

        threads = [threading.Thread(target=body, args=(r,), daemon=True) for r in range(self.world)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(self.timeout_s * 4)
        if any(t.is_alive() for t in threads):
            raise TimeoutError(f"ranks still running after {self.timeout_s * 4:.0f} s")
        first = next((e for e in errors if e is not None and not isinstance(e, threading.BrokenBarrierError)), None)
        first = first or next((e for e in errors if e is not None), None)
        if first is not None:
            if isinstance(first, threading.BrokenBarrierError):
                raise RuntimeError("the ranks did not issue the same collectives (a barrier broke): every rank "
                                   "must call every collective, in the same order") from first
            raise first
        return results


class GlooGroup:
    """The same two methods over a real torch.distributed group (a vLLM TP group's ``cpu_group``)."""

    def __init__(self, group: Any, world: int) -> None:
        self.group, self.world = group, world
        self.calls = {"all_reduce": 0, "all_gather": 0}

    def all_reduce(self, array: np.ndarray) -> np.ndarray:
        import torch
        import torch.distributed as dist

        self.calls["all_reduce"] += 1
        t = torch.from_numpy(np.ascontiguousarray(array))
        dist.all_reduce(t, group=self.group)
        return t.numpy()

    def all_gather(self, array: np.ndarray) -> np.ndarray:
        import torch
        import torch.distributed as dist

        self.calls["all_gather"] += 1
        t = torch.from_numpy(np.ascontiguousarray(array))
        parts = [torch.empty_like(t) for _ in range(self.world)]
        dist.all_gather(parts, t, group=self.group)
        return torch.cat(parts, dim=-1).numpy()


def _cpu_env() -> None:
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
    os.environ.setdefault("TRITON_INTERPRET", "1")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    os.environ.pop("VLLM_PP_LAYER_PARTITION", None)  # get_pp_indices must use its own rule


def _import_vllm_on_cpu() -> None:
    """The heavy imports, in the order the jobs need them (the CPU platform is set before any layer)."""
    import warnings

    warnings.simplefilter("ignore")
    import torch  # noqa: F401
    import vllm.platforms as platforms  # the CUDA wheel cannot tell it runs on a CPU: say so first
    from vllm.platforms.cpu import CpuPlatform

    platforms._current_platform = CpuPlatform()
    import vllm.config  # noqa: F401
    import vllm.distributed.parallel_state  # noqa: F401
    import vllm.distributed.utils  # noqa: F401
    import vllm.model_executor.layers.linear  # noqa: F401


def run_ranks(world: int, job: str, timeout_s: float = 200.0, **kwargs: Any) -> dict[int, Any]:
    """Run ``JOBS[job](rank, world, **kwargs)`` in ``world`` real gloo ranks; ``{rank: result}``.

    Raises ``RuntimeError`` naming the rank (with its traceback) when a rank fails, and
    ``TimeoutError`` when some rank sends nothing within ``timeout_s``.
    """
    import multiprocessing as mp
    import queue as queue_mod
    import tempfile

    if job not in JOBS:
        raise ValueError(f"unknown job {job!r}; choose from {sorted(JOBS)}")
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    got: dict[int, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        init = "file://" + os.path.join(tmp, "rendezvous")
        # one spawned launcher imports vLLM once and forks the ranks (it has children: not a daemon)
        launcher = ctx.Process(target=_launch, args=(world, init, job, kwargs, results))
        launcher.start()
        try:
            for _ in range(world):
                try:
                    rank, status, payload = results.get(timeout=timeout_s)
                except queue_mod.Empty:
                    raise TimeoutError(f"job {job!r}: no result from ranks {sorted(set(range(world)) - set(got))} "
                                       f"within {timeout_s:.0f} s") from None
                if status != "ok":
                    raise RuntimeError(f"job {job!r}, rank {rank} failed:\n{payload}")
                got[rank] = payload
        finally:
            launcher.join(timeout=20)
            if launcher.is_alive():
                launcher.kill()
                launcher.join(timeout=5)
    return got


def _launch(world: int, init_method: str, job: str, kwargs: dict, queue: Any) -> None:
    """The spawned launcher: import vLLM once, then fork the ``world`` ranks (half the import cost).

    Nothing has started a thread pool or a process group yet, so the fork is clean.
    """
    import multiprocessing as mp

    _cpu_env()
    _import_vllm_on_cpu()
    ctx = mp.get_context("fork")
    procs = [ctx.Process(target=_rank_main, args=(r, world, init_method, job, kwargs, queue), daemon=True)
             for r in range(world)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()


def _rank_main(rank: int, world: int, init_method: str, job: str, kwargs: dict, queue: Any) -> None:
    _cpu_env()
    try:
        queue.put((rank, "ok", JOBS[job](rank, world, init_method, **kwargs)))
    except BaseException as exc:  # report instead of dying silently
        import traceback

        queue.put((rank, "error", f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"))


def weights(seed: int, hidden: int = 8, inter: int = 16, tokens: int = 4, bias: bool = False):
    """``x, w1, w2`` (torch's ``(out, in)`` layout, float32), plus ``b1, b2`` when ``bias``."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((tokens, hidden)).astype(np.float32)
    w1 = rng.standard_normal((inter, hidden)).astype(np.float32)  # the column-parallel layer
    w2 = rng.standard_normal((hidden, inter)).astype(np.float32)  # the row-parallel layer
    if not bias:
        return x, w1, w2
    b1 = rng.standard_normal(inter).astype(np.float32)
    b2 = rng.standard_normal(hidden).astype(np.float32)
    return x, w1, w2, b1, b2


def _join(rank: int, world: int, init_method: str, tp: int, pp: int) -> None:
    from vllm.config import ParallelConfig, VllmConfig, set_current_vllm_config
    from vllm.distributed import parallel_state as ps

    cm = set_current_vllm_config(VllmConfig(parallel_config=ParallelConfig(tensor_parallel_size=tp,
                                                                           pipeline_parallel_size=pp)))
    cm.__enter__()
    ps.init_distributed_environment(world_size=world, rank=rank, distributed_init_method=init_method,
                                    local_rank=rank, backend="gloo")
    ps.initialize_model_parallel(tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp)


def _leave() -> None:
    from vllm.distributed import parallel_state as ps

    ps.destroy_model_parallel()
    ps.destroy_distributed_environment()


def _tp_mlp(rank: int, world: int, init_method: str, seed: int = 0, impl: str | None = None,
            bias: bool = False) -> dict:
    _import_vllm_on_cpu()  # a no-op after _launch
    import torch
    import vllm.model_executor.layers.linear as linear
    from vllm.distributed import parallel_state as ps

    torch.set_num_threads(1)
    if impl is None and bias:
        raise ValueError("mini_vllm's tp_mlp_rank has no biases; pass impl= to test a file that has them")
    arrays = weights(seed, bias=bias)
    x, w1, w2 = arrays[:3]
    b1, b2 = arrays[3:] if bias else (None, None)
    _join(rank, world, init_method, tp=world, pp=1)
    calls = {"all_reduce": 0, "all_gather": 0}
    real_reduce, real_gather = linear.tensor_model_parallel_all_reduce, linear.tensor_model_parallel_all_gather

    def counting_reduce(t):
        calls["all_reduce"] += 1
        return real_reduce(t)

    def counting_gather(t, *a, **k):
        calls["all_gather"] += 1
        return real_gather(t, *a, **k)

    linear.tensor_model_parallel_all_reduce = counting_reduce
    linear.tensor_model_parallel_all_gather = counting_gather
    col = linear.ColumnParallelLinear(w1.shape[1], w1.shape[0], bias=bias, params_dtype=torch.float32)
    row = linear.RowParallelLinear(w2.shape[1], w2.shape[0], bias=bias, params_dtype=torch.float32)
    col.weight_loader(col.weight, torch.from_numpy(w1))
    row.weight_loader(row.weight, torch.from_numpy(w2))
    if bias:
        col.weight_loader(col.bias, torch.from_numpy(b1))
        row.weight_loader(row.bias, torch.from_numpy(b2))
    for layer in (col, row):
        layer.quant_method.process_weights_after_loading(layer)
    with torch.no_grad():
        y_vllm, _ = row(torch.relu(col(torch.from_numpy(x))[0]))

    group = GlooGroup(ps.get_tp_group().cpu_group, world)
    out = {
        "y_vllm": y_vllm.numpy().copy(),
        "col_shard": tuple(col.weight.shape), "row_shard": tuple(row.weight.shape),
        "col_weight_is_chunk": bool(np.array_equal(col.weight.detach().numpy(), np.split(w1, world, 0)[rank])),
        "row_weight_is_chunk": bool(np.array_equal(row.weight.detach().numpy(), np.split(w2, world, 1)[rank])),
        "vllm_calls": dict(calls),
    }
    if impl is None:
        from mini_vllm.executor import tp_mlp_rank

        y_impl, _ = tp_mlp_rank(x, w1, w2, rank, world, group.all_reduce)
    else:
        from course.runtime.harness import load_file

        module = load_file(impl)
        shard = module.load_mlp_shard(w1, b1, w2, b2, rank, world)
        y_impl = module.mlp_rank_forward(x, shard, rank, group)
        vllm_params = {"w1": col.weight, "w2": row.weight, "b1": col.bias, "b2": row.bias}
        out["shard_equal_vllm"] = {
            name: (vllm_params[name] is None and getattr(shard, name) is None)
            or (getattr(shard, name) is not None and vllm_params[name] is not None
                and bool(np.array_equal(np.asarray(getattr(shard, name)), vllm_params[name].detach().numpy())))
            for name in vllm_params
        }
    out["y_impl"] = np.asarray(y_impl).copy()
    out["impl_calls"] = dict(group.calls)
    _leave()
    return out


def _pp_handoff(rank: int, world: int, init_method: str, num_layers: int = 30, seed: int = 0) -> dict:
    _import_vllm_on_cpu()
    import torch
    from vllm.distributed import parallel_state as ps
    from vllm.distributed.utils import get_pp_indices

    torch.set_num_threads(1)
    _join(rank, world, init_method, tp=1, pp=world)
    pp = ps.get_pp_group()
    start, end = get_pp_indices(num_layers, pp.rank_in_group, pp.world_size)
    rng = np.random.default_rng(seed)
    hidden = rng.standard_normal((5, 8)).astype(np.float32)  # stage 0's activations after its layers
    residual = rng.standard_normal((5, 8)).astype(np.float32)
    out: dict[str, Any] = {"layers": (start, end), "pp_rank": pp.rank_in_group, "pp_world": pp.world_size,
                           "tp_world": ps.get_tp_group().world_size, "first": pp.is_first_rank,
                           "last": pp.is_last_rank, "sent": hidden, "sent_residual": residual}
    if pp.is_first_rank:
        out["send_returned"] = pp.send_tensor_dict({"hidden_states": torch.from_numpy(hidden),
                                                    "residual": torch.from_numpy(residual)})
    else:
        got = pp.recv_tensor_dict()
        out["received"] = {k: v.numpy().copy() for k, v in got.items()}
    _leave()
    return out


JOBS: dict[str, Callable[..., dict]] = {"tp_mlp": _tp_mlp, "pp_handoff": _pp_handoff}
