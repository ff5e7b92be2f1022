import numpy as np

import mini_vllm
from course.runtime import lab_module
from mini_vllm import Request, RequestStatus, SamplingParams

lab = lab_module(__file__)   # solution.py by default; LAB_IMPL=starter grades starter.py


EOS = 256  # mini_vllm's ByteTokenizer


def test_eos_stops_generation():
    r = lab.run_until_stop([10, 20, EOS, 30, 40], EOS, SamplingParams(max_tokens=10))
    assert list(r.output_token_ids) == [10, 20, EOS], (
        f"generation must stop right after EOS, and the EOS token itself is kept as an output token: "
        f"expected [10, 20, {EOS}], got {list(r.output_token_ids)}"
    )
    assert r.status == RequestStatus.FINISHED_STOPPED, f"EOS finishes with FINISHED_STOPPED, got {r.status.name}"
    assert lab.finish_reason(r) == "stop", f"FINISHED_STOPPED maps to 'stop', got {lab.finish_reason(r)!r}"
    for eos in (2, 50256):  # Llama 2's </s>, GPT-2's <|endoftext|>: the id is the request's, not a constant
        r = lab.run_until_stop([5, eos, 6], eos, SamplingParams(max_tokens=10))
        assert list(r.output_token_ids) == [5, eos], (
            f"compare against request.eos_token_id ({eos}), not a hard-coded 256: got {list(r.output_token_ids)}"
        )


def test_ignore_eos_runs_to_length_cap():
    r = lab.run_until_stop([10, EOS, 20, EOS, 30, 40], EOS, SamplingParams(max_tokens=4, ignore_eos=True))
    assert list(r.output_token_ids) == [10, EOS, 20, EOS], (
        f"ignore_eos=True skips only the EOS check; the max_tokens=4 cap still binds: expected "
        f"[10, {EOS}, 20, {EOS}], got {list(r.output_token_ids)}"
    )
    assert lab.finish_reason(r) == "length", f"capped requests report 'length', got {lab.finish_reason(r)!r}"
    r = lab.run_until_stop([10, 7, 20], EOS, SamplingParams(max_tokens=8, ignore_eos=True, stop_token_ids=(7,)))
    assert list(r.output_token_ids) == [10, 7] and lab.finish_reason(r) == "stop", (
        f"ignore_eos does not disable stop_token_ids: token 7 must stop the request with 'stop', got "
        f"{list(r.output_token_ids)} / {lab.finish_reason(r)!r}"
    )
    assert r.stop_reason == 7, f"record which stop token fired in request.stop_reason, got {r.stop_reason!r}"



def test_every_stop_token_id_stops_and_is_recorded():
    params = SamplingParams(max_tokens=10, stop_token_ids=(7, 9, 11))
    for stop in (7, 9, 11):
        r = lab.run_until_stop([10, 20, stop, 30], EOS, params)
        assert list(r.output_token_ids) == [10, 20, stop] and r.stop_reason == stop, (
            f"stop_token_ids=(7, 9, 11): token {stop} must stop the request (test `last in stop_token_ids`, not "
            f"only the first id) and be recorded as stop_reason; got outputs {list(r.output_token_ids)}, "
            f"stop_reason {r.stop_reason!r}"
        )
        assert lab.finish_reason(r) == "stop"
    r = lab.run_until_stop([10, 20, 9], EOS, SamplingParams(max_tokens=3, stop_token_ids=(7, 9)))
    assert (lab.finish_reason(r), r.stop_reason) == ("stop", 9), (
        f"a stop token arriving as the max_tokens-th token reports 'stop' with stop_reason 9 (vLLM checks stop "
        f"ids before the length cap), got {(lab.finish_reason(r), r.stop_reason)}"
    )

def test_no_eos_hits_length_cap():
    for cap in (1, 3, 5):
        r = lab.run_until_stop(range(10, 30), EOS, SamplingParams(max_tokens=cap))
        assert r.num_output_tokens == cap, (
            f"max_tokens={cap} must stop after exactly {cap} output tokens (>=, not >), got {r.num_output_tokens}"
        )
        assert r.status == RequestStatus.FINISHED_LENGTH_CAPPED, (
            f"hitting max_tokens gives FINISHED_LENGTH_CAPPED, got {r.status.name}"
        )


def test_eos_on_the_boundary_reports_stop():
    r = lab.run_until_stop([10, 20, EOS], EOS, SamplingParams(max_tokens=3))
    assert lab.finish_reason(r) == "stop", (
        f"EOS as the 3rd token with max_tokens=3 trips both rules; the EOS check comes first, so the "
        f"reason is 'stop', got {lab.finish_reason(r)!r}"
    )


def test_unfinished_request_has_no_reason():
    r = Request("fresh", [1, 2, 3], SamplingParams(max_tokens=4))
    for status in (RequestStatus.WAITING, RequestStatus.RUNNING, RequestStatus.PREEMPTED):
        r.status = status
        assert lab.finish_reason(r) is None, f"{status.name} is not finished, so no reason: got {lab.finish_reason(r)!r}"
    r.status = RequestStatus.FINISHED_ABORTED
    assert lab.finish_reason(r) == "abort", f"FINISHED_ABORTED maps to 'abort', got {lab.finish_reason(r)!r}"
    dry = lab.run_until_stop([10, 20], EOS, SamplingParams(max_tokens=8))
    assert dry.status == RequestStatus.RUNNING and lab.finish_reason(dry) is None, (
        f"a stream that runs dry before any stop leaves the request RUNNING with no reason, got "
        f"{dry.status.name} / {lab.finish_reason(dry)!r}"
    )
    assert lab.check_stop(Request("empty", [1], SamplingParams(max_tokens=1))) is False, (
        "check_stop on a request with no output tokens must return False"
    )


def test_max_model_len_caps_prompt_plus_output():
    # A 3-token prompt in a model that holds 6 positions: the context is full after 3 outputs,
    # long before max_tokens=10.
    r = Request("ctx", [1, 2, 3], SamplingParams(max_tokens=10), eos_token_id=EOS)
    r.status = RequestStatus.RUNNING
    stopped_at = None
    for i, tok in enumerate([10, 11, 12, 13, 14, 15], 1):
        r.append_output_token_ids(tok)
        if lab.check_stop(r, max_model_len=6):
            stopped_at = i
            break
    assert stopped_at == 3, (
        f"max_model_len=6 caps prompt + output: 3 prompt + 3 output tokens = 6 = num_tokens, so "
        f"check_stop(request, max_model_len=6) must fire on the 3rd output token; it fired at "
        f"{stopped_at}. Compare request.num_tokens (not num_output_tokens) with max_model_len"
    )
    assert r.status == RequestStatus.FINISHED_LENGTH_CAPPED and lab.finish_reason(r) == "length", (
        f"running out of context is a length cap: FINISHED_LENGTH_CAPPED / 'length', got "
        f"{r.status.name} / {lab.finish_reason(r)!r}"
    )


def _engine_requests(prompt, params):
    engine = mini_vllm.LLMEngine()
    rid = engine.add_request(prompt, params)
    request = engine.scheduler.requests[rid]
    outputs = []
    while engine.has_unfinished_requests():
        outputs += engine.step()
    return request, outputs[0]


def test_engine_reports_length_with_ignore_eos():
    request, output = _engine_requests("hello", SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True))
    assert lab.finish_reason(request) == "length" == output.finish_reason, (
        f"the engine ran 'hello' to max_tokens=5 with ignore_eos: your finish_reason says "
        f"{lab.finish_reason(request)!r}, the engine's RequestOutput says {output.finish_reason!r}"
    )
    stop_tok = output.token_ids[2]
    request, output = _engine_requests(
        "hello", SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True, stop_token_ids=(stop_tok,))
    )
    assert lab.finish_reason(request) == "stop" == output.finish_reason, (
        f"the same run with stop_token_ids=({stop_tok},) stops early: your finish_reason says "
        f"{lab.finish_reason(request)!r}, the engine says {output.finish_reason!r}"
    )


def test_agrees_with_mini_vllm_maybe_finish():
    rng = np.random.default_rng(0)
    for case in range(300):
        n = int(rng.integers(1, 12))
        stream = [int(t) for t in rng.choice([EOS, 7, 11, 40, 41, 42], size=n, p=[.15, .1, .2, .2, .2, .15])]
        params = SamplingParams(
            max_tokens=int(rng.integers(1, 8)),
            ignore_eos=bool(rng.integers(2)),
            stop_token_ids=(7,) if rng.integers(2) else (),
        )
        mine = lab.run_until_stop(stream, EOS, params)
        ref = Request("ref", [1, 2, 3], params, eos_token_id=EOS)
        ref.status = RequestStatus.RUNNING
        for tok in stream:
            ref.append_output_token_ids(tok)
            if ref.maybe_finish():
                break
        assert (list(mine.output_token_ids), mine.status) == (list(ref.output_token_ids), ref.status), (
            f"case {case}: stream {stream}, {params}: mini_vllm's maybe_finish gives "
            f"{list(ref.output_token_ids)} {ref.status.name}, yours gives "
            f"{list(mine.output_token_ids)} {mine.status.name}"
        )
        assert mine.stop_reason == ref.stop_reason, (
            f"case {case}: stream {stream}, {params}: stop_reason should be {ref.stop_reason!r}, got "
            f"{mine.stop_reason!r}. Only a stop token id is recorded there; EOS leaves it None"
        )


def test_a_prompt_that_ends_in_a_stop_token_is_not_finished():
    # The stop checks look at OUTPUT tokens only: a prompt may end in EOS, in a stop id, or already
    # fill max_model_len, and the request must still generate its first token.
    for prompt, kw in (([1, 2, EOS], {}), ([1, 2, 7], {}), ([1, 2, 3], {"max_model_len": 3})):
        r = Request("p", prompt, SamplingParams(max_tokens=4, stop_token_ids=(7,)), eos_token_id=EOS)
        r.status = RequestStatus.RUNNING
        fired = lab.check_stop(r, **kw)
        assert fired is False and r.status == RequestStatus.RUNNING, (
            f"prompt {prompt} with no output yet ({kw or 'no max_model_len'}): check_stop must return False and "
            f"leave the request RUNNING, got {fired} / {r.status.name}; read output_token_ids[-1], never the "
            f"prompt's last token, and return False when there is no output"
        )
