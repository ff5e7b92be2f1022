import re

import numpy as np
import pytest

from course.runtime import lab_module

lab = lab_module(__file__)   # solution.py by default; LAB_IMPL=starter grades starter.py

# Single characters, multi-character tokens that cross atoms ("0x") or die half-way ("1x", "0z"),
# the adversary's favourites (q, @, zz), and EOS last.
VOCAB = [*"0123456789abcdefxq@.", "0x", "zz", "1x", "ff", "0z", None]
EOS = len(VOCAB) - 1
HEX = "0x[0-9a-f]+"


def tid(text):
    return VOCAB.index(text)


def shown(mask):
    return {"EOS" if VOCAB[i] is None else VOCAB[i] for i in np.flatnonzero(mask)}


def fullmatch(pattern, text):
    return re.fullmatch(pattern, text) is not None


def test_parse_atoms():
    atoms = lab.parse_atoms(HEX)
    assert [(sorted(a.chars), a.plus) for a in atoms] == [
        (["0"], False), (["x"], False), (sorted("0123456789abcdef"), True)
    ], f"'0x[0-9a-f]+' is three atoms: '0', 'x', then a 16-character class with '+'; got {atoms}"
    assert [a.chars for a in lab.parse_atoms("\\.[-a]b+")] == [{"."}, {"-", "a"}, {"b"}], (
        "'\\.' is a literal dot; a '-' first in a class is a literal too"
    )
    assert lab.parse_atoms("[a-c]")[0].chars == {"a", "b", "c"}, "a range includes both ends"
    assert lab.parse_atoms("[a-]")[0].chars == {"a", "-"}, (
        "a '-' last in a class is a literal too: only read 'x-y' as a range when a character follows the '-'"
    )
    # Any wording will do: the message must name the offending piece (the fact a user needs to fix it).
    for bad, piece in [("[ab", "["), ("+a", "+"), ("a++", "+"), ("a*", "*"), ("(a)", "("), ("a|b", "|"),
                       ("a.b", "."), ("[z-a]", "z"), ("[]", "[]"), ("a\\", "\\"),
                       # every other metacharacter the subset lacks, closers included: a stray ']' or
                       # ')' is not a literal (a real regex engine would read a different pattern)
                       ("a?", "?"), ("a)", ")"), ("a{2}", "{"), ("a}", "}"), ("^a", "^"), ("a$", "$"),
                       ("a]", "]"), ("0x[0-9]]", "]")]:
        with pytest.raises(ValueError) as err:
            lab.parse_atoms(bad)
        assert piece in str(err.value), f"parse_atoms({bad!r}): say what is wrong and name {piece!r}; got {err.value}"
    with pytest.raises(ValueError):
        lab.parse_atoms("")


def test_advance_and_death():
    fsm = lab.compile_pattern(HEX)
    assert fsm.num_states == 4 and fsm.accepting == {3}, "n atoms give n + 1 states; only the last accepts"
    assert lab.advance(fsm, 0, "0x") == 2, "'0x' crosses two atoms in one call"
    assert lab.advance(fsm, 2, "ff") == 3 and lab.advance(fsm, 3, "1") == 3, "'+' loops on the state after its atom"
    assert lab.advance(fsm, 2, "") == 2, "no characters, no move"
    assert lab.advance(fsm, 2, "1x") is None, "'1x' dies at its second character: the whole token dies"
    assert lab.advance(fsm, 2, "1") == 3, "the state you passed in is untouched by a dead token"
    assert lab.advance(fsm, 0, "0x") not in fsm.accepting, "'0x' alone does not match: '+' means one or more"
    assert 2 not in fsm.transitions[2].values(), "no self-loop before the '+' atom has matched once"


def test_mask_is_exactly_the_survivors():
    fsm = lab.compile_pattern(HEX)
    assert shown(lab.allowed_tokens(fsm, 0, VOCAB, EOS)) == {"0", "0x"}, (
        "from the start only '0' and '0x' survive; '0z' starts well but dies: check every character"
    )
    assert shown(lab.allowed_tokens(fsm, 1, VOCAB, EOS)) == {"x"}
    want = set("0123456789abcdef") | {"ff"}
    assert shown(lab.allowed_tokens(fsm, 2, VOCAB, EOS)) == want, "state 2 needs a hex digit; no EOS yet"
    assert shown(lab.allowed_tokens(fsm, 3, VOCAB, EOS)) == want | {"EOS"}, "state 3 accepts: EOS joins"


def test_constrained_output_always_matches():
    hater = lab.ranked_model(["q", "@", "zz", "1x", "0z", None, "0x", "ff"], VOCAB)
    g = lab.constrained_generate(HEX, VOCAB, EOS, hater, max_tokens=10)
    assert g.finish_reason == "stop" and fullmatch(HEX, g.text), (
        f"a model preferring q, @, zz must still emit valid hex, got {g.text!r} ({g.finish_reason})"
    )
    assert g.text == "0xff" and g.token_ids == [tid("0x"), tid("ff"), EOS], (
        f"greedy under the mask: '0x' (best legal), then 'ff' (EOS illegal in state 2), then EOS; got {g.token_ids}"
    )
    assert g.mask_computations == 3, "one mask per distinct state visited (0, 2, 3): cache the table by state"


def test_fuzzed_preferences_never_violate():
    pattern = "[0-9a-f][0-9a-f]\\.[xq]"  # every match is 4 characters: 8 tokens can never truncate it
    rng = np.random.default_rng(12)
    texts = [t for t in VOCAB if t is not None]
    for trial in range(50):
        ranking = list(rng.permutation(texts))
        ranking.insert(int(rng.integers(0, len(ranking) + 1)), None)
        g = lab.constrained_generate(pattern, VOCAB, EOS, lab.ranked_model(ranking, VOCAB), max_tokens=8)
        assert g.finish_reason == "stop" and fullmatch(pattern, g.text), (
            f"trial {trial}: ranking {ranking[:5]}... gave {g.text!r} ({g.finish_reason}): a violation means a "
            f"token slipped through the mask"
        )


def test_truncation_caveat_is_real():
    pattern = "[0-9]+\\.[0-9]"
    digits = lab.ranked_model(["7", None, "."], VOCAB)
    fsm = lab.compile_pattern(pattern)
    for max_tokens in (1, 5, 40):
        g = lab.constrained_generate(pattern, VOCAB, EOS, digits, max_tokens)
        assert g.text == "7" * max_tokens and g.finish_reason == "length", (
            f"a digit lover loops in [0-9]+ and never reaches '.': expect {max_tokens} sevens, 'length'; got {g}"
        )
        assert lab.advance(fsm, 0, g.text) is not None and not fullmatch(pattern, g.text), (
            "a truncated output is a live prefix, not a match: the mask cannot save you from max_tokens"
        )


def test_mask_is_computed_once_per_state_not_once_per_step(monkeypatch):
    calls = []
    real = lab.allowed_tokens

    def counting(fsm, state, vocab, eos_token_id):
        calls.append(state)
        return real(fsm, state, vocab, eos_token_id)

    monkeypatch.setattr(lab, "allowed_tokens", counting)
    digits = lab.ranked_model(["7", None, "."], VOCAB)
    g = lab.constrained_generate("[0-9]+\\.[0-9]", VOCAB, EOS, digits, max_tokens=40)
    assert len(g.token_ids) == 40, f"the digit lover runs to max_tokens=40; got {len(g.token_ids)} tokens"
    assert len(calls) == 2, (
        f"40 steps visit 2 distinct states (the start, then the [0-9]+ loop), so allowed_tokens should run "
        f"twice; it ran {len(calls)} times: keep the masks in a dict keyed by state and reuse them"
    )
    assert g.mask_computations == 2, f"mask_computations counts those calls: 2, got {g.mask_computations}"


def test_eos_only_when_accepting():
    quitter = lab.ranked_model([None, "5", "4"], VOCAB)
    g = lab.constrained_generate("[0-9]+", VOCAB, EOS, quitter, max_tokens=5)
    assert g.token_ids == [tid("5"), EOS] and g.text == "5", (
        f"a model wanting to stop at once must first emit a digit, then may stop; got {g.token_ids}"
    )
    fsm = lab.compile_pattern("ab")
    for state, eos in [(0, False), (1, False), (2, True)]:
        assert lab.allowed_tokens(fsm, state, VOCAB, EOS)[EOS] == eos, f"EOS in state {state} should be {eos}"


def test_max_tokens_boundary_counts_eos():
    model = lab.ranked_model([None, "a", "b"], VOCAB)
    exact = lab.constrained_generate("ab", VOCAB, EOS, model, max_tokens=3)
    assert exact.finish_reason == "stop" and exact.token_ids == [tid("a"), tid("b"), EOS]
    short = lab.constrained_generate("ab", VOCAB, EOS, model, max_tokens=2)
    assert short.finish_reason == "length" and short.text == "ab", (
        "with max_tokens=2 the text 'ab' is complete but EOS never fits: EOS is a token and counts"
    )


def test_ties_pick_lowest_id_and_special_tokens_never_allowed():
    vocab = ["a", None, "b", None]
    g = lab.constrained_generate("[ab]+", vocab, 3, lambda out: np.zeros(4), max_tokens=3)
    assert g.token_ids == [0, 0, 0], "ties go to the lowest id (np.argmax); special token 1 is never legal"
    fsm = lab.compile_pattern("[ab]+")
    assert lab.allowed_tokens(fsm, 1, vocab, 3).tolist() == [True, False, True, True]


def test_empty_string_token_is_allowed_in_every_state():
    # A token with no characters cannot break the pattern: "all its characters survive" holds vacuously.
    # Only None marks a special token; "" is an ordinary (if odd) token that some tokenizers have.
    vocab = ["a", "", None, "b"]
    fsm = lab.compile_pattern("ab")
    for state in range(fsm.num_states):
        got = lab.allowed_tokens(fsm, state, vocab, 2)
        assert got[1], (
            f"allowed_tokens(state {state}) bans the empty-string token 1: it has no characters to die on, so it "
            f"is allowed in every state; test for a special token with 'text is None', not with 'not text'"
        )


def test_documented_errors():
    model = lab.ranked_model(["a"], VOCAB)
    # The type is the contract; the message must carry the offending value or name it, in any words.
    with pytest.raises(ValueError, match="max_tokens|0"):
        lab.constrained_generate("a", VOCAB, EOS, model, max_tokens=0)
    with pytest.raises(ValueError, match="(?i)eos|None|0"):
        lab.constrained_generate("a", VOCAB, 0, model, max_tokens=3)
    with pytest.raises(ValueError, match="shape|3"):
        lab.constrained_generate("a", VOCAB, EOS, lambda out: np.zeros(3), max_tokens=3)
    with pytest.raises(ValueError, match="0"):  # the character both atoms match
        lab.compile_pattern("[0-9]+0")


@pytest.mark.parametrize("pattern", ["[0-9]+[0-9]+", "a+[ab]+", "[a-c]+b+x"])
def test_plus_clash_is_refused_when_the_next_atom_also_repeats(pattern):
    try:
        fsm = lab.compile_pattern(pattern)
    except ValueError:
        return
    pytest.fail(f"compile_pattern({pattern!r}) built {fsm.num_states} states: a '+' atom and the next atom share a "
                "character, and the next atom's own '+' does not change that (one character, two next states). "
                "Check the clash whether or not the next atom repeats")


@pytest.mark.parametrize("pattern", [HEX, "[0-9]+\\.[0-9]", "a+b+c", "[a-f]x+[0-9]", "\\.q@+"])
def test_agrees_with_mini_vllm_grammar(pattern):
    from mini_vllm.grammar import GrammarCompiler, Vocab

    mine = lab.compile_pattern(pattern)
    engine = GrammarCompiler(Vocab(tuple(VOCAB), EOS)).compile_grammar("regex", pattern)
    rng = np.random.default_rng(0)
    for _ in range(30):
        state, text = 0, ""
        for _step in range(12):
            want = engine.allowed_token_mask()
            got = lab.allowed_tokens(mine, state, VOCAB, EOS)
            assert (got == want).all(), (
                f"{pattern!r} after {text!r}: your mask {sorted(shown(got))} differs from mini_vllm.grammar's "
                f"{sorted(shown(want))}"
            )
            tok = int(rng.choice(np.flatnonzero(want)))
            if tok == EOS:
                break
            engine.accept_tokens("r", [tok])
            state, text = lab.advance(mine, state, VOCAB[tok]), text + VOCAB[tok]
        engine.reset()
