"""mini_vllm.entrypoints.serving: request -> SamplingParams rules, through a live server (more in test_server.py)."""

import json
import urllib.request

import pytest

openai = pytest.importorskip("openai")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

from mini_vllm.testing.live_server import LiveServer  # noqa: E402


@pytest.fixture(scope="module")
def server():
    s = LiveServer(num_gpu_blocks=64, block_size=16)
    yield s
    s.stop()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key="-", timeout=10, max_retries=0)


def test_max_tokens_that_exactly_fill_the_context_are_served_one_more_is_refused(server, client):
    with urllib.request.urlopen(server.base_url + "/v1/models", timeout=10) as r:
        max_len = json.loads(r.read())["data"][0]["max_model_len"]
    kw = dict(model="mini-toy", prompt=[72] * (max_len - 4), temperature=0, extra_body={"ignore_eos": True})
    try:
        out = client.completions.create(max_tokens=4, **kw)
    except openai.BadRequestError as e:
        pytest.fail(
            f"prompt {max_len - 4} + max_tokens 4 = max_model_len {max_len} fits exactly, but it was refused: {e}; "
            "refuse only max_tokens > max_model_len - prompt_len"
        )
    assert out.usage.completion_tokens == 4 and out.choices[0].finish_reason == "length"
    with pytest.raises(openai.BadRequestError, match="maximum context length"):
        client.completions.create(max_tokens=5, **kw)


def test_seed_zero_makes_the_n_choices_reproducible(client):
    kw = dict(model="mini-toy", prompt="zero", max_tokens=8, temperature=1.0, seed=0, n=2)
    a, b = client.completions.create(**kw), client.completions.create(**kw)
    got = [[c.text for c in r.choices] for r in (a, b)]
    assert got[0] == got[1], (
        f"seed=0 gave {got[0]} then {got[1]}: 0 is a seed like any other (test 'seed is None', not its truth value)"
    )
    assert got[0][0] != got[0][1], "choice i samples with seed + i: the two choices must differ"


def test_a_forced_schema_writes_json_numbers_only():
    # The flat-schema regex is what the grammar lets the model write: every match must be JSON, so an
    # integer or number property takes no leading zero ("01" and "-00" are not JSON).
    import re

    from mini_vllm.entrypoints.serving import schema_regex

    schema = {"type": "object", "properties": {"n": {"type": "integer"}, "x": {"type": "number"}}}
    rx = schema_regex(schema, "response_format")
    for good in ('{"n": 0, "x": -7}', '{"n": 10, "x": 0}', '{"n": -305, "x": 9}'):
        assert re.fullmatch(rx, good) and json.loads(good), f"{good!r} is valid JSON for the schema: allow it"
    for bad in ('{"n": 01, "x": 1}', '{"n": 1, "x": -00}', '{"n": 007, "x": 0}'):
        assert not re.fullmatch(rx, bad), (
            f"the forced-schema regex {rx!r} lets the model write {bad!r}, which json.loads refuses: "
            "an integer is -?(0|[1-9][0-9]*)"
        )
