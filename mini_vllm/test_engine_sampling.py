"""Phase 09 in the engine: each request's history reaches the sampler, so the history knobs work in generate()."""

from collections import Counter

import numpy as np

from mini_vllm import LLMEngine, SamplingParams, ToyModel

PROMPT = "the cat sat on the mat, the cat sat"
PROMPTS = ["hello world, this is a longer prompt that spans blocks", "hi", "the quick brown fox " * 3]


def reference_greedy(prompt_ids, n, rep=1.0, freq=0.0, pres=0.0):
    """Greedy decoding with the penalties written out from their definitions (not the sampler's code)."""
    model, tokens, out = ToyModel(vocab_size=257), list(prompt_ids), []
    for _ in range(n):
        x = model.forward(np.array([tokens[-1]]), np.array([len(tokens) - 1]))[0].copy()
        counts = np.bincount(np.array(out, dtype=np.int64), minlength=257)
        seen = counts > 0
        seen[list(prompt_ids)] = True
        for t in np.flatnonzero(seen):  # repetition: divide a positive logit, multiply a negative one
            x[t] = x[t] / rep if x[t] > 0 else x[t] * rep
        x -= freq * counts + pres * (counts > 0)
        out.append(int(np.argmax(x)))
        tokens.append(out[-1])
    return out


def run(prompts, params, **engine_args):
    return [o.token_ids for o in LLMEngine(**engine_args).generate(prompts, params)]


def test_no_history_knob_draws_the_recorded_tokens():
    """Recorded before the engine passed any history: a batch without such knobs is unchanged bit for bit."""
    params = [
        SamplingParams(max_tokens=10, temperature=0.9, top_k=40, top_p=0.9),
        SamplingParams(max_tokens=10, temperature=1.2, seed=7),
        SamplingParams(max_tokens=10, temperature=0),
    ]
    assert run(PROMPTS, params, seed=5) == [
        [116, 189, 113, 110, 26, 118, 25, 93, 100, 246],
        [115, 197, 191, 90, 100, 201, 1, 187, 209, 98],
        [107, 123, 195, 233, 116, 102, 205, 166, 82, 32],
    ], "with no penalty, bad word or min_tokens the engine must sample exactly as before"


def test_each_penalty_changes_greedy_tokens_exactly_as_defined():
    ids = list(PROMPT.encode())
    cases = [dict(rep=1.8), dict(freq=0.7), dict(pres=1.5), dict(rep=1.3, freq=0.4, pres=0.3)]
    plain = reference_greedy(ids, 24)
    assert run([PROMPT], SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)) == [plain]
    for case in cases:
        want = reference_greedy(ids, 24, **case)
        assert want != plain, f"{case} must change the greedy tokens, or this case tests nothing"
        params = SamplingParams(
            max_tokens=24, temperature=0, ignore_eos=True, repetition_penalty=case.get("rep", 1.0),
            frequency_penalty=case.get("freq", 0.0), presence_penalty=case.get("pres", 0.0),
        )
        got = run([PROMPT], params)
        assert got == [want], (
            f"{case}: the engine must pass each request's output (and, for repetition, prompt) ids to the sampler"
        )


def test_repetition_penalty_reads_the_prompt():
    ids = list(PROMPT.encode())
    with_prompt, without = reference_greedy(ids, 24, rep=1.8), reference_greedy(ids, 24)
    output_only = []  # what a penalty that sees only the output would produce
    model, tokens = ToyModel(vocab_size=257), list(ids)
    for _ in range(24):
        x = model.forward(np.array([tokens[-1]]), np.array([len(tokens) - 1]))[0].copy()
        for t in set(output_only):
            x[t] = x[t] / 1.8 if x[t] > 0 else x[t] * 1.8
        output_only.append(int(np.argmax(x)))
        tokens.append(output_only[-1])
    assert with_prompt != output_only != without, "the prompt must matter for this case to have teeth"
    got = run([PROMPT], SamplingParams(max_tokens=24, temperature=0, ignore_eos=True, repetition_penalty=1.8))
    assert got == [with_prompt], "repetition_penalty counts the prompt's ids too (upstream's prompt mask)"


def test_bad_words_never_appear():
    base = SamplingParams(max_tokens=40, temperature=1.0, ignore_eos=True)
    seeds = range(6)
    free = [run(PROMPTS, base, seed=s) for s in seeds]
    singles = Counter(t for batch in free for out in batch for t in out)
    pairs = Counter(p for batch in free for out in batch for p in zip(out, out[1:]))
    word = singles.most_common(1)[0][0]
    pair = next(p for p, _ in pairs.most_common() if word not in p)
    banned = SamplingParams(max_tokens=40, temperature=1.0, ignore_eos=True, bad_words_token_ids=[[word], list(pair)])
    for s in seeds:
        for out in run(PROMPTS, banned, seed=s):
            assert word not in out, f"the one-token bad word {word} was generated"
            assert pair not in set(zip(out, out[1:])), (
                f"the bad word {pair} was generated: pass each request's output so far to the sampler"
            )


def test_min_tokens_holds_back_eos_and_stop_tokens():
    model = ToyModel(vocab_size=257)
    prompt = None
    for pos in range(3, 64):
        hits = np.flatnonzero(model.forward(np.arange(257), np.full(257, pos)).argmax(axis=1) == 256)
        if len(hits):
            prompt = [32] * pos + [int(hits[0])]
            break
    assert prompt is not None
    (free,) = run([prompt], SamplingParams(max_tokens=8, temperature=0))
    assert free == [256], "greedy stops at once on this prompt"
    (held,) = run([prompt], SamplingParams(max_tokens=8, temperature=0, min_tokens=5))
    assert len(held) >= 5 and 256 not in held[:5], f"EOS must be banned until min_tokens outputs, got {held}"
    (plain,) = run([prompt], SamplingParams(max_tokens=8, temperature=0, ignore_eos=True))
    stop = plain[1]
    (held,) = run([prompt], SamplingParams(max_tokens=8, temperature=0, ignore_eos=True, stop_token_ids=[stop],
                                           min_tokens=3))
    assert stop not in held[:3] and len(held) >= 3, "stop ids are held back by min_tokens too"


def test_seeded_request_is_batch_invariant_in_the_engine():
    knobs = dict(max_tokens=20, temperature=1.1, top_k=60, repetition_penalty=1.2, frequency_penalty=0.3,
                 presence_penalty=0.2, bad_words_token_ids=[[101], [32, 116]], min_tokens=4, seed=1234)
    seeded = SamplingParams(**knobs)
    (alone,) = run(["seeded request"], seeded)
    companions = [
        SamplingParams(max_tokens=30, temperature=0.7, presence_penalty=1.0),
        SamplingParams(max_tokens=5, temperature=0),
        SamplingParams(max_tokens=25, temperature=1.5, top_p=0.8, bad_words_token_ids=[[32]]),
    ]
    for order in range(4):
        prompts = ["a companion " * 5, "b", "c" * 30]
        params = list(companions)
        prompts.insert(order, "seeded request")
        params.insert(order, seeded)
        outs = run(prompts, params, max_num_batched_tokens=16, long_prefill_token_threshold=6, seed=order)
        assert outs[order] == alone, "a seeded request's tokens must not depend on its companions or its slot"
