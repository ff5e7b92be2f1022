import json

import numpy as np
import pytest

from course.runtime import lab_module

lab = lab_module(__file__)  # solution.py by default; LAB_IMPL=starter grades starter.py


def call(name, **args):
    return '<tool_call>{"name": "%s", "arguments": %s}</tool_call>' % (name, json.dumps(args, ensure_ascii=False))


TEXTS = [
    "Sure. " + call("get_weather", city="Paris"),
    call("a") + "\n" + call("b", k=1) + " done",
    "no calls here, only <today> and a < b",
    "x<tool_" + call("search", q="<b>paged</b> 𝄞") + "<to",
    call("f", s="</tool") + call("g", t="天气"),
]


def stream(text, cuts):
    p, events = lab.StreamingToolParser(), []
    for a, b in zip([0, *cuts], [*cuts, len(text)]):
        events += p.feed(text[a:b])
    return events + p.finish()


def test_trailing_tag_prefix():
    cases = [("Sure. <tool", 5), ("x<", 1), ("<tool_call", 10), ("abc", 0), ("<tool_call>", 0), ("", 0), ("a<t<to", 3)]
    for text, want in cases:
        got = lab.trailing_tag_prefix(text, "<tool_call>")
        assert got == want, f"trailing_tag_prefix({text!r}) should be {want}, got {got} (a proper prefix of the tag, longest first)"


def test_batch_parse():
    content, calls = lab.parse_tool_calls(TEXTS[0])
    assert content == "Sure. ", f"the text before the call is content, got {content!r}"
    assert calls == [{"name": "get_weather", "arguments": {"city": "Paris"}}], f"got {calls}"
    assert lab.parse_tool_calls(TEXTS[2]) == (TEXTS[2], []), "text without calls comes back whole"


def test_multiple_calls_in_order():
    content, calls = lab.parse_tool_calls(TEXTS[1])
    assert [c["name"] for c in calls] == ["a", "b"], f"every call, in order, got {[c['name'] for c in calls]}"
    assert content == "\n done", f"text between and after calls is content too, got {content!r}"


def test_malformed_json_is_loud():
    for bad in ['<tool_call>{"name": "f", "arguments": </tool_call>', "<tool_call>hello</tool_call>",
                '<tool_call>{"name": 3, "arguments": {}}</tool_call>', '<tool_call>{"name": "f"}</tool_call>']:
        with pytest.raises(ValueError):
            lab.parse_tool_calls(bad)
        with pytest.raises(ValueError):
            stream(bad, [])


def test_streaming_equals_batch_for_any_chunking():
    rng = np.random.default_rng(0)
    for text in TEXTS:
        want = lab.parse_tool_calls(text)
        for trial in range(50):
            k = int(rng.integers(0, min(12, len(text))))
            cuts = sorted(set(rng.integers(1, len(text), size=k).tolist())) if trial else list(range(1, len(text)))
            got = lab.collect(stream(text, cuts))
            assert got == want, f"chunks cut at {cuts} of {text!r}: stream gave {got}, batch {want}"


def test_tag_split_across_chunks_is_not_leaked():
    p = lab.StreamingToolParser()
    assert p.feed("Sure. <tool") == [("content", "Sure. ")], "emit 'Sure. ' now, hold '<tool' (it may be a tag)"
    assert p.feed("_call>{") == [], "inside a call nothing is emitted"
    p2 = lab.StreamingToolParser()
    assert p2.feed("a<") == [("content", "a")] and p2.feed("t") == [] and p2.feed("o") == []


def test_false_alarm_prefix_is_released():
    p = lab.StreamingToolParser()
    assert p.feed("<to") == []
    assert p.feed("day>") == [("content", "<today>")], "held text that turns out not to be a tag is emitted intact"
    p = lab.StreamingToolParser()
    assert p.feed("end <tool_") == [("content", "end ")]
    assert p.finish() == [("content", "<tool_")], "at the end, held text is content (never swallowed)"


def test_unterminated_block_fails_at_finish():
    p = lab.StreamingToolParser()
    p.feed('ok <tool_call>{"name": "f", "arguments": {}}')
    with pytest.raises(ValueError):
        p.finish()
    with pytest.raises(ValueError):
        lab.parse_tool_calls('<tool_call>{"name": "f", "arguments": {}}')


def test_close_tag_inside_a_string_is_a_known_limit():
    # The convention has no escaping: a body containing "</tool_call>" ends the call early. Both
    # paths must fail the same way (loudly), never disagree.
    text = '<tool_call>{"name": "f", "arguments": {"s": "</tool_call>"}}</tool_call>'
    with pytest.raises(ValueError):
        lab.parse_tool_calls(text)
    with pytest.raises(ValueError):
        stream(text, [5, 20])


def test_equals_minis_parser():
    from mini_vllm.entrypoints.tool_parsers import StreamingToolParser, parse_tool_calls

    rng = np.random.default_rng(1)
    for text in TEXTS:
        assert lab.parse_tool_calls(text) == parse_tool_calls(text)
        for _ in range(20):
            cuts = sorted(set(rng.integers(1, len(text), size=int(rng.integers(0, 8))).tolist()))
            mini, events = StreamingToolParser(), []
            for a, b in zip([0, *cuts], [*cuts, len(text)]):
                events += mini.feed(text[a:b])
            events += mini.finish()
            assert stream(text, cuts) == events, f"event by event, yours must equal mini's (cuts {cuts})"


@pytest.mark.upstream
def test_equals_vllms_hermes_parser():
    rp = pytest.importorskip("mini_vllm.testing.real_parsers")
    rng = np.random.default_rng(2)
    for text in [TEXTS[0], "Let me check 𝄞 " + call("a") + call("b", k=[1, 2]), call("w", city="東京")]:
        content, calls = lab.parse_tool_calls(text)
        v_content, v_calls = rp.hermes_batch(text)
        assert (content or None) == v_content
        assert [(c["name"], json.dumps(c["arguments"], ensure_ascii=False)) for c in calls] == v_calls
        ids = rp.encode(text)
        for _ in range(8):
            chunks = rp.random_chunking(ids, rng)
            p, events = lab.StreamingToolParser(), []
            for d in rp.text_deltas(chunks):
                events += p.feed(d)
            vs_content, vs_calls = rp.hermes_stream(chunks)
            got = lab.collect(events)
            assert got[0] == vs_content, f"content streamed by vLLM {vs_content!r}, yours {got[0]!r}"
            assert [(c["name"], c["arguments"]) for c in got[1]] == [(n, json.loads(a)) for n, a in vs_calls]
