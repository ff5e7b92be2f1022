"""One contract, two servers: mini's OpenAI server and the real vLLM's, same checkpoint, same requests.

The ``mini`` target runs in every test run (mini's server on a tiny Llama built here). The ``vllm``
target is tier 2 (``engine`` marker): the real ``vllm.entrypoints.openai.api_server`` (what
``vllm serve`` runs) in the engine venv on ``build/tiny-llama``, float32, ``--block-size 16``,
``max_model_len`` 512, with the hermes tool parser. Both serve the model as ``tiny-llama``.

What both must agree on: the greedy text of mini's ``LLMEngine`` on the same checkpoint (mini is
token-identical to vLLM's CPU engine: ``course/runtime/test_engine.py``; one documented difference:
a text that ends inside a UTF-8 character shows U+FFFD for the cut bytes in mini and nothing in
vLLM, whose ``DecodeStream`` never emits them), usage counts from the
checkpoint's tokenizer and chat template, streamed deltas that add up to the whole text, a forced
tool call, and the OpenAI error shape and status of each bad request, with the server still
serving after it. Every request is small; every client call has a timeout.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest

openai = pytest.importorskip("openai")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
pytest.importorskip("transformers")

NAME = "tiny-llama"
MAX_MODEL_LEN = 512
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "enum": ["Paris", "Tokyo"]}},
            "required": ["city"],
        },
    },
}


class Target:
    def __init__(self, kind: str, base_url: str, checkpoint: str, stop) -> None:
        self.kind, self.base_url, self.checkpoint, self.stop = kind, base_url, checkpoint, stop
        self.client = openai.OpenAI(base_url=base_url + "/v1", api_key="-", timeout=60, max_retries=0)

    def expect(self, text: str) -> str:
        """The text this server shows for mini's engine text (see the module docstring)."""
        return text.rstrip("\ufffd") if self.kind == "vllm" else text

    def post(self, path: str, body: dict | bytes) -> tuple[int, dict]:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        req = urllib.request.Request(
            self.base_url + path, data=data, headers={"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read())


@pytest.fixture(scope="module", params=["mini", pytest.param("vllm", marks=pytest.mark.engine)])
def target(request, tmp_path_factory):
    if request.param == "mini":
        from course.runtime import tiny_model
        from mini_vllm.testing.live_server import LiveServer

        checkpoint = str(tiny_model.build(tmp_path_factory.mktemp("tiny-llama")))
        server = LiveServer(
            checkpoint=checkpoint,
            served_model_name=NAME,
            num_gpu_blocks=64,
            block_size=16,
            max_model_len=MAX_MODEL_LEN,
        )
        t = Target("mini", server.base_url, checkpoint, server.stop)
    else:
        from course.runtime import engine

        server = engine.RealServer(
            "--enable-auto-tool-choice", "--tool-call-parser", "hermes", served_model_name=NAME
        )
        t = Target("vllm", server.base_url, str(engine.model_path()), server.stop)
    yield t
    t.stop()


@pytest.fixture(scope="module")
def reference(target):
    """mini's engine on the target's checkpoint: greedy text and the tokenizer, in this process."""
    from mini_vllm import LLMEngine, SamplingParams

    llm = LLMEngine(model=target.checkpoint, num_gpu_blocks=64, block_size=16)

    def greedy(prompt, max_tokens: int, ignore_eos: bool = True) -> str:
        (out,) = llm.generate(
            [prompt], SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=ignore_eos)
        )
        return out.text

    return llm.tokenizer, greedy


def test_models_lists_the_served_name(target):
    assert [m.id for m in target.client.models.list().data] == [NAME]
    assert urllib.request.urlopen(target.base_url + "/health", timeout=10).status == 200


def test_completion_text_and_usage_equal_the_engine(target, reference):
    tokenizer, greedy = reference
    for prompt in ("Hello world", "The scheduler picks"):
        r = target.client.completions.create(
            model=NAME, prompt=prompt, max_tokens=8, temperature=0, extra_body={"ignore_eos": True}
        )
        assert r.choices[0].text == target.expect(greedy(prompt, 8)), f"{target.kind}: greedy text for {prompt!r}"
        assert r.choices[0].finish_reason == "length"
        n = len(tokenizer.encode(prompt))
        assert (r.usage.prompt_tokens, r.usage.completion_tokens, r.usage.total_tokens) == (n, 8, n + 8), (
            f"{target.kind}: usage must count the checkpoint tokenizer's tokens (no BOS added: it has no post-processor)"
        )
    ids = [10, 11, 12, 300]
    r = target.client.completions.create(
        model=NAME, prompt=ids, max_tokens=6, temperature=0, extra_body={"ignore_eos": True}
    )
    assert r.choices[0].text == target.expect(greedy(ids, 6)) and r.usage.prompt_tokens == 4, "token-id prompt"


def test_streamed_deltas_add_up_to_the_whole_text(target):
    kw = dict(
        model=NAME, prompt="Paged attention", max_tokens=12, temperature=0, extra_body={"ignore_eos": True}
    )
    whole = target.client.completions.create(**kw).choices[0].text
    chunks = list(target.client.completions.create(stream=True, stream_options={"include_usage": True}, **kw))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == whole
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 12, "the usage chunk comes last"
    msgs = [{"role": "user", "content": "hi"}]
    chat = target.client.chat.completions.create(model=NAME, messages=msgs, max_tokens=10, temperature=0)
    streamed = list(
        target.client.chat.completions.create(
            model=NAME, messages=msgs, max_tokens=10, temperature=0, stream=True
        )
    )
    assert streamed[0].choices[0].delta.role == "assistant"
    assert (
        "".join(c.choices[0].delta.content or "" for c in streamed if c.choices)
        == chat.choices[0].message.content
    )
    assert streamed[-1].choices[0].finish_reason == chat.choices[0].finish_reason


def test_chat_renders_the_checkpoints_template(target, reference):
    tokenizer, greedy = reference
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is a block table?"}]
    r = target.client.chat.completions.create(
        model=NAME, messages=msgs, max_tokens=9, temperature=0, extra_body={"ignore_eos": True}
    )
    prompt = tokenizer.apply_chat_template(msgs, add_generation_prompt=True)
    assert r.usage.prompt_tokens == len(tokenizer.encode(prompt)), (
        f"{target.kind}: the chat template's token count"
    )
    assert r.choices[0].message.content == target.expect(greedy(prompt, 9)), f"{target.kind}: greedy chat text"
    assert r.choices[0].message.role == "assistant" and r.choices[0].finish_reason == "length"


@pytest.mark.parametrize(
    "tool_choice", ["required", {"type": "function", "function": {"name": "get_weather"}}]
)
def test_a_forced_tool_call(target, tool_choice):
    """``required`` lets the model write one or more calls (upstream: a JSON array of them; room for
    whitespace too, so it gets 200 tokens), a named choice exactly one."""
    msgs = [{"role": "user", "content": "Weather in Paris?"}]
    r = target.client.chat.completions.create(
        model=NAME, messages=msgs, tools=[WEATHER], tool_choice=tool_choice, max_tokens=200, temperature=0
    )
    calls = r.choices[0].message.tool_calls
    assert calls, f"{target.kind}: no tool call in {r.choices[0].message} ({r.choices[0].finish_reason})"
    if tool_choice != "required":
        assert len(calls) == 1, f"{target.kind}: a named tool_choice makes exactly one call, got {len(calls)}"
    for call in calls:
        assert call.function.name == "get_weather" and call.id and call.type == "function"
        assert json.loads(call.function.arguments)["city"] in ("Paris", "Tokyo"), call.function.arguments
    want = "tool_calls" if tool_choice == "required" else "stop"
    assert r.choices[0].finish_reason == want, (
        f"{target.kind}: tool_choice={tool_choice!r} finishes with {want!r} (upstream's rule), "
        f"got {r.choices[0].finish_reason!r}"
    )


ERRORS = [
    ("/v1/completions", {"prompt": "hi", "max_tokens": 10**6}, 400),
    ("/v1/completions", {"prompt": "hi", "max_tokens": -1}, 400),
    ("/v1/completions", {"prompt": "hi", "temperature": "hot"}, 400),
    ("/v1/completions", {"prompt": [5] * 600, "max_tokens": 4}, 400),
    ("/v1/completions", {"prompt": "hi", "model": "gpt-9"}, 404),
    ("/v1/chat/completions", {"messages": []}, 400),
    ("/v1/completions", b'{"model": bad json', 400),
]


@pytest.mark.parametrize(("path", "body", "status"), ERRORS, ids=[f"{i}" for i in range(len(ERRORS))])
def test_bad_requests_get_the_openai_error_shape(target, path, body, status):
    if isinstance(body, dict):
        body = {"model": NAME, **body}
    code, err = target.post(path, body)
    assert code == status, f"{target.kind}: {body!r} -> {code} {err}"
    assert set(err) == {"error"} and {"message", "type", "param", "code"} <= set(err["error"]), err
    assert err["error"]["code"] == status and err["error"]["message"], err
    assert target.post("/v1/completions", {"model": NAME, "prompt": "ok", "max_tokens": 2})[0] == 200, (
        f"{target.kind}: the server must still serve after {body!r}"
    )


def test_the_official_client_raises_by_status(target):
    # A fresh client per call: after this 400 the real server's connection is not reused cleanly
    # (the next request on it was reset), and max_retries=0 would turn that into a failure here.
    def fresh():
        return openai.OpenAI(base_url=target.base_url + "/v1", api_key="-", timeout=60, max_retries=0)

    with pytest.raises(openai.BadRequestError, match="maximum context length"):
        fresh().completions.create(model=NAME, prompt=[5] * 600, max_tokens=4)
    with pytest.raises(openai.NotFoundError):
        fresh().completions.create(model="nope", prompt="hi", max_tokens=2)


# --- reasoning: a scripted checkpoint, the deepseek_r1 parser on both servers -----------------------
# The tiny tokenizer's <think> and </think> are added tokens that are not special (as in Qwen3's and
# DeepSeek-R1's tokenizers), so the text keeps them and the parser splits both the whole text and a
# stream. A scripted model (course.runtime.tiny_model.build(script=...)) makes the random-weight
# Llama write exactly: <think> REASON </think> ANSWER <eos>.
REASON, ANSWER = "Paged", "Through"  # one token each in the tiny BPE


@pytest.fixture(scope="module", params=["mini", pytest.param("vllm", marks=pytest.mark.engine)])
def thinker(request, tmp_path_factory):
    from course.runtime import tiny_model
    from mini_vllm.tokenizer import HFTokenizer

    folder = tmp_path_factory.mktemp("thinker")
    tiny_model.write_tokenizer(folder)
    tok = HFTokenizer(folder, tiny_model.VOCAB_SIZE, tiny_model.CONFIG["eos_token_id"])
    last = tok.encode(tok.apply_chat_template([{"role": "user", "content": "think"}]))[-1]
    think, end = tok.encode("<think>"), tok.encode("</think>")
    reason, answer = tok.encode(REASON), tok.encode(ANSWER)
    assert len(think) == len(end) == len(reason) == len(answer) == 1, "each piece must be one token"
    order = [last, think[0], reason[0], end[0], answer[0], tiny_model.CONFIG["eos_token_id"]]
    assert len(set(order)) == len(order), f"the script's tokens must differ: {order}"
    checkpoint = str(tiny_model.build(folder, script=dict(zip(order, order[1:]))))
    if request.param == "mini":
        from mini_vllm.testing.live_server import LiveServer

        server = LiveServer(
            checkpoint=checkpoint, served_model_name=NAME, reasoning_parser="deepseek_r1", num_gpu_blocks=64, block_size=16
        )
        t = Target("mini", server.base_url, checkpoint, server.stop)
    else:
        from course.runtime import engine

        server = engine.RealServer("--reasoning-parser", "deepseek_r1", model=checkpoint, served_model_name=NAME)
        t = Target("vllm", server.base_url, checkpoint, server.stop)
    yield t
    t.stop()


def test_think_tags_are_text_and_the_reasoning_splits(thinker):
    msgs = [{"role": "user", "content": "think"}]
    raw = thinker.client.completions.create(
        model=NAME, prompt="<|user|>think\n<|assistant|>", max_tokens=10, temperature=0
    )
    assert raw.choices[0].text == f"<think>{REASON}</think>{ANSWER}" and raw.choices[0].finish_reason == "stop", (
        f"{thinker.kind}: the scripted model writes the tags as text (not special), then EOS; got {raw.choices[0].text!r}"
    )
    r = thinker.client.chat.completions.create(model=NAME, messages=msgs, max_tokens=10, temperature=0)
    m = r.choices[0].message
    assert (m.reasoning, m.content) == (REASON, ANSWER), f"{thinker.kind}: reasoning {m.reasoning!r}, content {m.content!r}"
    chunks = list(thinker.client.chat.completions.create(model=NAME, messages=msgs, max_tokens=10, temperature=0, stream=True))
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    assert "".join(getattr(d, "reasoning", None) or "" for d in deltas) == REASON, f"{thinker.kind}: streamed reasoning"
    assert "".join(d.content or "" for d in deltas) == ANSWER, f"{thinker.kind}: streamed content"
    assert chunks[-1].choices[0].finish_reason == "stop"
