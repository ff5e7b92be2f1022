"""Differential test: mini_vllm.grammar's allowed-token sets equal xgrammar 0.2.8's at every step.

Both compile the same regex over the same small tokenizer (single characters plus multi-character
tokens, EOS last). A seeded random walk picks an allowed token each step; after every step the two
allowed sets must be identical, EOS included, and both must agree on termination. (Only the first V
bits are compared: xgrammar may leave the padding bits of the last word set, e.g. word -7 where
mini writes 1 for a 35-token vocabulary; no logit sits behind them.)

The same walk in UTF-8: a vocabulary of every single byte plus whole characters and tokens that
stop or start mid-character, non-ASCII literals and classes (negated, across the 1/2/3/4-byte
boundaries), and JSON strings against xgrammar's built-in JSON grammar, byte by byte.
"""

import re

import numpy as np
import pytest

from mini_vllm.grammar import _STR, _STR_UTF8, GrammarCompiler, Vocab, allocate_token_bitmask, unpack_bitmask

pytestmark = pytest.mark.upstream

TOKS = list("abcdefxyz0123456789-.: ") + ["0x", "ab", "12", "x1", "abc", "1x", "ye", "s ", "no", "ff", "-0"]
VOCAB = Vocab(tuple(TOKS) + (None,), eos_token_id=len(TOKS))
PATTERNS = ["0x[0-9a-f]+", "(yes|no) [0-9][0-9]", "a(b|c)*x?", "[a-c]+-[0-9]+(\\.[0-9]+)?", "(ab|x1)*z",
            "\\d+(\\.\\d\\d)?", "[^0-9]?[0-9]", "(a|b|)c*"]


@pytest.fixture(scope="module")
def xgr_compiler():
    xgr = pytest.importorskip("xgrammar")
    info = xgr.TokenizerInfo(TOKS + ["<eos>"], vocab_type=xgr.VocabType.RAW, vocab_size=VOCAB.size,
                             stop_token_ids=[VOCAB.eos_token_id])
    return xgr, xgr.GrammarCompiler(info)


@pytest.mark.parametrize("pattern", PATTERNS)
def test_allowed_tokens_equal_xgrammar_every_step(xgr_compiler, pattern):
    xgr, compiler = xgr_compiler
    compiled = compiler.compile_regex(pattern)
    for seed in range(3):
        rng = np.random.default_rng(seed)
        matcher = xgr.GrammarMatcher(compiled)
        mine = GrammarCompiler(VOCAB).compile_grammar("regex", pattern)
        theirs = xgr.allocate_token_bitmask(1, VOCAB.size)
        row = allocate_token_bitmask(1, VOCAB.size)
        for step in range(40):
            matcher.fill_next_token_bitmask(theirs)
            mine.fill_bitmask(row, 0)
            want = unpack_bitmask(theirs.numpy()[0], VOCAB.size)
            got = unpack_bitmask(row[0], VOCAB.size)
            assert (want == got).all(), (
                f"{pattern!r} seed {seed} step {step}: tokens "
                f"{[VOCAB.tokens[i] or 'EOS' for i in np.flatnonzero(want != got)]} differ from xgrammar"
            )
            allowed = np.flatnonzero(mine.allowed_token_mask())
            if allowed.size == 0:
                pytest.fail(f"{pattern!r}: no token allowed at step {step} before termination")
            tok = int(rng.choice(allowed))
            assert matcher.accept_token(tok) and mine.accept_tokens("r", [tok])
            if mine.is_terminated():
                assert matcher.is_terminated(), f"{pattern!r}: xgrammar did not terminate on EOS"
                break


def test_control_characters_in_strings_at_the_pin(xgr_compiler):
    """Grammar validity is parser validity only if the grammar says so. Strict json.loads refuses a
    raw U+0018 inside a string (strict=False takes it); mini's JsonMachine refuses it too. The
    control-character mismatch reported as xgrammar#286 does not reproduce here for a plain string:
    xgrammar 0.2.8's JSON-schema and built-in JSON grammars both refuse the character. (A schema
    string with maxLength or minLength admits it: Phase 12 lab 03 pins that hole.)"""
    import json

    from xgrammar.testing import _is_grammar_accept_string

    from mini_vllm.grammar import JsonMachine

    xgr, _ = xgr_compiler
    text = '{"name":"a\x18b","age":1}'
    schema = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
              "required": ["name", "age"]}
    with pytest.raises(json.JSONDecodeError, match="control character"):
        json.loads(text)
    assert json.loads(text, strict=False)["age"] == 1
    assert not JsonMachine().fullmatch(text)
    assert _is_grammar_accept_string(xgr.Grammar.from_json_schema(json.dumps(schema)), '{"name":"ab","age":1}')
    assert not _is_grammar_accept_string(xgr.Grammar.from_json_schema(json.dumps(schema)), text)
    assert not _is_grammar_accept_string(xgr.Grammar.builtin_json_grammar(), text)


# -- UTF-8: non-ASCII literals, classes and JSON strings, byte by byte ----------------------------

# Every byte alone (a byte tokenizer's ids), whole characters, tokens that stop or start mid-character.
UTOKS = [bytes([b]) for b in range(256)] + [t.encode() for t in ("café", "é", "日本", "本語", "αβ", "ω", "€", "\u3000",
                                                               "\u00a0x", '"', '":', '{"', '"}', "naïve")]
UTOKS += [b"\xc3", b"\xa9\xc3", b"\xe6\x97", b"\xa5a", b"\xf0\x9f", b"\x98\x80"]
UVOCAB = Vocab(tuple(UTOKS) + (None,), eos_token_id=len(UTOKS))
UPATTERNS = ["café", "(日本|中文)語?", "[α-ω]+[0-9]", "[^a-z]+", "[à-ÿ]*x", "[^é]é", "[\u07f0-\u0810]+",
             "[\uffe0-\U00010010]+", "\\s+[^\\s]", '[^"\\\\]*"', "(naïve|[€£¥])+", "[^\u0800-\U0010ffff]?😀"]
WHITESPACE = {0x09, 0x0A, 0x0D, 0x20}


@pytest.fixture(scope="module")
def xgr_utf8():
    xgr = pytest.importorskip("xgrammar")
    info = xgr.TokenizerInfo(UTOKS + ["<eos>"], vocab_type=xgr.VocabType.RAW, vocab_size=UVOCAB.size,
                             stop_token_ids=[UVOCAB.eos_token_id])
    return xgr, xgr.GrammarCompiler(info)


def _rows(xgr, matcher, mine):
    theirs = xgr.allocate_token_bitmask(1, UVOCAB.size)
    matcher.fill_next_token_bitmask(theirs)
    return unpack_bitmask(theirs.numpy()[0], UVOCAB.size), mine.allowed_token_mask()


def _shown(ids):
    return [UVOCAB.tokens[i] if UVOCAB.tokens[i] is not None else "EOS" for i in ids][:12]


@pytest.mark.parametrize("pattern", UPATTERNS)
def test_non_ascii_regex_masks_equal_xgrammar_byte_by_byte(xgr_utf8, pattern):
    xgr, compiler = xgr_utf8
    compiled = compiler.compile_regex(pattern)
    for seed in range(4):
        rng = np.random.default_rng(seed)
        matcher, mine = xgr.GrammarMatcher(compiled), GrammarCompiler(UVOCAB).compile_grammar("regex", pattern)
        text = b""
        for step in range(30):
            want, got = _rows(xgr, matcher, mine)
            assert (want == got).all(), (
                f"{pattern!r} after {text!r} (seed {seed}, step {step}): tokens {_shown(np.flatnonzero(want != got))} "
                "differ from xgrammar"
            )
            allowed = np.flatnonzero(got)
            assert allowed.size, f"{pattern!r}: no token allowed after {text!r} before termination"
            tok = int(rng.choice(allowed))
            assert matcher.accept_token(tok) and mine.accept_tokens("r", [tok])
            if mine.is_terminated():
                assert matcher.is_terminated(), f"{pattern!r}: xgrammar did not terminate on EOS after {text!r}"
                # re's \s is Python's white space (U+001C..U+001F too), xgrammar's is ECMAScript's
                assert "\\s" in pattern or re.fullmatch(pattern, text.decode()), text
                break
            text += UVOCAB.token_bytes[tok]


def test_json_strings_with_multi_byte_characters_equal_xgrammar(xgr_utf8):
    """mini's compact ``json_object`` against xgrammar's built-in JSON grammar on the same documents:
    inside a string (and inside a character) the masks are equal; elsewhere they differ only by the
    whitespace xgrammar allows between tokens and mini's compact form does not."""
    xgr, compiler = xgr_utf8
    compiled = compiler.compile_builtin_json_grammar()
    quote = np.array(['"' in (t or b"").decode("latin-1") for t in UVOCAB.token_bytes])
    in_string_steps = non_ascii = 0
    for seed in range(6):
        rng = np.random.default_rng(seed)
        matcher, mine = xgr.GrammarMatcher(compiled), GrammarCompiler(UVOCAB).compile_grammar("json_object", "")
        start = UTOKS.index(b'{"')  # xgrammar's document may also be an array; both start an object here
        assert matcher.accept_token(start) and mine.accept_tokens("r", [start])
        text = b'{"'
        for _ in range(80):
            want, got = _rows(xgr, matcher, mine)
            in_string = mine.state[0] in (_STR, _STR_UTF8)  # inside a string, or inside one of its characters
            extra = np.flatnonzero(want & ~got)
            if in_string:
                in_string_steps += 1
                assert (want == got).all(), f"in a string after {text!r}: {_shown(np.flatnonzero(want != got))} differ"
            else:
                assert not (got & ~want).any(), f"after {text!r} mini allows {_shown(np.flatnonzero(got & ~want))}"
                assert all(UVOCAB.token_bytes[i] and UVOCAB.token_bytes[i][0] in WHITESPACE for i in extra), (
                    f"after {text!r}: xgrammar also allows {_shown(extra)}, not just whitespace"
                )
            allowed = np.flatnonzero(got)
            weights = np.where(quote[allowed], 25.0, 1.0)
            tok = int(rng.choice(allowed, p=weights / weights.sum()))
            assert matcher.accept_token(tok) and mine.accept_tokens("r", [tok])
            if mine.is_terminated():
                break
            text += UVOCAB.token_bytes[tok]
            non_ascii += UVOCAB.token_bytes[tok][0] >= 0x80
    assert in_string_steps > 100 and non_ascii > 30, (in_string_steps, non_ascii)
