"""Differential test: mini_vllm.grammar's allowed-token sets equal xgrammar 0.2.8's at every step.

Both compile the same regex over the same small tokenizer (single characters plus multi-character
tokens, EOS last). A seeded random walk picks an allowed token each step; after every step the two
allowed sets must be identical, EOS included, and both must agree on termination. (Only the first V
bits are compared: xgrammar may leave the padding bits of the last word set, e.g. word -7 where
mini writes 1 for a 35-token vocabulary; no logit sits behind them.)
"""

import numpy as np
import pytest

from mini_vllm.grammar import GrammarCompiler, Vocab, allocate_token_bitmask, unpack_bitmask

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
