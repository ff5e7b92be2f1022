import pytest

from mini_vllm import ByteTokenizer


def test_one_byte_is_one_token():
    tok = ByteTokenizer()
    assert tok.encode("hello") == [104, 101, 108, 108, 111], (
        "ASCII text must map to its bytes, one token each"
    )
    assert tok.vocab_size == 257 and tok.eos_token_id == 256


def test_round_trip_including_multibyte_utf8():
    tok = ByteTokenizer()
    for text in ["", "hi", "naïve café", "日本語", "tab\tnew\nline"]:
        assert tok.decode(tok.encode(text)) == text, f"decode(encode(x)) must give x back for {text!r}"
    assert len(tok.encode("é")) == 2, "non-ASCII characters take several byte tokens"


def test_decode_skips_eos_and_replaces_broken_utf8():
    tok = ByteTokenizer()
    assert tok.decode([104, 105, 256]) == "hi", "EOS is a control token, not text"
    assert tok.decode([0xC3]) == "\ufffd", "a truncated UTF-8 sequence decodes to U+FFFD, never raises"


@pytest.mark.parametrize("bad", [[257], [-1], [1.5], ["a"], [True]])
def test_decode_rejects_ids_outside_the_vocab(bad):
    with pytest.raises((ValueError, TypeError)):
        ByteTokenizer().decode(bad)
