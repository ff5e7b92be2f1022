"""mini_vllm.entrypoints' text machinery: detokenizer, hermes tool parser, reasoning split."""

import numpy as np
import pytest

from mini_vllm.entrypoints.detokenizer import (
    IncrementalDetokenizer,
    byte_token_bytes,
    check_stop_strings,
    complete_prefix_len,
    utf8_expected_len,
)
from mini_vllm.entrypoints.reasoning import StreamingReasoningParser, extract_reasoning
from mini_vllm.entrypoints.tool_parsers import StreamingToolParser, parse_tool_calls, partial_tag_overlap
from mini_vllm.tokenizer import ByteTokenizer

TEXT = "naïve café — 你好 🚀🇫🇷 ok"
TOK = ByteTokenizer()


def _chunks(ids, rng):
    cuts = sorted(set(rng.integers(1, len(ids), size=int(rng.integers(0, 6))).tolist()))
    return [ids[a:b] for a, b in zip([0, *cuts], [*cuts, len(ids)])]


def test_utf8_lengths_and_prefix():
    assert [utf8_expected_len(b) for b in (0x41, 0xC3, 0xE4, 0xF0, 0x80, 0xFF)] == [1, 2, 3, 4, 1, 1]
    rocket = "🚀".encode()
    assert [complete_prefix_len(rocket[:k]) for k in range(5)] == [0, 0, 0, 0, 4]
    assert complete_prefix_len(b"a" + rocket[:2]) == 1


def test_every_byte_decoded_once_and_no_replacement_chars():
    ids = TOK.encode(TEXT) + [TOK.eos_token_id]
    d = IncrementalDetokenizer(byte_token_bytes())
    deltas = [(d.update([t]), d.get_next_output_text(False, True))[1] for t in ids]
    assert "".join(deltas) == TEXT and "\ufffd" not in "".join(deltas)
    assert d.num_decoded_bytes == len(TEXT.encode()), "each byte must be decoded exactly once (the O(n) path)"


def test_emoji_is_held_until_complete():
    d = IncrementalDetokenizer(byte_token_bytes())
    assert [(d.update([t]), d.get_next_output_text(False, True))[1] for t in "🚀".encode()] == [
        "",
        "",
        "",
        "🚀",
    ]


def test_cut_character_shows_replacement_at_finish():
    d = IncrementalDetokenizer(byte_token_bytes())
    d.update(list("a🚀".encode())[:3])
    assert d.get_next_output_text(False, True) == "a"
    d.finish()
    assert d.get_next_output_text(True, True) == "\ufffd"


@pytest.mark.parametrize("stop", [["ok"], ["🇫🇷"], ["—", "zz"], ["ca"]])
def test_stop_strings_any_chunking(stop):
    ids = TOK.encode(TEXT)
    want = TEXT[: min(TEXT.find(s) for s in stop if s in TEXT)]
    rng = np.random.default_rng(0)
    for _ in range(40):
        d = IncrementalDetokenizer(byte_token_bytes(), stop=stop)
        out, hit = "", None
        for c in _chunks(ids, rng):
            hit = d.update(c)
            out += d.get_next_output_text(hit is not None, True)
            assert not any(s in out for s in stop), "a stop string leaked into a delta"
            if hit:
                break
        assert hit in stop and out == want, f"stop {stop}: got {out!r}, want {want!r}"


def test_stop_hold_back_and_include():
    d = IncrementalDetokenizer(byte_token_bytes(), stop=["end"])
    d.update(TOK.encode("the en"))
    assert d.get_next_output_text(False, True) == "the "  # 2 chars held: could become "end"
    d2 = IncrementalDetokenizer(byte_token_bytes(), stop=["end"], include_stop_str_in_output=True)
    assert d2.update(TOK.encode("the end!")) == "end" and d2.output_text == "the end"
    assert check_stop_strings("abc", 0, ["a"], False) is None
    with pytest.raises(ValueError, match="already stopped"):
        d2.update([65])
    with pytest.raises(ValueError, match="non-empty"):
        IncrementalDetokenizer(byte_token_bytes(), stop=[""])


TOOL_TEXTS = [
    'Sure. <tool_call>{"name": "f", "arguments": {"x": "🚀<"}}</tool_call>',
    '<tool_call>{"name": "a", "arguments": {}}</tool_call>\n<tool_call>{"name": "b", "arguments": {"k": 1}}</tool_call> done <to',
    "no calls, only <today> and <tool",
]


def test_tool_parser_batch():
    content, calls = parse_tool_calls(TOOL_TEXTS[1])
    assert content == "\n done <to" and [c["name"] for c in calls] == ["a", "b"]
    assert parse_tool_calls(TOOL_TEXTS[2]) == (TOOL_TEXTS[2], [])
    for bad in [
        '<tool_call>{"name": 1, "arguments": {}}</tool_call>',
        "<tool_call>{}",
        "<tool_call>nope</tool_call>",
    ]:
        with pytest.raises(ValueError):
            parse_tool_calls(bad)


def test_tool_parser_streaming_equals_batch_any_chunking():
    rng = np.random.default_rng(1)
    for text in TOOL_TEXTS:
        for _ in range(50):
            p, events = StreamingToolParser(), []
            for c in _chunks(list(text), rng):
                events += p.feed("".join(c))
            events += p.finish()
            got = (
                "".join(v for k, v in events if k == "content"),
                [v for k, v in events if k == "tool_call"],
            )
            assert got == parse_tool_calls(text)


def test_tool_parser_holds_tag_prefix_and_fails_unterminated():
    p = StreamingToolParser()
    assert p.feed("Sure. <tool") == [("content", "Sure. ")]
    assert p.feed("day>") == [("content", "<toolday>")]
    assert partial_tag_overlap("x<tool_", "<tool_call>") == 6
    p = StreamingToolParser()
    p.feed("<tool_call>{")
    with pytest.raises(ValueError, match="ended inside"):
        p.finish()


R1 = [
    "<think>2+2 is 4</think>The answer is 4.",
    "2+2</think>4",
    "<think>open",
    "ab<think>c</think>",
    "<th",
    "x</thi",
]


def test_reasoning_streaming_equals_batch_any_chunking():
    rng = np.random.default_rng(2)
    assert extract_reasoning(R1[0]) == ("2+2 is 4", "The answer is 4.")
    assert extract_reasoning(R1[2]) == ("open", None)
    for text in R1:
        for _ in range(30):
            p, r, c = StreamingReasoningParser(), "", ""
            for ch in _chunks(list(text), rng):
                dr, dc = p.feed("".join(ch))
                assert "<think>" not in dr
                r, c = r + dr, c + dc
            dr, dc = p.finish()
            assert ((r + dr) or None, (c + dc) or None) == extract_reasoning(text), text
