import numpy as np
import pytest

from course.runtime import lab_module

lab = lab_module(__file__)  # solution.py by default; LAB_IMPL=starter grades starter.py

EOS = 256
MIXED = "naïve café — 你好 𝄞𝄢"


def _stream(text_or_ids, stop=()):
    ids = list(text_or_ids.encode()) if isinstance(text_or_ids, str) else list(text_or_ids)
    d = lab.StreamingDetokenizer(stop=stop)
    out = []
    for t in ids:
        out.append(d.feed(t))
        if d.stopped is not None:
            break
    return out, d


def test_utf8_expected_len_table():
    cases = {0x00: 1, 0x41: 1, 0x7F: 1, 0xC3: 2, 0xDF: 2, 0xE4: 3, 0xEF: 3, 0xF0: 4, 0xF4: 4, 0x80: 1, 0xBF: 1, 0xC0: 1, 0xFF: 1}
    for b, want in cases.items():
        got = lab.utf8_expected_len(b)
        assert got == want, f"utf8_expected_len(0x{b:02X}) should be {want}, got {got}"
    clef = "𝄞".encode()
    assert [lab.complete_prefix_len(clef[:k]) for k in range(5)] == [0, 0, 0, 0, 4], (
        "a prefix of 𝄞 is complete only when all 4 bytes are there")
    assert lab.complete_prefix_len(b"ab" + "你".encode()[:2]) == 2, "keep the 2 bytes of an unfinished 3-byte 你, emit 'ab'"


def test_ascii_streams_one_char_per_token():
    out, _ = _stream("hello, world")
    assert out == list("hello, world"), f"every ASCII byte is a whole character: emit it at once, got {out}"


def test_emoji_is_held_until_complete():
    out, _ = _stream("𝄞")
    assert out == ["", "", "", "𝄞"], f"𝄞 is 4 byte tokens: three '' then the clef, got {out}"


def test_never_emits_replacement_chars_for_valid_text():
    out, d = _stream(MIXED)
    joined = "".join(out) + d.flush()
    assert "\ufffd" not in joined, f"valid UTF-8 must never show U+FFFD, got {joined!r}"
    assert joined == MIXED, f"the deltas must add up to the text exactly (nothing swallowed), got {joined!r}"


def test_naive_approach_really_is_broken():
    assert lab.naive_decode(list("𝄞".encode())) == ["\ufffd"] * 4, "the control: per-token decode shows four garbage strings"


def test_flush_handles_truncated_sequence():
    out, d = _stream(list("ok𝄞".encode())[:4])
    assert out == ["o", "k", "", ""]
    tail = d.flush()
    assert tail == "\ufffd", f"a stream cut inside a character must show U+FFFD at flush (never hide the cut), got {tail!r}"
    assert d.flush() == "", "a second flush has nothing left to give"


def test_eos_is_ignored():
    d = lab.StreamingDetokenizer()
    assert d.feed(ord("a")) == "a"
    assert d.feed(EOS) == "", "ids >= 256 (EOS) are not bytes: they show nothing"
    assert d.feed(0xF0) == "" and d.feed(EOS) == "", "EOS in the middle of a character must not break it"
    assert [d.feed(b) for b in "𝄞".encode()[1:]] == ["", "", "𝄞"]


def test_invalid_bytes_show_once_and_do_not_block():
    out, d = _stream([0xFF, ord("a"), 0x80, ord("b")])
    assert out == ["\ufffd", "a", "\ufffd", "b"], f"a byte no character starts with is shown as U+FFFD at once, got {out}"


@pytest.mark.parametrize(("stop", "text", "want"), [
    (["end"], "the end is near", "the "),
    (["𝄢"], MIXED, MIXED[: MIXED.find("𝄢")]),
    (["你好", "zz"], MIXED, MIXED[: MIXED.find("你好")]),
    (["é —"], MIXED, MIXED[: MIXED.find("é —")]),
    (["e"], "the", "th"),
])
def test_stop_string_cuts_and_never_leaks(stop, text, want):
    out, d = _stream(text, stop)
    shown = "".join(out)
    assert d.stopped in stop, f"stop {stop} is in {text!r}: the stream must stop, stopped={d.stopped!r}"
    assert shown == want, f"text before the stop string only: want {want!r}, got {shown!r}"
    for i in range(1, len(out) + 1):
        partial = "".join(out[:i])
        assert not any(s in partial for s in stop), f"the stop string leaked after {i} tokens: {partial!r}"
    with pytest.raises(ValueError):
        d.feed(ord("x"))


def test_hold_back_is_exactly_len_minus_one():
    out, d = _stream("abcdefg", ["xyz1"])
    assert out == ["", "", "", "a", "b", "c", "d"], f"stop 'xyz1' holds back exactly 3 characters, got {out}"
    assert d.flush() == "efg", "at the end, the held characters are released"


def test_stop_string_split_across_many_tokens():
    out, d = _stream("say 東京 now", ["東京"])
    assert d.stopped == "東京" and "".join(out) == "say ", "a stop string spread over 6 byte tokens must still match"


def test_equals_minis_detokenizer_on_random_streams():
    from mini_vllm.entrypoints.detokenizer import IncrementalDetokenizer, byte_token_bytes

    rng = np.random.default_rng(0)
    alphabet = list("ab 你好𝄞é—") + ["STOP", "é "]
    for trial in range(60):
        text = "".join(rng.choice(alphabet, size=int(rng.integers(1, 12))))
        ids = list(text.encode())
        if trial % 3 == 0:  # some invalid bytes and EOS too
            ids.insert(int(rng.integers(0, len(ids))), int(rng.choice([0xFF, 0x80, EOS])))
        stop = [["STOP"], [], ["你好", "é "]][trial % 3]
        mine = IncrementalDetokenizer(byte_token_bytes(), stop=stop)
        d = lab.StreamingDetokenizer(stop=stop)
        for t in ids:
            hit = mine.update([t])
            want = mine.get_next_output_text(hit is not None, delta=True)
            got = d.feed(t)
            assert got == want, f"{text!r} stop={stop}: after byte {t:#x} mini emits {want!r}, yours {got!r}"
            if hit:
                break
        if not mine.stopped:
            mine.finish()
            assert d.flush() == mine.get_next_output_text(True, delta=True)


@pytest.mark.upstream
@pytest.mark.parametrize("stop", [[], ["ok"], ["𝄢"], ["你好", "zz"]])
def test_equals_vllms_fast_incremental_detokenizer(stop):
    rp = pytest.importorskip("mini_vllm.testing.real_parsers")
    text = "Paris 𝄞 ok. " + MIXED + " then more"
    data = text.encode()
    deltas, v_stop, v_text = rp.detok_stream(rp.fast_detokenizer(rp.byte_token_ids(b"Hi"), stop), [[t] for t in rp.byte_token_ids(data)])
    out, d = _stream(text, stop)
    assert d.stopped == v_stop, f"vLLM stopped on {v_stop!r}, yours on {d.stopped!r}"
    assert out == deltas[: len(out)] and len(out) == len(deltas), f"per-token deltas differ from vLLM's: {out} vs {deltas}"
    if v_stop is None:
        assert "".join(out) + d.flush() == v_text
