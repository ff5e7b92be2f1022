"""Lab 12-03 reference: the consumer's side of structured outputs, checked against the real vLLM.

The engine guarantees that every token satisfies the compiled grammar. The program that reads
the output still has to decide whether to trust it. Three functions do that:

* ``parse_strict(text)``: parse a JSON document the way a strict consumer does. Python's
  ``json.loads`` already refuses raw control characters inside strings; on top of it this
  refuses the literals ``NaN`` / ``Infinity`` / ``-Infinity`` (not JSON), numbers that
  overflow a double (``1e400`` would become ``inf``), and lone UTF-16 surrogates in strings or
  keys (``"\\ud800"`` parses in Python but cannot be encoded as UTF-8). Each refusal is a
  ``ValueError``.
* ``validate(value, schema)``: the errors (a list of strings, each starting with a JSON path
  such as ``$.tags[1]``) of a parsed value against a JSON-schema subset: ``type`` (object,
  array, string, integer, number, boolean, null), ``properties``, ``required``,
  ``additionalProperties`` (a boolean), ``items``, ``minItems`` / ``maxItems``,
  ``minLength`` / ``maxLength`` (code points), ``minimum`` / ``maximum`` (inclusive) and
  ``enum`` (JSON equality: ``true`` is not ``1``). Any other keyword anywhere in the schema is a
  ``ValueError`` before anything is checked. ``integer`` means a parsed ``int`` (``1.0`` parses
  as a float, and the grammar never emits it for an integer).
* ``check_output(text, finish_reason, constraint)``: one verdict per finished request:
  ``"truncated"`` (``finish_reason == "length"``, whatever the text), ``"unparseable"``,
  ``"invalid"`` (parses but breaks the constraint) or ``"ok"``. ``constraint`` holds exactly one
  of ``json`` (a schema), ``regex`` or ``choice``, like ``StructuredOutputsParams``.

``main()`` runs the real vLLM 0.22.1 scheduler, ``StructuredOutputManager`` and xgrammar on CPU
(random logits as the model; ``mini_vllm/testing/real_structured_output.py``) and prints each
request's text and verdict.

Run it: ``python phase-12-structured-outputs/labs/lab-03-json-schema-constrained/solution.py``
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

SUPPORTED_KEYWORDS = frozenset({
    "type", "properties", "required", "additionalProperties", "items", "minItems", "maxItems",
    "minLength", "maxLength", "minimum", "maximum", "enum",
})
TYPES = ("object", "array", "string", "integer", "number", "boolean", "null")
VERDICTS = ("ok", "truncated", "unparseable", "invalid")


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON (Python's json.loads accepts it, a strict consumer does not)")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"the number {text} overflows a double (it would become {value})")
    return value


def _check_strings(value: Any) -> None:
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise ValueError(f"lone surrogate in string {value!r}: not encodable as UTF-8") from None
    elif isinstance(value, list):
        for item in value:
            _check_strings(item)
    elif isinstance(value, dict):
        for key, item in value.items():
            _check_strings(key)
            _check_strings(item)


def parse_strict(text: str) -> Any:
    """Parse ``text`` as one JSON document, refusing what a strict consumer refuses (ValueError)."""
    value = json.loads(text, parse_constant=_reject_constant, parse_float=_finite_float)
    _check_strings(value)
    return value


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    raise TypeError(f"not a parsed JSON value: {type(value).__name__}")


def _is_type(value: Any, name: str) -> bool:
    t = _json_type(value)
    return t == name or (name == "number" and t == "integer")


def _json_equal(a: Any, b: Any) -> bool:
    ta, tb = _json_type(a), _json_type(b)
    if {ta, tb} <= {"integer", "number"}:
        return a == b
    if ta != tb:
        return False
    if ta == "array":
        return len(a) == len(b) and all(_json_equal(x, y) for x, y in zip(a, b, strict=True))
    if ta == "object":
        return a.keys() == b.keys() and all(_json_equal(a[k], b[k]) for k in a)
    return a == b


def _check_schema(schema: Any, where: str) -> None:
    if not isinstance(schema, dict):
        raise ValueError(f"schema at {where} must be a dict, got {type(schema).__name__}")
    for key in schema:
        if key not in SUPPORTED_KEYWORDS:
            raise ValueError(f"unsupported schema keyword {key!r} at {where}")
    if "type" in schema and schema["type"] not in TYPES:
        raise ValueError(f"unknown type {schema['type']!r} at {where}")
    for name, sub in schema.get("properties", {}).items():
        _check_schema(sub, f"{where}.properties.{name}")
    if "items" in schema:
        _check_schema(schema["items"], f"{where}.items")


def _validate(value: Any, schema: dict[str, Any], path: str, errors: list[str]) -> None:
    if "type" in schema and not _is_type(value, schema["type"]):
        errors.append(f"{path}: expected {schema['type']}, got {_json_type(value)}")
        return
    if "enum" in schema and not any(_json_equal(value, e) for e in schema["enum"]):
        errors.append(f"{path}: {value!r} is not one of {schema['enum']}")
    kind = _json_type(value)
    if kind in ("integer", "number"):
        if "minimum" in schema and value < schema["minimum"]:
            errors.append(f"{path}: {value} < minimum {schema['minimum']}")
        if "maximum" in schema and value > schema["maximum"]:
            errors.append(f"{path}: {value} > maximum {schema['maximum']}")
    elif kind == "string":
        if "minLength" in schema and len(value) < schema["minLength"]:
            errors.append(f"{path}: length {len(value)} < minLength {schema['minLength']}")
        if "maxLength" in schema and len(value) > schema["maxLength"]:
            errors.append(f"{path}: length {len(value)} > maxLength {schema['maxLength']}")
    elif kind == "array":
        if "minItems" in schema and len(value) < schema["minItems"]:
            errors.append(f"{path}: {len(value)} items < minItems {schema['minItems']}")
        if "maxItems" in schema and len(value) > schema["maxItems"]:
            errors.append(f"{path}: {len(value)} items > maxItems {schema['maxItems']}")
        if "items" in schema:
            for i, item in enumerate(value):
                _validate(item, schema["items"], f"{path}[{i}]", errors)
    elif kind == "object":
        properties = schema.get("properties", {})
        for key in schema.get("required", []):
            if key not in value:
                errors.append(f"{path}: missing required key {key!r}")
        for key, item in value.items():
            if key in properties:
                _validate(item, properties[key], f"{path}.{key}", errors)
            elif schema.get("additionalProperties", True) is False:
                errors.append(f"{path}: unexpected key {key!r}")


def validate(value: Any, schema: dict[str, Any]) -> list[str]:
    """The errors of ``value`` (parsed JSON) against ``schema``; ``[]`` means valid.

    Raises ValueError for a keyword outside ``SUPPORTED_KEYWORDS`` anywhere in the schema.
    """
    _check_schema(schema, "$")
    errors: list[str] = []
    _validate(value, schema, "$", errors)
    return errors


def check_output(text: str, finish_reason: str, constraint: dict[str, Any]) -> str:
    """The verdict on one finished structured request: ``"ok"``, ``"truncated"``, ``"unparseable"`` or ``"invalid"``.

    ``constraint`` has exactly one key among ``json`` / ``regex`` / ``choice``; ``finish_reason``
    is ``"stop"`` or ``"length"``. Anything else is a ValueError.
    """
    kinds = [k for k in ("json", "regex", "choice") if constraint.get(k) is not None]
    if len(kinds) != 1 or len(constraint) != 1:
        raise ValueError(f"constraint must set exactly one of json, regex, choice; got {sorted(constraint)}")
    if finish_reason not in ("stop", "length"):
        raise ValueError(f"finish_reason must be 'stop' or 'length', got {finish_reason!r}")
    if finish_reason == "length":
        return "truncated"
    kind, spec = kinds[0], constraint[kinds[0]]
    if kind == "regex":
        return "ok" if re.fullmatch(spec, text) else "invalid"
    if kind == "choice":
        return "ok" if text in spec else "invalid"
    try:
        value = parse_strict(text)
    except ValueError:
        return "unparseable"
    return "invalid" if validate(value, spec) else "ok"


def main() -> None:
    from mini_vllm.testing import real_structured_output as real

    run = real.standard_run()
    print(f"real vLLM 0.22.1 scheduler + xgrammar on CPU, random logits, greedy, max_tokens={real.STANDARD_MAX_TOKENS}, "
          f"{run.steps} steps")
    counts = dict.fromkeys(VERDICTS, 0)
    for rid, constraint in real.STANDARD_REQUESTS.items():
        verdict = check_output(run.texts[rid], run.finish[rid], constraint)
        counts[verdict] += 1
        text = run.texts[rid]
        shown = repr(text if len(text) <= 48 else text[:45] + "...")
        print(f"  {rid:<9} {run.finish[rid]:<6} {verdict:<11} {shown}")
    print("verdicts: " + ", ".join(f"{v} {n}" for v, n in counts.items()))
    for rid in real.STANDARD_REQUESTS:
        if run.finish[rid] == "stop" and check_output(run.texts[rid], "stop", real.STANDARD_REQUESTS[rid]) == "unparseable":
            try:
                parse_strict(run.texts[rid])
            except ValueError as exc:
                print(f"{rid}: {exc}")
            lenient = json.loads(run.texts[rid], strict=False)
            print(f"  with raw control characters allowed it parses and validate() finds "
                  f"{len(validate(lenient, real.PROFILE_SCHEMA))} schema errors")


if __name__ == "__main__":
    main()
