"""Lab 11-01: batched multi-LoRA apply. Grades solution.py, or starter.py with LAB_IMPL=starter."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import mini_vllm.lora as engine_lora
from course.runtime import lab_module
from mini_vllm.lora import LoRAAdapter

lab = lab_module(__file__)   # solution.py by default; LAB_IMPL=starter grades starter.py

D_IN, D_OUT, RANK = 24, 20, 4


def setup(rows=10, n_slots=4, seed=0, rank=RANK):
    rng = np.random.default_rng(seed)
    W = rng.standard_normal((D_OUT, D_IN))
    slots = [LoRAAdapter.random(D_IN, D_OUT, rank, seed=100 + s, alpha=2 * rank) for s in range(n_slots)]
    return rng.standard_normal((rows, D_IN)), W, slots


class Counter:
    def __init__(self):
        self.shapes = []

    def __call__(self, a, b):
        self.shapes.append((a.shape, b.shape))
        return np.matmul(a, b)


def test_delta_goes_through_rank_r():
    x, _, slots = setup(rows=30)
    a = slots[0]
    mm = Counter()
    d = lab.lora_delta(x, a.A, a.B, a.scaling, mm)
    np.testing.assert_allclose(d, a.scaling * x @ (a.B @ a.A).T, atol=1e-9,
                               err_msg="delta must be scaling * (x @ A.T) @ B.T")
    assert np.linalg.matrix_rank(d) == RANK, "a rank-4 adapter's delta has rank 4: it factors through r"
    assert [s[1] for s in mm.shapes] == [(D_IN, RANK), (RANK, D_OUT)], (
        "shrink with A.T (in -> r) then expand with B.T (r -> out), through `matmul`; never form B @ A"
    )


def test_scaling_is_applied_once():
    x, _, slots = setup()
    a = slots[1]
    one = lab.lora_delta(x, a.A, a.B, 1.0)
    np.testing.assert_allclose(lab.lora_delta(x, a.A, a.B, 3.0), 3.0 * one, atol=1e-9,
                               err_msg="scaling multiplies the delta exactly once (alpha / r)")
    np.testing.assert_allclose(lab.lora_delta(x, a.A, a.B, 0.0), 0.0 * one, atol=0)


def test_apply_single_is_base_plus_delta():
    x, W, slots = setup()
    a = slots[2]
    np.testing.assert_allclose(lab.apply_single(x, W, a), x @ W.T + a.scaling * x @ a.A.T @ a.B.T, atol=1e-9)
    np.testing.assert_allclose(lab.apply_single(x, W, None), x @ W.T, atol=1e-12,
                               err_msg="no adapter means the base output only")


@settings(max_examples=30, deadline=None)
@given(st.lists(st.integers(-1, 3), min_size=1, max_size=16), st.integers(0, 5))
def test_batched_equals_the_per_row_loop(idx, seed):
    x, W, slots = setup(rows=len(idx), seed=seed)
    got = lab.apply_batched(x, W, idx, slots)
    for i, s in enumerate(idx):
        want = lab_ref_single(x[i : i + 1], W, None if s < 0 else slots[s])
        np.testing.assert_allclose(got[i], want[0], atol=1e-9,
                                   err_msg=f"row {i} (slot {s}): grouping must not change any row's result")


def lab_ref_single(x, W, a):
    y = x @ W.T
    return y if a is None else y + a.scaling * (x @ a.A.T) @ a.B.T


def test_base_rows_equal_pure_base_output():
    x, W, slots = setup(rows=6)
    idx = [-1, 3, -1, 0, 3, -1]
    got = lab.apply_batched(x, W, idx, slots)
    base = x @ W.T
    for i in (0, 2, 5):
        assert np.array_equal(got[i], base[i]), (
            f"row {i} has index -1 (no adapter) but its output changed: did slots[-1] (the last slot) "
            "get applied? That is the CPU-ops defect this lab warns about"
        )


def test_every_slot_occupied_base_rows_still_untouched():
    x, W, slots = setup(rows=4, n_slots=1)
    got = lab.apply_batched(x, W, [-1, 0, -1, 0], slots)
    assert np.array_equal(got[[0, 2]], (x @ W.T)[[0, 2]]), "one slot, occupied: base rows must not get its delta"


def test_one_base_matmul_and_one_pair_per_adapter():
    x, W, slots = setup(rows=64)
    mm = Counter()
    lab.apply_batched(x, W, [i % 4 for i in range(64)], slots, mm)
    base_calls = [s for s in mm.shapes if s[1] == (D_IN, D_OUT)]
    assert len(base_calls) == 1, f"the base weight must be multiplied once for the whole batch, got {len(base_calls)} calls"
    assert base_calls[0][0] == (64, D_IN), "the single base product covers all 64 rows"
    assert len(mm.shapes) == 1 + 2 * 4, (
        f"64 rows over 4 adapters: 1 base + 4 shrinks + 4 expands = 9 products, got {len(mm.shapes)}; "
        "group rows by adapter instead of looping over rows"
    )
    assert all(s[0][0] == 16 for s in mm.shapes[1:]), "each adapter's shrink/expand covers its 16 rows at once"


def test_all_base_batch_runs_no_adapter_matmul():
    x, W, slots = setup(rows=5)
    mm = Counter()
    got = lab.apply_batched(x, W, [-1] * 5, [None, None], mm)
    assert len(mm.shapes) == 1, "an all-base batch is one product; empty slots are never touched"
    assert np.array_equal(got, x @ W.T)


def test_unused_empty_slot_is_fine_and_ranks_may_differ():
    x, W, slots = setup(rows=3)
    big = LoRAAdapter.random(D_IN, D_OUT, 8, seed=7)
    got = lab.apply_batched(x, W, [0, 2, 2], [slots[0], None, big])
    np.testing.assert_allclose(got[1:], lab_ref_single(x[1:], W, big), atol=1e-9,
                               err_msg="slot 2 has rank 8 while slot 0 has rank 4: each slot uses its own rank")


@pytest.mark.parametrize(
    "idx, slots, match",
    [
        ([0, 1], [None, None], "empty"),
        ([0, 4], "four", r"-1\.\.3"),
        ([-2, 0], "four", r"-1\.\.3"),
        ([0], "four", "one adapter index per row"),
    ],
)
def test_promised_errors(idx, slots, match):
    x, W, four = setup(rows=2)
    with pytest.raises(ValueError, match=match):
        lab.apply_batched(x, W, idx, four if slots == "four" else slots)


def test_an_empty_batch_is_still_checked():
    x, W, four = setup(rows=2)
    got = lab.apply_batched(x[:0], W, [], four)
    assert got.shape == (0, W.shape[0]), f"zero rows, zero indices: an empty (0, {W.shape[0]}) output; got {got.shape}"
    try:
        got = lab.apply_batched(x[:0], W, [0], four)
    except ValueError:
        return
    pytest.fail(f"zero rows with one adapter index returned shape {got.shape}: the index count is checked before "
                "any early return for an empty batch (ValueError)")


def test_agrees_with_mini_vllm():
    x, W, slots = setup(rows=12, seed=3)
    idx = [3, -1, 1, 1, 0, -1, 3, 2, 2, -1, 0, 3]
    want = engine_lora.apply_batched(x, idx, slots, out=x @ W.T)
    np.testing.assert_allclose(lab.apply_batched(x, W, idx, slots), want, atol=1e-9,
                               err_msg="your apply_batched must equal mini_vllm.lora.apply_batched plus the base")


@pytest.mark.upstream
def test_agrees_with_punica_wrapper_cpu():
    """Same mapping through vLLM's PunicaWrapperCPU.add_lora_linear, the empty slot zeroed."""
    import torch
    import vllm.utils.torch_utils as tu
    from vllm.lora.layers.utils import LoRAMapping
    from vllm.lora.punica_wrapper.punica_cpu import PunicaWrapperCPU

    x, W, slots = setup(rows=8, n_slots=2, seed=4)
    lora_index_to_id = [11, 22, None]  # slot 2 never used: still the zeros it was allocated as
    ids = (0, 11, 22, 11, 0, 22, 22, 0)
    A = torch.zeros(3, 1, RANK, D_IN, dtype=torch.float64)
    B = torch.zeros(3, 1, D_OUT, RANK, dtype=torch.float64)
    for s, a in enumerate(slots):
        A[s, 0], B[s, 0] = torch.from_numpy(a.A * a.scaling), torch.from_numpy(a.B)
    saved = tu.async_tensor_h2d.__defaults__
    tu.async_tensor_h2d.__defaults__ = (False,)  # CPU torch refuses pinned memory
    try:
        pw = PunicaWrapperCPU(max_num_batched_tokens=64, max_batches=8, device="cpu")
        pw.update_metadata(LoRAMapping(index_mapping=ids, prompt_mapping=ids, is_prefill=False),
                           lora_index_to_id=lora_index_to_id, max_loras=3, vocab_size=512)
        y = torch.from_numpy(x @ W.T)
        pw.add_lora_linear(y, torch.from_numpy(x), (A,), (B,), scale=1.0, output_slices=(D_OUT,))
        idx = pw.token_lora_indices[:8].tolist()
    finally:
        tu.async_tensor_h2d.__defaults__ = saved
    assert idx == [-1, 0, 1, 0, -1, 1, 1, -1]
    np.testing.assert_allclose(lab.apply_batched(x, W, idx, slots + [None]), y.numpy(), rtol=1e-5, atol=1e-5,
                               err_msg="vLLM's CPU punica wrapper and your apply_batched disagree")
