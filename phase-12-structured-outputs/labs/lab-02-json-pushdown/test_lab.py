import json

import numpy as np
import pytest

from course.runtime import lab_module

lab = lab_module(__file__)   # solution.py by default; LAB_IMPL=starter grades starter.py

VALID = ["0", "7", "120", '{}', '{"a":1}', '{"a":0,"b":10}', '{"k_9":{}}', '{"a":{"b":{"c":3}},"d":0}',
         '{"a":{},"a":{}}', '{"x":{"y":{}},"z":{"w":5}}']
INVALID = ["{}}", '{"a":}', '{"a":1,}', "0123", "00", "", "{", '{"a":1', '{"a":1}}', '{a:1}', '{"a"1}',
           '{"A":1}', '{"":1}', '{"a":1"b":2}', "}", ",", '{,"a":1}', '{"a"::1}', '{"a":{}}}', "1}", "1,"]


def feed_all(m, text):
    for ch in text:
        m.feed(ch)
    return m


def live_prefix(text):
    m = lab.JsonMachine()
    try:
        feed_all(m, text)
    except ValueError:
        return False
    return True


def test_recognizes_valid_json():
    for text in VALID:
        m = feed_all(lab.JsonMachine(), text)
        assert m.accepting(), f"{text!r} is a complete document of the subset; the machine ends in mode {m.mode!r}"
        assert m.depth == 0, f"after {text!r} every object is closed, depth must be 0, got {m.depth}"
        json.loads(text)  # the subset really is JSON
        assert lab.accepts(text)


def test_rejects_invalid_json():
    for text in INVALID:
        assert not lab.accepts(text), (
            f"{text!r} must be rejected (a trailing comma, a missing value, an extra '}}', a leading zero, "
            f"an unquoted or empty or upper-case key...)"
        )


def test_illegal_feed_raises():
    m = feed_all(lab.JsonMachine(), '{"a":1')
    for ch in ['"', "{", ":", "a"]:
        with pytest.raises(ValueError, match="illegal"):
            m.feed(ch)
        assert (m.mode, m.depth) == ("int", 1), f"a refused {ch!r} must leave the machine unchanged"
    m.feed("}")
    with pytest.raises(ValueError, match="done"):
        m.feed("}")
    assert m.accepting() and m.depth == 0, "the refused extra '}' did not pop anything"
    with pytest.raises(ValueError, match="illegal"):
        lab.JsonMachine().feed("x")


# one prefix per mode (and both depths of the integer modes)
EVERY_MODE = [
    "",
    "1",
    "0",
    "{",
    '{"',
    '{"a',
    '{"a"',
    '{"a":',
    '{"a":1',
    '{"a":0',
    '{"a":{',
    '{"a":{}',
    '{"a":1,',
    '{"a":1}',
]


@pytest.mark.parametrize("prefix", EVERY_MODE)
def test_every_refused_character_leaves_the_machine_unchanged(prefix):
    m = feed_all(lab.JsonMachine(), prefix)
    before = (m.mode, m.depth)
    for ch in lab.ALPHABET:
        if ch in m.allowed():
            continue
        try:
            m.feed(ch)
        except ValueError:
            assert (m.mode, m.depth) == before, (
                f"after {prefix!r}, the refused {ch!r} changed the machine from {before} to {(m.mode, m.depth)}: "
                "check the character before switching mode or depth"
            )
            continue
        pytest.fail(
            f"after {prefix!r} (mode {before[0]!r}) feed accepted {ch!r}, which allowed() does not offer"
        )


@pytest.mark.parametrize("prefix", ["12", "0"])
@pytest.mark.parametrize("ch", [",", "}"])
def test_top_level_int_refuses_comma_and_close(prefix, ch):
    m = feed_all(lab.JsonMachine(), prefix)
    before = (m.mode, m.depth)
    try:
        m.feed(ch)
    except ValueError:
        assert (m.mode, m.depth) == before, f"the refused {ch!r} after {prefix!r} changed the machine to {(m.mode, m.depth)}"
        return
    pytest.fail(f"{ch!r} after the top-level integer {prefix!r} was accepted (now mode {m.mode!r}, depth {m.depth}): "
                "at depth 0 nothing may end an integer, so feed must raise before ending it")


def test_depth_is_the_stack():
    m = lab.JsonMachine()
    for level in range(1, 9):
        feed_all(m, '{"k":' if level < 8 else "{")
        assert m.depth == level, f"after opening {level} objects depth must be {level}, got {m.depth}"
    feed_all(m, '"z":0')
    for level in range(7, -1, -1):
        m.feed("}")
        assert m.depth == level, f"each '}}' pops one level: expected depth {level}, got {m.depth}"
        assert m.accepting() == (level == 0), "only the last '}' completes the document"
    assert m.mode == "done" and m.allowed() == frozenset(), "after the top-level object closes, only EOS is legal"


def test_int_end_depends_on_depth():
    top = feed_all(lab.JsonMachine(), "12")
    assert top.allowed() == set("0123456789") and top.accepting(), (
        "a top-level integer can only grow or end at EOS: no ',' or '}' at depth 0"
    )
    inner = feed_all(lab.JsonMachine(), '{"a":12')
    assert inner.allowed() == set("0123456789,}") and not inner.accepting(), (
        "inside an object an integer may be ended by ',' or '}', and EOS is illegal"
    )
    zero_top = feed_all(lab.JsonMachine(), "0")
    assert zero_top.allowed() == frozenset() and zero_top.accepting(), "after a top-level 0 nothing but EOS: no leading zeros"
    zero_in = feed_all(lab.JsonMachine(), '{"a":0')
    assert zero_in.allowed() == {",", "}"}, "after a nested 0 only ',' or '}'"


def test_comma_after_int_redispatches():
    m = feed_all(lab.JsonMachine(), '{"a":5')
    m.feed(",")
    assert m.mode == "obj_key" and m.depth == 1, (
        "',' in mode int ends the integer and is then read as the separator: expect mode obj_key"
    )
    m = feed_all(lab.JsonMachine(), '{"a":{"b":50')
    m.feed("}")
    assert m.mode == "comma_or_close" and m.depth == 1, "'}' after a nested int closes the inner object only"


def test_brace_hating_model_still_emits_valid_json():
    hater = lab.ranked_model([None, "}"], script='{"a":{"b":1')
    g = lab.constrained_generate(hater, max_tokens=40)
    assert g.finish_reason == "stop" and g.text == '{"a":{"b":1}}', (
        f"the model wants EOS after '{{\"a\":{{\"b\":1' and ranks '}}' last; EOS must stay illegal until both "
        f"objects close, so the output is '{{\"a\":{{\"b\":1}}}}'; got {g.text!r} ({g.finish_reason})"
    )
    assert json.loads(g.text) == {"a": {"b": 1}} and g.max_depth == 2


def test_fuzzed_preferences_always_parse_or_truncate_live():
    rng = np.random.default_rng(3)
    outcomes = {"stop": 0, "length": 0}
    for trial in range(50):
        ranking = list(rng.permutation(list(lab.ALPHABET)))
        ranking.insert(int(rng.integers(0, 8)), None)
        g = lab.constrained_generate(lab.ranked_model(ranking), max_tokens=30)
        outcomes[g.finish_reason] += 1
        if g.finish_reason == "stop":
            json.loads(g.text)  # a completed output must parse
            assert lab.accepts(g.text), f"trial {trial}: {g.text!r} stopped but the machine does not accept it"
        else:
            assert len(g.text) == 30 and live_prefix(g.text), (
                f"trial {trial}: truncated output {g.text!r} must be a live prefix (e.g. no '0123')"
            )
    assert outcomes["stop"] >= 5 and outcomes["length"] >= 5, f"seeded fuzz should see both endings: {outcomes}"


def test_truncation_caveat_brace_lover_never_closes():
    lover = lab.ranked_model(["{", '"', "a", ":", "}", None])
    for max_tokens in (5, 40):
        g = lab.constrained_generate(lover, max_tokens=max_tokens)
        assert g.finish_reason == "length" and g.max_depth > 0 and len(g.text) == max_tokens, (
            f"a '{{'-lover nests forever and hits max_tokens={max_tokens} with objects open; got {g}"
        )
        with pytest.raises(ValueError):
            json.loads(g.text)
    assert g.max_depth == 8, '40 characters of {"a": nest 8 deep'
    for max_tokens, depth in ((1, 1), (6, 2)):
        g = lab.constrained_generate(lover, max_tokens=max_tokens)
        assert g.max_depth == depth, (
            f"after {g.text!r} the depth is {depth}: update max_depth after feeding each token, so the "
            f"last '{{' counts too; got {g.max_depth}"
        )


def test_max_tokens_boundary_and_errors():
    model = lab.ranked_model([None], script="{}")
    assert lab.constrained_generate(model, 3) == ("{}", "stop", 1), "'{}' + EOS is exactly 3 tokens"
    short = lab.constrained_generate(model, 2)
    assert short.finish_reason == "length" and short.text == "{}", "EOS counts against max_tokens"
    flat = lab.constrained_generate(lambda out: np.zeros(len(lab.VOCAB)), 10)
    assert flat == ("0", "stop", 0), (
        f"with every logit tied the lowest legal id wins ('0', then only EOS is legal); got {flat}: take "
        "np.argmax of the masked logits, which picks the first maximum"
    )
    with pytest.raises(ValueError, match="max_tokens"):
        lab.constrained_generate(model, 0)
    with pytest.raises(ValueError, match="shape"):
        lab.constrained_generate(lambda out: np.zeros(3), 5)


def test_agrees_with_mini_vllm_grammar():
    from mini_vllm.grammar import JsonMachine

    rng = np.random.default_rng(1)
    engine = JsonMachine(top_level="any")
    for _ in range(60):
        m, state, text = lab.JsonMachine(), engine.start(), ""
        for _step in range(25):
            legal = sorted(m.allowed())
            if not legal:
                break
            ch = legal[int(rng.integers(len(legal)))]
            m.feed(ch)
            text += ch
            state = engine.step(state, ch)
            assert state is not None, f"{text!r} is live in your machine but dead in mini_vllm.grammar's"
            assert engine.is_accepting(state) == m.accepting(), f"accepting disagrees after {text!r}"
    for text in INVALID:
        if not lab.accepts(text) and engine.fullmatch(text):
            assert json.loads(text) is not None and ('""' in text or "A" in text), (
                f"{text!r}: only the subset's stricter keys may separate the two machines"
            )


def in_subset(text):
    """The subset written independently of the machine: ``json.loads`` plus the subset's rules."""
    import re

    def check(value):
        if isinstance(value, dict):
            return all(check(v) for v in value.values())
        return type(value) is int and value >= 0

    def pairs(items):
        if not all(re.fullmatch(r"[a-z0-9_]+", k) for k, _ in items):
            raise ValueError("key outside the subset")
        return dict(items)

    try:
        return check(json.loads(text, object_pairs_hook=pairs))
    except ValueError:
        return False


def test_every_allowed_character_can_be_fed_and_accepting_means_valid():
    # allowed() and feed() state one rule twice. Every text up to 8 characters reachable through
    # allowed() (with one digit, one key letter and every punctuation mark standing for their
    # classes): each allowed character must be accepted by feed(), and accepting() must hold exactly
    # when the text is a document of the subset (so '{""":1}' can never be reached and accepted)
    import copy

    reps = set('{}":,01a')
    frontier, seen = [(lab.JsonMachine(), "")], 0
    for _ in range(8):
        grown = []
        for m, text in frontier:
            for ch in sorted(m.allowed()):
                child = copy.deepcopy(m)
                try:
                    child.feed(ch)
                except ValueError as exc:
                    raise AssertionError(
                        f"allowed() after {text!r} offers {ch!r} but feed() refuses it ({exc}): one rule, two copies"
                    ) from None
                if ch not in reps:
                    continue
                seen += 1
                assert child.accepting() == in_subset(text + ch), (
                    f"accepting() is {child.accepting()} after {text + ch!r}, but the text "
                    f"{'is' if in_subset(text + ch) else 'is not'} a document of the subset: allowed() offered "
                    "a character its transitions do not handle as that mode should"
                )
                grown.append((child, text + ch))
        frontier = grown
    assert seen > 500, f"only {seen} texts explored: is allowed() too narrow?"
