"""mini_vllm.lora: batched apply, slot manager, admission rule (fast, numpy only)."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mini_vllm.lora import (
    BASE,
    LoRAAdapter,
    LoRARequest,
    LoRASlotManager,
    admit_waiting,
    apply_batched,
    lora_delta,
    lora_logits,
)
from mini_vllm.model import ToyModel


def adapters(n, d_in=12, d_out=10, rank=3):
    return [LoRAAdapter.random(d_in, d_out, rank, seed=s, alpha=2 * rank) for s in range(n)]


def per_row(x, idx, slots, width):
    out = np.zeros((len(x), width))
    for i, s in enumerate(idx):
        if s != BASE:
            a = slots[s]
            out[i] = a.scaling * (a.B @ a.A @ x[i])  # the merged form, row by row
    return out


def test_delta_is_shrink_then_expand_and_rank_r():
    a = adapters(1, 32, 24, 4)[0]
    x = np.random.default_rng(0).standard_normal((40, 32))
    d = lora_delta(x, a.A, a.B, a.scaling)
    np.testing.assert_allclose(d, a.scaling * x @ (a.B @ a.A).T, atol=1e-10)
    assert np.linalg.matrix_rank(d) == 4, "a rank-4 adapter's delta over 40 rows has rank exactly 4"
    assert a.scaling == 2.0, "alpha=2r gives scaling alpha/r = 2"


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(-1, 3), min_size=0, max_size=20), st.integers(0, 10))
def test_batched_equals_per_row(idx, seed):
    slots = adapters(4)
    x = np.random.default_rng(seed).standard_normal((len(idx), 12))
    got = apply_batched(x, np.array(idx, dtype=np.int64), slots, out=np.zeros((len(idx), 10)))
    np.testing.assert_allclose(got, per_row(x, idx, slots, 10), atol=1e-10)


def test_base_rows_untouched_bitwise_and_empty_slot_allowed_when_unused():
    slots = adapters(3)
    slots[2] = None  # an empty slot that no row points at is fine
    rng = np.random.default_rng(1)
    x, y = rng.standard_normal((5, 12)), rng.standard_normal((5, 10))
    before = y.copy()
    apply_batched(x, [BASE, 0, BASE, 1, 0], slots, out=y)
    assert np.array_equal(y[[0, 2]], before[[0, 2]]), "base rows (-1) must be left exactly as they were"
    assert not np.allclose(y[1], before[1])


def test_all_base_batch_needs_no_adapter():
    out = apply_batched(np.ones((3, 12)), [BASE] * 3, adapters(2))
    assert out.shape == (3, 10) and not out.any()
    with pytest.raises(ValueError, match="every slot is empty"):
        apply_batched(np.ones((2, 12)), [BASE, BASE], [None, None])


def test_groups_run_one_shrink_per_distinct_slot(monkeypatch):
    import mini_vllm.lora as L

    calls = []
    real = L.lora_delta
    monkeypatch.setattr(L, "lora_delta", lambda x, *a: calls.append(len(x)) or real(x, *a))
    apply_batched(np.ones((64, 12)), [i % 4 for i in range(64)], adapters(4))
    assert calls == [16, 16, 16, 16], "64 rows over 4 adapters: 4 grouped matmuls of 16 rows, not 64"


@pytest.mark.parametrize(
    "idx, slots, err, match",
    [
        ([0, 4], adapters(4), ValueError, "outside -1..3"),
        ([0, -2], adapters(4), ValueError, "outside"),
        ([0, 1], [adapters(1)[0], None], ValueError, "holds no adapter"),
        ([0, 0, 0], adapters(1), ValueError, "one adapter index per row"),
        ([0.0, 1.0], adapters(2), TypeError, "integers"),
    ],
)
def test_apply_batched_rejects(idx, slots, err, match):
    with pytest.raises(err, match=match):
        apply_batched(np.ones((2, 12)), idx, slots)


def test_an_empty_slot_is_refused_before_any_row_is_written():
    out = np.zeros((2, 10))
    slots = [adapters(1)[0], None]
    with pytest.raises(ValueError, match="holds no adapter"):
        apply_batched(np.ones((2, 12)), [0, 1], slots, out=out)
    assert not out.any(), (
        f"apply_batched refused the call (slot 1 is empty) but had already added slot 0's delta into "
        f"the caller's out (row 0 sums to {out[0].sum():.3f}): check every slot before writing any row"
    )


def test_shape_errors():
    with pytest.raises(ValueError, match="in_features"):
        apply_batched(np.ones((1, 7)), [0], adapters(1))
    with pytest.raises(ValueError, match="rank mismatch"):
        LoRAAdapter(np.ones((2, 4)), np.ones((3, 3)))
    with pytest.raises(ValueError, match="produces"):
        apply_batched(np.ones((1, 12)), [0], adapters(1), out=np.zeros((1, 9)))


def test_lora_request_ids():
    assert LoRARequest("sql", 1, "/p").lora_int_id == 1
    with pytest.raises(ValueError, match=">= 1"):
        LoRARequest("base", 0)
    with pytest.raises(TypeError):
        LoRARequest("x", True)


def test_adapter_changes_toy_logits_only_on_its_rows():
    model = ToyModel(vocab_size=64, seed=0)
    tokens, pos = np.array([3, 3, 7]), np.array([0, 0, 5])
    logits = model.forward(tokens, pos)
    slot = LoRAAdapter.random(64, 64, 4, seed=9, std=2.0)
    got = lora_logits(logits, tokens, [BASE, 0, BASE], [slot])
    assert np.array_equal(got[[0, 2]], logits[[0, 2]])
    np.testing.assert_allclose(got[1], logits[1] + slot.B @ slot.A[:, 3])
    assert got[1].argmax() != logits[1].argmax(), "a strong adapter changes the greedy token"


def test_slot_manager_hit_load_evict_lru_and_first_free_slot():
    m = LoRASlotManager(2)
    a = adapters(5)
    assert m.activate_adapter(1, a[1]) and m.activate_adapter(2, a[2])
    assert m.activate_adapter(1, a[1]) is False, "1 is resident: a hit"
    assert m.activate_adapter(3, a[3]), "3 is new: evicts the LRU (2, since 1 was touched)"
    assert m.resident() == [1, 3] and m.lora_index_to_id == [1, 3]
    assert m.slots[1] is a[3], "the new adapter goes to the freed slot"
    assert m.stats == (1, 3, 1)
    assert m.deactivate_adapter(1) and not m.deactivate_adapter(1)
    assert m.lora_index_to_id == [None, 3] and m.slots[0] is None
    m.activate_adapter(4, a[4])
    assert m.lora_index_to_id == [4, 3], "first free slot = lowest index"
    assert m.stats.evictions == 1, "filling a free slot evicts nothing"
    np.testing.assert_array_equal(m.token_lora_indices([None, 3, 0, 4]), [BASE, 1, BASE, 0])
    with pytest.raises(ValueError, match="not resident"):
        m.token_lora_indices([2])
    with pytest.raises(ValueError, match="positive"):
        LoRASlotManager(0)
    with pytest.raises(ValueError, match=">= 1"):
        m.activate_adapter(0, a[0])


def test_slot_manager_with_one_slot_thrashes():
    m = LoRASlotManager(1)
    for lora_id in [1, 2, 1, 2]:
        m.activate_adapter(lora_id, adapters(1)[0])
    assert m.stats == (0, 4, 3)


def test_admission_rule():
    # running requests already claim adapter 1; max_loras=2
    assert admit_waiting({1}, [2, None, 3, 1, 2, 4], 2) == [0, 1, 3, 4], "3 and 4 wait; 1 and 2 reuse"
    assert admit_waiting(set(), [None, None], 1) == [0, 1], "base requests never claim a slot"
    assert admit_waiting({1, 2}, [3, 1], 2) == [1], "a skipped request is not a barrier"
    assert admit_waiting(set(), [5, 6, 7], 3) == [0, 1, 2]
    assert admit_waiting(set(), [], 1) == []
    with pytest.raises(ValueError, match="already use 3"):
        admit_waiting({1, 2, 3}, [], 2)
    with pytest.raises(ValueError, match="use None"):
        admit_waiting(set(), [0], 2)
    with pytest.raises(ValueError, match="positive"):
        admit_waiting(set(), [1], 0)


def test_admission_leaves_the_running_set_alone():
    running = {1}
    admit_waiting(running, [2, 3], 3)
    assert running == {1}, (
        "admit_waiting added the waiting requests' adapters to the caller's running set: "
        "copy scheduled_loras before claiming (the caller still needs the running requests' set)"
    )


@settings(max_examples=60, deadline=None)
@given(st.lists(st.one_of(st.none(), st.integers(1, 6)), max_size=25), st.integers(1, 4))
def test_admission_never_exceeds_and_is_maximal(waiting, max_loras):
    got = admit_waiting(set(), waiting, max_loras)
    ids = {waiting[i] for i in got} - {None}
    assert len(ids) <= max_loras
    for i, lora_id in enumerate(waiting):
        if i not in got:  # a skipped request had a new adapter and the cap was full
            assert lora_id not in ids and len(ids) == max_loras


# -- the scheduler's max_loras rule (mini_vllm.scheduler) --------------------------------------
def lora_engine_parts(max_loras, max_num_batched_tokens=256, max_num_seqs=16):
    from mini_vllm.config import create_engine_config
    from mini_vllm.scheduler import Scheduler

    return Scheduler(create_engine_config(num_gpu_blocks=128, block_size=4, max_num_batched_tokens=max_num_batched_tokens,
                                          max_num_seqs=max_num_seqs, enable_lora=True, max_loras=max_loras))


def add(sched, rid, lora_id, max_tokens=1, prompt=(5, 6, 7)):
    from mini_vllm.request import Request
    from mini_vllm.sampling_params import SamplingParams

    lora = None if lora_id is None else LoRARequest(f"a{lora_id}", lora_id)
    sched.add_request(Request(rid, list(prompt), SamplingParams(max_tokens=max_tokens, ignore_eos=True),
                              lora_request=lora))


def step(sched):
    out = sched.schedule()
    sampled = {r.request_id: 9 for r in out.scheduled_requests
               if sched.needs_sample(r, out.num_scheduled_tokens[r.request_id])}
    sched.update_from_output(out, sampled)
    return list(out.num_scheduled_tokens)


def test_scheduler_admits_at_most_max_loras_adapters_and_skips_without_blocking():
    sched = lora_engine_parts(max_loras=2)
    for i, lora_id in enumerate([1, None, 2, 3, 1, None, 3, 4]):
        add(sched, f"r{i}", lora_id)
    assert step(sched) == ["r0", "r1", "r2", "r4", "r5"], (
        "step 1: A1 and A2 claim the two slots, base rides free, A1 again is free, A3 and A4 are skipped "
        "and the walk goes on (a skip is not a barrier)"
    )
    assert step(sched) == ["r3", "r6", "r7"], "step 2: the skipped requests, in their original order"
    assert not sched.has_unfinished_requests()


def test_running_requests_claim_their_adapters_first():
    sched = lora_engine_parts(max_loras=1)
    add(sched, "long", 1, max_tokens=3)
    assert step(sched) == ["long"]
    add(sched, "other", 2)
    add(sched, "base", None)
    add(sched, "same", 1)
    assert step(sched) == ["long", "base", "same"], "A1 is running, so A2 must wait; base and A1 pass"
    assert step(sched) == ["long"], "long's last token: A1 is still scheduled this step, so A2 still waits"
    assert step(sched) == ["other"], "A1 finished: A2 gets the slot"


def test_skipped_requests_keep_their_place_ahead_of_later_arrivals():
    sched = lora_engine_parts(max_loras=1)
    add(sched, "a1", 1, max_tokens=2)
    add(sched, "a2-first", 2)
    assert step(sched) == ["a1"]
    add(sched, "a2-later", 2)
    add(sched, "a3", 3)
    assert step(sched) == ["a1"]
    assert step(sched) == ["a2-first", "a2-later"], (
        "a skipped request goes back to the FRONT of waiting (upstream walks skipped_waiting first): "
        "a2-first is admitted before a2-later, and a3 waits"
    )
    assert step(sched) == ["a3"]


def test_skipped_requests_go_ahead_of_the_requests_the_walk_never_reached():
    sched = lora_engine_parts(max_loras=1, max_num_seqs=2)
    for rid, lora_id in [("x", 1), ("y", 2), ("z", None), ("w", None)]:
        add(sched, rid, lora_id)
    assert step(sched) == ["x", "z"], "x claims the slot, y is skipped, z takes the second seat and the walk stops"
    assert step(sched) == ["y", "w"], (
        "y was skipped, w was never reached: y goes back AHEAD of w (upstream walks skipped_waiting before waiting)"
    )


def test_skipped_requests_cost_no_budget():
    sched = lora_engine_parts(max_loras=1, max_num_batched_tokens=6)
    add(sched, "x", 1, prompt=(1, 2, 3))
    add(sched, "y", 2, prompt=(1, 2, 3, 4, 5, 6))
    add(sched, "z", None, prompt=(7, 8, 9))
    assert step(sched) == ["x", "z"], "y is skipped for its adapter before it takes any of the 6-token budget"


def test_lora_config_and_request_checks():
    from mini_vllm.config import LoRAConfig, create_engine_config
    from mini_vllm.engine import LLMEngine
    from mini_vllm.request import Request

    with pytest.raises(ValueError, match="max_loras must be >= 1"):
        LoRAConfig(max_loras=0)
    with pytest.raises(TypeError, match="max_loras must be an int"):
        LoRAConfig(max_loras=True)
    with pytest.raises(ValueError, match="without enable_lora=True"):
        create_engine_config(max_loras=2)
    assert create_engine_config().lora_config is None
    assert create_engine_config(enable_lora=True, max_loras=3).lora_config == LoRAConfig(max_loras=3)
    with pytest.raises(TypeError, match="lora_request must be a LoRARequest"):
        Request("r", [1, 2], lora_request=1)
    engine = LLMEngine(num_gpu_blocks=64, block_size=4)
    with pytest.raises(ValueError, match="LoRA is not enabled"):
        engine.add_request([1, 2, 3], lora_request=LoRARequest("a", 1))
    assert engine.add_request([1, 2, 3]) == "req-0", "a refused request must not consume an id"
    lora_engine = LLMEngine(num_gpu_blocks=64, block_size=4, enable_lora=True, max_loras=1)
    lora_engine.add_request([1, 2, 3], lora_request=LoRARequest("a", 1))
    lora_engine.add_request([1, 2, 3], lora_request=LoRARequest("b", 2))
    first = lora_engine.step()
    assert lora_engine.scheduler.get_request_counts() == (1, 1), "max_loras=1: the second adapter waits a step"
    assert not first or all(o.request_id == "req-0" for o in first)
