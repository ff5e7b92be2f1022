"""What the engine hands back for a request: its completions.

Mirrors ``vllm/outputs.py``: ``RequestOutput`` holds ``outputs: list[CompletionOutput]``, one
completion per sample (``n`` of them when ``SamplingParams.n > 1``, in index order; see
``parallel_sampling.py``). For the common ``n = 1`` case ``token_ids``, ``text`` and
``finish_reason`` read the first completion, so code written before ``n`` existed keeps working.
``DraftTokenIds`` mirrors ``vllm/v1/outputs.py``: the drafts a proposer made after a step, handed
to ``Scheduler.update_draft_token_ids``; ``ModelRunnerOutput`` (same file) is what the model
runner's ``sample_tokens`` returns: the tokens of each request of the batch (an empty list for a
mid-prefill chunk), plus, in mini only, the collectives the TP group issued for the step, and
``KVConnectorOutput`` (same file): what the worker's KV connector finished this step.

``PoolingRequestOutput`` / ``EmbeddingRequestOutput`` are what ``LLMEngine.encode`` / ``embed``
return (vllm/outputs.py:204, :267; without ``num_cached_tokens``); the runner's output carries
``pooler_output`` for them.
Left out: per-token logprobs and the cumulative logprob in ``CompletionOutput``, prompt logprobs,
metrics, LoRA, streaming deltas (mini returns a request's output when it finishes; a parent with
``n > 1`` also reports, unfinished, each time one of its children finishes).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class CompletionOutput:
    index: int  # which of the request's n samples (0 when n = 1)
    text: str  # token_ids decoded, EOS skipped
    token_ids: list[int]  # generated tokens (an EOS that stopped generation is included)
    finish_reason: str | None  # "stop", "length" or "abort"; None while it runs
    stop_reason: int | None = None  # the stop token id that finished it, if one did

    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass(frozen=True)
class RequestOutput:
    request_id: str
    prompt: str | None  # the prompt text, or None when the prompt was given as token ids
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]  # finished completions, in index order
    finished: bool  # every completion is finished

    # The single-completion view (n = 1): the first completion's fields.
    @property
    def token_ids(self) -> list[int]:
        return self.outputs[0].token_ids

    @property
    def text(self) -> str:
        return self.outputs[0].text

    @property
    def finish_reason(self) -> str | None:
        return self.outputs[0].finish_reason


@dataclass(frozen=True)
class DraftTokenIds:
    req_ids: list[str]
    draft_token_ids: list[list[int]]  # one list per request id, possibly empty


@dataclass(frozen=True)
class KVConnectorOutput:
    """The worker-side connector's report for one step (``None`` fields: nothing to report)."""

    finished_sending: set[str] | None = None  # saves done: the scheduler may free these blocks
    finished_recving: set[str] | None = None  # async loads landed: parked requests may run
    invalid_block_ids: set[int] | None = None  # blocks whose load failed: recompute them


@dataclass(frozen=True)
class ModelRunnerOutput:
    req_ids: list[str]  # the batch's requests, in batch order
    req_id_to_index: dict[str, int]
    sampled_token_ids: list[list[int]]  # per request: accepted drafts + one more; [] for a mid-prefill chunk
    num_collectives: int = 0  # collectives the TP group issued for this step (0 at TP=1)
    kv_connector_output: KVConnectorOutput | None = None  # None: no KV connector configured
    pooler_output: list | None = None  # pooling runner: per request, its pooled array or None (unfinished)


@dataclass(frozen=True)
class PoolingOutput:
    data: Any  # np.ndarray: [H] for embed, [prompt_len, H] for token_embed


@dataclass(frozen=True)
class PoolingRequestOutput:
    request_id: str
    outputs: PoolingOutput
    prompt_token_ids: list[int]
    finished: bool


@dataclass(frozen=True)
class EmbeddingOutput:
    embedding: list[float]

    @property
    def hidden_size(self) -> int:
        return len(self.embedding)


@dataclass(frozen=True)
class EmbeddingRequestOutput:
    request_id: str
    outputs: EmbeddingOutput
    prompt_token_ids: list[int]
    finished: bool

    @staticmethod
    def from_base(output: PoolingRequestOutput) -> EmbeddingRequestOutput:
        data = output.outputs.data
        if data.ndim != 1:
            raise ValueError("an embedding is one vector per prompt (pooling_task='embed')")
        return EmbeddingRequestOutput(
            output.request_id, EmbeddingOutput(data.tolist()), output.prompt_token_ids, output.finished
        )


EMPTY_MODEL_RUNNER_OUTPUT = ModelRunnerOutput(req_ids=[], req_id_to_index={}, sampled_token_ids=[])
