"""Differential (tier 1): mini's column → row MLP equals vLLM's real parallel linears over gloo.

Two CPU processes (forked by one spawned launcher that imports vLLM once) form a real vLLM TP group; each loads the same full weights into
``ColumnParallelLinear`` and ``RowParallelLinear`` (each keeps its shard) and runs mini's
``tp_mlp_rank`` on the same group. See ``mini_vllm/testing/tp_gloo.py``.
"""

import multiprocessing as mp
import os
import queue as queue_mod
import tempfile

import numpy as np
import pytest

from mini_vllm.testing.tp_gloo import launch_ranks, weights

pytestmark = [pytest.mark.upstream, pytest.mark.slow]


@pytest.mark.timeout(240)
def test_column_row_mlp_matches_vllm_parallel_linears_with_one_all_reduce():
    world, seed = 2, 0
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    with tempfile.TemporaryDirectory() as tmp:
        init = "file://" + os.path.join(tmp, "rendezvous")
        # one spawned launcher imports vLLM once and forks the ranks (it has children: not a daemon)
        procs = [ctx.Process(target=launch_ranks, args=(world, init, seed, results))]
        for p in procs:
            p.start()
        got = {}
        try:
            for _ in range(world):
                rank, status, payload = results.get(timeout=200)
                assert status == "ok", f"rank {rank} failed:\n{payload}"
                got[rank] = payload
        except queue_mod.Empty:
            pytest.fail(f"no result from ranks {sorted(set(range(world)) - set(got))} within 200 s")
        finally:
            for p in procs:
                p.join(timeout=20)
                if p.is_alive():
                    p.kill()
                    p.join(timeout=5)
    x, w1, w2 = weights(seed)
    dense = np.maximum(x.astype(np.float64) @ w1.T.astype(np.float64), 0) @ w2.T.astype(np.float64)
    for rank, out in got.items():
        assert out["col_shard"] == (8, 8) and out["row_shard"] == (8, 8), "each rank keeps half of each weight"
        assert out["col_weight_is_chunk"], "ColumnParallelLinear keeps rows (output features) rank*8..rank*8+7"
        assert out["vllm_calls"] == {"all_reduce": 1, "all_gather": 0}, (
            f"rank {rank}: the column → row pair must cost exactly one all-reduce and no gather, got {out['vllm_calls']}"
        )
        assert out["mini_all_reduces"] == 1
        err_vllm = np.abs(out["y_vllm"] - dense).max()
        err_mini = np.abs(out["y_mini"] - out["y_vllm"]).max()
        assert err_vllm < 1e-5 and err_mini < 1e-5, f"rank {rank}: vs dense {err_vllm:.2e}, mini vs vLLM {err_mini:.2e}"
        print(f"rank {rank}: max |vLLM - dense| = {err_vllm:.1e}, max |mini - vLLM| = {err_mini:.1e}")
