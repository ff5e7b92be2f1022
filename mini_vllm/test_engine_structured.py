"""Phase 12 in the engine: a per-request grammar masks the logits before sampling and advances with each token."""

import json
import re

import numpy as np
import pytest

from mini_vllm import LLMEngine, SamplingParams, StructuredOutputsParams, ToyModel
from mini_vllm.grammar import GrammarCompiler, byte_vocab, unpack_bitmask

EOS = 256
REGEX = r"-?[0-9]+(\.[0-9]+)?"
SHORT = r"[a-c]+(x|yz)"
NON_ASCII = r"(café|naïve) [α-ω]+"
CHOICES = ["yes", "no", "maybe so"]


def so(**kw):
    return StructuredOutputsParams(**kw)


def grammar_for(constraint):
    kind, spec = constraint.kind_and_spec
    return GrammarCompiler(byte_vocab()).compile_grammar(kind, list(spec) if kind == "choice" else spec)


def text_of(token_ids, errors="strict"):
    """The UTF-8 text of the output bytes (a cut output may stop mid-character: pass "replace")."""
    return bytes(t for t in token_ids if t != EOS).decode("utf-8", errors=errors)


def satisfies(constraint, text):
    if constraint.regex is not None:
        return re.fullmatch(constraint.regex, text) is not None
    if constraint.choice is not None:
        return text in constraint.choice
    try:
        return isinstance(json.loads(text), dict)
    except ValueError:
        return False


@pytest.mark.parametrize(
    ("make", "error", "match"),
    [
        (lambda: so(), ValueError, "exactly one"),
        (lambda: so(regex="a", choice=["a"]), ValueError, "exactly one"),
        (lambda: so(choice=[]), ValueError, "non-empty list"),
        (lambda: so(choice=["a", ""]), ValueError, "non-empty strings"),
        (lambda: so(choice="ab"), TypeError, "list of strings"),
        (lambda: so(json_object=False), ValueError, "must be True"),
        (lambda: so(regex=3), TypeError, "regex must be a str"),
        (lambda: SamplingParams(structured_outputs={"regex": "a"}), TypeError, "StructuredOutputsParams"),
        (lambda: SamplingParams(ignore_eos=True, structured_outputs=so(regex="a")), ValueError, "ignore_eos"),
        (lambda: SamplingParams(min_tokens=2, structured_outputs=so(regex="a+")), ValueError, "min_tokens"),
    ],
)
def test_bad_structured_output_requests_are_refused(make, error, match):
    with pytest.raises(error, match=match):
        make()


def test_a_bad_regex_queues_nothing():
    engine = LLMEngine()
    good = SamplingParams(structured_outputs=so(regex="a+"))
    bad = SamplingParams(structured_outputs=so(regex="a{2}"))
    with pytest.raises(ValueError, match="outside the supported subset"):
        engine.add_request("x", bad)
    with pytest.raises(ValueError, match="outside the supported subset"):
        engine.generate(["x", "y"], [good, bad])
    assert not engine.has_unfinished_requests() and not engine.structured_output_manager.grammars
    assert engine.add_request("x") == "req-0", "a refused request takes no id"


@pytest.mark.parametrize("constraint", [so(regex=REGEX), so(regex=SHORT), so(choice=CHOICES), so(json_object=True)])
def test_greedy_tokens_are_the_best_allowed_token_at_every_step(constraint):
    """The prediction: at each position, the argmax of the toy model's logits over the grammar's allowed set."""
    prompt = list(b"answer: ")
    model, grammar, tokens, want = ToyModel(vocab_size=257), grammar_for(constraint), list(prompt), []
    while len(want) < 30 and not grammar.is_terminated():
        logits = model.forward(np.array([tokens[-1]]), np.array([len(tokens) - 1]))[0]
        allowed = grammar.allowed_token_mask()
        assert allowed[EOS] == grammar.is_accepting(), "EOS is legal exactly in an accepting state"
        tok = int(np.argmax(np.where(allowed, logits, -np.inf)))
        grammar.accept_tokens("", [tok])
        want.append(tok)
        tokens.append(tok)
    (out,) = LLMEngine().generate([prompt], SamplingParams(max_tokens=30, temperature=0, structured_outputs=constraint))
    assert out.token_ids == want, "mask the logits with the request's grammar, then advance it with the token"


def test_the_bitmask_has_ceil_v_over_32_words_and_eos_only_in_accepting_states():
    engine = LLMEngine()
    manager = engine.structured_output_manager
    fill = manager.grammar_bitmask
    seen = []

    def spy(grammars, spec_tokens=None):
        bitmask = fill(grammars, spec_tokens)
        assert bitmask.dtype == np.int32 and bitmask.shape == (len(grammars), 9), "257 tokens -> 9 int32 words a row"
        allowed = unpack_bitmask(bitmask, 257)
        for g, row in zip(grammars, allowed):
            assert row[EOS] == g.is_accepting(), "EOS may be sampled only where the grammar accepts"
            assert row.sum() == g.allowed_token_mask().sum()
        seen.append(len(grammars))
        return bitmask

    manager.grammar_bitmask = spy
    params = [
        SamplingParams(max_tokens=12, temperature=1.0, structured_outputs=so(regex=REGEX)),
        SamplingParams(max_tokens=12, temperature=1.0),
        SamplingParams(max_tokens=12, temperature=1.0, structured_outputs=so(choice=CHOICES)),
    ]
    engine.generate(["p1", "p2", "p3"], params)
    assert seen and max(seen) == 2, "one bitmask row per constrained request that samples, none for the others"
    assert not manager.grammars, "finished requests give their grammars back"


def test_outputs_always_satisfy_their_grammar_over_random_seeds():
    constraints = [so(regex=REGEX), so(regex=SHORT), so(choice=CHOICES), so(json_object=True), so(regex=NON_ASCII)]
    stops = dict.fromkeys(range(len(constraints)), 0)
    for seed in range(12):
        params = [SamplingParams(max_tokens=40, temperature=1.3, top_p=0.95, structured_outputs=c) for c in constraints]
        params.append(SamplingParams(max_tokens=20, temperature=1.0))  # an unconstrained companion
        prompts = ["number: ", "letters: ", "answer: ", "json: ", "greek: ", "free text: "]
        outs = LLMEngine(seed=seed, max_num_batched_tokens=8).generate(prompts, params)
        for k, (c, out) in enumerate(zip(constraints, outs)):
            text = text_of(out.token_ids, "strict" if out.finish_reason == "stop" else "replace")
            if out.finish_reason == "stop":
                stops[k] += 1
                assert out.token_ids[-1] == EOS and satisfies(c, text), (
                    f"seed {seed}: {c} stopped with {text!r}, which does not satisfy it"
                )
            else:
                legal = grammar_for(c).validate_tokens(out.token_ids)
                assert legal == out.token_ids, f"seed {seed}: {c} produced an illegal prefix {text!r}"
    assert all(stops.values()), f"each grammar must finish by EOS at some seed, or the property is vacuous: {stops}"


def test_grammar_rows_do_not_leak_into_companions_and_seeds_stay_batch_invariant():
    constrained = SamplingParams(max_tokens=16, temperature=1.0, seed=5, structured_outputs=so(regex=SHORT))
    free = SamplingParams(max_tokens=16, temperature=1.0, seed=9)
    (c_alone,) = LLMEngine().generate(["c"], constrained)
    (f_alone,) = LLMEngine().generate(["f"], free)
    for order in (["f", "c", "f"], ["c", "f", "f"], ["f", "f", "c"]):
        params = [constrained if p == "c" else free for p in order]
        outs = LLMEngine().generate(order, params)
        for p, out in zip(order, outs):
            want = c_alone if p == "c" else f_alone
            assert out.token_ids == want.token_ids, (
                f"order {order}: apply each constrained request's bitmask row to its own logits row only"
            )


def test_abort_frees_the_grammar_and_drafts_are_validated_without_advancing():
    engine = LLMEngine()
    rid = engine.add_request("x", SamplingParams(max_tokens=8, structured_outputs=so(choice=CHOICES)))
    manager = engine.structured_output_manager
    assert manager.should_advance(rid)
    assert manager.validate_draft_tokens(rid, list(b"mayq")) == list(b"may"), "the longest legal prefix of the drafts"
    assert manager.validate_draft_tokens(rid, list(b"no") + [EOS]) == list(b"no") + [EOS]
    assert manager.grammars[rid].num_processed_tokens == 0, "validating drafts never advances the grammar"
    assert manager.validate_draft_tokens("not-constrained", [1, 2]) == [1, 2]
    engine.abort_request(rid)
    assert not manager.grammars, "an aborted request gives its grammar back"


def test_a_non_ascii_pattern_is_matched_in_utf8_bytes():
    """The tokenizer's ids are UTF-8 bytes, so ``café`` must allow 0xC3 then 0xA9 after ``caf``
    (read as Latin-1 characters, 0xE9 would be allowed instead and decode to U+FFFD)."""
    engine = LLMEngine()
    (out,) = engine.generate(["x"], SamplingParams(max_tokens=10, temperature=0, structured_outputs=so(regex="café")))
    assert out.text == "café" and out.finish_reason == "stop", f"got {out.text!r} ({out.finish_reason})"
    assert out.token_ids == [*"café".encode(), EOS], f"the bytes of café, then EOS; got {out.token_ids}"
    g = grammar_for(so(choice=["日本", "中文"]))
    assert np.flatnonzero(g.allowed_token_mask()).tolist() == [0xE4, 0xE6], "the lead bytes of 中 and 日"
