"""Lab 12-03 starter: the consumer's side of structured outputs, checked against the real vLLM.

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
from typing import Any

SUPPORTED_KEYWORDS = frozenset({
    "type", "properties", "required", "additionalProperties", "items", "minItems", "maxItems",
    "minLength", "maxLength", "minimum", "maximum", "enum",
})
TYPES = ("object", "array", "string", "integer", "number", "boolean", "null")
VERDICTS = ("ok", "truncated", "unparseable", "invalid")


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


def parse_strict(text: str) -> Any:
    """Parse ``text`` as one JSON document, refusing what a strict consumer refuses (ValueError)."""
    raise NotImplementedError(
        "json.loads(text, parse_constant=..., parse_float=...) does most of it: make parse_constant raise "
        "ValueError for NaN/Infinity/-Infinity, make parse_float raise when float(s) is not finite (1e400), "
        "then walk the result and try s.encode('utf-8') on every string, keys included (lone surrogates fail)"
    )


def validate(value: Any, schema: dict[str, Any]) -> list[str]:
    """The errors of ``value`` (parsed JSON) against ``schema``; ``[]`` means valid.

    Raises ValueError for a keyword outside ``SUPPORTED_KEYWORDS`` anywhere in the schema.
    """
    raise NotImplementedError(
        "first walk the whole schema (properties, items) and raise ValueError(\"unsupported schema keyword 'k'\"); "
        "then recurse over the value with a path ('$', '$.key', '$[i]'): a type mismatch is one error and stops "
        "that node (bool is not integer, 36.0 is not integer); enum by JSON equality; inclusive bounds, lengths in "
        "code points (len of the str); required keys first, then "
        "members in document order (additionalProperties false refuses unknown keys); array items in order"
    )


def check_output(text: str, finish_reason: str, constraint: dict[str, Any]) -> str:
    """The verdict on one finished structured request: ``"ok"``, ``"truncated"``, ``"unparseable"`` or ``"invalid"``.

    ``constraint`` has exactly one key among ``json`` / ``regex`` / ``choice``; ``finish_reason``
    is ``"stop"`` or ``"length"``. Anything else is a ValueError.
    """
    raise NotImplementedError(
        "validate the arguments (ValueError), then: 'length' -> 'truncated' whatever the text; regex -> "
        "re.fullmatch; choice -> membership; json -> parse_strict (ValueError -> 'unparseable'), then validate"
    )


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
