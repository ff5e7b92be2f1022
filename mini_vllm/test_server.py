"""mini's OpenAI-compatible server, driven by the official ``openai`` client on a loopback port.

One server per module (a few hundred ms to start). Every test is bounded: small ``max_tokens``,
64 concurrent streaming clients (32 running at once, the rest queued), client timeouts of a few seconds.
"""

import asyncio
import json
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

openai = pytest.importorskip("openai")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

from mini_vllm.testing.live_server import LiveServer  # noqa: E402

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "enum": ["Paris", "東京"]}},
        },
    },
}


@pytest.fixture(scope="module")
def server():
    s = LiveServer(num_gpu_blocks=64, block_size=16, max_num_seqs=32, reasoning_parser="deepseek_r1")
    yield s
    s.stop()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key="-", timeout=10, max_retries=0)


def _post(server, path, body, headers=None):
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    req = urllib.request.Request(
        server.base_url + path, data=data, headers={"Content-Type": "application/json", **(headers or {})}
    )
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_models_and_health(server, client):
    assert [m.id for m in client.models.list().data] == ["mini-toy"]
    assert urllib.request.urlopen(server.base_url + "/health", timeout=5).status == 200


def test_completion_usage_and_length(client):
    r = client.completions.create(
        model="mini-toy", prompt="Hello", max_tokens=7, temperature=0, extra_body={"ignore_eos": True}
    )
    assert r.choices[0].finish_reason == "length"
    assert r.usage.prompt_tokens == 5 and r.usage.completion_tokens == 7 and r.usage.total_tokens == 12


def test_return_token_ids_carries_the_prompt_and_the_choices_ids(server):
    body = {"prompt": "Hello", "max_tokens": 5, "temperature": 0, "ignore_eos": True, "n": 2, "seed": 1}
    code, plain = _post(server, "/v1/completions", body)
    assert code == 200 and "token_ids" not in plain["choices"][0], "only on request"
    code, r = _post(server, "/v1/completions", {**body, "return_token_ids": True})
    assert code == 200
    for c in r["choices"]:
        assert c["prompt_token_ids"] == list(b"Hello"), "the toy's byte tokenizer: one id per byte"
        assert len(c["token_ids"]) == 5 and bytes(c["token_ids"]).decode(errors="replace") == c["text"]
    assert r["usage"]["completion_tokens"] == sum(len(c["token_ids"]) for c in r["choices"])


def test_streamed_deltas_equal_the_whole_text(client):
    kw = dict(model="mini-toy", prompt="The scheduler", max_tokens=24, temperature=0)
    whole = client.completions.create(**kw).choices[0].text
    chunks = list(client.completions.create(stream=True, stream_options={"include_usage": True}, **kw))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == whole
    assert chunks[-1].usage.completion_tokens >= 1 and chunks[-1].choices == []
    msgs = [{"role": "user", "content": "hi 🚀"}]
    chat = client.chat.completions.create(model="mini-toy", messages=msgs, max_tokens=16, temperature=0)
    streamed = client.chat.completions.create(
        model="mini-toy", messages=msgs, max_tokens=16, temperature=0, stream=True
    )
    deltas = [c.choices[0].delta.content for c in streamed]
    assert deltas[0] == "" and deltas[-1] is None, "role chunk first, finish chunk last"
    assert "".join(d or "" for d in deltas) == chat.choices[0].message.content


def test_n_seed_token_prompt_and_json_schema(client):
    kw = dict(model="mini-toy", prompt=[72, 105], max_tokens=6, temperature=1.0, seed=7, n=2, extra_body={"ignore_eos": True})
    a, b = client.completions.create(**kw), client.completions.create(**kw)
    assert [c.text for c in a.choices] == [c.text for c in b.choices], "a seed makes the n choices reproducible"
    assert [c.index for c in a.choices] == [0, 1] and a.usage.prompt_tokens == 2
    assert a.usage.completion_tokens == 12, "usage counts every choice's tokens: 2 x 6"
    streamed = list(client.completions.create(stream=True, **kw))
    for i in range(2):
        text = "".join(c.choices[0].text for c in streamed if c.choices and c.choices[0].index == i)
        assert text == a.choices[i].text, f"choice {i}: streamed text must equal the non-streamed one"
    schema = {"type": "object", "properties": {"unit": {"enum": ["C", "F"]}, "ok": {"type": "boolean"}}}
    r = client.chat.completions.create(model="mini-toy", messages=[{"role": "user", "content": "json"}], max_tokens=40,
                                       response_format={"type": "json_schema", "json_schema": {"name": "t", "schema": schema}})
    obj = json.loads(r.choices[0].message.content)
    assert obj["unit"] in ("C", "F") and isinstance(obj["ok"], bool)


def test_stop_string_cuts_and_finishes(client):
    base = client.completions.create(
        model="mini-toy", prompt="ab", max_tokens=20, temperature=0, extra_body={"ignore_eos": True}
    )
    text = base.choices[0].text
    stop = text[5:7]
    r = client.completions.create(model="mini-toy", prompt="ab", max_tokens=20, temperature=0, stop=[stop])
    assert r.choices[0].text == text[: text.find(stop)] and r.choices[0].finish_reason == "stop"
    s = client.completions.create(
        model="mini-toy", prompt="ab", max_tokens=20, temperature=0, stop=[stop], stream=True
    )
    assert "".join(c.choices[0].text for c in s) == r.choices[0].text


def test_forced_tool_call(client):
    msgs = [{"role": "user", "content": "Weather in Paris?"}]
    r = client.chat.completions.create(
        model="mini-toy", messages=msgs, tools=[WEATHER], tool_choice="required", max_tokens=80
    )
    call = r.choices[0].message.tool_calls[0]
    assert r.choices[0].finish_reason == "tool_calls" and call.function.name == "get_weather"
    assert json.loads(call.function.arguments)["city"] in ("Paris", "東京")
    named = {"type": "function", "function": {"name": "get_weather"}}
    s = client.chat.completions.create(
        model="mini-toy", messages=msgs, tools=[WEATHER], tool_choice=named, max_tokens=80, stream=True
    )
    chunks = list(s)
    calls = [tc for c in chunks for tc in (c.choices[0].delta.tool_calls or [])]
    assert len(calls) == 1 and calls[0].function.name == "get_weather"
    assert chunks[-1].choices[0].finish_reason == "stop", (
        "a named tool_choice finishes with 'stop' (upstream's rule)"
    )


def test_reasoning_split(client):
    force = {"structured_outputs": {"regex": "<think>(two and two|four|sums)</think>(ok|fine)"}}
    msgs = [{"role": "user", "content": "think"}]
    r = client.chat.completions.create(
        model="mini-toy", messages=msgs, max_tokens=60, temperature=0, extra_body=force
    )
    m = r.choices[0].message
    assert m.content in ("ok", "fine") and m.reasoning and "<think>" not in m.reasoning
    s = client.chat.completions.create(
        model="mini-toy", messages=msgs, max_tokens=60, temperature=0, stream=True, extra_body=force
    )
    chunks = [c.choices[0].delta for c in s if c.choices]
    assert "".join(getattr(d, "reasoning", None) or "" for d in chunks) == m.reasoning
    assert "".join(d.content or "" for d in chunks) == m.content


@pytest.mark.parametrize(
    ("path", "body", "status", "param"),
    [
        ("/v1/completions", {"prompt": "hi", "temperature": "hot"}, 400, "temperature"),
        ("/v1/completions", {"prompt": "hi", "max_tokens": -1}, 400, "max_tokens"),
        ("/v1/completions", {"prompt": "hi", "max_tokens": 10**6}, 400, "max_tokens"),
        ("/v1/completions", {"prompt": "x" * 2000}, 400, "input_tokens"),
        ("/v1/completions", {"prompt": [1, 999]}, 400, "prompt"),
        ("/v1/completions", {"prompt": ""}, 400, "prompt"),
        ("/v1/completions", {"prompt": "hi", "model": "gpt-9"}, 404, "model"),
        ("/v1/chat/completions", {"messages": []}, 400, "messages"),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "x"}], "tool_choice": "required"},
            400,
            "tool_choice",
        ),
        ("/v1/completions", {"prompt": "hi", "structured_outputs": {"regex": "(a"}}, 400, None),
    ],
)
def test_errors_are_openai_shaped_4xx(server, path, body, status, param):
    code, err = _post(server, path, body)
    assert code == status, f"{body} -> {code} {err}"
    assert set(err["error"]) == {"message", "type", "param", "code"} and err["error"]["code"] == status
    if param:
        assert err["error"]["param"] == param
    assert _post(server, "/v1/completions", {"prompt": "ok", "max_tokens": 2})[0] == 200, (
        "server must still serve"
    )


def test_malformed_json_is_400(server):
    code, err = _post(server, "/v1/completions", b"{not json")
    assert code == 400 and err["error"]["code"] == 400


def test_openai_client_raises_bad_request(client):
    with pytest.raises(openai.BadRequestError, match="maximum context length"):
        client.completions.create(model="mini-toy", prompt="hi", max_tokens=10**6)
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="nope", prompt="hi", max_tokens=2)


def test_concurrent_streams_all_finish_and_blocks_return(server):
    start = server.num_free_blocks()
    aclient = openai.AsyncOpenAI(base_url=server.base_url + "/v1", api_key="-", timeout=30, max_retries=0)

    async def one(i):
        s = await aclient.completions.create(
            model="mini-toy",
            prompt=f"client {i}",
            max_tokens=12,
            stream=True,
            seed=i,
            extra_body={"ignore_eos": True},
        )
        texts = [c async for c in s]
        return texts[-1].choices[0].finish_reason

    async def main():
        try:
            return await asyncio.gather(*(one(i) for i in range(64)))
        finally:
            await aclient.close()

    assert asyncio.run(main()) == ["length"] * 64
    assert server.wait_idle() and server.num_free_blocks() == start


def test_disconnect_mid_stream_aborts_and_frees_blocks(server):
    start = server.num_free_blocks()
    for _ in range(3):
        steps = server.engine.num_steps
        body = json.dumps({"prompt": "long", "max_tokens": 1000, "stream": True, "ignore_eos": True}).encode()
        sock = socket.create_connection(("127.0.0.1", server.port), timeout=10)
        sock.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        got = b""
        while got.count(b"data: ") < 3:
            got += sock.recv(4096)
        assert server.engine.has_unfinished_requests(), "the request should still be running"
        sock.close()
        assert server.wait_idle(), "the engine still holds the disconnected request"
        assert server.num_free_blocks() == start, "a disconnected request's KV blocks were not freed"
        ran = server.engine.num_steps - steps
        assert ran < 1000, f"the request ran {ran} steps after the hang-up: it was not aborted, it ran to max_tokens"


def test_api_key_guards_v1_only():
    s = LiveServer(api_key="sekret", num_gpu_blocks=16)
    try:
        code, err = _post(s, "/v1/completions", {"prompt": "hi", "max_tokens": 2})
        assert code == 401 and err["error"]["code"] == 401
        assert (
            _post(s, "/v1/completions", {"prompt": "hi", "max_tokens": 2}, {"Authorization": "Bearer wrong"})[
                0
            ]
            == 401
        )
        assert (
            _post(
                s, "/v1/completions", {"prompt": "hi", "max_tokens": 2}, {"Authorization": "Bearer sekret"}
            )[0]
            == 200
        )
        assert urllib.request.urlopen(s.base_url + "/health", timeout=5).status == 200
    finally:
        s.stop()


def test_cli_serve_binds_loopback(tmp_path):
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    proc = subprocess.Popen(
        [sys.executable, "-m", "mini_vllm", "serve", "--port", str(port), "--num-gpu-blocks", "32"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                body = urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=1).read()
                break
            except OSError:
                assert proc.poll() is None and time.monotonic() < deadline, (
                    "`python -m mini_vllm serve` did not come up"
                )
                time.sleep(0.05)
        assert json.loads(body)["data"][0]["id"] == "mini-toy"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_random_bodies_never_500(server):
    hyp = pytest.importorskip("hypothesis")
    st = pytest.importorskip("hypothesis.strategies")
    scalars = st.one_of(
        st.none(), st.booleans(), st.integers(-5, 10**7), st.floats(allow_nan=True), st.text(max_size=8)
    )
    value = st.one_of(
        scalars,
        st.lists(st.integers(-3, 300), max_size=4),
        st.dictionaries(st.text(max_size=5), scalars, max_size=3),
    )
    keys = st.sampled_from(
        [
            "prompt",
            "messages",
            "max_tokens",
            "temperature",
            "top_p",
            "n",
            "seed",
            "stop",
            "stream",
            "model",
            "tools",
            "tool_choice",
            "response_format",
            "structured_outputs",
            "top_k",
        ]
    )
    messages = st.lists(
        st.fixed_dictionaries({"role": st.sampled_from(["user", "robot"]), "content": st.text(max_size=6)}),
        max_size=2,
    )

    @hyp.settings(max_examples=25, deadline=None, derandomize=True)
    @hyp.given(
        path=st.sampled_from(["/v1/completions", "/v1/chat/completions"]),
        body=st.dictionaries(keys, value, max_size=5),
        msgs=messages,
    )
    def check(path, body, msgs):
        if path.endswith("chat/completions") and "messages" not in body:
            body["messages"] = msgs
        body.setdefault("max_tokens", 8)
        if isinstance(body.get("max_tokens"), int) and body["max_tokens"] > 8:
            body["max_tokens"] = 8  # keep runs short; the oversized case has its own test
        body["stream"] = False
        code, err = _post(server, path, body)
        assert code < 500, f"{path} {body} -> {code} {err}"
        if code >= 400:
            assert set(err["error"]) == {"message", "type", "param", "code"}

    check()
    assert _post(server, "/v1/completions", {"prompt": "ok", "max_tokens": 2})[0] == 200
    assert server.wait_idle()
