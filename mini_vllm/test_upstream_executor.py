"""Differential (tier 1): vLLM's real process groups on CPU, two gloo processes.

* mini's column → row MLP equals vLLM's real ``ColumnParallelLinear`` → ``RowParallelLinear``
  (each rank loads the same full weights and keeps its shard), with one all-reduce each;
* two pipeline stages (``initialize_model_parallel(1, 2)``) split 30 layers with
  ``get_pp_indices`` and hand the activations over with ``send_tensor_dict`` / ``recv_tensor_dict``.

Both run through ``mini_vllm/testing/tp_gloo.py`` (one spawned launcher imports vLLM once and
forks the ranks). ``get_pp_indices`` itself is pure and is also checked here without processes.
"""

import numpy as np
import pytest

from mini_vllm.testing.tp_gloo import run_ranks, weights


@pytest.mark.upstream
@pytest.mark.slow
@pytest.mark.timeout(240)
def test_column_row_mlp_matches_vllm_parallel_linears_with_one_all_reduce():
    world, seed = 2, 0
    got = run_ranks(world, "tp_mlp", seed=seed)
    x, w1, w2 = weights(seed)
    dense = np.maximum(x.astype(np.float64) @ w1.T.astype(np.float64), 0) @ w2.T.astype(np.float64)
    for rank, out in got.items():
        assert out["col_shard"] == (8, 8) and out["row_shard"] == (8, 8), "each rank keeps half of each weight"
        assert out["col_weight_is_chunk"], "ColumnParallelLinear keeps rows (output features) rank*8..rank*8+7"
        assert out["row_weight_is_chunk"], "RowParallelLinear keeps columns (input features) rank*8..rank*8+7"
        assert out["vllm_calls"] == {"all_reduce": 1, "all_gather": 0}, (
            f"rank {rank}: the column → row pair must cost exactly one all-reduce and no gather, got {out['vllm_calls']}"
        )
        assert out["impl_calls"] == {"all_reduce": 1, "all_gather": 0}
        err_vllm = np.abs(out["y_vllm"] - dense).max()
        err_mini = np.abs(out["y_impl"] - out["y_vllm"]).max()
        assert err_vllm < 1e-5 and err_mini < 1e-5, f"rank {rank}: vs dense {err_vllm:.2e}, mini vs vLLM {err_mini:.2e}"
        print(f"rank {rank}: max |vLLM - dense| = {err_vllm:.1e}, max |mini - vLLM| = {err_mini:.1e}")


@pytest.mark.upstream
@pytest.mark.slow
@pytest.mark.timeout(240)
def test_two_pipeline_stages_split_the_layers_and_hand_over_the_activations():
    got = run_ranks(2, "pp_handoff", num_layers=30, seed=3)
    first, last = got[0], got[1]
    assert (first["pp_world"], first["tp_world"]) == (2, 1), "initialize_model_parallel(1, 2): TP 1, PP 2"
    assert (first["first"], first["last"], last["first"], last["last"]) == (True, False, False, True)
    assert first["layers"] == (0, 15) and last["layers"] == (15, 30), (
        f"get_pp_indices(30, r, 2) gives each stage 15 contiguous layers, got {first['layers']}, {last['layers']}"
    )
    assert first["send_returned"] is None, "send_tensor_dict returns None once the dict has left"
    received = last["received"]
    assert set(received) == {"hidden_states", "residual"}, f"the whole dict crosses, keys and all: {sorted(received)}"
    assert np.array_equal(received["hidden_states"], first["sent"]), "stage 1 gets stage 0's activations bit for bit"
    assert np.array_equal(received["residual"], first["sent_residual"])
    assert received["hidden_states"].dtype == np.float32 and received["hidden_states"].shape == (5, 8)


@pytest.mark.upstream
def test_get_pp_indices_gives_the_remainder_to_the_stages_before_the_last(monkeypatch):
    monkeypatch.delenv("VLLM_PP_LAYER_PARTITION", raising=False)
    from vllm.distributed.utils import get_pp_indices

    def split(layers, stages):
        return [get_pp_indices(layers, r, stages) for r in range(stages)]

    assert split(30, 2) == [(0, 15), (15, 30)]
    assert split(31, 2) == [(0, 16), (16, 31)], "an odd layer goes to the first stage: the last one holds the LM head"
    assert split(32, 4) == [(0, 8), (8, 16), (16, 24), (24, 32)]
    assert split(34, 4) == [(0, 8), (8, 17), (17, 26), (26, 34)], (
        "two extra layers go to the middle stages: first and last hold the embedding and the LM head"
    )
