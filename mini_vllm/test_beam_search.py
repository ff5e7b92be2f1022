"""Beam search over the engine: the score, the parameters, and the result against brute force."""

import itertools
import math

import numpy as np
import pytest

from mini_vllm import LLMEngine
from mini_vllm.beam_search import BeamSearchOutput, beam_search, get_beam_search_score
from mini_vllm.model import ToyModel
from mini_vllm.sampling_params import BeamSearchParams

EOS = 256
MODEL = ToyModel(vocab_size=257)  # the engine's model: fixed weights


def logprobs(tokens):
    """The next-token log-probabilities after ``tokens``, straight from the model (test's own softmax)."""
    logits = MODEL.forward(np.array([tokens[-1]]), np.array([len(tokens) - 1]))[0]
    shifted = logits - logits.max()
    return shifted - np.log(np.exp(shifted).sum())


def score(tokens, cum, length_penalty):
    n = len(tokens) - (tokens[-1] == EOS)
    return cum / n**length_penalty


@pytest.mark.parametrize(
    ("tokens", "cum", "lp", "want"),
    [
        ([5, 6, 7], -3.0, 1.0, -1.0),
        ([5, 6, EOS], -3.0, 1.0, -1.5),  # a final EOS does not count
        ([5, EOS, 7], -3.0, 1.0, -1.0),  # an EOS elsewhere does
        ([5, 6, 7], -3.0, 2.0, -3.0 / 9),
        ([5, 6, 7], -3.0, 0.0, -3.0),  # no length normalisation: the raw log-probability
        ([5, 6, 7, 8], -2.0, 0.5, -1.0),
    ],
)
def test_score_divides_by_length_to_the_penalty(tokens, cum, lp, want):
    assert get_beam_search_score(tokens, cum, EOS, lp) == pytest.approx(want, rel=1e-12)


@pytest.mark.parametrize(
    ("kwargs", "exc", "match"),
    [
        ({"beam_width": 0, "max_tokens": 2}, ValueError, "beam_width must be at least 1"),
        ({"beam_width": 2, "max_tokens": 0}, ValueError, "max_tokens must be at least 1"),
        ({"beam_width": 2.0, "max_tokens": 2}, TypeError, "beam_width must be an int"),
        ({"beam_width": True, "max_tokens": 2}, TypeError, "beam_width must be an int"),
        ({"beam_width": 2, "max_tokens": 2, "ignore_eos": 1}, TypeError, "ignore_eos must be a bool"),
        ({"beam_width": 2, "max_tokens": 2, "temperature": -0.5}, ValueError, "temperature must be >= 0"),
        ({"beam_width": 2, "max_tokens": 2, "length_penalty": math.nan}, ValueError, "length_penalty must be finite"),
        ({"beam_width": 2, "max_tokens": 2, "length_penalty": "1"}, TypeError, "length_penalty must be a float"),
    ],
)
def test_beam_search_params_are_validated(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        BeamSearchParams(**kwargs)


def brute_force(prompt, width, lp):
    """Every sequence of up to 2 tokens, ranked by score: [EOS] and [a, b] for every a != EOS."""
    first = logprobs(prompt)
    rows = MODEL.forward(np.arange(257), np.full(257, len(prompt)))  # the row after each first token
    rows = rows - rows.max(axis=1, keepdims=True)
    rows = rows - np.log(np.exp(rows).sum(axis=1, keepdims=True))
    cum = np.concatenate([[first[EOS]], (first[:EOS, None] + rows[:EOS]).ravel()])
    seqs = [[*prompt, EOS]] + [[*prompt, a, b] for a in range(EOS) for b in range(257)]
    lengths = np.array([len(s) - (s[-1] == EOS) for s in seqs], dtype=float)
    best = np.argsort(-(cum / lengths**lp), kind="stable")[:width]
    return [(seqs[i], float(cum[i])) for i in best]


def test_wide_beams_equal_brute_force_enumeration():
    # 2 * width >= the vocabulary: every token is a candidate, and width keeps every live beam of
    # step 1, so beam search must return the exact best `width` of all sequences up to 2 tokens.
    prompt, width, lp = [104, 105], 256, 0.5
    (out,) = LLMEngine().beam_search([prompt], BeamSearchParams(beam_width=width, max_tokens=2, length_penalty=lp))
    want = brute_force(prompt, width, lp)
    assert [s.tokens for s in out.sequences] == [w[0] for w in want], "not the best sequences by score, best first"
    np.testing.assert_allclose([s.cum_logprob for s in out.sequences], [w[1] for w in want], rtol=1e-12)


def reference(prompt, width, max_tokens, lp, ignore_eos):
    """The algorithm in plain words: 2 * width candidates per beam, EOS set aside, width best live on."""
    beams, done = [(list(prompt), 0.0)], []

    def key(b):
        return score(b[0], b[1], lp)

    for _ in range(max_tokens):
        if not beams:
            break
        cands = []
        for tokens, cum in beams:
            row = logprobs(tokens)
            for tok in np.argsort(-row, kind="stable")[: 2 * width]:
                new = (tokens + [int(tok)], cum + float(row[tok]))
                (done if tok == EOS and not ignore_eos else cands).append(new)
        beams = sorted(cands, key=key, reverse=True)[:width]
    return sorted(done + beams, key=key, reverse=True)[:width]


@pytest.mark.parametrize(("width", "lp", "ignore_eos"), list(itertools.product([1, 2, 3], [1.0, 2.0], [False, True])))
def test_narrow_beams_equal_the_reference_for_each_prompt_of_a_batch(width, lp, ignore_eos):
    prompts = ["hi", "the fox", [7, 250, 3]]
    params = BeamSearchParams(beam_width=width, max_tokens=3, length_penalty=lp, ignore_eos=ignore_eos)
    eng = LLMEngine()
    outs = eng.beam_search(prompts, params)
    assert all(isinstance(o, BeamSearchOutput) for o in outs) and len(outs) == 3
    for prompt, out in zip(prompts, outs):
        ids = list(prompt.encode()) if isinstance(prompt, str) else prompt
        want = reference(ids, width, 3, lp, ignore_eos)
        assert [s.tokens for s in out.sequences] == [w[0] for w in want], f"prompt {prompt!r}: wrong beams"
        np.testing.assert_allclose([s.cum_logprob for s in out.sequences], [w[1] for w in want], rtol=1e-12)
        assert [s.text for s in out.sequences] == [eng.tokenizer.decode(w[0]) for w in want]


# prompts after which EOS is the likeliest next token (the row depends on last token and position only)
EOS_PROMPTS = [[t] for t in range(256) if np.argmax(logprobs([t])) == EOS][:3]


@pytest.mark.parametrize(("width", "lp"), list(itertools.product([1, 2, 3], [0.0, 1.0, 2.0])))
def test_eos_candidates_are_set_aside_and_live_beams_go_on(width, lp):
    # EOS tops each beam's first candidates: it is filed as finished and the next 2 * width - 1 compete on
    eng = LLMEngine()
    assert len(EOS_PROMPTS) == 3, "the toy model changed: pick other prompts where EOS is the argmax"
    outs = eng.beam_search(EOS_PROMPTS, BeamSearchParams(beam_width=width, max_tokens=3, length_penalty=lp))
    for prompt, out in zip(EOS_PROMPTS, outs):
        want = reference(prompt, width, 3, lp, False)
        assert [s.tokens for s in out.sequences] == [w[0] for w in want], (
            f"prompt {prompt}, width {width}, length_penalty {lp}: each beam must propose 2 * width candidates, "
            "EOS ones finished, the rest live"
        )
    assert not eng.has_unfinished_requests()


def test_bad_inputs_are_refused():
    eng = LLMEngine(num_gpu_blocks=3, block_size=4)  # max_model_len 8
    params = BeamSearchParams(beam_width=2, max_tokens=3)
    with pytest.raises(ValueError, match="longer than max_model_len=8"):
        eng.beam_search(["abcdef"], params)
    with pytest.raises(TypeError, match="BeamSearchParams"):
        beam_search(eng, ["ab"], {"beam_width": 2})
    with pytest.raises(TypeError, match="wrap it in a list"):
        eng.beam_search([1, 2, 3], params)
    assert not eng.has_unfinished_requests(), "a refused call queues nothing"
    (out,) = eng.beam_search("abcde", params)  # one str is one prompt; 5 + 3 fits exactly
    assert len(out.sequences) == 2


def test_each_beam_step_is_one_engine_request_per_beam_with_upstreams_params():
    eng = LLMEngine(seed=4)
    calls = []
    generate = eng.generate

    def spy(prompts, params):
        calls.append((list(prompts), params))
        return generate(prompts, params)

    eng.generate = spy
    params = BeamSearchParams(beam_width=2, max_tokens=3, temperature=0.7, ignore_eos=True)
    (out,) = eng.beam_search(["ab"], params)
    assert [len(p) for p, _ in calls] == [1, 2, 2], "step 1 runs the prompt, later steps one request per live beam"
    for step, (prompts, sp) in enumerate(calls):
        assert (sp.max_tokens, sp.logprobs, sp.temperature, sp.n) == (1, 4, 0.7, 1), (
            "a beam step asks for one token, 2 * beam_width logprobs, at the search's temperature"
        )
        assert all(p[:2] == [97, 98] and len(p) == 2 + step for p in prompts), "a beam's request is its whole sequence"
    assert all(len(s.tokens) == 5 for s in out.sequences), "with ignore_eos every beam runs max_tokens steps"


def test_each_beams_sampled_token_is_a_candidate_even_outside_the_top(monkeypatch):
    # upstream's candidates are the returned logprobs: the sampled token first, then the 2 * width
    # likeliest. Force every sampled token to one far down the row and check it is scored.
    from mini_vllm import beam_search as module

    eng = LLMEngine(seed=1)
    generate, made, asked = eng.generate, [], []

    def unlikely(prompts, params):
        outs = generate(prompts, params)
        for prompt, out in zip(prompts, outs):
            tok = int(np.argsort(logprobs(prompt), kind="stable")[0])  # the least likely token
            out.outputs[0].token_ids[0] = tok
            asked.append([*prompt, tok])
        return outs

    class Recorded(module.BeamSearchSequence):
        def __init__(self, tokens, cum_logprob=0.0, text=None):
            super().__init__(tokens, cum_logprob, text)
            made.append(list(tokens))

    eng.generate = unlikely
    monkeypatch.setattr(module, "BeamSearchSequence", Recorded)
    eng.beam_search(["ab"], BeamSearchParams(beam_width=2, max_tokens=3, temperature=1.3, ignore_eos=True))
    missing = [seq for seq in asked if seq not in made]
    assert asked and not missing, (
        f"the sampled tokens of {missing} were never scored as candidates: each beam's candidates are "
        "its sampled token and then the 2 * beam_width likeliest"
    )
