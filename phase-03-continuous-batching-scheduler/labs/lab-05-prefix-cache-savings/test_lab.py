import functools

from course.runtime import lab_module

lab = lab_module(__file__)   # solution.py by default; LAB_IMPL=starter grades starter.py


SYSTEM = "S" * 64  # 16 full blocks of 4
PROMPTS = tuple(SYSTEM + str(i) for i in range(8))  # 65 byte-tokens each


@functools.cache
def count(prompts: tuple[str, ...], caching: bool):
    total, token_ids = lab.run_and_count(list(prompts), enable_caching=caching, block_size=4, max_tokens=4)
    return total, token_ids


def test_caching_off_pays_full_price_for_everyone():
    total, token_ids = count(PROMPTS, False)
    assert total == 8 * (65 + 3) == 544, (
        f"without caching each request schedules its 65 prompt tokens + 3 decodes (the 4th token is sampled, "
        f"never fed back): 8 x 68 = 544, got {total}: sum out.total_num_scheduled_tokens over every schedule()"
    )
    assert all(len(t) == 4 for t in token_ids), f"every request generates max_tokens=4 tokens, got {token_ids}"
    assert lab.predicted_total(8, 65, 64, 4, 4, enable_caching=False) == 544, "predicted_total must say 544 too"


def test_caching_on_computes_the_shared_prefix_once():
    total, _ = count(PROMPTS, True)
    assert total == 68 + 7 * (1 + 3) == 96, (
        f"with caching the first request pays 68; each of the 7 followers adopts 16 cached blocks (64 tokens), "
        f"computes its 1 unique last token and 3 decodes: 68 + 7 x 4 = 96, got {total}"
    )
    assert lab.predicted_total(8, 65, 64, 4, 4, enable_caching=True) == 96, "predicted_total must say 96"


def test_savings_equal_followers_times_shared_full_blocks():
    saved = count(PROMPTS, False)[0] - count(PROMPTS, True)[0]
    assert saved == 7 * 16 * 4 == 448, f"savings = 7 followers x 16 blocks x 4 tokens = 448, measured {saved}"
    assert lab.predicted_savings(8, 65, 64, 4) == 448, "predicted_savings(8, 65, 64, 4) should be 448"
    # The two edge cases of the formula: a partial shared block, and a prompt with no unique suffix.
    assert lab.predicted_savings(8, 67, 66, 4) == 448, (
        "a 66-token shared prefix still hits only 16 full blocks (64 tokens): the partial block never hits"
    )
    assert lab.predicted_savings(8, 64, 64, 4) == 7 * 15 * 4, (
        "identical 64-token prompts hit only 15 blocks each: a hit never covers the last prompt token, "
        "so the cap is (64 - 1) // 4 = 15 blocks"
    )
    same = ("S" * 64,) * 8
    measured = count(same, False)[0] - count(same, True)[0]
    assert measured == lab.predicted_savings(8, 64, 64, 4), (
        f"identical 64-token prompts: measured savings {measured}, predicted {lab.predicted_savings(8, 64, 64, 4)}"
    )


def test_outputs_are_identical_with_and_without_caching():
    off, on = count(PROMPTS, False)[1], count(PROMPTS, True)[1]
    assert off == on, f"prefix caching must never change the tokens: off {off}, on {on}"


def test_unshared_prompts_save_nothing():
    unique = tuple(str(i) + SYSTEM for i in range(8))  # the very first block differs
    off, on = count(unique, False)[0], count(unique, True)[0]
    assert (off - on) / off < 0.25, f"prompts that differ in their first block share nothing, saved {off - on} of {off}"
    assert off == on, f"with a unique first token no block can hit: expected identical totals, got {off} vs {on}"


def test_block_size_8_with_a_partial_shared_block():
    # 3 prompts sharing 60 tokens (7 full blocks of 8 + 4 tokens), 5 unique tokens each, max_tokens 2.
    prompts = ["S" * 60 + f"{i}uniq" for i in range(3)]
    off, toks_off = lab.run_and_count(prompts, enable_caching=False, block_size=8, max_tokens=2)
    on, toks_on = lab.run_and_count(prompts, enable_caching=True, block_size=8, max_tokens=2)
    assert off == 3 * (65 + 1) == lab.predicted_total(3, 65, 60, 2, 8, enable_caching=False), (
        f"caching off, max_tokens=2: each request schedules 65 + 1 tokens, 3 x 66 = 198; measured {off}: "
        f"build the engine from the block_size and max_tokens arguments, not the module constants")
    assert lab.predicted_savings(3, 65, 60, 8) == 2 * 7 * 8, (
        "at block size 8 a 60-token shared prefix is 7 full blocks (56 tokens) per follower: 2 x 56 = 112")
    assert off - on == lab.predicted_savings(3, 65, 60, 8), (
        f"measured savings {off - on} at block size 8, predicted {lab.predicted_savings(3, 65, 60, 8)}")
    assert toks_off == toks_on and all(len(t) == 2 for t in toks_on), "2 identical tokens per request either way"


def test_the_pool_size_reaches_the_engine():
    # 19 blocks of 4 (18 usable, the null block aside) = 72 slots: room for 65 prompt + 4 output tokens.
    total, _ = lab.run_and_count(lab.PROMPTS, enable_caching=True, num_gpu_blocks=19)
    assert total == 96, f"a 19-block pool still serves the 8 prompts (some wait) for 96 tokens, got {total}"
    # 17 blocks = 64 slots: the engine caps max_model_len at 64 and must refuse a 65-token prompt.
    try:
        lab.run_and_count(lab.PROMPTS, enable_caching=True, num_gpu_blocks=17)
    except ValueError:
        return
    raise AssertionError(
        "num_gpu_blocks=17 holds 64 tokens, too few for a 65-token prompt, yet the run went through: build "
        "LLMEngine(num_gpu_blocks=num_gpu_blocks, ...) from the argument, not a fixed pool"
    )
