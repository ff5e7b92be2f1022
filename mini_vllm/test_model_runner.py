"""The model runner: flattened inputs from the persistent batch, slots from block tables, one forward per step."""

import numpy as np
import pytest

from mini_vllm import LLMEngine, SamplingParams
from mini_vllm.model_runner import BlockTable, CachedRequestState, InputBatch

GREEDY = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)


def runner_of(engine):
    return engine.model_executor.driver_worker.model_runner


class SpyModel:
    """Wraps the worker's model; records every forward's flattened inputs."""

    def __init__(self, model):
        self.model, self.calls = model, []

    def forward(self, input_ids, positions, kv_caches, attn_metadata):
        self.calls.append((input_ids.copy(), positions.copy(), attn_metadata))
        return self.model.forward(input_ids, positions, kv_caches, attn_metadata)

    def compute_logits(self, hidden):
        return self.model.compute_logits(hidden)


def spy_on(engine):
    runner = runner_of(engine)
    spy = SpyModel(runner.model)
    runner.model = spy
    return spy


def test_prepare_inputs_flattens_every_scheduled_token_in_batch_order():
    engine = LLMEngine(block_size=4, num_gpu_blocks=64, max_num_batched_tokens=8, enable_prefix_caching=False)
    spy = spy_on(engine)
    engine.add_request("abcdef", GREEDY)  # 6 tokens
    engine.add_request("xyz", GREEDY)  # 3 tokens: only 2 fit the budget of 8 in step 1
    engine.step()
    ids, pos, meta = spy.calls[0]
    inputs = runner_of(engine).last_inputs
    assert ids.tolist() == [*b"abcdef", *b"xy"], (
        f"every scheduled token, request after request, got {ids.tolist()}"
    )
    assert pos.tolist() == [0, 1, 2, 3, 4, 5, 0, 1], f"positions restart per request, got {pos.tolist()}"
    assert meta.query_start_loc.tolist() == [0, 6, 8] and meta.seq_lens.tolist() == [6, 2]
    assert meta.num_actual_tokens == 8 and meta.max_query_len == 6 and meta.max_seq_len == 6
    blocks = [engine.scheduler.kv_cache_manager.get_block_ids(rid) for rid in ("req-0", "req-1")]
    want = [blocks[0][p // 4] * 4 + p % 4 for p in range(6)] + [
        blocks[1][p // 4] * 4 + p % 4 for p in range(2)
    ]
    assert meta.slot_mapping.tolist() == want, (
        "slot = block_table[row, pos // block_size] * block_size + pos % block_size"
    )
    assert meta.slot_mapping.dtype == np.int64 and meta.query_start_loc.dtype == np.int32
    assert inputs.logits_indices.tolist() == [5, 7], "logits only at each request's last scheduled token"
    assert inputs.needs_sample == [True, False], "the mid-prefill chunk of 'xyz' samples nothing"
    engine.step()  # decode of req-0 (1 token) + the rest of req-1 (1 token)
    ids, pos, meta = spy.calls[1]
    assert (
        pos.tolist() == [6, 2]
        and meta.query_start_loc.tolist() == [0, 1, 2]
        and meta.seq_lens.tolist() == [7, 3]
    )
    assert ids[1] == ord("z")


def test_drafts_get_one_logits_row_each_plus_the_bonus_row():
    engine = LLMEngine(
        speculative_config={"method": "ngram", "num_speculative_tokens": 3}, block_size=4, num_gpu_blocks=64
    )
    spy = spy_on(engine)
    engine.add_request("the cat", SamplingParams(max_tokens=140, temperature=0, ignore_eos=True))
    seen = False
    while engine.has_unfinished_requests():
        engine.step()
        inputs = runner_of(engine).last_inputs
        if inputs is not None and inputs.num_draft.sum():
            k = int(inputs.num_draft[0])
            n = len(spy.calls[-1][0])
            assert inputs.logits_indices.tolist() == list(range(n - k - 1, n)), (
                f"a request with {k} drafts needs logits at its last real token and each draft, got "
                f"{inputs.logits_indices.tolist()} of {n} tokens"
            )
            seen = True
    assert seen, "the toy model's greedy output cycles with period 64: the n-gram drafter must propose"


def test_the_persistent_batch_drops_finished_requests_and_condenses():
    engine = LLMEngine(block_size=4, num_gpu_blocks=64)
    runner = runner_of(engine)
    engine.add_request("a", SamplingParams(max_tokens=1, temperature=0))
    engine.add_request("bb", SamplingParams(max_tokens=4, temperature=0, ignore_eos=True))
    engine.add_request("ccc", SamplingParams(max_tokens=4, temperature=0, ignore_eos=True))
    engine.step()
    assert runner.input_batch.req_ids == ["req-0", "req-1", "req-2"]
    engine.step()  # req-0 finished last step: its slot is refilled by the last request
    assert runner.input_batch.req_ids == ["req-2", "req-1"], runner.input_batch.req_ids
    assert "req-0" not in runner.requests, "a finished request's cached state is dropped"
    row = runner.input_batch.req_id_to_index["req-2"]
    n = runner.input_batch.num_tokens_no_spec[row]
    assert (
        runner.input_batch.token_ids_cpu[row, :n].tolist()
        == engine.scheduler.requests["req-2"].all_token_ids[:]
    )
    while engine.has_unfinished_requests():
        engine.step()
    engine.step()  # an empty step still tells the runner who finished
    assert runner.input_batch.num_reqs == 0 and not runner.requests


def test_preemption_keeps_the_generator_so_sampling_does_not_change():
    params = SamplingParams(max_tokens=40, temperature=1.0, ignore_eos=True, seed=3)
    calm = LLMEngine(block_size=4, num_gpu_blocks=64).generate(["x" * 10, "y" * 10], params)
    engine = LLMEngine(
        block_size=4, num_gpu_blocks=14, enable_prefix_caching=False
    )  # 13 blocks: too few for both
    ids = [engine.add_request(p, params) for p in ("x" * 10, "y" * 10)]
    reqs = [engine.scheduler.requests[i] for i in ids]
    while engine.has_unfinished_requests():
        engine.step()
    assert max(r.num_preemptions for r in reqs) >= 1, (
        "the pool of 13 blocks cannot hold both requests to the end"
    )
    assert [list(r.output_token_ids) for r in reqs] == [o.token_ids for o in calm], (
        "a preempted request keeps its cached state and generator in the runner: recomputing it may not change "
        "what it samples"
    )


def test_a_token_appended_outside_the_runner_refreshes_its_batch_row():
    # Phase 01 lab 03 steps an engine's scheduler by hand: a token the runner never produced lands in the
    # request. The toy's next token depends only on the last token and its position, so an engine that
    # takes the hand-reported token must continue exactly as one that produced it itself.
    calm = LLMEngine(block_size=4, num_gpu_blocks=64)
    want = calm.generate(["the cat"], GREEDY)[0].token_ids
    engine = LLMEngine(block_size=4, num_gpu_blocks=64)
    rid = engine.add_request("the cat", GREEDY)
    engine.step()  # prefill + the first token, through the runner: the request has a batch row
    out = engine.scheduler.schedule()  # one decode step by hand, reporting the token the model would give
    engine.scheduler.update_from_output(out, {rid: want[1]})
    finished = []
    while engine.has_unfinished_requests():
        finished += engine.step()
    got = finished[0].token_ids
    assert got == want, (
        f"after a token reported by hand ({want[1]}) the engine continued {got}; the same model alone gives "
        f"{want}: when a running request holds more tokens than its cached state, re-add its batch row from "
        f"the request (the persistent row still ends before the hand-reported token)"
    )


def test_block_table_refuses_a_position_without_a_block():
    table = BlockTable(max_num_reqs=2, max_num_blocks_per_req=3, block_size=4)
    table.add_row([7, 2], 0)
    assert table.compute_slot_mapping(np.array([0, 0, 0]), np.array([0, 5, 7])).tolist() == [28, 9, 11]
    with pytest.raises(RuntimeError, match="position 8 of batch row 0 has no KV block"):
        table.compute_slot_mapping(np.array([0]), np.array([8]))
    with pytest.raises(RuntimeError, match="would hold 4 blocks"):
        table.append_row([1, 1], 0)


def test_input_batch_condense_moves_the_last_row_into_the_hole():
    batch = InputBatch(max_num_reqs=4, max_model_len=8, max_num_blocks_per_req=2, block_size=4)
    gen = np.random.default_rng(0)
    for i, toks in enumerate([[1], [2, 2], [3, 3, 3]]):
        batch.add_request(CachedRequestState(f"r{i}", toks, GREEDY, gen, [i + 1], 0))
    batch.remove_request("r0")
    batch.condense()
    assert batch.req_ids == ["r2", "r1"] and batch.req_id_to_index == {"r2": 0, "r1": 1}
    assert batch.token_ids_cpu[0, :3].tolist() == [3, 3, 3] and batch.num_tokens[0] == 3
    assert batch.block_table.block_table[0, 0] == 3
    assert batch.remove_request("nobody") is None


class RecordingGenerator(np.random.Generator):
    """A numpy Generator that logs each draw (method, size) before making it."""

    def __init__(self, seed):
        super().__init__(np.random.PCG64(seed))
        self.log = []

    def random(self, size=None, *args, **kwargs):
        self.log.append(("random", size))
        return super().random(size, *args, **kwargs)

    def exponential(self, scale=1.0, size=None):
        self.log.append(("exponential", size))
        return super().exponential(scale, size)


def test_a_verify_step_draws_the_bonus_then_the_uniforms_then_the_noise():
    # README ("How a step runs"): the bonus, the uniforms and the recovered token's noise come from the
    # request's generator, in that order; another order gives other tokens for the same seed.
    spec = {"num_speculative_tokens": 3, "prompt_lookup_min": 1, "prompt_lookup_max": 3}
    engine = LLMEngine(speculative_config=spec, block_size=4, num_gpu_blocks=64)
    rid = engine.add_request("the cat sat on the mat", SamplingParams(max_tokens=60, temperature=1.0, seed=3))
    engine.step()
    rec = RecordingGenerator(3)
    runner_of(engine).requests[rid].generator = rec
    vocab = engine.tokenizer.vocab_size
    checked = 0
    while engine.has_unfinished_requests() and checked < 3:
        start = len(rec.log)
        engine.step()
        inputs = runner_of(engine).last_inputs
        k = int(inputs.num_draft[0]) if inputs is not None else 0
        if k:
            got = rec.log[start:]
            assert got == [("random", None), ("random", k), ("exponential", vocab)], (
                f"a step verifying {k} drafts drew {got} from the request's generator: draw the bonus's "
                "uniform, then one uniform per draft, then the recovered token's noise row"
            )
            checked += 1
    assert checked, "the n-gram drafter (prompt_lookup_min=1) should have proposed drafts in 60 tokens"
