"""The real vLLM 0.22.1 Scheduler + StructuredOutputManager + xgrammar on CPU, random logits as the model.

The run itself (a tiny byte-level BPE, the real scheduler, seeded random logits, argmax, grammars
compiled synchronously) lives in ``mini_vllm/testing/real_structured_output.py``, shared with
Phase 12's lab 03: ``standard_run()`` is computed once per process.

What it shows: every request that stops satisfies its constraint, the JSON requests that hit
``max_tokens`` are the truncation hole (``finish_reason`` length, not parseable), and for the
regex request ``mini_vllm.grammar`` computes the same allowed-token set as the real bitmask row
at every step.
"""

import json
import re

import numpy as np
import pytest

from mini_vllm.grammar import GrammarCompiler, Vocab, unpack_bitmask

pytestmark = [
    pytest.mark.upstream,
    # vLLM passes max_rollback_tokens; xgrammar 0.2.8 ignores it (history is unlimited) and warns
    pytest.mark.filterwarnings("ignore:max_rollback_tokens is deprecated:DeprecationWarning"),
]

REGEX = "(yes|no) [0-9][0-9]"
CHOICES = ["red", "green", "blue"]


@pytest.fixture(scope="module")
def run():
    pytest.importorskip("xgrammar")
    pytest.importorskip("lmformatenforcer")  # SamplingParams._validate_structured_outputs imports it
    real = pytest.importorskip("mini_vllm.testing.real_structured_output")
    assert real.STANDARD_REQUESTS["regex"] == {"regex": REGEX} and real.STANDARD_REQUESTS["choice"] == {"choice": CHOICES}
    r = real.standard_run()
    return {"tok": r.tokenizer, "V": r.vocab_size, "texts": r.texts, "tokens": r.tokens, "finish": r.finish,
            "regex_rows": r.rows["regex"], "max_tokens": real.STANDARD_MAX_TOKENS}


def test_regex_and_choice_outputs_satisfy_their_constraint(run):
    assert run["finish"]["regex"] == "stop" and re.fullmatch(REGEX, run["texts"]["regex"]), run["texts"]["regex"]
    assert run["finish"]["choice"] == "stop" and run["texts"]["choice"] in CHOICES, run["texts"]["choice"]


def test_stopped_json_parses_and_truncated_json_is_the_length_hole(run):
    stopped = [rid for rid in run["texts"] if rid.startswith("json") and run["finish"][rid] == "stop"]
    truncated = [rid for rid in run["texts"] if rid.startswith("json") and run["finish"][rid] == "length"]
    assert stopped and truncated, f"seed 0 gives both endings with max_tokens={run['max_tokens']}: {run['finish']}"
    for rid in stopped:
        doc = json.loads(run["texts"][rid])  # strict: no raw control characters inside strings
        assert isinstance(doc["name"], str) and isinstance(doc["age"], int), doc
    for rid in truncated:
        assert len(run["tokens"][rid]) == run["max_tokens"]
        with pytest.raises(json.JSONDecodeError):
            json.loads(run["texts"][rid])


def test_mini_grammar_matches_the_real_bitmask_row_every_step(run):
    tok, V = run["tok"], run["V"]
    special = set(tok.all_special_ids)
    vocab = Vocab(tuple(None if i in special else tok.decode([i]) for i in range(V)), tok.eos_token_id)
    mine = GrammarCompiler(vocab).compile_grammar("regex", REGEX)
    assert len(run["regex_rows"]) >= 3, "the regex request samples at least 3 times (multi-character tokens)"
    for so_far, row in run["regex_rows"]:
        mine.reset()
        assert mine.accept_tokens("regex", so_far)
        want = unpack_bitmask(row, V)
        got = mine.allowed_token_mask()
        diff = np.flatnonzero(want != got)
        assert diff.size == 0, f"after {tok.decode(so_far)!r}: tokens {[tok.decode([i]) for i in diff]} differ"
