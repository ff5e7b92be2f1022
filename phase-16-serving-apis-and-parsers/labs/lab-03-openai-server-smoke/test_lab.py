"""CPU path: the five smoke steps against mini's server on a free loopback port (run.py does them on a GPU)."""

import pytest

from course.runtime import lab_module

lab = lab_module(__file__)  # solution.py by default; LAB_IMPL=starter grades starter.py

openai = pytest.importorskip("openai")
pytest.importorskip("fastapi")


@pytest.fixture(scope="module")
def server():
    from mini_vllm.testing.live_server import LiveServer

    s = LiveServer(num_gpu_blocks=128, block_size=16)
    yield s
    s.stop()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key="-", timeout=30, max_retries=0)


def test_streamed_deltas_join_to_the_whole_text(client):
    deltas, whole = lab.stream_deltas(client, "mini-toy")
    assert deltas[0] == "", f"the first chunk is the role chunk (content ''), got {deltas[0]!r}: keep every chunk"
    assert deltas[-1] is None, f"the last chunk only carries finish_reason (content None), got {deltas[-1]!r}"
    assert len(deltas) >= 3, "one chunk per delta of text, between the role chunk and the finish chunk"
    joined = "".join(d or "" for d in deltas)
    assert joined == whole, f"greedy streamed deltas must add up to the non-streamed text: {joined!r} vs {whole!r}"


def test_forced_tool_call_arguments_are_a_json_string(client):
    out = lab.forced_tool_call(client, "mini-toy")
    assert out["name"] == "get_weather", out
    assert out["finish_reason"] == "stop", "a *named* tool_choice finishes with 'stop'; 'tool_calls' is for auto/required"
    assert out["arguments_type"] == "str", "OpenAI sends function.arguments as a JSON string; parse it yourself"
    assert out["arguments"] in ({"city": "Paris"}, {"city": "Tokyo"}), f"arguments should be parsed to a dict, got {out['arguments']!r}"


def test_oversized_max_tokens_is_a_400_that_never_reached_the_engine(server, client):
    steps = server.model.llm.num_steps
    out = lab.error_of(lambda: client.chat.completions.create(model="mini-toy", messages=lab.MESSAGES, max_tokens=10**7))
    assert out["status"] == 400 and out["exception"] == "BadRequestError", out
    assert set(out["error"]) == {"message", "type", "param", "code"}, f"the OpenAI error object, got {out['error']}"
    assert "maximum context length" in out["error"]["message"] and out["error"]["param"] == "max_tokens"
    assert server.model.llm.num_steps == steps, "validation answered: the engine never ran a step for it"


def test_wrong_model_is_a_404(client):
    out = lab.error_of(lambda: client.chat.completions.create(model="no-such-model", messages=lab.MESSAGES))
    assert out["status"] == 404 and out["exception"] == "NotFoundError", out
    assert "no-such-model" in out["error"]["message"]
    with pytest.raises(AssertionError):
        lab.error_of(lambda: None)


def test_disconnect_aborts_and_frees_blocks(server):
    free, steps = server.num_free_blocks(), server.engine.num_steps
    assert lab.abandon_stream(server.base_url, "mini-toy") == 3
    assert server.wait_idle(), "the engine still runs the abandoned request: disconnect must abort it"
    assert server.num_free_blocks() == free, "the abandoned request's KV blocks must return to the pool"
    assert server.engine.num_steps - steps < 2000, "it ran to max_tokens: the hang-up never became an abort"
