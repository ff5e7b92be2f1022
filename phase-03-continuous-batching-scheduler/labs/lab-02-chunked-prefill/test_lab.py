from course.runtime import lab_module

lab = lab_module(__file__)   # solution.py by default; LAB_IMPL=starter grades starter.py


PROMPT = ("The quick brown fox jumps over the lazy dog. " * 6)[:256]  # 256 byte-tokens


def test_threshold_zero_means_one_step_when_it_fits():
    got = lab.num_prefill_steps(256, 0, 2048)
    assert got == 1, f"threshold 0 disables the per-request cap: 256 tokens fit a 2048 budget in 1 step, got {got}"
    assert lab.predicted_chunks(256, 0, 2048) == [256], "with no cap the chunk list is the whole prompt, [256]"


def test_budget_binds_when_threshold_exceeds_it():
    got = lab.num_prefill_steps(256, 512, 100)
    assert got == 3, f"threshold 512 > budget 100, so the budget is the chunk: ceil(256/100) = 3 steps, got {got}"
    chunks = lab.predicted_chunks(256, 512, 100)
    assert chunks == [100, 100, 56], f"256 tokens in chunks of at most 100 are [100, 100, 56], got {chunks}"
    got = lab.num_prefill_steps(256, 0, 100)
    assert got == 3, f"threshold 0 with budget 100 still chunks (the budget always applies): 3 steps, got {got}"


def test_exact_division_has_no_extra_step():
    for threshold, want in [(64, 4), (32, 8), (256, 1), (128, 2)]:
        got = lab.num_prefill_steps(256, threshold, 2048)
        assert got == want, (
            f"256 tokens in chunks of {threshold} take exactly {want} steps (no +1 when it divides), got {got}"
        )
        chunks = lab.predicted_chunks(256, threshold, 2048)
        assert chunks == [threshold] * want, f"expected {want} chunks of {threshold}, got {chunks}: no empty last chunk"
    assert lab.num_prefill_steps(257, 64, 2048) == 5, "one token over a multiple needs one more step: ceil(257/64) = 5"


def test_a_one_token_remainder_over_a_big_chunk_is_a_step():
    # A remainder that is a tiny fraction of the chunk still needs its own step; a float ceiling
    # (int(x + 0.999), round(...)) loses it. Integer ceiling: -(-prompt_len // chunk).
    cases = [(2049, 0, 2048), (8193, 8192, 16384), (100_001, 0, 100_000), (5, 0, 4)]
    for prompt_len, threshold, budget in cases:
        chunk = min(threshold or budget, budget)
        want = -(-prompt_len // chunk)
        got = lab.num_prefill_steps(prompt_len, threshold, budget)
        assert got == want, (
            f"num_prefill_steps({prompt_len}, {threshold}, {budget}) should be {want} (a {prompt_len % chunk}-token "
            f"remainder over chunk {chunk} is one more step), got {got}: use an integer ceiling, not a float fudge"
        )
        chunks = lab.predicted_chunks(prompt_len, threshold, budget)
        assert len(chunks) == got and sum(chunks) == prompt_len, (
            f"predicted_chunks({prompt_len}, {threshold}, {budget}) = {len(chunks)} chunks summing to {sum(chunks)}; "
            f"it must agree with num_prefill_steps ({got}) and cover the prompt exactly"
        )


def test_engine_follows_the_predicted_chunks():
    for threshold in (0, 64, 100):
        obs = lab.observe(PROMPT, threshold)
        chunks = lab.predicted_chunks(256, threshold, 2048)
        want = chunks + [1, 1, 1]  # then 3 decode steps (4 tokens: the first comes with the prefill)
        assert obs.scheduled == want, (
            f"threshold {threshold}: mini_vllm schedules {obs.scheduled}, the arithmetic says {want}: "
            f"record out.num_scheduled_tokens for your request in every step"
        )


def test_mid_prefill_chunks_emit_nothing():
    obs = lab.observe(PROMPT, 64)
    assert obs.sampled == [False, False, False, True, True, True, True], (
        f"chunks 1-3 of a 4-chunk prefill must not sample; the 4th chunk and each decode do; got {obs.sampled}: "
        f"record Scheduler.needs_sample(request, n) right after schedule()"
    )
    assert len(obs.token_ids) == 4, f"max_tokens=4 means 4 generated tokens, got {len(obs.token_ids)}"


def test_chunked_and_unchunked_outputs_are_identical():
    reference = lab.observe(PROMPT, 0).token_ids
    assert len(reference) == 4, f"expected 4 tokens from the unchunked run, got {reference}"
    for threshold in (64, 100, 7):
        got = lab.observe(PROMPT, threshold).token_ids
        assert got == reference, (
            f"threshold {threshold} produced {got}, unchunked produced {reference}: chunking may change "
            f"timing, never the tokens (greedy + a deterministic model)"
        )


def test_engine_chunks_by_a_small_budget_alone():
    obs = lab.observe(PROMPT, 0, budget=100, max_tokens=2)
    assert obs.scheduled == [100, 100, 56, 1], (
        f"threshold 0 with max_num_batched_tokens=100: the budget alone chunks 256 tokens as 100, 100, 56, then "
        f"1 decode for max_tokens=2; got {obs.scheduled}: pass `budget` to LLMEngine(max_num_batched_tokens=...)"
    )
    assert obs.sampled == [False, False, True, True], f"only the completing chunk and the decode sample, got {obs.sampled}"
    assert obs.token_ids == lab.observe(PROMPT, 0, max_tokens=2).token_ids, "budget chunking never changes the tokens"


def test_observe_ignores_eos():
    # The toy model's greedy first token after "66666666" is EOS (id 256): observe must keep going.
    obs = lab.observe("66666666", 4, max_tokens=3)
    assert obs.scheduled == [4, 4, 1, 1] and len(obs.token_ids) == 3, (
        f"an 8-token prompt at threshold 4 is 4 + 4, then 2 decodes for 3 tokens; got scheduled {obs.scheduled}, "
        f"{len(obs.token_ids)} tokens: pass ignore_eos=True (this prompt's first greedy token is EOS)"
    )
