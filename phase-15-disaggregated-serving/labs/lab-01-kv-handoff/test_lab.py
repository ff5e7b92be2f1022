from types import SimpleNamespace

import numpy as np
import pytest

from course.runtime import lab_module
from mini_vllm.config import KVTransferConfig
from mini_vllm.kv_connector import KVConnectorFactory, KVConnectorRole, align_to_block_size, read_safetensors

lab = lab_module(__file__)  # solution.py by default; LAB_IMPL=starter grades starter.py


def prompt(n, salt=0):
    return [(7 * i + 3 + salt) % 97 for i in range(n)]


def single(model, p, max_tokens, bs=4):
    eng = lab.PagedEngine(model, block_size=bs)
    eng.add_request("r", p, max_tokens)
    return lab.run_to_completion(eng)["r"]


def p_to_d(model, p, max_tokens, steps_on_p=1, bs=4, d_free=None):
    """Run ``steps_on_p`` steps on P, move the request, finish on D (whose free list is shuffled)."""
    P, D = lab.PagedEngine(model, block_size=bs), lab.PagedEngine(model, block_size=bs)
    if d_free is not None:
        D.free_block_ids = d_free
    P.add_request("r", p, max_tokens)
    for _ in range(steps_on_p):
        P.step()
    snap = lab.export_request(P, "r")
    lab.import_request(D, snap)
    return P, D, snap


@pytest.mark.parametrize("n,bs", [(10, 4), (12, 4), (13, 4), (3, 4), (21, 8), (16, 16)])
def test_handoff_after_prefill_continues_identically(n, bs):
    model = lab.TinyPagedModel(seed=n)
    want = single(model, prompt(n), 8, bs)
    shuffled = list(np.random.default_rng(n).permutation(np.arange(1, 32)))
    P, D, snap = p_to_d(model, prompt(n), 8, bs=bs, d_free=[int(b) for b in shuffled])
    assert snap.num_computed_tokens == n and snap.output == want[:1], (
        f"after one step P has computed the {n}-token prompt and sampled 1 token; snapshot says "
        f"computed={snap.num_computed_tokens}, output={snap.output}"
    )
    got = lab.run_to_completion(D)["r"]
    assert got == want, (
        f"{n}-token prompt, block size {bs}: D's tokens {got} differ from one engine's {want}. D's "
        "blocks come in another order: pack KV by logical position, never by block id"
    )


@pytest.mark.parametrize("steps", [2, 4, 7])
def test_handoff_mid_decode_also_works(steps):
    model = lab.TinyPagedModel(seed=3)
    want = single(model, prompt(9, 5), 8)
    _, D, snap = p_to_d(model, prompt(9, 5), 8, steps_on_p=steps, d_free=list(range(31, 0, -1)))
    assert snap.output == want[:steps], (
        f"after {steps} steps the snapshot must carry {steps} outputs, got {snap.output}"
    )
    assert snap.num_computed_tokens == 9 + steps - 1, (
        f"computed = prompt 9 + outputs {steps} - 1 (the newest token's KV is not computed yet), got "
        f"{snap.num_computed_tokens}"
    )
    assert lab.run_to_completion(D)["r"] == want


def test_source_engine_is_clean_after_export():
    model = lab.TinyPagedModel()
    P = lab.PagedEngine(model)
    P.add_request("r", prompt(10), 8)
    P.add_request("s", prompt(6, 1), 8)
    P.step()
    before = set(P.free_block_ids)
    lab.export_request(P, "r")
    assert "r" not in P.running, "the exported request must leave the source's running set"
    assert len(P.free_block_ids) == len(before) + 3, (
        "r's 3 blocks (10 tokens / 4) must return to the free list"
    )
    lab.export_request(P, "s")
    assert P.usage == 0.0, (
        f"after exporting everything the source's usage must be 0.0 (a leak), got {P.usage}"
    )
    with pytest.raises(KeyError, match="'r'"):
        lab.export_request(P, "r")


@pytest.mark.parametrize("steps,bs,want_blocks", [(1, 4, 3), (3, 4, 3), (4, 4, 4), (1, 16, 1), (1, 3, 4)])
def test_destination_pays_the_kv_bill(steps, bs, want_blocks):
    model = lab.TinyPagedModel()
    _, D, snap = p_to_d(model, prompt(10), 8, steps_on_p=steps, bs=bs)
    computed = 10 + steps - 1
    assert -(-computed // bs) == want_blocks
    used = D.num_blocks - 1 - len(D.free_block_ids)
    assert used == want_blocks, (
        f"{computed} computed tokens at block size {bs} need ceil({computed}/{bs}) = {want_blocks} blocks on D, "
        f"it claimed {used}"
    )
    assert D.running["r"].num_computed_tokens == computed, "D must carry the counter over, not restart at 0"
    assert snap.nbytes == model.L * 2 * computed * model.H * model.D * 4, (
        "the payload is the computed tokens' KV"
    )


def test_destination_oom_is_loud():
    model = lab.TinyPagedModel()
    P = lab.PagedEngine(model)
    P.add_request("r", prompt(10), 8)
    P.step()
    snap = lab.export_request(P, "r")
    D = lab.PagedEngine(model, num_blocks=3)  # 2 usable blocks, 3 needed
    with pytest.raises(MemoryError):
        lab.import_request(D, snap)
    assert D.running == {} and D.free_block_ids == [1, 2], "a refused import must leave D exactly as it was"
    big = lab.PagedEngine(model)
    lab.import_request(big, snap)  # the snapshot survives the refusal
    assert lab.run_to_completion(big)["r"] == single(model, prompt(10), 8)


def test_import_refuses_a_snapshot_of_another_shape():
    model = lab.TinyPagedModel()
    _, _, snap = p_to_d(model, prompt(10), 8)
    other = lab.PagedEngine(lab.TinyPagedModel(head_size=4))
    with pytest.raises(ValueError, match="does not fit"):
        lab.import_request(other, snap)
    assert other.running == {} and len(other.free_block_ids) == other.num_blocks - 1


def connector(tmp_path, role, model):
    cfg = KVTransferConfig("ExampleConnector", "kv_both", {"shared_storage_path": str(tmp_path)})
    return KVConnectorFactory.create_connector(cfg, role, 4, [f"layer.{i}" for i in range(model.L)])


@pytest.mark.parametrize("n", [10, 12, 15])
def test_snapshot_kv_is_what_the_connector_stores(tmp_path, n):
    """The first aligned tokens of your payload are, row for row, the files mini's ExampleConnector
    writes from P's blocks."""
    model = lab.TinyPagedModel(seed=1)
    P = lab.PagedEngine(model)
    P.free_block_ids = list(range(31, 0, -1))
    P.add_request("r", prompt(n), 8)
    P.step()
    blocks = list(P.running["r"].block_ids)
    sched, worker = (
        connector(tmp_path, KVConnectorRole.SCHEDULER, model),
        connector(tmp_path, KVConnectorRole.WORKER, model),
    )
    out = SimpleNamespace(
        scheduled_new_reqs=[SimpleNamespace(request_id="r", prompt_token_ids=prompt(n))],
        req_to_new_block_ids={"r": blocks},
    )
    worker.bind_connector_metadata(sched.build_connector_meta(out))
    for i, kv in enumerate(P.kv_caches):
        worker.save_kv_layer(f"layer.{i}", kv)
    snap = lab.export_request(P, "r")
    k = align_to_block_size(n, 4)
    for i in range(model.L):
        stored = read_safetensors(sched._filename(f"layer.{i}", prompt(n)[:k])).reshape(
            2, k, model.H, model.D
        )
        np.testing.assert_array_equal(
            snap.kv[i, :, :k], stored, err_msg=f"layer {i}: your payload differs from the connector's rows"
        )


def test_connector_handoff_plus_tail_recompute_is_identical(tmp_path):
    """The connector moves only whole blocks (8 of 10 tokens); D recomputes the tail and still agrees."""
    model = lab.TinyPagedModel(seed=2)
    want = single(model, prompt(10), 8)
    P = lab.PagedEngine(model)
    P.add_request("r", prompt(10), 8)
    P.step()
    snap = lab.export_request(P, "r")
    k = align_to_block_size(10, 4)
    partial = lab.Snapshot("r", snap.prompt, snap.output, 8, k, np.ascontiguousarray(snap.kv[:, :, :k]))
    D = lab.PagedEngine(model)
    D.free_block_ids = list(range(31, 0, -1))
    lab.import_request(D, partial)
    assert D.num_blocks - 1 - len(D.free_block_ids) == 2, (
        "8 prepaid tokens: 2 blocks now, the engine adds more"
    )
    assert lab.run_to_completion(D)["r"] == want, "D must recompute tokens 8..9 from the counter and agree"
