"""Lab 10-04: one rank's shard loader and forward, and the collectives a TP step sends.

Default suite: the ranks run as threads of this process (``ThreadGroup``). Marked ``slow``: the
same functions in two gloo processes beside vLLM's real ``ColumnParallelLinear`` /
``RowParallelLinear``. Marked ``engine``: the real engine at TP=2 on two CPU workers.
"""

import json

import numpy as np
import pytest

from course.runtime import lab_module
from course.runtime.harness import lab_file
from mini_vllm.testing.tp_gloo import ThreadGroup, run_ranks, weights

lab = lab_module(__file__)   # solution.py by default; LAB_IMPL=starter grades starter.py


def _mlp(seed, hidden=8, inter=16, tokens=4, bias=True):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((tokens, hidden))
    w1, w2 = rng.standard_normal((inter, hidden)), rng.standard_normal((hidden, inter))
    b1 = rng.standard_normal(inter) if bias else None
    b2 = rng.standard_normal(hidden) if bias else None
    return x, w1, b1, w2, b2


def _dense(x, w1, b1, w2, b2):
    h = x @ w1.T + (0 if b1 is None else b1)
    return np.maximum(h, 0) @ w2.T + (0 if b2 is None else b2)


def _run(x, w1, b1, w2, b2, tp):
    group = ThreadGroup(tp)
    shards = [lab.load_mlp_shard(w1, b1, w2, b2, r, tp) for r in range(tp)]
    return group.run(lambda r, g: lab.mlp_rank_forward(x, shards[r], r, g)), group


# --- the shard loader: which rows, which columns, which bias ---------------------------------------
@pytest.mark.parametrize("tp", [1, 2, 4, 8])
def test_column_shard_keeps_output_rows_and_their_bias(tp):
    w, b = np.arange(16 * 6, dtype=float).reshape(16, 6), np.arange(16, dtype=float)
    c = 16 // tp
    for rank in range(tp):
        got_w, got_b = lab.load_column_shard(w, b, rank, tp)
        assert got_w.shape == (c, 6) and np.array_equal(got_w, w[rank * c:(rank + 1) * c]), (
            f"tp={tp}, rank {rank}: a column-parallel layer keeps OUTPUT rows {rank * c}..{(rank + 1) * c - 1} of "
            f"the (out, in) weight (got shape {got_w.shape}); vLLM's ColumnParallelLinear shards dim 0"
        )
        assert np.array_equal(got_b, b[rank * c:(rank + 1) * c]), (
            "the column-parallel bias belongs to the output features: each rank keeps the slice matching its rows"
        )
    assert lab.load_column_shard(w, None, 0, tp)[1] is None, "no bias in, no bias out"


@pytest.mark.parametrize("tp", [1, 2, 4, 8])
def test_row_shard_keeps_input_columns_and_the_whole_bias(tp):
    w, b = np.arange(6 * 16, dtype=float).reshape(6, 16), np.arange(6, dtype=float)
    c = 16 // tp
    for rank in range(tp):
        got_w, got_b = lab.load_row_shard(w, b, rank, tp)
        assert got_w.shape == (6, c) and np.array_equal(got_w, w[:, rank * c:(rank + 1) * c]), (
            f"tp={tp}, rank {rank}: a row-parallel layer keeps INPUT columns {rank * c}..{(rank + 1) * c - 1} "
            f"(got shape {got_w.shape}); vLLM's RowParallelLinear shards dim 1"
        )
        assert got_b is not None and np.array_equal(got_b, b), (
            "the row-parallel bias is per OUTPUT feature and the outputs are not split: every rank keeps all of it"
        )


def test_shards_tile_the_weight_even_from_strided_views():
    base = np.random.default_rng(1).standard_normal((12, 40))
    w_col = base[:, 3:11]  # (12, 8), a column slice: not contiguous
    w_row = base[:8, ::3].T  # (14, 8): a transposed, strided view
    cols = [lab.load_column_shard(w_col, None, r, 4)[0] for r in range(4)]
    rows = [lab.load_row_shard(w_row, None, r, 2)[0] for r in range(2)]
    assert np.array_equal(np.concatenate(cols, axis=0), w_col), "column shards in rank order rebuild the weight"
    assert np.array_equal(np.concatenate(rows, axis=1), w_row), "row shards in rank order rebuild the weight"


@pytest.mark.parametrize("loader", ["load_column_shard", "load_row_shard"])
def test_an_axis_that_does_not_split_is_refused(loader):
    w = np.zeros((10, 10))
    with pytest.raises(ValueError, match="does not split evenly"):
        getattr(lab, loader)(w, None, 3, 4)
    with pytest.raises(ValueError, match="does not split evenly"):
        getattr(lab, loader)(w, None, 0, 4)  # rank 0 too: refuse before anything is loaded
    with pytest.raises(ValueError, match="rank must lie"):
        getattr(lab, loader)(np.zeros((8, 8)), None, 2, 2)
    with pytest.raises(ValueError, match="w1 makes 8 features but w2 takes 6"):
        lab.load_mlp_shard(np.zeros((8, 4)), None, np.zeros((4, 6)), None, 0, 2)


# --- one rank's forward, over a simulated group ----------------------------------------------------
@pytest.mark.parametrize("tp", [1, 2, 4])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("tokens", [1, 5])
def test_every_rank_ends_with_the_dense_output(tp, bias, tokens):
    x, w1, b1, w2, b2 = _mlp(seed=tp * 10 + tokens, tokens=tokens, bias=bias)
    outs, _ = _run(x, w1, b1, w2, b2, tp)
    dense = _dense(x, w1, b1, w2, b2)
    for rank, out in enumerate(outs):
        err = np.abs(out - dense).max()
        assert out.shape == dense.shape and err < 1e-12, (
            f"tp={tp}, bias={bias}, rank {rank}: max error {err:.2e} vs relu(x @ w1.T + b1) @ w2.T + b2; every rank "
            f"must end with the full output"
        )


@pytest.mark.parametrize("tp", [2, 4])
def test_row_bias_is_added_once_not_once_per_rank(tp):
    x, w1, b1, w2, _ = _mlp(seed=5)
    b2 = np.full(8, 1000.0)
    outs, _ = _run(x, w1, b1, w2, b2, tp)
    shift = outs[0] - _dense(x, w1, b1, w2, None)
    assert np.allclose(shift, 1000.0), (
        f"tp={tp}: the output is shifted by {shift[0, 0]:.0f}, not 1000: add the row-parallel bias on rank 0 only "
        f"(or after the all-reduce), never on every rank before the sum"
    )


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_one_all_reduce_no_gather_and_its_bytes(tp):
    x, w1, b1, w2, b2 = _mlp(seed=7, tokens=3)
    _, group = _run(x, w1, b1, w2, b2, tp)
    want = {"all_reduce": 1 if tp > 1 else 0, "all_gather": 0}
    assert group.calls == want, (
        f"tp={tp}: the column → row block issued {group.calls}; it needs exactly {want}: the hidden slice "
        f"stays on its rank and one sum (not a gather) finishes the block; alone, no collective at all"
    )
    assert group.bytes["all_reduce"] == (3 * 8 * 8 if tp > 1 else 0), (
        "the all-reduce carries the full-shaped output, tokens × hidden values, from every rank"
    )


# --- the prediction: collectives per step, for the tiny engine model --------------------------------
def test_tiny_model_step_at_tp2():
    got = lab.predict_step_collectives(num_layers=2, hidden=256, vocab_size=512, num_tokens=19, num_seqs=2,
                                       tp_size=2, dtype_bytes=4)
    assert tuple(got) == (5, 19 * 256 * 4, 1, 2 * 256 * 4), (
        f"got {tuple(got)}: 2 all-reduces per layer (attention, MLP) + 1 for the vocabulary-parallel embedding = 5, "
        f"each num_tokens × hidden × 4 B; one all-gather of each rank's half of the logits (num_seqs × 256 × 4 B)"
    )


def test_step_prediction_varies_every_parameter():
    base = {"num_layers": 32, "hidden": 4096, "vocab_size": 128256, "num_tokens": 1, "num_seqs": 1, "dtype_bytes": 2}
    assert tuple(lab.predict_step_collectives(**base, tp_size=1)) == (0, 0, 0, 0), "TP=1 sends nothing"
    assert tuple(lab.predict_step_collectives(**base, tp_size=8)) == (65, 8192, 1, 128256 // 8 * 2)
    odd = dict(base, vocab_size=50257, num_tokens=2048, num_seqs=4, num_layers=24, hidden=1024)
    got = lab.predict_step_collectives(**odd, tp_size=4)
    assert tuple(got) == (49, 2048 * 1024 * 2, 1, 4 * (50304 // 4) * 2), (
        f"got {tuple(got)}: a vocabulary of 50257 is padded to a multiple of 64 (50304) before it is split over ranks"
    )
    with pytest.raises(ValueError, match="num_seqs"):
        lab.predict_step_collectives(**dict(base, num_seqs=3, num_tokens=2), tp_size=2)
    with pytest.raises(ValueError, match="tp_size"):
        lab.predict_step_collectives(**base, tp_size=0)
    with pytest.raises(ValueError, match="num_layers"):
        lab.predict_step_collectives(**dict(base, num_layers=0), tp_size=2)
    with pytest.raises(ValueError, match="vocabulary"):   # 512 logits over 3 ranks: 170 each would lose 2
        lab.predict_step_collectives(**dict(base, vocab_size=512), tp_size=3)


def test_generate_is_one_prefill_then_decode_steps():
    steps = lab.predict_generate_collectives([16, 3], 4, num_layers=2, hidden=256, vocab_size=512, tp_size=2,
                                             dtype_bytes=4)
    assert [s.all_reduce_bytes for s in steps] == [19 * 1024, 2 * 1024, 2 * 1024, 2 * 1024], (
        "step 0 runs both prompts (19 tokens); each later step runs one token per sequence (2 tokens): "
        "max_tokens=4 means 4 forward steps"
    )
    assert {s.all_reduces for s in steps} == {5} and {s.all_gather_bytes for s in steps} == {2048}
    assert len(lab.predict_generate_collectives([7], 1, 2, 256, 512, 2)) == 1, "max_tokens=1: the prefill step only"
    with pytest.raises(ValueError, match="no prompts"):
        lab.predict_generate_collectives([], 4, 2, 256, 512, 2)
    with pytest.raises(ValueError, match="max_tokens"):   # vLLM's SamplingParams refuses it too: no step samples nothing
        lab.predict_generate_collectives([7], 0, 2, 256, 512, 2)
    with pytest.raises(ValueError, match="prompt length"):
        lab.predict_generate_collectives([7, 0], 2, 2, 256, 512, 2)


# --- tier 1: two gloo processes beside vLLM's real layers -------------------------------------------
@pytest.mark.upstream
@pytest.mark.slow
@pytest.mark.timeout(240)
def test_your_ranks_match_vllm_parallel_linears_over_gloo():
    got = run_ranks(2, "tp_mlp", seed=4, impl=str(lab_file(__file__)), bias=True)
    x, w1, w2, b1, b2 = weights(4, bias=True)
    dense = np.maximum(x.astype(np.float64) @ w1.T + b1, 0) @ w2.T.astype(np.float64) + b2
    for rank, out in got.items():
        assert out["shard_equal_vllm"] == {"w1": True, "w2": True, "b1": True, "b2": True}, (
            f"rank {rank}: your shards differ from what vLLM's weight_loader kept: {out['shard_equal_vllm']}"
        )
        assert out["vllm_calls"] == {"all_reduce": 1, "all_gather": 0}
        assert out["impl_calls"] == {"all_reduce": 1, "all_gather": 0}, (
            f"rank {rank}: your forward issued {out['impl_calls']}; vLLM's pair issues one all-reduce"
        )
        err = np.abs(out["y_impl"] - out["y_vllm"]).max()
        assert err < 1e-5 and np.abs(out["y_vllm"] - dense).max() < 1e-4, f"rank {rank}: yours vs vLLM {err:.1e}"
        print(f"rank {rank}: max |yours - vLLM| = {err:.1e}")


# --- tier 2: the whole engine at TP=2 on two CPU workers --------------------------------------------
@pytest.mark.engine
def test_real_engine_tp2_tokens_and_collectives():
    from course.runtime import engine

    prompts, max_tokens = [list(range(10, 26)), [7, 8, 9]], 4
    runs = {}
    for tp in (1, 2):
        env = engine.engine_env(VLLM_CPU_OMP_THREADS_BIND="0|1" if tp == 2 else "0")
        runs[tp] = engine.run_job("tensor_parallel", env=env, prompts=prompts, max_tokens=max_tokens,
                                  tensor_parallel_size=tp)
    one, two = runs[1].result, runs[2].result
    assert two["tokens"] == one["tokens"], f"TP=2 greedy tokens {two['tokens']} differ from TP=1's {one['tokens']}"
    assert two["ranks"] == [0, 1] and len(runs[2].lines("Worker_TP1")) > 0, "two worker processes, TP ranks 0 and 1"
    assert one["collectives"] == [[]], "TP=1 issues no collective"
    cfg = json.loads((engine.model_path() / "config.json").read_text())
    steps = lab.predict_generate_collectives([len(p) for p in prompts], max_tokens, cfg["num_hidden_layers"],
                                             cfg["hidden_size"], cfg["vocab_size"], 2, dtype_bytes=4)
    want = []
    for s in steps:
        want += [("all_reduce", s.all_reduce_bytes)] * s.all_reduces + [("all_gather", s.all_gather_bytes)] * s.all_gathers
    for rank, log in enumerate(two["collectives"]):
        seen = [(op, int(np.prod(shape)) * 4) for op, shape in log]
        assert sorted(seen) == sorted(want), (
            f"rank {rank}: the worker issued {len(seen)} collectives, you predicted {len(want)}; "
            f"first ones seen: {seen[:7]}"
        )
    embed = [s["model.embed_tokens.weight"] for s in two["weight_shapes"]]
    assert embed == [[cfg["vocab_size"] // 2, cfg["hidden_size"]]] * 2, f"each rank holds half the vocabulary: {embed}"
