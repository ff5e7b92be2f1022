"""A prefill/decode proxy over two in-process engines: prefill on one, decode on the other.

Mirrors the flow of upstream's disaggregated-serving proxy (``examples/online_serving/
disaggregated_serving/``, which is not part of the pinned wheel tree; the pin ships only the
engine-side token endpoint a proxy calls, ``vllm/entrypoints/serve/disagg/protocol.py:62 —
GenerateRequest``, whose ``kv_transfer_params`` carry the handoff): send the request to the prefill
engine with ``max_tokens=1``, then to the decode engine, and return the decode engine's answer.
The prefill engine (``kv_producer``) saves the prompt's KV through its connector as it computes it;
the decode engine (``kv_consumer``) finds it and computes only the tail.

Mini follows ``ExampleConnector``'s convention, not NIXL's: the decode engine gets the prompt plus
the prefill engine's one token (the connector keys the KV by the prompt without its last token),
asks for ``max_tokens - 1`` more, and the proxy puts the first token in front. For greedy sampling
the tokens equal one engine's. Left out: HTTP, streaming, round-robin over several engines of each
kind, ``kv_transfer_params``, ``n > 1``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from ..engine import LLMEngine
from ..outputs import CompletionOutput, RequestOutput
from ..sampling_params import SamplingParams
from ..tokenizer import Prompt


class DisaggProxy:
    """``generate`` like an ``LLMEngine``, split over a prefill engine and a decode engine."""

    def __init__(self, prefill: LLMEngine, decode: LLMEngine) -> None:
        for name, engine, role in (
            ("prefill", prefill, "is_kv_producer"),
            ("decode", decode, "is_kv_consumer"),
        ):
            if not isinstance(engine, LLMEngine):
                raise TypeError(f"{name} must be an LLMEngine, got {type(engine).__name__}")
            cfg = engine.vllm_config.kv_transfer_config
            if cfg is None or not getattr(cfg, role):
                got = "no kv_transfer_config" if cfg is None else f"kv_role={cfg.kv_role!r}"
                want = "kv_producer" if name == "prefill" else "kv_consumer"
                raise ValueError(f"the {name} engine needs kv_role {want!r} (or 'kv_both'), it has {got}")
        if prefill is decode:
            raise ValueError("prefill and decode must be two engines")
        self.prefill, self.decode = prefill, decode

    def generate(
        self, prompts: Prompt | Sequence[Prompt], sampling_params: SamplingParams | None = None
    ) -> list[RequestOutput]:
        """Outputs in input order, as ``LLMEngine.generate``; one sampling params for all prompts."""
        params = sampling_params if sampling_params is not None else SamplingParams()
        if not isinstance(params, SamplingParams):
            raise TypeError(f"sampling_params must be a SamplingParams, got {type(params).__name__}")
        if params.n != 1:
            raise ValueError(f"the proxy serves n=1 only, got n={params.n}")
        prompts = [prompts] if isinstance(prompts, str) else list(prompts)
        # 1. prefill: the whole prompt, one token; the producer's connector saves the prompt's KV
        first = self.prefill.generate(prompts, replace(params, max_tokens=1))
        outputs = []
        todo = [i for i, out in enumerate(first) if params.max_tokens > 1 and out.finish_reason == "length"]
        # 2. decode: prompt + that token; the consumer's connector loads the KV, it computes the tail
        rest = {}
        if todo:
            decoded = self.decode.generate(
                [first[i].prompt_token_ids + first[i].token_ids for i in todo],
                replace(params, max_tokens=params.max_tokens - 1),
            )
            rest = dict(zip(todo, decoded))
        for i, out in enumerate(first):
            if i not in rest:  # stopped at its first token (EOS, a stop token) or max_tokens=1
                outputs.append(out)
                continue
            tail = rest[i].outputs[0]
            token_ids = out.token_ids + tail.token_ids
            completion = CompletionOutput(
                index=0,
                text=self.decode.tokenizer.decode(token_ids),
                token_ids=token_ids,
                finish_reason=tail.finish_reason,
                stop_reason=tail.stop_reason,
            )
            outputs.append(replace(out, outputs=[completion], finished=rest[i].finished))
        return outputs
