import pytest

from mini_vllm import Request, RequestStatus, SamplingParams
from mini_vllm.block_pool import get_request_block_hasher, hash_block_tokens


def test_status_order_matches_upstream():
    names = [s.name for s in RequestStatus]
    assert names == [
        "WAITING",
        "WAITING_FOR_REMOTE_KVS",  # a KV connector's async load (Phase 15)
        "RUNNING",
        "PREEMPTED",
        "FINISHED_STOPPED",
        "FINISHED_LENGTH_CAPPED",
        "FINISHED_ABORTED",
    ]
    assert [RequestStatus.is_finished(s) for s in RequestStatus] == [False, False, False, False, True, True, True]


def test_counters():
    r = Request("r", [1, 2, 3], SamplingParams(max_tokens=5))
    assert (r.num_tokens, r.num_prompt_tokens, r.num_computed_tokens, r.num_output_tokens) == (3, 3, 0, 0)
    r.append_output_token_ids(9)
    r.append_output_token_ids([8, 7])
    assert r.num_tokens == 6 and r.output_token_ids == [9, 8, 7] and r.all_token_ids == [1, 2, 3, 9, 8, 7]


def test_token_lists_are_read_only():
    r = Request("r", [1, 2, 3])
    with pytest.raises(TypeError):
        r.output_token_ids.append(5)
    with pytest.raises(TypeError):
        r.all_token_ids[0] = 5
    assert r.num_tokens == 3


def test_eos_checked_before_length_and_counts_as_output():
    r = Request("r", [1], SamplingParams(max_tokens=2))
    r.append_output_token_ids(10)
    assert not r.maybe_finish()
    r.append_output_token_ids(256)
    assert r.maybe_finish() and r.get_finished_reason() == "stop", "EOS landing on the cap must report stop"
    assert r.output_token_ids == [10, 256] and r.is_finished


def test_ignore_eos_runs_to_length_and_stop_tokens_still_stop():
    r = Request("r", [1], SamplingParams(max_tokens=3, ignore_eos=True))
    r.append_output_token_ids(256)
    assert not r.maybe_finish()
    r.append_output_token_ids([256, 256])
    assert (
        r.maybe_finish() and r.status == RequestStatus.FINISHED_LENGTH_CAPPED and r.get_finished_reason() == "length"
    )
    s = Request("s", [1], SamplingParams(max_tokens=9, ignore_eos=True, stop_token_ids=[42]))
    s.append_output_token_ids(42)
    assert s.maybe_finish() and s.get_finished_reason() == "stop" and s.stop_reason == 42


def test_max_model_len_caps_prompt_plus_output():
    r = Request("r", [1, 2, 3], SamplingParams(max_tokens=100))
    r.append_output_token_ids(5)
    assert r.maybe_finish(max_model_len=4) and r.get_finished_reason() == "length"


def test_unfinished_request_has_no_reason():
    r = Request("r", [1])
    assert r.get_finished_reason() is None and not r.is_finished


def test_block_hashes_grow_incrementally_and_chain():
    r = Request("r", list(range(10)), block_hasher=get_request_block_hasher(4))
    h0 = hash_block_tokens(None, [0, 1, 2, 3])
    assert r.block_hashes == [h0, hash_block_tokens(h0, [4, 5, 6, 7])], "only full blocks are hashed"
    r.append_output_token_ids([10, 11])
    assert len(r.block_hashes) == 3 and r.block_hashes[2] == hash_block_tokens(
        r.block_hashes[1], [8, 9, 10, 11]
    )


def test_numpy_integers_are_accepted_as_token_ids():
    import numpy as np

    r = Request(
        "r", np.array([1, 2, 3]), SamplingParams(max_tokens=np.int64(2), stop_token_ids=[np.int64(9)])
    )
    r.append_output_token_ids(np.int64(9))
    assert r.all_token_ids == [1, 2, 3, 9] and type(r.all_token_ids[-1]) is int
    assert r.maybe_finish() and r.stop_reason == 9
