"""Tests for mini_vllm.grammar: the regex FSM, the JSON pushdown machine, masks and bitmasks."""

import json
import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mini_vllm.grammar import (
    GrammarCompiler,
    JsonMachine,
    RegexFSM,
    StructuredOutputManager,
    Vocab,
    allocate_token_bitmask,
    apply_bitmask,
    bitmask_words,
    byte_vocab,
    constrained_argmax,
    pack_mask,
    unpack_bitmask,
)

# A small tokenizer with multi-character tokens; the last id is EOS.
TOKS = list("abcxyz0123456789-.:{}[]\",q@") + ["0x", "ab", "12", "x1", "abc", "1x", "zz", "\"a", "\":", "},",
                                               "true", "nu", "ll", "{\"", "[1"]
VOCAB = Vocab(tuple(TOKS) + (None,), eos_token_id=len(TOKS))
EOS = VOCAB.eos_token_id
PATTERNS = ["0x[0-9a-f]+", "(ab|x1)*z", "a(b|c)*x?", "[a-c]+-[0-9]+(\\.[0-9]+)?", "(yes|no) \\d\\d",
            "[^0-9]+1", "(a|)b?", "x(y(z)?)?"]


def ids(*texts):
    return [TOKS.index(t) for t in texts]


def allowed_texts(mask):
    return {("EOS" if i == EOS else TOKS[i]) for i in np.flatnonzero(mask)}


# --- the bitmask format ----------------------------------------------------------------------

def test_bitmask_row_is_ceil_v_over_32_words():
    assert bitmask_words(257) == 9, "ByteTokenizer's 257 ids need 9 words: 8 words hold only 256 bits"
    assert [bitmask_words(v) for v in (1, 32, 33, 64, 151_936)] == [1, 1, 2, 2, 4748]
    bm = allocate_token_bitmask(3, 257)
    assert bm.shape == (3, 9) and bm.dtype == np.int32 and (bm == -1).all(), "a fresh row allows everything"
    with pytest.raises(ValueError, match="positive"):
        bitmask_words(0)
    with pytest.raises(ValueError, match="positive"):
        allocate_token_bitmask(0, 10)


def test_bit_layout_matches_vllm():
    for tok, word, value in [(0, 0, 1), (1, 0, 2), (31, 0, -(2**31)), (32, 1, 1), (256, 8, 1)]:
        mask = np.zeros(257, dtype=bool)
        mask[tok] = True
        row = pack_mask(mask)
        expect = np.zeros(9, dtype=np.int32)
        expect[word] = value
        assert (row == expect).all(), f"token {tok} must be bit {tok % 32} of word {tok // 32}, got {row}"


@given(st.lists(st.booleans(), min_size=1, max_size=200))
@settings(max_examples=60, deadline=None)
def test_pack_unpack_roundtrip(bits):
    mask = np.array(bits)
    assert (unpack_bitmask(pack_mask(mask), mask.size) == mask).all()


def test_apply_bitmask_sets_disallowed_to_minus_inf():
    logits = np.arange(40, dtype=np.float32).reshape(2, 20)
    m0, m1 = np.zeros(20, bool), np.ones(20, bool)
    m0[[3, 19]] = True
    m1[0] = False
    out = apply_bitmask(logits, np.stack([pack_mask(m0), pack_mask(m1)]))
    assert out is logits, "apply_bitmask works in place"
    assert np.isfinite(logits[0]).tolist() == m0.tolist() and np.isfinite(logits[1]).tolist() == m1.tolist()
    assert logits[0, 3] == 3 and logits[1, 5] == 25, "allowed logits keep their values"
    with pytest.raises(TypeError, match="floating"):
        apply_bitmask(np.zeros(5, dtype=np.int64), pack_mask(np.ones(5, bool)))
    with pytest.raises(ValueError, match="words"):
        apply_bitmask(np.zeros(40), pack_mask(np.ones(20, bool)))


def test_masking_renormalizes_to_the_one_allowed_token():
    logits = np.random.default_rng(0).normal(size=20) * 5
    mask = np.zeros(20, bool)
    mask[7] = True
    apply_bitmask(logits, pack_mask(mask))
    probs = np.exp(logits - logits.max())
    probs /= probs.sum()
    assert probs[7] == 1.0 and probs.sum() == 1.0, "one legal token must be sampled with probability 1"


# --- the regex compiler ----------------------------------------------------------------------

@pytest.mark.parametrize("pattern", PATTERNS)
@given(text=st.text(alphabet="abcxyz01-.9 yesno", max_size=8))
@settings(max_examples=60, deadline=None)
def test_regex_fsm_agrees_with_re_fullmatch(pattern, text):
    assert RegexFSM(pattern).fullmatch(text) == (re.fullmatch(pattern, text) is not None), (pattern, text)


@pytest.mark.parametrize("bad, why", [("a)", "unbalanced"), ("(a", "unclosed"), ("*a", "nothing to repeat"),
                                      ("[ab", "unclosed"), ("a.b", "outside the supported subset"),
                                      ("a**", "stacked"), ("[z-a]", "bad range"), ("a\\", "dangling"),
                                      ("a{2}", "outside")])
def test_regex_errors(bad, why):
    with pytest.raises(ValueError, match=why):
        RegexFSM(bad)
    with pytest.raises(TypeError):
        RegexFSM(b"ab")


def test_classes_escapes_and_negation():
    fsm = RegexFSM("[^0-9]\\d[-a]\\.[]x]")
    assert fsm.fullmatch("q7-.]") and fsm.fullmatch("z0a.x")
    assert not fsm.fullmatch("17-.x") and not fsm.fullmatch("q7-x]")
    for pattern in ("(a*)*b", "(a?|b*)+c", "((a|)*)*"):
        for text in ("", "b", "aab", "c", "abbc", "a"):
            assert RegexFSM(pattern).fullmatch(text) == (re.fullmatch(pattern, text) is not None), (
                f"{pattern!r} on {text!r}: a starred group that matches the empty string makes an epsilon "
                "cycle; the closure must skip states it has already seen")
    for pattern in ("[a-]", "[a-]+b", "x[0-9-]"):
        for text in ("a", "-", "]", "a-b", "x-", "x5", "b"):
            assert RegexFSM(pattern).fullmatch(text) == (re.fullmatch(pattern, text) is not None), (
                f"{pattern!r} on {text!r}: a '-' just before ']' is a literal dash, not the start of a range")


# --- lifting to tokens -----------------------------------------------------------------------

def test_multi_char_tokens_advance_through_every_character():
    g = GrammarCompiler(VOCAB).compile_grammar("regex", "0x[0-9a-f]+")
    assert allowed_texts(g.allowed_token_mask()) == {"0", "0x"}, "'0x' crosses two atoms in one token"
    assert g.accept_tokens("r", ids("0x"))
    assert allowed_texts(g.allowed_token_mask()) == set("abc0123456789") | {"ab", "12", "abc"}
    assert g.accept_tokens("r", ids("12"))
    assert "EOS" in allowed_texts(g.allowed_token_mask()), "after 0x12 the pattern is complete"
    state = g.state
    assert not g.accept_tokens("r", ids("1x")), "'1x' dies at its second character"
    assert g.state == state and g.num_processed_tokens == 2, "a rejected token must not move the state"


def test_eos_only_in_accepting_states_and_terminated_allows_nothing():
    g = GrammarCompiler(VOCAB, num_speculative_tokens=1).compile_grammar("regex", "ab?")
    assert not g.allowed_token_mask()[EOS], "empty output does not match ab?"
    assert not g.accept_tokens("r", [EOS])
    g.accept_tokens("r", ids("a"))
    assert g.allowed_token_mask()[EOS] and g.is_accepting()
    assert g.accept_tokens("r", [EOS]) and g.is_terminated()
    assert not g.allowed_token_mask().any(), "nothing follows EOS"
    assert not g.is_accepting(), "after EOS the grammar is terminated: EOS is no longer legal, so not accepting"
    assert not g.accept_tokens("r", ids("b"))
    g.rollback(1)
    assert not g.is_terminated() and allowed_texts(g.allowed_token_mask()) == {"b", "EOS"}


def test_special_tokens_never_allowed():
    vocab = Vocab(("a", None, "b", None), eos_token_id=3)
    g = GrammarCompiler(vocab).compile_grammar("regex", "a*")
    assert g.allowed_token_mask().tolist() == [True, False, False, True]
    with pytest.raises(ValueError, match="EOS entry"):
        Vocab(("a", "b"), eos_token_id=1)
    with pytest.raises(ValueError, match="no characters"):
        Vocab(("", None), eos_token_id=1)


def test_rollback_restores_bit_identical_masks():
    g = GrammarCompiler(VOCAB, num_speculative_tokens=3).compile_grammar("regex", "[a-c]+-[0-9]+(\\.[0-9]+)?")
    g.accept_tokens("r", ids("ab"))
    before = pack_mask(g.allowed_token_mask())
    assert g.accept_tokens("r", ids("c", "-", "12"))
    g.rollback(3)
    assert (pack_mask(g.allowed_token_mask()) == before).all()
    assert g.num_processed_tokens == 1
    g.rollback(0)
    assert (pack_mask(g.allowed_token_mask()) == before).all() and g.num_processed_tokens == 1, (
        "rollback(0) is a no-op: beware history[-0:], which is the whole list")
    with pytest.raises(ValueError, match="only 0 can be undone"):
        g.rollback(1)
    with pytest.raises(ValueError, match="negative"):
        g.rollback(-1)


def test_max_rollback_tokens_bounds_history():
    g = GrammarCompiler(VOCAB, num_speculative_tokens=2).compile_grammar("regex", "a*")
    g.accept_tokens("r", ids("a", "a", "a", "a"))
    assert len(g.history) == 3, "keep max_rollback_tokens states plus the current one"
    g.rollback(2)
    with pytest.raises(ValueError, match="only 0"):
        g.rollback(1)


def test_validate_tokens_returns_legal_prefix_without_advancing():
    g = GrammarCompiler(VOCAB).compile_grammar("regex", "(ab|x1)*z")
    draft = ids("ab", "x1", "a", "z")
    assert g.validate_tokens(draft) == ids("ab", "x1", "a"), "'a' is a live prefix of 'ab'; 'z' after 'a' dies"
    assert g.num_processed_tokens == 0 and len(g.history) == 1, "validate_tokens must not advance"
    assert not g.accept_tokens("r", draft), "accept_tokens is all-or-nothing"
    assert len(g.history) == 1
    assert g.num_processed_tokens == 0 and g.state == g.compiled.machine.start(), (
        f"a refused list must leave the grammar where it was; it advanced to num_processed_tokens="
        f"{g.num_processed_tokens}: validate the whole list before accepting any of it"
    )
    spec = GrammarCompiler(VOCAB, num_speculative_tokens=4).compile_grammar("regex", "(ab|x1)*z")
    assert not spec.accept_tokens("r", draft)
    assert len(spec.history) == 1 and spec.num_processed_tokens == 0, (
        f"with rollback history kept, a refused list of {len(draft)} tokens left {len(spec.history) - 1} "
        "states behind: accept_tokens must advance by all tokens or by none"
    )
    with pytest.raises(ValueError, match="outside the vocabulary"):
        g.validate_tokens([len(TOKS) + 1])
    with pytest.raises(TypeError):
        g.validate_tokens([True])


def test_mask_cache_one_computation_per_state():
    comp = GrammarCompiler(byte_vocab())
    g = comp.compile_grammar("regex", "(ab|cd)*e")
    rng = np.random.default_rng(1)
    for _ in range(200):
        mask = g.allowed_token_mask()
        g.accept_tokens("r", [int(rng.choice(np.flatnonzero(mask)))])
        if g.is_terminated():
            g.reset()
    assert g.compiled.mask_computations == g.compiled.machine.num_states == 6, (
        "(ab|cd)*e has 6 DFA states (start, a, c, ab/cd, e... unminimized): one mask computation each over 200 steps"
    )
    assert comp.compile_grammar("regex", "(ab|cd)*e").compiled is g.compiled and comp.compilations == 1


@pytest.mark.parametrize("pattern", ["(yes|no) \\d\\d", "\\d\\d\\d\\d-\\d\\d-\\d\\d", "(ab|x1)*z", "0x[0-9a-f]+"])
def test_adversarial_model_still_matches(pattern):
    vocab = Vocab(tuple(TOKS) + tuple("yesno ") + (None,), eos_token_id=len(TOKS) + 6)
    text = [*vocab.tokens[:-1]]
    rng = np.random.default_rng(2)
    g = GrammarCompiler(vocab).compile_grammar("regex", pattern)
    # worst allowed token: logits rank q, @, zz highest, the rest random, EOS just above the rest
    def logits_fn(out):
        base = rng.normal(size=vocab.size)
        base[[text.index("q"), text.index("@"), text.index("zz")]] += 100
        base[vocab.eos_token_id] += 10
        return base
    out = constrained_argmax(logits_fn, g, max_tokens=100)
    assert out[-1] == vocab.eos_token_id, f"{pattern}: should finish within 100 tokens"
    s = "".join(vocab.tokens[t] for t in out[:-1])
    assert re.fullmatch(pattern, s), f"{pattern}: constrained output {s!r} must match"


def test_no_way_forward_raises():
    g = GrammarCompiler(Vocab(("a", None), eos_token_id=1)).compile_grammar("regex", "b")
    with pytest.raises(RuntimeError, match="no token is allowed"):
        constrained_argmax(lambda out: np.zeros(2), g, 5)


# --- JSON ------------------------------------------------------------------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-10**6, 10**6) | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(alphabet='ab"\\\x18é/', max_size=4),
    lambda kids: st.lists(kids, max_size=3) | st.dictionaries(st.text(alphabet='ab"', max_size=2), kids, max_size=3),
    max_leaves=8,
)


@given(json_values)
@settings(max_examples=40, deadline=None)
def test_json_machine_accepts_every_compact_document_and_its_prefixes_live(value):
    text = json.dumps(value, separators=(",", ":"))
    jm, state = JsonMachine(), JsonMachine().start()
    for i, ch in enumerate(text):
        state = jm.step(state, ch)
        assert state is not None, f"{text!r} died at {i} ({ch!r})"
    assert jm.is_accepting(state), text


@given(json_values, st.integers(0, 1000), st.sampled_from(list('{}[]:,"0123456789-.eE+tfnul\\ab')))
@settings(max_examples=80, deadline=None)
def test_json_machine_agrees_with_strict_json_loads_on_mutations(value, pos, ch):
    text = json.dumps(value, separators=(",", ":"))
    pos %= len(text) + 1
    for cand in (text[:pos] + ch + text[pos:], text[:pos] + text[pos + 1:]):
        try:
            json.loads(cand)
            ok = True
        except ValueError:
            ok = False
        assert JsonMachine().fullmatch(cand) == ok, cand


@pytest.mark.parametrize("bad", ['{"a":1,}', "[1,]", "{}}", "01", "1.", "-", '"\x18"', '{"a"}', "tru", "1e",
                                 '{1:2}', "[1 2]", '"\\x"', '"\\u12g4"', "", "1e+-5", "1e5e5",
                                 "1.2.3", "--1"])
def test_json_rejects(bad):
    assert not JsonMachine().fullmatch(bad), bad


def test_json_a_minus_then_zero_is_the_whole_integer_part():
    # JSON's int is "-"? ("0" | [1-9][0-9]*): a zero after the minus ends the integer part too.
    for good in ("-0", "-0.5", "-0e1", "-10", "[-0,-7]"):
        assert JsonMachine().fullmatch(good), (
            f"{good!r} is JSON (json.loads takes it) but the machine refused it"
        )
    for bad in ("-01", "-00", "[-05]", '{"a":-01}'):
        assert not JsonMachine().fullmatch(bad), (
            f"{bad!r} was accepted: after '-', a '0' must go to the zero state (no digit may follow), "
            "as a leading '0' does"
        )


def test_json_closer_must_match_the_stack_top():
    for bad in ("[1}", '{"a":1]', "[{}}", '{"a":[1}}', "[[]}"):
        assert not JsonMachine().fullmatch(bad), f"{bad!r}: '}}' closes only '{{' and ']' only '[' (read the stack top)"
    comp = GrammarCompiler(VOCAB)
    obj, arr = comp.compile_grammar("json", ""), comp.compile_grammar("json", "")
    assert obj.accept_tokens("r", ids('{"', "a", '":', "[1", "]")) and arr.accept_tokens("r", ids("[", "[1", "]"))
    assert {"}", "]"} & allowed_texts(obj.allowed_token_mask()) == {"}"}, "after {\"a\":[1] only '}' closes"
    assert {"}", "]"} & allowed_texts(arr.allowed_token_mask()) == {"]"}, (
        "after [[1] only ']' closes: the same mode with a different stack needs its own cached mask "
        "(key the mask cache by the whole state, stack included)")


def test_json_depth_is_the_stack_and_max_depth_refuses():
    jm = JsonMachine(max_depth=3)
    s = jm.start()
    for ch, d in zip('[{"', [1, 2, 2], strict=True):
        s = jm.step(s, ch)
        assert jm.depth(s) == d
    s = jm.step(jm.step(jm.step(s, '"'), ":"), "[")
    assert jm.depth(s) == 3 and jm.step(s, "[") is None, "a fourth level is refused at max_depth=3"
    for ch in "]}]":
        s = jm.step(s, ch)
    assert jm.is_accepting(s) and jm.depth(s) == 0
    with pytest.raises(ValueError, match="top_level"):
        JsonMachine("array")
    with pytest.raises(ValueError, match="max_depth"):
        JsonMachine(max_depth=0)


def test_json_object_kind_and_top_level_numbers():
    comp = GrammarCompiler(VOCAB)
    g = comp.compile_grammar("json_object", "")
    assert allowed_texts(g.allowed_token_mask()) == {"{", "{\""}, "json_object must start with {"
    g2 = comp.compile_grammar("json", "")
    g2.accept_tokens("r", ids("12"))
    assert {"EOS", "0", ".", "12"} <= allowed_texts(g2.allowed_token_mask()), "a top-level number may end at EOS"
    assert comp.compile_grammar("regex", "a+").compiled is not comp.compile_grammar("regex", "b+").compiled, (
        "the compile cache is keyed by (kind, spec): two patterns must not share a machine")
    assert comp.compile_grammar("choice", ["a"]).compiled is not comp.compile_grammar("choice", ["b"]).compiled
    assert comp.compilations == 6, "json_object, json, a+, b+, [a], [b]: one compilation per distinct (kind, spec)"
    with pytest.raises(ValueError, match="unknown grammar kind"):
        comp.compile_grammar("ebnf", "root ::= x")


def test_choice_lowers_to_escaped_alternation():
    vocab = Vocab(tuple("yesno?a.") + (None,), eos_token_id=8)
    g = GrammarCompiler(vocab).compile_grammar("choice", ["yes", "no?", "a."])
    g.accept_tokens("r", [vocab.tokens.index("n"), vocab.tokens.index("o")])
    assert not g.is_accepting(), "'?' in a choice is a literal, not 'optional'"
    assert g.accept_tokens("r", [vocab.tokens.index("?"), 8])
    with pytest.raises(ValueError, match="non-empty"):
        GrammarCompiler(vocab).compile_grammar("choice", [])


# --- the manager: one row per sampled position --------------------------------------------

def test_manager_fills_k_plus_one_rows_and_rolls_back():
    comp = GrammarCompiler(VOCAB, num_speculative_tokens=2)
    mgr = StructuredOutputManager(comp, max_num_seqs=3)
    assert mgr._bitmask.shape == (9, bitmask_words(VOCAB.size)), "max_num_seqs x (1 + k) rows"
    g = comp.compile_grammar("regex", "0x[0-9a-f]+")
    h = comp.compile_grammar("regex", "0x[0-9a-f]+")
    bm = mgr.grammar_bitmask([g, None, h], [ids("0x", "1"), [], ids("q", "0")])
    assert bm.shape == (7, bitmask_words(VOCAB.size)), "3 + 1 + 3 rows"
    rows = unpack_bitmask(bm, VOCAB.size)
    assert allowed_texts(rows[0]) == {"0", "0x"}
    assert "1" in allowed_texts(rows[1]) and "EOS" not in allowed_texts(rows[1]), "row 1: after the draft 0x"
    assert "EOS" in allowed_texts(rows[2]), "row 2 (bonus): after 0x1 the pattern is complete"
    assert rows[3].all(), "an unconstrained request's row allows everything"
    assert allowed_texts(rows[4]) == {"0", "0x"} and rows[5].all() and rows[6].all(), (
        "after a rejected draft the rows stay open")
    assert g.num_processed_tokens == 0 and h.num_processed_tokens == 0, "every tentative advance is rolled back"
    bm2 = mgr.grammar_bitmask([None, g])
    assert bm2.shape == (2, bitmask_words(VOCAB.size)) and (bm2[0] == -1).all(), (
        "row 0 is unconstrained this step: reset every row to -1 before filling, or last step's row leaks")
    with pytest.raises(ValueError, match="rows needed"):
        mgr.grammar_bitmask([g, g, g], [ids("0", "0"), ids("0", "0"), ids("0", "0", "0")])
    with pytest.raises(ValueError, match="one"):
        mgr.grammar_bitmask([g], [[], []])


def test_manager_rolls_back_the_drafts_it_accepted_before_a_rejected_one():
    comp = GrammarCompiler(VOCAB, num_speculative_tokens=3)
    mgr = StructuredOutputManager(comp, max_num_seqs=1)
    g = comp.compile_grammar("regex", "0x[0-9a-f]+")
    before = unpack_bitmask(mgr.grammar_bitmask([g]), VOCAB.size)[0]
    bm = mgr.grammar_bitmask([g], [ids("0x", "1", "q")])  # two legal drafts, then one the grammar refuses
    rows = unpack_bitmask(bm, VOCAB.size)
    assert "1" in allowed_texts(rows[1]) and "EOS" in allowed_texts(rows[2]) and rows[3].all()
    assert g.num_processed_tokens == 0 and len(g.history) == 1, (
        f"the grammar kept {g.num_processed_tokens} tentative draft tokens after a rejected draft: roll back "
        "every accepted draft, whether or not a later one was refused"
    )
    after = unpack_bitmask(mgr.grammar_bitmask([g]), VOCAB.size)[0]
    assert (after == before).all(), "the next step's mask must be the start state's again"


# -- UTF-8 ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("lo, hi", [(0x80, 0xE8), (0xE9, 0x1FF), (0x3B1, 0x3C9), (0x7F0, 0x810), (0xD7F0, 0xE010),
                                    (0xFFE0, 0x10010), (0x40000, 0x10FFFF), (0, 0x10FFFF)])
def test_utf8_sequences_match_exactly_the_encodings_of_the_range(lo, hi):
    from mini_vllm.grammar import utf8_sequences

    seqs = utf8_sequences(lo, hi)

    def covered(data: bytes) -> bool:
        return any(len(s) == len(data) and all(a <= b <= z for (a, z), b in zip(s, data)) for s in seqs)

    rng = np.random.default_rng(lo)
    points = {lo, hi, lo - 1, hi + 1, *rng.integers(max(lo - 300, 0), min(hi + 300, 0x10FFFF) + 1, 400).tolist()}
    for cp in sorted(p for p in points if 0 <= p <= 0x10FFFF):
        data = chr(cp).encode("utf-8", "surrogatepass")
        assert covered(data) == (lo <= cp <= hi), f"U+{cp:04X} ({data.hex()}) for [{lo:#x}, {hi:#x}]: {seqs}"
    for s in seqs:  # every corner of every piece is the encoding of a code point in the range
        for pick in (0, 1):
            data = bytes(r[pick] for r in s)
            assert lo <= ord(data.decode("utf-8", "surrogatepass")) <= hi, f"{data.hex()} escapes [{lo:#x}, {hi:#x}]"


@pytest.mark.parametrize("pattern", ["café", "[^é]é", "[^a-z]+", "[α-ω]+[0-9]?", "(日本|中文)語?", "[à-ÿ]*😀"])
def test_non_ascii_patterns_agree_with_re_on_utf8_bytes(pattern):
    rng = np.random.default_rng(len(pattern))
    alphabet = list("aéèzω9日本中文語😀αǿ") + ["\u0800", "\U0010ffff"]
    fsm = RegexFSM(pattern)
    texts = ["".join(rng.choice(alphabet, size=n)) for n in rng.integers(0, 5, 300)] + ["café", "éé", "αβ7", "日本語"]
    for text in texts:
        assert fsm.fullmatch(text) == (re.fullmatch(pattern, text) is not None), (pattern, text)
    assert not fsm.fullmatch("café".encode("latin-1")), "é as the one byte 0xE9 is not UTF-8"


def test_json_strings_take_well_formed_utf8_only():
    jm = JsonMachine()
    assert jm.fullmatch('{"clé":"日本語 😀"}') and jm.fullmatch('["é"]')
    for bad in (b'{"a":"\xc3"}', b'{"a":"\xe0\x80\x80"}', b'{"a":"\xf4\x90\x80\x80"}', b'{"a":"\xa9"}', b'{"\xc3\xa9":\xc3}'):
        assert not jm.fullmatch(bad), f"{bad!r}: a lone, overlong, past-U+10FFFF or out-of-string byte"
    state = jm.start()
    for b in b'{"':
        state = jm.step(state, b)
    state = jm.step(state, 0xE6)
    assert jm.step(state, ord('"')) is None, "a string cannot close in the middle of a character"
    with pytest.raises(ValueError, match="UTF-8 bytes"):
        jm.step(jm.start(), "é")


def test_negated_class_reaches_the_last_code_point():
    for pattern in ("[^\U0010fffe]", "[^a-\U0010fffe]"):
        got = RegexFSM(pattern).fullmatch("\U0010ffff")
        assert got, (
            f"{pattern!r} must match U+10FFFF (the complement runs up to and including it), got {got}"
        )
