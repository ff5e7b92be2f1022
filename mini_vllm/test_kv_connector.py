"""mini_vllm.kv_connector: both roles of the shared-storage connector on mini's KV layout.

A producer engine's scheduler side decides what to store, its worker side writes each layer's
rows; a consumer's scheduler side matches the prompt (P's prompt + P's first token), its worker
side fills the blocks the consumer allocated. Small block sizes, seeded KV, counted bytes.
"""

import logging
import os
from types import SimpleNamespace

import numpy as np
import pytest

from mini_vllm.config import KVTransferConfig
from mini_vllm.kv_connector import (
    ExampleConnector,
    KVConnectorFactory,
    KVConnectorRole,
    KVFileError,
    ReqMeta,
    align_to_block_size,
    read_safetensors,
    write_safetensors,
)

BS, H, D, NB = 4, 2, 3, 12
LAYERS = ["layer.0", "layer.1", "layer.2"]


def req(rid, prompt, mm=()):
    return SimpleNamespace(request_id=rid, prompt_token_ids=list(prompt), mm_features=list(mm))


def caches(seed=None):
    rng = np.random.default_rng(seed)
    if seed is None:
        return {name: np.zeros((2, NB, BS, H, D), np.float32) for name in LAYERS}
    return {name: rng.standard_normal((2, NB, BS, H, D)).astype(np.float32) for name in LAYERS}


def pair(tmp_path, **extra):
    cfg = KVTransferConfig("ExampleConnector", "kv_both", {"shared_storage_path": str(tmp_path), **extra})
    make = KVConnectorFactory.create_connector
    return make(cfg, KVConnectorRole.SCHEDULER, BS, LAYERS), make(cfg, KVConnectorRole.WORKER, BS, LAYERS)


def produce(tmp_path, prompt, block_ids, kv, rid="p"):
    """The producer's step: the scheduler side plans a store, the worker side saves every layer."""
    sched, worker = pair(tmp_path)
    out = SimpleNamespace(scheduled_new_reqs=[req(rid, prompt)], req_to_new_block_ids={rid: block_ids})
    meta = sched.build_connector_meta(out)
    worker.bind_connector_metadata(meta)
    for name in LAYERS:
        worker.save_kv_layer(name, kv[name])
    worker.wait_for_save()
    return meta, worker


def consume(tmp_path, prompt, block_ids, rid="d", **extra):
    """The consumer's step: match, allocate (given block ids), build the load, load into zeroed KV."""
    sched, worker = pair(tmp_path, **extra)
    kv = caches()
    worker.register_kv_caches(kv)
    n, is_async = sched.get_num_new_matched_tokens(req(rid, prompt), 0)
    sched.update_state_after_alloc(req(rid, prompt), block_ids, n)
    meta = sched.build_connector_meta(SimpleNamespace(scheduled_new_reqs=[], req_to_new_block_ids={}))
    worker.bind_connector_metadata(meta)
    worker.start_load_kv()
    return n, is_async, kv, sched, worker


def rows(kv, blocks, n):
    """The first ``n`` token rows of a request whose blocks are ``blocks``, every layer."""
    return {name: np.concatenate([kv[name][:, b] for b in blocks], axis=1)[:, :n] for name in LAYERS}


@pytest.mark.parametrize("plen", [1, 4, 5, 10, 12, 13])
def test_block_alignment_keeps_the_last_token_and_the_partial_block(plen):
    want = (plen - 1) // BS * BS
    assert align_to_block_size(plen, BS) == want, f"align_to_block_size({plen}, {BS}) should be {want}"


@pytest.mark.parametrize("plen", [10, 12, 13])  # partial last block, exact multiple, one over
def test_round_trip_moves_exactly_the_full_blocks(tmp_path, plen):
    prompt = list(range(100, 100 + plen))
    p_blocks, d_blocks = [7, 2, 9, 4][: -(-plen // BS)], [3, 11, 5, 1][: -(-(plen + 1) // BS)]
    kv_p = caches(seed=plen)
    meta, pw = produce(tmp_path, prompt, p_blocks, kv_p)
    stored = align_to_block_size(plen, BS)
    assert [(m.is_store, len(m.slot_mapping)) for m in meta.requests] == [(True, stored)]
    assert pw.bytes_saved == len(LAYERS) * 2 * stored * H * D * 4, (
        "bytes saved = layers x 2 x tokens x H x D x 4"
    )

    n, is_async, kv_d, _, dw = consume(tmp_path, prompt + [5], d_blocks)
    assert (n, is_async) == (stored, False), f"the consumer should match {stored} tokens, got {n}"
    assert dw.bytes_loaded == pw.bytes_saved
    got, want = rows(kv_d, d_blocks, stored), rows(kv_p, p_blocks, stored)
    for name in LAYERS:
        np.testing.assert_array_equal(got[name], want[name], err_msg=f"{name}: loaded rows differ from P's")
        tail = rows(kv_d, d_blocks, len(d_blocks) * BS)[name][:, stored:]
        assert not tail.any(), (
            f"{name}: rows past the {stored} matched tokens must stay untouched (recomputed)"
        )


def test_short_prompt_stores_nothing_and_matches_nothing(tmp_path):
    meta, _ = produce(tmp_path, [1, 2, 3, 4], [1], caches(seed=0))
    assert meta.requests == [], "a prompt with no full block before its last token has nothing to store"
    assert os.listdir(tmp_path) == []
    n, *_ = consume(tmp_path, [1, 2, 3, 4, 9], [2, 3])
    assert n == 0


def test_second_producer_of_the_same_prompt_does_not_store_again(tmp_path):
    produce(tmp_path, list(range(9)), [1, 2, 3], caches(seed=1))
    meta, _ = produce(tmp_path, list(range(9)), [4, 5, 6], caches(seed=2))
    assert meta.requests == [], "the prompt's folder exists: build_connector_meta must not store it twice"


def test_local_prefix_hits_shrink_the_external_count(tmp_path):
    produce(tmp_path, list(range(13)), [1, 2, 3, 4], caches(seed=3))
    sched, _ = pair(tmp_path)
    assert sched.get_num_new_matched_tokens(req("d", list(range(14))), 4) == (8, False)
    assert sched.get_num_new_matched_tokens(req("d", list(range(14))), 12) == (0, False)


def test_mm_hashes_are_part_of_the_key(tmp_path):
    sched, _ = pair(tmp_path)
    a = sched._foldername([1, 2, 3, 4])
    b = sched._foldername([1, 2, 3, 4], ["img0"])
    assert a != b and os.path.dirname(a) == str(tmp_path)


@pytest.mark.parametrize("damage", ["missing", "truncated", "garbage", "wrong_shape"])
def test_bad_file_falls_back_to_recompute_with_a_reason(tmp_path, caplog, damage):
    prompt = list(range(50, 63))
    produce(tmp_path, prompt, [1, 2, 3, 4], caches(seed=4))
    sched, _ = pair(tmp_path)
    path = sched._filename("layer.1", prompt[:12])
    if damage == "missing":
        os.remove(path)
    elif damage == "truncated":
        blob = open(path, "rb").read()
        open(path, "wb").write(blob[:-5])
    elif damage == "garbage":
        open(path, "wb").write(b"\x00\x01not a safetensors file")
    else:
        write_safetensors(path, np.zeros((2, 8, H * D), np.float32))
    with caplog.at_level(logging.WARNING, logger="mini_vllm.kv_connector"):
        n, is_async, kv, sched, worker = consume(tmp_path, prompt + [1], [5, 6, 7, 8])
    assert (n, is_async) == (0, False), (
        f"a {damage} layer file must mean 0 external tokens (recompute), got {n}"
    )
    assert not any(kv[name].any() for name in LAYERS), "nothing may be written into the consumer's KV"
    assert [rid for rid, _ in sched.fallbacks] == ["d"] and "recomputing 12 tokens" in caplog.text
    assert "layer.1" in sched.fallbacks[0][1], (
        f"the reason should name the bad file, got {sched.fallbacks[0][1]!r}"
    )


def test_file_broken_after_the_match_reports_the_blocks_and_writes_nothing(tmp_path):
    prompt = list(range(13))
    produce(tmp_path, prompt, [1, 2, 3, 4], caches(seed=5))
    sched, worker = pair(tmp_path)
    kv = caches()
    worker.register_kv_caches(kv)
    n, _ = sched.get_num_new_matched_tokens(req("d", prompt + [0]), 0)
    sched.update_state_after_alloc(req("d", prompt + [0]), [9, 3, 6, 1], n)
    os.remove(sched._filename("layer.2", prompt[:12]))  # lost between the match and the load
    worker.bind_connector_metadata(sched.build_connector_meta(SimpleNamespace(scheduled_new_reqs=[])))
    worker.start_load_kv()
    assert worker.get_block_ids_with_load_errors() == {9, 3, 6}, "the 3 blocks holding the 12 tokens"
    assert worker.get_block_ids_with_load_errors() == set(), "errors are reported once"
    assert not any(kv[name].any() for name in LAYERS), (
        "a failed load must not write some layers and not others"
    )


def test_async_load_lands_only_when_reported(tmp_path):
    prompt = list(range(20, 29))
    kv_p = caches(seed=6)
    produce(tmp_path, prompt, [1, 2, 3], kv_p)
    n, is_async, kv, _, worker = consume(
        tmp_path, prompt + [3], [4, 5, 6], load_async=True, load_delay_steps=2
    )
    assert (n, is_async) == (8, True), "load_async=True: the scheduler must park the request (n, True)"
    reports = [worker.get_finished(set())[1] for _ in range(4)]
    assert reports == [None, None, {"d"}, None], (
        f"received after 2 delayed steps, reported once, got {reports}"
    )
    np.testing.assert_array_equal(rows(kv, [4, 5], 8)["layer.0"], rows(kv_p, [1, 2], 8)["layer.0"])


def test_files_are_safetensors_with_upstreams_key(tmp_path):
    kv = caches(seed=7)
    produce(tmp_path, list(range(9)), [3, 1, 2], kv)
    sched, _ = pair(tmp_path)
    import hashlib

    folder = hashlib.md5(np.arange(8, dtype=np.int64).tobytes()).hexdigest()
    assert sorted(os.listdir(tmp_path / folder)) == [f"{n}.safetensors" for n in LAYERS]
    got = read_safetensors(str(tmp_path / folder / "layer.0.safetensors"))
    want = kv["layer.0"].reshape(2, NB * BS, H * D)[:, [12, 13, 14, 15, 4, 5, 6, 7]]
    np.testing.assert_array_equal(got, want)


def test_bad_input_is_refused(tmp_path):
    sched, worker = pair(tmp_path)
    with pytest.raises(ValueError, match="expected \\(2, num_blocks, 4"):
        worker.register_kv_caches({"layer.0": np.zeros((2, NB, H, BS, D), np.float32)})
    with pytest.raises(RuntimeError, match="bind_connector_metadata"):
        worker.start_load_kv()
    with pytest.raises(ValueError, match="unknown kv_connector"):
        KVConnectorFactory.create_connector(KVTransferConfig("NoSuch"), KVConnectorRole.WORKER, BS, LAYERS)
    with pytest.raises(ValueError, match="kv_role"):
        KVTransferConfig(kv_role="producer")
    with pytest.raises(ValueError, match="need 3 blocks"):
        ReqMeta.make_meta("r", list(range(12)), [1, 2], BS, True, num_tokens=12)
    with pytest.raises(KVFileError, match="cannot read"):
        read_safetensors(str(tmp_path / "nope.safetensors"))
    with pytest.raises(TypeError, match="cannot store dtype"):
        write_safetensors(str(tmp_path / "x"), np.zeros(3, np.int8))
    assert isinstance(sched, ExampleConnector)
