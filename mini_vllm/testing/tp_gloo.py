"""Two gloo processes on CPU: mini's column → row MLP beside vLLM 0.22.1's parallel linears.

Each rank builds vLLM's real ``ColumnParallelLinear`` / ``RowParallelLinear`` inside a real TP
group (``init_distributed_environment`` + ``initialize_model_parallel`` over gloo), loads the same
full weights through their ``weight_loader`` (each keeps its shard), runs ``row(relu(col(x)))`` and
counts the all-reduces the pair issues. Then it runs ``mini_vllm.executor.tp_mlp_rank`` over the
same process group. Rank 0 reports both outputs; the test compares them with the dense product.
Used by ``mini_vllm/test_upstream_executor.py``; importing it imports nothing heavy.
"""

from __future__ import annotations

import os
from typing import Any


def _cpu_env() -> None:
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
    os.environ.setdefault("TRITON_INTERPRET", "1")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")


def _import_vllm_on_cpu() -> None:
    """The heavy imports, in the order ``_run`` needs them (the CPU platform is set before any layer)."""
    import warnings

    warnings.simplefilter("ignore")
    import torch  # noqa: F401
    import vllm.platforms as platforms  # the CUDA wheel cannot tell it runs on a CPU: say so first
    from vllm.platforms.cpu import CpuPlatform

    platforms._current_platform = CpuPlatform()
    import vllm.config  # noqa: F401
    import vllm.distributed.parallel_state  # noqa: F401
    import vllm.model_executor.layers.linear  # noqa: F401


def launch_ranks(world: int, init_method: str, seed: int, queue: Any) -> None:
    """One spawned process imports vLLM once, then forks the ``world`` ranks (half the import cost).

    Nothing has started a thread pool or a process group yet, so the fork is clean.
    """
    import multiprocessing as mp

    _cpu_env()
    _import_vllm_on_cpu()
    ctx = mp.get_context("fork")
    procs = [ctx.Process(target=_rank_main, args=(r, world, init_method, seed, queue), daemon=True)
             for r in range(world)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()


def _rank_main(rank: int, world: int, init_method: str, seed: int, queue: Any) -> None:
    _cpu_env()
    try:
        queue.put((rank, "ok", _run(rank, world, init_method, seed)))
    except BaseException as exc:  # report instead of dying silently
        import traceback

        queue.put((rank, "error", f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"))


def weights(seed: int, hidden: int = 8, inter: int = 16, tokens: int = 4):
    import numpy as np

    rng = np.random.default_rng(seed)
    x = rng.standard_normal((tokens, hidden)).astype(np.float32)
    w1 = rng.standard_normal((inter, hidden)).astype(np.float32)  # (out, in): the column-parallel layer
    w2 = rng.standard_normal((hidden, inter)).astype(np.float32)  # (out, in): the row-parallel layer
    return x, w1, w2


def _run(rank: int, world: int, init_method: str, seed: int) -> dict:
    _import_vllm_on_cpu()  # a no-op after launch_ranks
    import numpy as np
    import torch
    import torch.distributed as dist
    import vllm.model_executor.layers.linear as linear
    from vllm.config import ParallelConfig, VllmConfig, set_current_vllm_config
    from vllm.distributed import parallel_state as ps

    from mini_vllm.executor import tp_mlp_rank

    torch.set_num_threads(1)
    x, w1, w2 = weights(seed)
    cm = set_current_vllm_config(VllmConfig(parallel_config=ParallelConfig(tensor_parallel_size=world)))
    cm.__enter__()
    ps.init_distributed_environment(world_size=world, rank=rank, distributed_init_method=init_method,
                                    local_rank=rank, backend="gloo")
    ps.initialize_model_parallel(tensor_model_parallel_size=world)
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
    col = linear.ColumnParallelLinear(w1.shape[1], w1.shape[0], bias=False, params_dtype=torch.float32)
    row = linear.RowParallelLinear(w2.shape[1], w2.shape[0], bias=False, params_dtype=torch.float32)
    col.weight_loader(col.weight, torch.from_numpy(w1))
    row.weight_loader(row.weight, torch.from_numpy(w2))
    for layer in (col, row):
        layer.quant_method.process_weights_after_loading(layer)
    with torch.no_grad():
        y_vllm, _ = row(torch.relu(col(torch.from_numpy(x))[0]))

    group = ps.get_tp_group().cpu_group
    mini_reduces = 0

    def all_reduce(partial: np.ndarray) -> np.ndarray:
        nonlocal mini_reduces
        mini_reduces += 1
        t = torch.from_numpy(np.ascontiguousarray(partial))
        dist.all_reduce(t, group=group)
        return t.numpy()

    y_mini, _ = tp_mlp_rank(x, w1, w2, rank, world, all_reduce)
    out = {
        "y_vllm": y_vllm.numpy().copy(), "y_mini": y_mini.copy(),
        "col_shard": tuple(col.weight.shape), "row_shard": tuple(row.weight.shape),
        "col_weight_is_chunk": bool(np.array_equal(col.weight.detach().numpy(), np.split(w1, world, 0)[rank])),
        "vllm_calls": dict(calls), "mini_all_reduces": mini_reduces,
    }
    ps.destroy_model_parallel()
    ps.destroy_distributed_environment()
    return out
