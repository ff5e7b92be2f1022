"""Differential tests: mini's detokenizer and parsers against vLLM 0.22.1's own classes.

The same token streams (the tiny model's byte-level BPE, emoji and CJK included) go through
``FastIncrementalDetokenizer``, the hermes tool parser and the deepseek_r1 reasoning parser, and
through ``mini_vllm.entrypoints``, over seeded random chunkings. Where the two differ on purpose
(see the modules' docstrings) a test pins the difference, so it stays a decision.
"""

import json

import numpy as np
import pytest

from mini_vllm.entrypoints.detokenizer import IncrementalDetokenizer, hf_token_bytes
from mini_vllm.entrypoints.reasoning import StreamingReasoningParser, extract_reasoning
from mini_vllm.entrypoints.tool_parsers import StreamingToolParser, parse_tool_calls, tool_call_to_openai

pytestmark = pytest.mark.upstream

rp = pytest.importorskip("mini_vllm.testing.real_parsers")

CONTENT = ["", "Sure. ", "Let me check 🚀 ", "天气 ", "a < b, ", "<to", "x<tool"]
CALLS = [
    {"name": "get_weather", "arguments": {"city": "Paris"}},
    {"name": "get_weather", "arguments": {"city": "東京", "unit": "°C"}},
    {"name": "search", "arguments": {"q": "<b>paged</b> 🚀", "k": 3}},
    {"name": "noop", "arguments": {}},
]


def _hermes_text(rng):
    calls = [CALLS[i] for i in rng.choice(len(CALLS), size=int(rng.integers(0, 3)))]
    sep = ["", " ", "\n"][int(rng.integers(0, 3))]
    body = "".join(f"<tool_call>{sep}{json.dumps(c, ensure_ascii=False)}{sep}</tool_call>" for c in calls)
    return CONTENT[int(rng.integers(len(CONTENT)))] + body, calls


def _mini_stream_tools(deltas, finish=True):
    p, events = StreamingToolParser(), []
    for d in deltas:
        events += p.feed(d)
    if finish:
        events += p.finish()
    content = "".join(v for k, v in events if k == "content")
    return content, [v for k, v in events if k == "tool_call"]


def test_hermes_batch_and_stream_equal_vllms_over_random_chunkings():
    rng = np.random.default_rng(16)
    for _ in range(30):
        text, calls = _hermes_text(rng)
        v_content, v_calls = rp.hermes_batch(text)
        m_content, m_calls = parse_tool_calls(text)
        if calls:  # upstream: content None when empty, text before the first call otherwise
            assert (m_content or None) == v_content, f"content differs on {text!r}"
        else:
            assert m_content == v_content == text
        m_openai = [tool_call_to_openai(c, "id")["function"] for c in m_calls]
        assert [(f["name"], f["arguments"]) for f in m_openai] == v_calls, f"batch calls differ on {text!r}"
        ids = rp.encode(text)
        for _ in range(5):
            chunks = rp.random_chunking(ids, rng)
            deltas = rp.text_deltas(chunks)
            vs_content, vs_calls = rp.hermes_stream(chunks)
            # before the end of the stream (upstream has no finish step: see the next test)
            ms_content, ms_calls = _mini_stream_tools(deltas, finish=False)
            assert ms_content == vs_content, f"streamed content differs for chunks {deltas!r}"
            assert [(c["name"], c["arguments"]) for c in ms_calls] == [
                (n, json.loads(a)) for n, a in vs_calls
            ]
            assert _mini_stream_tools(deltas) == parse_tool_calls(text), "mini: streaming != batch"


def test_hermes_differences_are_decisions():
    text = 'A<tool_call>{"name": "f", "arguments": {}}</tool_call> and after'
    assert rp.hermes_batch(text)[0] == "A"  # upstream drops text after a call
    assert parse_tool_calls(text)[0] == "A and after"  # mini keeps it as content
    bad = 'A<tool_call>{"name": "f", "arguments": </tool_call>'
    assert rp.hermes_batch(bad) == (bad, [])  # upstream: raw text back, error only in its log
    with pytest.raises(ValueError, match="not JSON"):
        parse_tool_calls(bad)
    # a stream that ends on a tag prefix: upstream holds "<to" back forever, mini's finish() releases it
    held = [[t] for t in rp.encode("x<to")]
    assert rp.hermes_stream(held)[0] == "x"
    assert _mini_stream_tools(rp.text_deltas(held)) == ("x<to", [])
    compact = '<tool_call>{"name":"f","arguments":{"x":1}}</tool_call>'
    # streamed arguments are the model's raw text; the batch path re-serializes them
    assert rp.hermes_stream([[t] for t in rp.encode(compact)])[1] == [("f", '{"x":1}')]
    assert rp.hermes_batch(compact)[1] == [("f", '{"x": 1}')]


R1_TEXTS = [
    "<think>2+2 is 4</think>The answer is 4.",
    "2+2 is 4</think>The answer is 4.",
    "<think>天气 🚀 好</think>",
    "<think>still thinking 🚀",
    "no tags at all <thi",
    "<think>a < b </thin</think>ok</think>",
]


def test_r1_batch_equals_vllms():
    for text in R1_TEXTS:
        assert extract_reasoning(text) == rp.r1_batch(text), f"batch split differs on {text!r}"


def test_r1_stream_token_by_token_equals_vllms():
    for text in R1_TEXTS[:-1]:  # the last one: see the next test
        ids = rp.encode(text)
        chunks = rp.random_chunking(ids, np.random.default_rng(0), max_tokens=1)
        p, r, c = StreamingReasoningParser(), "", ""
        for d in rp.text_deltas(chunks):
            dr, dc = p.feed(d)
            r, c = r + dr, c + dc
        dr, dc = p.finish()
        r, c = r + dr, c + dc
        assert (r, c) == rp.r1_stream(chunks), f"token-by-token split differs on {text!r}"
        batch = extract_reasoning(text)
        assert (r or None, c or None) == batch, "mini: streaming != batch"


def test_r1_multi_token_deltas_leak_the_tag_upstream():
    # a delta holding <think> plus more text (speculative decoding, a slow client) is reasoning
    # verbatim upstream, tag included; mini strips it for any chunking
    ids = rp.encode("<think>abc</think>ok")
    chunks = [ids[:2], ids[2:]]
    assert rp.r1_stream(chunks)[0].startswith("<think>")
    assert extract_reasoning("<think>abc</think>ok") == ("abc", "ok")
    # a second </think> is content in upstream's batch path but silently skipped by its stream
    # (a lone tag token is never forwarded); mini's stream and batch both keep it
    text = R1_TEXTS[-1]
    one_by_one = [[t] for t in rp.encode(text)]
    assert rp.r1_batch(text)[1] == "ok</think>" and rp.r1_stream(one_by_one)[1] == "ok"
    assert extract_reasoning(text)[1] == "ok</think>"


DETOK_TEXT = "Paris 🚀 ok. naïve café — 你好 🚀🇫🇷 stop here, then more 東京"


@pytest.mark.parametrize("stop", [[], ["ok"], ["🇫🇷"], ["stop here", "東"], ["never"]])
def test_detokenizer_equals_fast_incremental_detokenizer(stop):
    tok = rp.tokenizer()
    token_bytes = hf_token_bytes(tok, skip_special_tokens=True)
    prompt = rp.encode("Hello")
    ids = rp.encode(DETOK_TEXT)
    rng = np.random.default_rng(len(stop))
    for trial in range(8):
        # byte-sized chunks at random cuts: trial 0 feeds one token at a time
        chunks = [[t] for t in ids] if trial == 0 else rp.random_chunking(ids, rng)
        v_deltas, v_stop, v_text = rp.detok_stream(rp.fast_detokenizer(prompt, stop), chunks)
        mine = IncrementalDetokenizer(token_bytes, stop=stop)
        m_deltas, m_stop = [], None
        for chunk in chunks:
            m_stop = mine.update(chunk)
            m_deltas.append(mine.get_next_output_text(m_stop is not None, delta=True))
            if m_stop is not None:
                break
        assert m_stop == v_stop, f"stop string: mini {m_stop!r}, vLLM {v_stop!r}"
        assert mine.get_next_output_text(True, delta=False) == v_text
        assert m_deltas == v_deltas, f"deltas differ (trial {trial}): {m_deltas!r} vs {v_deltas!r}"
        assert "\ufffd" not in "".join(m_deltas)


def test_detokenizer_emoji_held_until_complete_like_vllm():
    ids = rp.encode("🚀")
    chunks = [[t] for t in ids]
    v_deltas = rp.detok_stream(rp.fast_detokenizer(rp.encode("x")), chunks)[0]
    mine = IncrementalDetokenizer(hf_token_bytes(rp.tokenizer()))
    m_deltas = [(mine.update(c), mine.get_next_output_text(False, True))[1] for c in chunks]
    assert len(ids) == 4 and m_deltas == v_deltas == ["", "", "", "🚀"]
