"""MUTANT: compares the output length (not prompt + output) with max_model_len, so a full context does not stop the request.

Lab 01-05 — how a request ends: stop checks and finish reasons (reference solution).

Every time a token is appended, the engine asks one question: *is this request done?* Upstream
that is ``check_stop`` in ``vllm/v1/core/sched/utils.py``; mini_vllm calls it
``Request.maybe_finish``. You write your own version and the mapping from the final status to
the ``finish_reason`` string an API client sees. The order of the checks is the whole lesson:

1. the EOS token (skipped when ``ignore_eos=True``)   → ``FINISHED_STOPPED``   → ``"stop"``
2. a token in ``stop_token_ids`` (even with ignore_eos) → ``FINISHED_STOPPED``   → ``"stop"``
3. ``num_output_tokens >= max_tokens`` or ``num_tokens >= max_model_len``
                                                       → ``FINISHED_LENGTH_CAPPED`` → ``"length"``

An EOS that lands exactly on the cap therefore reports ``"stop"``. The EOS token itself is
appended first, so it counts as one of the output tokens.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from mini_vllm import Request, RequestStatus, SamplingParams


# --------------------------------------------------------------------------- the lab
def check_stop(request: Request, max_model_len: int | None = None) -> bool:
    """Look at the request's last output token; if it ends the request, set its status and return True.

    Checks, in this order: EOS (``request.eos_token_id``) unless
    ``request.sampling_params.ignore_eos``; ``stop_token_ids`` (also record
    ``request.stop_reason = token``); then the length caps. No output yet → False.
    """
    if request.num_output_tokens == 0:
        return False
    last = request.output_token_ids[-1]
    params = request.sampling_params
    if not params.ignore_eos and last == request.eos_token_id:
        request.status = RequestStatus.FINISHED_STOPPED
        return True
    if last in params.stop_token_ids:
        request.status = RequestStatus.FINISHED_STOPPED
        request.stop_reason = last
        return True
    if request.num_output_tokens >= params.max_tokens or (
        max_model_len is not None and request.num_output_tokens >= max_model_len
    ):
        request.status = RequestStatus.FINISHED_LENGTH_CAPPED
        return True
    return False


def finish_reason(request: Request) -> str | None:
    """The OpenAI-style finish reason for a request's status: "stop", "length", "abort" or None."""
    return {
        RequestStatus.FINISHED_STOPPED: "stop",
        RequestStatus.FINISHED_LENGTH_CAPPED: "length",
        RequestStatus.FINISHED_ABORTED: "abort",
    }.get(request.status)


def run_until_stop(
    token_stream: Iterable[int],
    eos_token_id: int,
    sampling_params: SamplingParams,
    prompt_token_ids: Sequence[int] = (1, 2, 3),
) -> Request:
    """Feed a scripted "model" to a RUNNING request, one token at a time, until ``check_stop`` fires.

    Build ``Request("scripted", prompt_token_ids, sampling_params, eos_token_id=eos_token_id)``,
    set it RUNNING, then for each token: ``append_output_token_ids(token)`` and stop as soon as
    ``check_stop(request)`` is True. If the stream runs dry first, the request stays RUNNING.
    """
    request = Request("scripted", prompt_token_ids, sampling_params, eos_token_id=eos_token_id)
    request.status = RequestStatus.RUNNING
    for token in token_stream:
        request.append_output_token_ids(token)
        if check_stop(request):
            break
    return request


# --------------------------------------------------------------------------- demo
def main() -> None:
    eos = 256
    cases = [
        ("EOS in the middle", [10, 20, eos, 30, 40], SamplingParams(max_tokens=8)),
        ("EOS ignored", [10, eos, 20, eos, 30, 40], SamplingParams(max_tokens=4, ignore_eos=True)),
        ("no EOS at all", [10, 20, 30, 40, 50, 60], SamplingParams(max_tokens=5)),
        ("EOS exactly at the cap", [10, 20, eos], SamplingParams(max_tokens=3)),
        ("a stop token id", [10, 7, 20], SamplingParams(max_tokens=8, stop_token_ids=(7,))),
        ("stream runs dry", [10, 20], SamplingParams(max_tokens=8)),
    ]
    print(f"EOS id {eos} (mini_vllm's ByteTokenizer; Llama 2 uses 2, GPT-2 uses 50256)")
    print(f"  {'case':<24}{'output tokens':<22}{'status':<24}finish_reason")
    for name, stream, params in cases:
        r = run_until_stop(stream, eos, params)
        print(f"  {name:<24}{list(r.output_token_ids)!s:<22}{r.status.name:<24}{finish_reason(r)!r}")


if __name__ == "__main__":
    main()
