"""Two engines, one store: the KV connector inside the engine, and the prefill/decode proxy.

A producer engine (``kv_producer``) prefills each prompt and saves its full blocks; a consumer
engine (``kv_consumer``) admits prompt + first token, loads those blocks into its paged cache and
computes only the tail. On the tiny Llama of ``course/runtime/tiny_model.py`` (real K/V in the
paged cache) the greedy tokens must equal one engine's, the consumer's forward must see
``len(prompt) + 1 - align(len(prompt))`` prompt tokens, no block may leak on either side after a
finish or an abort, and a broken store entry must cost a recompute, never a wrong token.
"""

import importlib.util
import logging
import os

import numpy as np
import pytest

from mini_vllm import LLMEngine, SamplingParams
from mini_vllm.config import KVTransferConfig
from mini_vllm.entrypoints.disagg_proxy import DisaggProxy
from mini_vllm.kv_connector import ExampleConnector, KVConnectorFactory, align_to_block_size
from mini_vllm.request import RequestStatus
from mini_vllm.testing.disagg_counts import count_forward_tokens

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("torch") is None or importlib.util.find_spec("transformers") is None,
    reason="the tiny checkpoint is written by transformers (pip install -e '.[torch]')",
)

BS, NB, MAX_TOKENS = 16, 48, 6
LAYERS, KV_HEADS, HEAD_DIM = 2, 2, 64  # the tiny Llama's shape
GREEDY = SamplingParams(max_tokens=MAX_TOKENS, temperature=0, ignore_eos=True)
LENGTHS = (5, 16, 17, 32, 40)  # no full block, exactly one block, one + 1, two blocks, two and a half


def prompts() -> list[list[int]]:
    rng = np.random.default_rng(15)
    return [[int(t) for t in rng.integers(3, 512, size=n)] for n in LENGTHS]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    from course.runtime import tiny_model

    return str(tiny_model.build(tmp_path_factory.mktemp("tiny-llama")))


@pytest.fixture(scope="module")
def reference(checkpoint):
    """One engine, no connector: the tokens every split must reproduce."""
    engine = LLMEngine(model=checkpoint, block_size=BS, num_gpu_blocks=NB)
    return [o.token_ids for o in engine.generate(prompts(), GREEDY)]


def make(checkpoint, role, store, **extra):
    cfg = KVTransferConfig("ExampleConnector", role, {"shared_storage_path": str(store), **extra})
    return LLMEngine(model=checkpoint, block_size=BS, num_gpu_blocks=NB, kv_transfer_config=cfg)


def worker_connector(engine) -> ExampleConnector:
    return engine.model_executor.driver_worker.model_runner.kv_connector


def assert_no_leak(engine, side: str) -> None:
    pool = engine.scheduler.kv_cache_manager.block_pool
    assert not engine.scheduler.kv_cache_manager.req_to_blocks, f"{side}: blocks still assigned to requests"
    assert pool.get_num_free_blocks() == NB - 1, (
        f"{side}: {pool.get_num_free_blocks()} free blocks after everything finished, expected {NB - 1}"
    )


def test_proxy_gives_one_engines_tokens_and_the_consumer_skips_the_prefill(checkpoint, reference, tmp_path):
    producer, consumer = make(checkpoint, "kv_producer", tmp_path), make(checkpoint, "kv_consumer", tmp_path)
    forward = count_forward_tokens(consumer)
    outs = DisaggProxy(producer, consumer).generate(prompts(), GREEDY)
    got = [o.token_ids for o in outs]
    assert got == reference, "prefill on one engine + decode on another must give one engine's greedy tokens"
    for o in outs:
        want = consumer.tokenizer.decode(o.token_ids)
        assert o.text == want, (
            f"the joined text is {o.text!r}, the decoded token ids {want!r}: decode the prefill's first token "
            "and the decode engine's tail together"
        )

    aligned = [align_to_block_size(n, BS) for n in LENGTHS]  # what the producer stored: 0, 0, 16, 16, 32
    assert consumer.scheduler.num_external_computed_tokens == sum(aligned)
    prefill = sum(n + 1 - a for n, a in zip(LENGTHS, aligned))  # the tail each consumer prompt computes
    decode = len(LENGTHS) * (MAX_TOKENS - 2)  # tokens 3..MAX_TOKENS: one forward token each
    assert forward[0] == prefill + decode, (
        f"the consumer's forward saw {forward[0]} tokens; expected {prefill} prompt-tail tokens + {decode} "
        f"decode tokens (the loaded {sum(aligned)} must not be recomputed)"
    )
    itemsize = 4  # float32
    assert (
        worker_connector(consumer).bytes_loaded == LAYERS * 2 * sum(aligned) * KV_HEADS * HEAD_DIM * itemsize
    )
    assert worker_connector(producer).bytes_saved == worker_connector(consumer).bytes_loaded
    assert worker_connector(consumer).bytes_saved == 0, "a kv_consumer only loads"
    assert_no_leak(producer, "producer")
    assert_no_leak(consumer, "consumer")


def test_a_request_that_stops_at_its_first_token_never_reaches_the_decode_engine(
    checkpoint, reference, tmp_path
):
    first = reference[0][0]
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0, stop_token_ids=(first,))
    producer, consumer = make(checkpoint, "kv_producer", tmp_path), make(checkpoint, "kv_consumer", tmp_path)
    forward = count_forward_tokens(consumer)
    (out,) = DisaggProxy(producer, consumer).generate([prompts()[0]], params)
    assert (out.token_ids, out.finish_reason) == ([first], "stop"), (
        f"the prefill engine's first token {first} is a stop token: the answer is that one token, finish_reason "
        f"'stop'; got {out.token_ids} ({out.finish_reason!r}). Send only prompts that finished by 'length' "
        "to the decode engine"
    )
    assert forward[0] == 0, (
        f"the decode engine ran {forward[0]} tokens for a request that had already stopped"
    )


def test_a_chunked_prefill_is_stored_once_its_last_block_is_computed(checkpoint, reference, tmp_path):
    cfg = KVTransferConfig("ExampleConnector", "kv_producer", {"shared_storage_path": str(tmp_path)})
    producer = LLMEngine(
        model=checkpoint, block_size=BS, num_gpu_blocks=NB, max_num_batched_tokens=BS, kv_transfer_config=cfg
    )  # a 40-token prompt runs in three chunks of at most 16
    consumer = make(checkpoint, "kv_consumer", tmp_path)
    got = [o.token_ids for o in DisaggProxy(producer, consumer).generate(prompts(), GREEDY)]
    assert got == reference, "a store planned at the first chunk would save KV not computed yet"
    aligned = [align_to_block_size(n, BS) for n in LENGTHS]
    assert consumer.scheduler.num_external_computed_tokens == sum(aligned), "every full block must be stored"
    assert not producer.scheduler.connector._pending_store, "no store may stay planned after its request"
    assert_no_leak(producer, "producer")


def test_a_repeated_prompt_hits_the_consumers_own_prefix_cache_not_the_store(checkpoint, reference, tmp_path):
    producer, consumer = make(checkpoint, "kv_producer", tmp_path), make(checkpoint, "kv_consumer", tmp_path)
    proxy = DisaggProxy(producer, consumer)
    assert [o.token_ids for o in proxy.generate(prompts(), GREEDY)] == reference
    loaded = worker_connector(consumer).bytes_loaded
    assert [o.token_ids for o in proxy.generate(prompts(), GREEDY)] == reference
    assert worker_connector(consumer).bytes_loaded == loaded, (
        "the loaded blocks entered the consumer's prefix cache: a second identical request must hit them "
        "locally (get_num_new_matched_tokens gets the local hits and owes nothing)"
    )
    assert_no_leak(consumer, "consumer")


def test_roles_gate_loading_and_storing(checkpoint, tmp_path):
    producer = make(checkpoint, "kv_producer", tmp_path / "p")
    producer.generate(prompts(), SamplingParams(max_tokens=1))
    producer.generate(prompts(), SamplingParams(max_tokens=1))  # the same prompts again: still no load
    assert producer.scheduler.num_external_computed_tokens == 0, "a kv_producer never loads"
    consumer = make(checkpoint, "kv_consumer", tmp_path / "c")
    consumer.generate(prompts(), SamplingParams(max_tokens=1))
    assert not (tmp_path / "c").exists() or not os.listdir(tmp_path / "c"), "a kv_consumer never stores"


@pytest.mark.parametrize("damage", ["truncate", "delete_layer"])
def test_a_broken_store_entry_falls_back_to_local_prefill(checkpoint, reference, tmp_path, damage, caplog):
    producer, consumer = make(checkpoint, "kv_producer", tmp_path), make(checkpoint, "kv_consumer", tmp_path)
    first = producer.generate(prompts(), SamplingParams(max_tokens=1, temperature=0, ignore_eos=True))
    files = sorted(
        os.path.join(root, f) for root, _, fs in os.walk(tmp_path) for f in fs if f.endswith(".safetensors")
    )
    assert len(files) == 3 * LAYERS, "three of the five prompts have a full block to store"
    for path in files[::LAYERS]:  # one layer of every stored prompt
        if damage == "truncate":
            with open(path, "r+b") as f:
                f.truncate(os.path.getsize(path) - 7)
        else:
            os.remove(path)
    forward = count_forward_tokens(consumer)
    with caplog.at_level(logging.WARNING, logger="mini_vllm.kv_connector"):
        got = consumer.generate(
            [o.prompt_token_ids + o.token_ids for o in first],
            SamplingParams(max_tokens=MAX_TOKENS - 1, temperature=0, ignore_eos=True),
        )
    assert [o.token_ids + g.token_ids for o, g in zip(first, got)] == reference, (
        "a fallback must not change tokens"
    )
    assert consumer.scheduler.num_external_computed_tokens == 0, (
        "no token may be promised from a broken entry"
    )
    assert len(worker_connector(consumer).fallbacks) == 0  # the scheduler side found it first
    assert len(consumer.scheduler.connector.fallbacks) == 3, "each broken entry is recorded with its reason"
    assert caplog.text.count("stored KV unusable, recomputing") == 3, "each fallback is logged"
    assert forward[0] == sum(n + 1 for n in LENGTHS) + len(LENGTHS) * (MAX_TOKENS - 2), (
        "the prompts run whole"
    )
    assert_no_leak(consumer, "consumer")


@pytest.mark.parametrize("load_async", [False, True])
def test_a_load_that_fails_after_the_match_recomputes_the_bad_blocks(
    checkpoint, reference, tmp_path, load_async
):
    producer = make(checkpoint, "kv_producer", tmp_path)
    consumer = make(checkpoint, "kv_consumer", tmp_path, load_async=load_async)
    first = producer.generate(prompts(), SamplingParams(max_tokens=1, temperature=0, ignore_eos=True))
    connector = worker_connector(consumer)
    start_load_kv = connector.start_load_kv

    def break_then_load(**kwargs):  # the files go bad between the scheduler's check and the load
        for root, _, fs in os.walk(tmp_path):
            for f in fs:
                with open(os.path.join(root, f), "wb") as fh:
                    fh.write(b"garbage")
        start_load_kv(**kwargs)

    connector.start_load_kv = break_then_load
    got = consumer.generate(
        [o.prompt_token_ids + o.token_ids for o in first],
        SamplingParams(max_tokens=MAX_TOKENS - 1, temperature=0, ignore_eos=True),
    )
    assert [o.token_ids + g.token_ids for o, g in zip(first, got)] == reference, (
        "tokens sampled over blocks that failed to load must be dropped and the blocks recomputed"
    )
    assert connector.bytes_loaded == 0 and len(connector.fallbacks) == 3
    assert_no_leak(consumer, "consumer")


def test_async_load_parks_the_request_until_the_worker_reports_it(checkpoint, reference, tmp_path):
    producer = make(checkpoint, "kv_producer", tmp_path)
    consumer = make(checkpoint, "kv_consumer", tmp_path, load_async=True, load_delay_steps=2)
    first = producer.generate(prompts(), SamplingParams(max_tokens=1, temperature=0, ignore_eos=True))
    params = SamplingParams(max_tokens=MAX_TOKENS - 1, temperature=0, ignore_eos=True)
    ids = [consumer.add_request(o.prompt_token_ids + o.token_ids, params) for o in first]
    consumer.step()
    parked = [
        r for r in consumer.scheduler.requests.values() if r.status == RequestStatus.WAITING_FOR_REMOTE_KVS
    ]
    assert len(parked) == 3, "the three prompts with a stored block wait for their KV; the others run"
    assert all(r.num_computed_tokens == align_to_block_size(r.num_prompt_tokens - 1, BS) for r in parked)
    outputs = {}
    while consumer.has_unfinished_requests():
        outputs.update({o.request_id: o for o in consumer.step()})
    got = [first[i].token_ids + outputs[rid].token_ids for i, rid in enumerate(ids)]
    assert got == reference, "an async load must give the same tokens once it lands"
    assert_no_leak(consumer, "consumer")


def test_abort_while_parked_holds_the_blocks_until_the_load_lands(checkpoint, tmp_path):
    producer = make(checkpoint, "kv_producer", tmp_path)
    consumer = make(checkpoint, "kv_consumer", tmp_path, load_async=True, load_delay_steps=2)
    first = producer.generate([prompts()[-1]], SamplingParams(max_tokens=1))[0]
    rid = consumer.add_request(first.prompt_token_ids + first.token_ids, SamplingParams(max_tokens=4))
    consumer.step()
    assert consumer.scheduler.requests[rid].status == RequestStatus.WAITING_FOR_REMOTE_KVS
    consumer.abort_request(rid)
    assert rid in consumer.scheduler.requests_held_for_kv, (
        "an aborted request whose load is in flight keeps its blocks: the load still writes them"
    )
    assert consumer.has_unfinished_requests(), "the engine keeps stepping until the transfer is over"
    steps = 0
    while consumer.has_unfinished_requests():
        consumer.step()
        steps += 1
        assert steps < 10, "the held blocks were never released"
    assert_no_leak(consumer, "consumer")
    assert_no_leak(producer, "producer")


def test_abort_mid_decode_frees_the_blocks_on_both_sides(checkpoint, tmp_path):
    producer, consumer = make(checkpoint, "kv_producer", tmp_path), make(checkpoint, "kv_consumer", tmp_path)
    rid = producer.add_request(prompts()[-1], SamplingParams(max_tokens=8))
    producer.step()
    producer.abort_request(rid)
    first = producer.generate([prompts()[-1]], SamplingParams(max_tokens=1))[0]
    rid = consumer.add_request(first.prompt_token_ids + first.token_ids, SamplingParams(max_tokens=8))
    consumer.step()
    consumer.step()
    consumer.abort_request(rid)
    assert not consumer.has_unfinished_requests()
    assert_no_leak(producer, "producer")
    assert_no_leak(consumer, "consumer")


class DelayedSaveConnector(ExampleConnector):
    """Saves 'in the background': a finished request's blocks stay held until the next step."""

    def request_finished(self, request, block_ids):
        return True, None

    def get_finished(self, finished_req_ids=()):
        _, recving = super().get_finished(finished_req_ids)
        return set(finished_req_ids) or None, recving


def test_request_finished_delays_the_free_until_the_save_is_reported(checkpoint, tmp_path):
    if "DelayedSaveConnector" not in KVConnectorFactory._registry:
        KVConnectorFactory.register_connector("DelayedSaveConnector", DelayedSaveConnector)
    cfg = KVTransferConfig("DelayedSaveConnector", "kv_producer", {"shared_storage_path": str(tmp_path)})
    engine = LLMEngine(model=checkpoint, block_size=BS, num_gpu_blocks=NB, kv_transfer_config=cfg)
    rid = engine.add_request(prompts()[-1], SamplingParams(max_tokens=1))
    done = engine.step()
    assert [o.request_id for o in done] == [rid]
    assert rid in engine.scheduler.requests_held_for_kv and engine.scheduler.kv_cache_manager.req_to_blocks, (
        "a connector that is still saving keeps the blocks after the request finished"
    )
    engine.step()  # the worker reports the save finished (its id came back in finished_req_ids)
    assert_no_leak(engine, "producer")


def test_misconfigured_kv_transfer_is_refused_at_construction(checkpoint, tmp_path):
    with pytest.raises(ValueError, match="kv_role"):
        LLMEngine(model=checkpoint, kv_transfer_config={"kv_role": "decode"})
    with pytest.raises(TypeError, match="kv_transfer_config"):
        LLMEngine(model=checkpoint, kv_transfer_config=42)
    with pytest.raises(ValueError, match="unknown kv_connector"):
        LLMEngine(model=checkpoint, kv_transfer_config={"kv_connector": "Nope", "kv_role": "kv_both"})
    with pytest.raises(ValueError, match="needs a model with a KV cache"):
        LLMEngine(kv_transfer_config={"kv_role": "kv_both"})  # the toy model keeps no KV
    producer, consumer = make(checkpoint, "kv_producer", tmp_path), make(checkpoint, "kv_consumer", tmp_path)
    with pytest.raises(ValueError, match="prefill engine needs kv_role 'kv_producer'"):
        DisaggProxy(consumer, producer)
    with pytest.raises(ValueError, match="decode engine needs kv_role 'kv_consumer'.*no kv_transfer_config"):
        DisaggProxy(producer, LLMEngine(model=checkpoint, block_size=BS, num_gpu_blocks=NB))
    with pytest.raises(ValueError, match="n=1"):
        DisaggProxy(producer, consumer).generate(prompts(), SamplingParams(n=2))


def test_the_http_proxy_splits_a_request_over_two_servers(checkpoint, tmp_path):
    """Two OpenAI servers (producer, consumer) behind ``build_proxy_app``, driven by the official
    client: greedy text equals one engine's, the consumer loads the stored blocks, streams relay,
    the prefill server's 4xx reaches the client, and no block is left on either side."""
    openai = pytest.importorskip("openai")
    pytest.importorskip("aiohttp")
    pytest.importorskip("uvicorn")
    from mini_vllm.entrypoints.disagg_proxy import build_proxy_app
    from mini_vllm.testing.live_server import LiveApp, LiveServer

    def server(role):
        cfg = KVTransferConfig("ExampleConnector", role, {"shared_storage_path": str(tmp_path)})
        return LiveServer(checkpoint=checkpoint, served_model_name="m", block_size=BS, num_gpu_blocks=NB,
                          kv_transfer_config=cfg)  # fmt: skip

    producer, consumer = server("kv_producer"), server("kv_consumer")
    proxy = LiveApp(build_proxy_app(producer.base_url, consumer.base_url), "the proxy")
    try:
        client = openai.OpenAI(base_url=proxy.base_url + "/v1", api_key="-", timeout=30, max_retries=0)
        alone = LLMEngine(model=checkpoint, block_size=BS, num_gpu_blocks=NB)
        for prompt in prompts()[2:]:  # 17, 32 and 40 tokens: one, two and two full blocks stored
            r = client.completions.create(model="m", prompt=prompt, max_tokens=MAX_TOKENS, temperature=0,
                                          extra_body={"ignore_eos": True})  # fmt: skip
            assert r.choices[0].text == alone.generate([prompt], GREEDY)[0].text, f"{len(prompt)}-token prompt"
            assert r.usage.completion_tokens == MAX_TOKENS
        loaded = consumer.engine.scheduler.num_external_computed_tokens
        assert loaded == sum(align_to_block_size(n, BS) for n in LENGTHS[2:]), (
            f"the consumer loaded {loaded} tokens from the store; the producer stored every full block"
        )
        kw = dict(model="m", prompt=prompts()[4], max_tokens=MAX_TOKENS, temperature=0, extra_body={"ignore_eos": True})
        whole = client.completions.create(**kw).choices[0].text
        chunks = list(client.completions.create(stream=True, stream_options={"include_usage": True}, **kw))
        assert "".join(c.choices[0].text for c in chunks if c.choices) == whole, "the relayed stream"
        assert (chunks[-1].usage.prompt_tokens, chunks[-1].usage.completion_tokens) == (LENGTHS[4], MAX_TOKENS), (
            "the usage chunk counts the client's prompt and all its tokens (the first one came from the prefill)"
        )
        first = alone.tokenizer.decode(alone.generate([prompts()[2]], GREEDY)[0].token_ids[:1])
        assert first.strip() and "\ufffd" not in first, (
            f"the first greedy token's text {first!r} makes no stop string"
        )
        r = client.completions.create(
            model="m", prompt=prompts()[2], max_tokens=MAX_TOKENS, temperature=0, stop=[first]
        )
        got = (r.choices[0].text, r.choices[0].finish_reason, r.usage.completion_tokens)
        assert got == ("", "stop", 1), (
            f"the prefill server stopped at its first token (stop string {first!r}); the proxy answered {got}, "
            "expected ('', 'stop', 1): only a first token that finished by 'length' goes on to the decode server"
        )
        with pytest.raises(openai.BadRequestError):
            client.completions.create(model="m", prompt="hi", max_tokens=10**6)
        for side in (producer, consumer):
            assert side.wait_idle() and side.num_free_blocks() == NB - 1, "a block was left behind"
    finally:
        proxy.stop()
        producer.stop()
        consumer.stop()
