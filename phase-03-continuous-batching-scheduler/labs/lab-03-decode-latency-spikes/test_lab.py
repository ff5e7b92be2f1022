import functools

from course.runtime import lab_module

lab = lab_module(__file__)   # solution.py by default; LAB_IMPL=starter grades starter.py


@functools.cache
def collision(threshold: int):
    return lab.run_collision(threshold, long_prompt_len=256, max_tokens=16)


def test_unchunked_prefill_spikes_one_decode_step():
    costs = collision(0).costs
    assert len(costs) == 15, (
        f"A generates 16 tokens, the first with its own prefill, so B's arrival is followed by 15 decode "
        f"steps of A; got {len(costs)} costs: record only the steps after B was added in which A was scheduled"
    )
    worst, second = sorted(costs, reverse=True)[:2]
    assert worst >= 257, (
        f"without chunking, B's whole 256-token prefill lands in one of A's steps: 256 + A's 1 = 257, "
        f"got a worst step of {worst}: cost = out.total_num_scheduled_tokens, not A's share"
    )
    assert second <= 3, f"every other step is a decode (1-2 tokens), got a second-worst step of {second}"
    assert sum(costs) == 272, f"work is conserved: 256 + 1 (B) + 15 (A) = 272 tokens, got {sum(costs)}"


def test_chunked_prefill_caps_the_spike():
    threshold = 32
    result = collision(threshold)
    costs = result.costs
    assert max(costs) <= threshold + 1, (
        f"with threshold {threshold} no step A shares can exceed {threshold} + 1 tokens, got {max(costs)}: "
        f"pass long_prefill_token_threshold to the engine"
    )
    elevated = [c for c in costs if c > 3]
    assert len(elevated) >= 8, f"256 / 32 = 8 chunks, so at least 8 elevated steps, got {len(elevated)}: {costs}"
    assert sum(costs) == 272, f"chunking spreads the same 272 tokens, it does not remove any: got {sum(costs)}"
    assert result.intruder_ttft_steps == 8 and collision(0).intruder_ttft_steps == 1, (
        f"the price of chunking is B's first token: 8 steps instead of 1, got "
        f"{result.intruder_ttft_steps} and {collision(0).intruder_ttft_steps}"
    )


def test_chunking_does_not_change_the_decode_streams_output():
    reference = collision(0).victim_output
    assert len(reference) == 16, f"A must generate its 16 tokens, got {len(reference)}"
    for threshold in (32, 64):
        got = collision(threshold).victim_output
        assert got == reference, (
            f"A's tokens with threshold {threshold} ({got}) differ from the unchunked run ({reference}): "
            f"scheduling must never change what a request generates"
        )


def test_decode_stream_is_never_starved():
    for threshold in (0, 32):
        result = collision(threshold)
        assert result.victim_tokens == [1] * result.steps_while_alive, (
            f"threshold {threshold}: A must get exactly 1 token in every step while it is alive "
            f"({result.steps_while_alive} steps), got {result.victim_tokens}: running requests are served first"
        )


def test_a_small_budget_alone_chunks_the_intruder():
    # No threshold, but a 64-token step budget: A's decode (1) plus 63 of B's prompt, twice, then the rest.
    result = lab.run_collision(0, long_prompt_len=150, max_tokens=6, long_max_tokens=3, budget=64)
    assert result.costs == [64, 64, 25, 2, 2], (
        f"with max_num_batched_tokens=64 and a 150-token intruder, A's steps cost 64, 64, 25 (1 + 63, 1 + 63, "
        f"1 + 24) and then 2 (both decoding); got {result.costs}: pass `budget` to the engine"
    )
    assert result.victim_tokens == [1] * 5 and result.intruder_ttft_steps == 3, (
        f"A gets 1 token in each of its 5 remaining steps and B's first token comes with its 3rd chunk; "
        f"got {result.victim_tokens}, TTFT {result.intruder_ttft_steps} steps"
    )
    assert len(result.victim_output) == 6, f"max_tokens=6 gives 6 tokens, got {len(result.victim_output)}"


def test_steps_while_alive_stop_when_a_finishes_even_if_b_goes_on():
    # B wants 12 tokens, A only 3 (1 with its prefill, 2 after B arrives): A leaves first, B keeps decoding.
    result = lab.run_collision(0, long_prompt_len=20, max_tokens=3, long_max_tokens=12)
    assert result.steps_while_alive == 2 == len(result.costs), (
        f"A decodes for 2 steps after B arrives, so steps_while_alive should be 2 (the steps in which A ran: "
        f"{len(result.costs)}), got {result.steps_while_alive}: step until A's output comes back, not until "
        f"the engine is empty (B outlives A here)"
    )


def test_collision_ignores_eos():
    # long_prompt(110) greedily samples EOS as its 3rd token: with ignore_eos B still decodes 6 tokens.
    result = lab.run_collision(0, long_prompt_len=110, max_tokens=10, long_max_tokens=6)
    assert result.costs == [111, 2, 2, 2, 2, 2, 1, 1, 1], (
        f"B's 110-token prefill rides with A (111), B decodes its other 5 tokens next to A (2 each), then A alone "
        f"(1); got {result.costs}: pass ignore_eos=True to both requests (B's 3rd greedy token is EOS)"
    )
