"""Differential: mini_vllm.kv_connector against vLLM 0.22.1's ``ExampleConnector``, both roles.

One trace, two stores. Producer: the real ``Scheduler`` (with the real connector inside) and
mini's ``Scheduler`` admit the same prompts; mini's connector plans its stores from mini's
output. Both must store the same key tokens at the same slots, and each layer's file must hold
the same rows (each side reads the other's files). Consumer (each prompt plus one token, the
proxy's ``max_tokens=1`` handoff): the real scheduler's external hit count and tokens computed
must equal mini's match, and both worker sides must fill the consumer's blocks with P's rows.
The one place they differ is pinned too: a producer prompt that is a whole number of blocks.
"""

import importlib
import os

import numpy as np
import pytest

from mini_vllm.config import KVTransferConfig, create_engine_config
from mini_vllm.kv_connector import KVConnectorFactory, KVConnectorRole, read_safetensors
from mini_vllm.request import Request
from mini_vllm.sampling_params import SamplingParams
from mini_vllm.scheduler import Scheduler

pytestmark = pytest.mark.upstream

BS, NB = 16, 64
PROMPTS = {"a": 50, "b": 21, "c": 77, "d": 9}  # none a multiple of 16: the shapes both handle


@pytest.fixture(scope="module")
def real():
    return importlib.import_module("mini_vllm.testing.real_kv_connector")


def prompt_of(rid, n):
    return [1000 * (ord(rid) - 96) + i for i in range(n)]


def paged_kv(real, seed):
    rng = np.random.default_rng(seed)
    return {
        name: rng.standard_normal((2, NB, BS, real.NUM_KV_HEADS, real.HEAD_SIZE)).astype(np.float32)
        for name in real.LAYERS
    }


def mini_connector(real, store, role):
    cfg = KVTransferConfig("ExampleConnector", "kv_both", {"shared_storage_path": str(store)})
    return KVConnectorFactory.create_connector(cfg, role, BS, real.LAYERS)


def tree(store):
    return sorted((d, sorted(os.listdir(os.path.join(store, d)))) for d in os.listdir(store))


@pytest.fixture(scope="module")
def produced(real, tmp_path_factory):
    """Run the producer side once on both: returns the stores, P's KV and the real step."""
    s_real, s_mini = tmp_path_factory.mktemp("real"), tmp_path_factory.mktemp("mini")
    kv_p = paged_kv(real, 0)
    P = real.RealEngineSide(str(s_real), "kv_producer", block_size=BS, num_gpu_blocks=NB)
    for rid, n in PROMPTS.items():
        P.add(rid, prompt_of(rid, n), max_tokens=1)
    step = P.schedule()
    P.save(kv_p)

    mini = Scheduler(create_engine_config(block_size=BS, num_gpu_blocks=NB, max_num_batched_tokens=2048))
    for rid, n in PROMPTS.items():
        mini.add_request(Request(rid, prompt_of(rid, n), SamplingParams(max_tokens=1)))
    out = mini.schedule()
    sched, worker = (
        mini_connector(real, s_mini, KVConnectorRole.SCHEDULER),
        mini_connector(real, s_mini, KVConnectorRole.WORKER),
    )
    meta = sched.build_connector_meta(out)
    worker.bind_connector_metadata(meta)
    for name in real.LAYERS:
        worker.save_kv_layer(name, kv_p[name])
    return s_real, s_mini, kv_p, step, out, meta


def test_producer_stores_the_same_tokens_at_the_same_slots(produced):
    _, _, _, step, out, meta = produced
    assert out.num_scheduled_tokens == step.num_scheduled_tokens
    assert {r: out.req_to_new_block_ids[r] for r in PROMPTS} == step.block_ids, (
        "mini's blocks differ from real's"
    )
    mine = [(m.is_store, m.token_ids.tolist(), m.slot_mapping.tolist()) for m in meta.requests]
    assert mine == step.transfers[:3], "mini's store plan (key tokens, slots) differs from ExampleConnector's"
    assert [len(t[1]) for t in mine] == [48, 16, 64], "50 -> 48, 21 -> 16, 77 -> 64 tokens: full blocks only"
    assert step.transfers[3] == (True, [], []), (
        "upstream plans an empty store for the 9-token prompt; mini none"
    )


def test_same_folders_same_files_same_rows(produced):
    s_real, s_mini, *_ = produced
    real_tree, mini_tree = tree(s_real), tree(s_mini)
    empty_key = {d for d, _ in real_tree} - {d for d, _ in mini_tree}
    assert len(empty_key) == 1, (
        "upstream also stores the 9-token prompt under the key of zero tokens; mini does not"
    )
    assert [t for t in real_tree if t[0] not in empty_key] == mini_tree
    for folder, files in mini_tree:
        for f in files:
            a = read_safetensors(os.path.join(s_real, folder, f))
            b = read_safetensors(os.path.join(s_mini, folder, f))
            np.testing.assert_array_equal(a, b, err_msg=f"{folder}/{f}: the stored rows differ")


def test_real_safetensors_reads_minis_files(produced):
    import safetensors.torch

    _, s_mini, *_ = produced
    folder, files = tree(s_mini)[0]
    t = safetensors.torch.load_file(os.path.join(s_mini, folder, files[0]))["kv_cache"]
    np.testing.assert_array_equal(t.numpy(), read_safetensors(os.path.join(s_mini, folder, files[0])))


@pytest.mark.parametrize("store", ["real", "mini"])
def test_consumer_matches_computes_and_loads_the_same(real, produced, store):
    """Both consumers read the same store (either side's files): same hits, same blocks, P's rows."""
    s_real, s_mini, kv_p, p_step, *_ = produced
    path = str(s_real if store == "real" else s_mini)
    D = real.RealEngineSide(path, "kv_consumer", block_size=BS, num_gpu_blocks=NB)
    rids = ["a", "b", "c"]
    for rid in rids:
        D.add(rid, prompt_of(rid, PROMPTS[rid]) + [7], max_tokens=4)
    step = D.schedule()
    kv_real = {k: np.zeros_like(v) for k, v in kv_p.items()}
    D.load(kv_real)

    sched = mini_connector(real, path, KVConnectorRole.SCHEDULER)
    worker = mini_connector(real, path, KVConnectorRole.WORKER)
    kv_mini = {k: np.zeros_like(v) for k, v in kv_p.items()}
    worker.register_kv_caches(kv_mini)
    for rid in rids:
        request = Request(rid, prompt_of(rid, PROMPTS[rid]) + [7], SamplingParams(max_tokens=4))
        n, is_async = sched.get_num_new_matched_tokens(request, 0)
        assert (n, is_async) == (step.num_computed_tokens[rid], False), f"{rid}: external hit count differs"
        assert PROMPTS[rid] + 1 - n == step.num_scheduled_tokens[rid], f"{rid}: tokens left to compute differ"
        sched.update_state_after_alloc(request, step.block_ids[rid], n)
    worker.bind_connector_metadata(sched.build_connector_meta(type("Out", (), {"scheduled_new_reqs": []})()))
    worker.start_load_kv()
    assert [(False, len(s)) for _, _, s in step.transfers] == [
        (False, len(s)) for s in (range(48), range(16), range(64))
    ]
    for name in real.LAYERS:
        np.testing.assert_array_equal(kv_mini[name], kv_real[name], err_msg=f"{name}: the loaded KV differs")
        for rid in rids:
            n = step.num_computed_tokens[rid]
            p_rows = np.concatenate([kv_p[name][:, b] for b in p_step.block_ids[rid]], axis=1)[:, :n]
            d_rows = np.concatenate([kv_mini[name][:, b] for b in step.block_ids[rid]], axis=1)[:, :n]
            np.testing.assert_array_equal(d_rows, p_rows, err_msg=f"{name}/{rid}: D's rows are not P's")


def test_whole_block_prompt_real_loads_the_wrong_key_mini_does_not(real, tmp_path):
    """P's prompt is 48 tokens: P stores 32; D's real scheduler matches 32, but its load asks for
    the folder of 48 tokens (the key is re-derived from D's 49-token prompt) and fails."""
    kv_p = paged_kv(real, 1)
    P = real.RealEngineSide(str(tmp_path), "kv_producer", block_size=BS, num_gpu_blocks=NB)
    P.add("e", prompt_of("e", 48), max_tokens=1)
    P.schedule()
    P.save(kv_p)
    D = real.RealEngineSide(str(tmp_path), "kv_consumer", block_size=BS, num_gpu_blocks=NB)
    D.add("e", prompt_of("e", 48) + [7], max_tokens=4)
    step = D.schedule()
    assert step.num_computed_tokens["e"] == 32 and step.num_scheduled_tokens["e"] == 17
    assert [len(s) for _, _, s in step.transfers] == [48], "the load plan names 48 slots for a 32-token hit"
    with pytest.raises(FileNotFoundError):
        D.load({k: np.zeros_like(v) for k, v in kv_p.items()})

    sched = mini_connector(real, str(tmp_path), KVConnectorRole.SCHEDULER)
    worker = mini_connector(real, str(tmp_path), KVConnectorRole.WORKER)
    kv = {k: np.zeros_like(v) for k, v in kv_p.items()}
    worker.register_kv_caches(kv)
    request = Request("e", prompt_of("e", 48) + [7], SamplingParams(max_tokens=4))
    n, _ = sched.get_num_new_matched_tokens(request, 0)
    sched.update_state_after_alloc(request, step.block_ids["e"], n)
    worker.bind_connector_metadata(sched.build_connector_meta(type("Out", (), {"scheduled_new_reqs": []})()))
    worker.start_load_kv()
    assert (
        n == 32 and worker.bytes_loaded == len(real.LAYERS) * 2 * 32 * real.NUM_KV_HEADS * real.HEAD_SIZE * 4
    )


@pytest.mark.parametrize("store", ["real", "mini"])
def test_minis_scheduler_with_the_connector_inside_admits_the_consumer_like_the_real_one(
    real, produced, store
):
    """The engine integration: mini's ``Scheduler`` built with ``kv_transfer_config`` (the connector
    inside, as in ``LLMEngine``) schedules the same tokens, computed counts, blocks and load plan as
    the real ``Scheduler`` with the real ``ExampleConnector`` on the consumer side."""
    from mini_vllm.config import ModelConfig, VllmConfig

    s_real, s_mini, *_ = produced
    path = str(s_real if store == "real" else s_mini)
    D = real.RealEngineSide(path, "kv_consumer", block_size=BS, num_gpu_blocks=NB)
    rids = ["a", "b", "c", "d"]
    for rid in rids:
        D.add(rid, prompt_of(rid, PROMPTS[rid]) + [7], max_tokens=4)
    step = D.schedule()

    hf = {"architectures": ["LlamaForCausalLM"], "vocab_size": 100_000, "num_hidden_layers": len(real.LAYERS)}
    base = create_engine_config(block_size=BS, num_gpu_blocks=NB, max_num_batched_tokens=2048)
    cfg = KVTransferConfig("ExampleConnector", "kv_consumer", {"shared_storage_path": path})
    mini = Scheduler(
        VllmConfig(
            base.cache_config,
            base.scheduler_config,
            model_config=ModelConfig(hf_config=hf, max_model_len=base.max_model_len),
            kv_transfer_config=cfg,
        )
    )
    mini.connector.layer_names = list(real.LAYERS)  # the real side's file names (an engine uses its model's)
    for rid in rids:
        mini.add_request(Request(rid, prompt_of(rid, PROMPTS[rid]) + [7], SamplingParams(max_tokens=4)))
    out = mini.schedule()
    assert out.num_scheduled_tokens == step.num_scheduled_tokens, "tokens left to compute differ"
    assert {r: mini.requests[r].num_computed_tokens for r in rids} == step.num_computed_tokens, (
        "the external hits must count as computed at admission, as upstream counts them"
    )
    assert {r: out.req_to_new_block_ids[r] for r in rids} == step.block_ids
    mine = [
        (m.is_store, m.token_ids.tolist(), m.slot_mapping.tolist())
        for m in out.kv_connector_metadata.requests
    ]
    loads = [t for t in step.transfers if not t[0]]
    assert mine == loads, "mini's load plan (key tokens, slots) differs from the real connector's"
