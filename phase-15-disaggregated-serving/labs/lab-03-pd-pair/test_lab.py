"""Tier 1: the real ExampleConnector and Scheduler on the CPU backend's KV layout, both roles."""

import importlib

import numpy as np
import pytest

from course.runtime import lab_module

pytestmark = pytest.mark.upstream

lab = lab_module(__file__)  # solution.py by default; LAB_IMPL=starter grades starter.py


@pytest.fixture(scope="module")
def torch():
    importlib.import_module("mini_vllm.testing.real_kv_connector")  # CPU wiring before vllm
    return importlib.import_module("torch")


def rows_by_loop(kv, slots, bs):
    """The reference, one token at a time: (2, n, H*D) from an HND layer."""
    return np.stack(
        [np.stack([kv[kv_i, s // bs, :, s % bs, :].reshape(-1) for s in slots]) for kv_i in (0, 1)]
    )


@pytest.mark.parametrize("prompt_len,block_size", [(50, 16), (33, 16), (70, 32)])
def test_the_stock_connector_is_silently_wrong_and_yours_is_right(tmp_path, prompt_len, block_size):
    stock = lab.handoff(None, str(tmp_path / "stock"), prompt_len, block_size=block_size)
    fixed = lab.handoff(
        lab.CPULayoutExampleConnector, str(tmp_path / "fixed"), prompt_len, block_size=block_size
    )
    n = (prompt_len - 1) // block_size * block_size
    assert stock["matched"] == fixed["matched"] == n, (
        f"D should match {n} whole-block tokens of {prompt_len + 1}"
    )
    assert fixed["computed_on_d"] == prompt_len + 1 - n, "and compute only the tail"
    blocks = fixed["d_block_ids"][: n // block_size]
    for name in stock["p_rows"]:
        assert not stock["d_rows"][name].any(), (
            "the stock connector must leave D's request blocks zero (the bug)"
        )
        assert not set(stock["d_touched_blocks"]) & set(blocks), "it writes outside the request's blocks"
        np.testing.assert_array_equal(
            fixed["d_rows"][name],
            fixed["p_rows"][name],
            err_msg=f"{name}: your connector's D rows are not P's",
        )
    assert fixed["d_touched_blocks"] == sorted(blocks), (
        f"your load must write exactly D's {len(blocks)} matched blocks {blocks}, wrote {fixed['d_touched_blocks']}"
    )


@pytest.mark.parametrize("heads,bs,slots", [(2, 16, [16, 17, 47, 3]), (3, 4, [9, 8, 1, 22, 23]), (1, 8, [5])])
def test_extract_rows_matches_a_loop(torch, heads, bs, slots):
    kv = np.random.default_rng(heads).standard_normal((2, 6, heads, bs, 5)).astype(np.float32)
    got = lab.extract_rows(torch.from_numpy(kv), torch.tensor(slots, dtype=torch.int64), bs)
    assert tuple(got.shape) == (2, len(slots), heads * 5), f"rows must be (2, n, H*D), got {tuple(got.shape)}"
    np.testing.assert_array_equal(
        got.numpy(), rows_by_loop(kv, slots, bs), err_msg="row order: token, then head, then dim"
    )


def test_inject_rows_writes_in_place_through_a_view(torch):
    big = torch.zeros(2, 6, 2, 4, 9)
    layer = big[..., 2:7]  # a non-contiguous view, as a layer of a shared buffer can be
    assert not layer.is_contiguous()
    rows = torch.arange(2 * 5 * 10, dtype=torch.float32).reshape(2, 5, 10)
    slots = torch.tensor([13, 2, 3, 20, 0])
    lab.inject_rows(layer, rows, slots, 4)
    np.testing.assert_array_equal(
        lab.extract_rows(layer, slots, 4).numpy(), rows.numpy(), err_msg="round trip failed"
    )
    written = big[..., 2:7].clone()
    for s in slots.tolist():
        written[:, s // 4, :, s % 4, :] = 0
    assert not written.any() and not big[..., :2].any() and not big[..., 7:].any(), (
        "only the 5 slots may change"
    )


def test_inject_refuses_rows_of_the_wrong_shape(torch):
    layer = torch.zeros(2, 4, 2, 4, 3)
    for bad in ((2, 3, 5), (3, 2, 6)):  # the second has the right size, so a bare reshape accepts it
        with pytest.raises(ValueError, match="do not fit"):
            lab.inject_rows(layer, torch.ones(*bad), torch.tensor([0, 1, 2]), 4)
        assert not layer.any(), f"a refused write of rows {bad} must change nothing"


def test_fixed_files_load_into_minis_cache(tmp_path, torch):
    """A file is a file: rows saved from the CPU layout by your connector load into mini's NHD cache."""
    from mini_vllm.config import KVTransferConfig
    from mini_vllm.kv_connector import KVConnectorFactory, KVConnectorRole
    from mini_vllm.request import Request
    from mini_vllm.sampling_params import SamplingParams
    from mini_vllm.testing.real_kv_connector import HEAD_SIZE, LAYERS, NUM_KV_HEADS

    fixed = lab.handoff(lab.CPULayoutExampleConnector, str(tmp_path), 40, seed=3)
    cfg = KVTransferConfig("ExampleConnector", "kv_consumer", {"shared_storage_path": str(tmp_path)})
    sched = KVConnectorFactory.create_connector(cfg, KVConnectorRole.SCHEDULER, 16, LAYERS)
    worker = KVConnectorFactory.create_connector(cfg, KVConnectorRole.WORKER, 16, LAYERS)
    caches = {name: np.zeros((2, 8, 16, NUM_KV_HEADS, HEAD_SIZE), np.float32) for name in LAYERS}
    worker.register_kv_caches(caches)
    prompt = fixed["prompt"] + [7]
    n, _ = sched.get_num_new_matched_tokens(Request("m", prompt, SamplingParams(max_tokens=2)), 0)
    assert n == 32
    sched.update_state_after_alloc(Request("m", prompt, SamplingParams(max_tokens=2)), [5, 2, 7], n)
    worker.bind_connector_metadata(sched.build_connector_meta(type("Out", (), {"scheduled_new_reqs": []})()))
    worker.start_load_kv()
    for name in LAYERS:
        mine = np.concatenate([caches[name][:, b] for b in (5, 2)], axis=1)  # (2, 32, H, D)
        np.testing.assert_array_equal(mine, fixed["p_rows"][name], err_msg=f"{name}: mini read other rows")


def test_run_py_pairs_the_roles_with_one_block_size(torch):
    """run.py (the GPU pair) starts a producer and a consumer with the same block size as the single
    engine; the rows it moves are the rows your functions move (one slot, round trip)."""
    import subprocess
    import sys
    from pathlib import Path

    layer = torch.zeros(2, 3, 2, 16, 4)
    rows = torch.arange(16, dtype=torch.float32).reshape(2, 1, 8)
    lab.inject_rows(layer, rows, torch.tensor([37]), 16)
    assert layer[:, 2, :, 5, :].reshape(2, 1, 8).equal(rows), "slot 37 at block size 16 is block 2, offset 5"
    run = Path(__file__).with_name("run.py")
    out = subprocess.run(
        [sys.executable, str(run), "--dry-run"], capture_output=True, text=True, check=True
    ).stdout
    assert '"kv_role": "kv_producer"' in out and '"kv_role": "kv_consumer"' in out
    assert out.count("--block-size 16") == 3, "all three servers must share the block size"


# --------------------------------------------------------------------------- the whole engine (tier 2)


@pytest.mark.engine
def test_two_cpu_engines_agree_with_one_only_with_your_connector(tmp_path, torch):
    """Five engine processes (about a minute each): one engine alone; a producer and a consumer with
    vLLM's ExampleConnector; a producer and a consumer with yours. Only yours gives one engine's tokens."""
    import json
    import subprocess
    from pathlib import Path

    from course.runtime import engine

    # Your functions first: a starter fails here, before the minutes the engines take.
    layer = torch.zeros(2, 2, 2, 16, 4)
    lab.inject_rows(layer, torch.ones(2, 1, 8), torch.tensor([17]), 16)
    assert layer[:, 1, :, 1, :].sum() == 16

    prompts = [[(37 * i + 11 * k) % 200 + 50 for i in range(n)] for k, n in enumerate((50, 40))]
    script = Path(__file__).with_name("engine_pair.py")

    def run(role, store, connector, prompt_ids, max_tokens):
        out = tmp_path / f"{role}-{connector}.json"
        args = {
            "role": role,
            "model": str(engine.model_path()),
            "store": str(store),
            "prompts": prompt_ids,
            "max_tokens": max_tokens,
            "connector": connector,
            "lab_file": str(Path(lab.__file__).resolve()),
        }
        proc = subprocess.run(
            [str(engine.python()), str(script), json.dumps(args), str(out)],
            env=engine.engine_env(),
            capture_output=True,
            text=True,
            timeout=engine.JOB_TIMEOUT_S,
            check=False,
        )
        assert proc.returncode == 0, f"{role} ({connector}) failed:\n{(proc.stdout + proc.stderr)[-3000:]}"
        return json.loads(out.read_text())

    single = run("single", tmp_path, "stock", prompts, 6)["tokens"]
    pairs = {}
    for connector in ("stock", "fixed"):
        store = tmp_path / connector
        store.mkdir()
        first = run("producer", store, connector, prompts, 1)
        assert first["stored_folders"] == 2, "the producer must store one folder per prompt"
        tail = run("consumer", store, connector, [p + t for p, t in zip(prompts, first["tokens"])], 5)
        assert tail["num_cached_tokens"] == [48, 32], "D must report 48 and 32 externally loaded tokens"
        pairs[connector] = [a + b for a, b in zip(first["tokens"], tail["tokens"])]
    assert pairs["stock"] != single, "expected the stock connector to be silently wrong on the CPU layout"
    assert pairs["fixed"] == single, (
        f"with your connector the pair gives {pairs['fixed']}, one engine {single}"
    )


@pytest.mark.engine
def test_the_http_proxy_between_two_vllm_servers_with_your_connector(tmp_path, torch):
    """Two real OpenAI servers (producer, consumer; your connector through kv_connector_module_path)
    behind mini's HTTP proxy: the producer's own full answer and the proxy's are the same text, and
    the consumer's /metrics counts the tokens it loaded from the store."""
    import json
    import urllib.request
    from pathlib import Path

    openai = pytest.importorskip("openai")
    pytest.importorskip("aiohttp")
    from course import ROOT
    from course.runtime import engine
    from mini_vllm.entrypoints.disagg_proxy import build_proxy_app
    from mini_vllm.testing.live_server import LiveApp

    spec = importlib.util.spec_from_file_location("engine_pair", Path(__file__).with_name("engine_pair.py"))
    pair = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(pair)
    shim = tmp_path / "shim"
    shim.mkdir()
    (shim / "course_pd_connector.py").write_text(pair.SHIM.format(path=str(Path(lab.__file__).resolve())))
    store = tmp_path / "store"
    store.mkdir()

    def server(role):
        config = {"kv_connector": "CPULayoutExampleConnector", "kv_connector_module_path": "course_pd_connector",
                  "kv_role": role, "kv_connector_extra_config": {"shared_storage_path": str(store)}}  # fmt: skip
        return engine.RealServer("--kv-transfer-config", json.dumps(config), env={"PYTHONPATH": f"{shim}:{ROOT}"})

    producer = server("kv_producer")
    consumer = proxy = None
    try:
        consumer = server("kv_consumer")
        proxy = LiveApp(build_proxy_app(producer.base_url, consumer.base_url), "the proxy")
        prompt = [(37 * i) % 200 + 50 for i in range(50)]  # 50 tokens: 48 stored (three blocks of 16)
        body = dict(model="tiny-llama", prompt=prompt, max_tokens=6, temperature=0, extra_body={"ignore_eos": True})
        alone = openai.OpenAI(base_url=producer.base_url + "/v1", api_key="-", timeout=120, max_retries=0)
        want = alone.completions.create(**body).choices[0].text
        via = openai.OpenAI(base_url=proxy.base_url + "/v1", api_key="-", timeout=120, max_retries=0)
        got = via.completions.create(**body)
        assert got.choices[0].text == want, f"through the proxy {got.choices[0].text!r}, one server {want!r}"
        assert (got.usage.prompt_tokens, got.usage.completion_tokens) == (50, 6)
        page = urllib.request.urlopen(consumer.base_url + "/metrics", timeout=30).read().decode()
        hits = [ln for ln in page.splitlines() if ln.startswith("vllm:external_prefix_cache_hits_total")]
        assert hits and float(hits[0].split()[-1]) == 48.0, f"the consumer's external hits: {hits}"
    finally:
        for s in (proxy, consumer, producer):
            if s is not None:
                s.stop()
