"""The real vLLM 0.22.1 Scheduler + StructuredOutputManager + xgrammar on CPU, random logits as the model.

Used by ``mini_vllm/test_upstream_structured_output.py`` and Phase 12's lab 03. Importing this
module imports torch and vllm (seconds).

A tiny byte-level BPE tokenizer (trained here on three lines, about 300 tokens) and the course's
stub model config make a ``VllmConfig`` with the xgrammar backend; requests carry
``StructuredOutputsParams`` (a JSON schema, a regex, a choice). Each step the real scheduler
schedules, ``Scheduler.get_grammar_bitmask`` fills one row per constrained request, the
runner-side ``apply_grammar_bitmask`` masks seeded random logits, argmax "samples", and
``update_from_output`` advances the grammars. Grammars compile synchronously
(``_use_async_grammar_compilation = False``, as with the external_launcher executor): with the
default thread pool the step at which a request becomes schedulable depends on timing, and the
same seed could give different texts.

``standard_run()`` is the one run the tests share (cached for the process): the requests in
``STANDARD_REQUESTS``, ``max_tokens=STANDARD_MAX_TOKENS``, seed 0.
"""

from __future__ import annotations

import json
import os
import tempfile
import warnings
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from course.runtime import real_vllm as rv  # first: the CPU wiring that precedes any vllm import

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    import numpy as np
    import torch
    from vllm.config import (
        CacheConfig,
        DeviceConfig,
        ModelConfig,
        SchedulerConfig,
        StructuredOutputsConfig,
        VllmConfig,
    )
    from vllm.sampling_params import SamplingParams, StructuredOutputsParams
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.outputs import ModelRunnerOutput
    from vllm.v1.request import Request
    from vllm.v1.structured_output import StructuredOutputManager
    from vllm.v1.structured_output.utils import apply_grammar_bitmask

__all__ = ["PROFILE_SCHEMA", "SCHEMA", "STANDARD_REQUESTS", "StructuredRun", "run_requests", "standard_run"]

SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
          "required": ["name", "age"]}
PROFILE_SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 6},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "role": {"enum": ["admin", "user", "guest"]},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 3}, "maxItems": 2},
        "active": {"type": "boolean"},
    },
    "required": ["name", "age", "role"],
    "additionalProperties": False,
}
STANDARD_REQUESTS: dict[str, dict[str, Any]] = {
    **{f"json{i}": {"json": SCHEMA} for i in range(4)},
    "regex": {"regex": "(yes|no) [0-9][0-9]"},
    "choice": {"choice": ["red", "green", "blue"]},
    **{f"profile{i}": {"json": PROFILE_SCHEMA} for i in range(4)},
}
STANDARD_MAX_TOKENS = 60


@dataclass
class StructuredRun:
    """What one run produced, per request id."""

    tokenizer: Any
    vocab_size: int
    texts: dict[str, str]
    tokens: dict[str, list[int]]
    finish: dict[str, str]  # "stop" or "length"
    steps: int
    rows: dict[str, list[tuple[list[int], np.ndarray]]] = field(default_factory=dict)  # (tokens so far, bitmask row)


@lru_cache(maxsize=1)
def _tokenizer_dir() -> str:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    d = tempfile.mkdtemp(prefix="mini_vllm_bpe_")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=360, special_tokens=["<s>", "</s>"], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(['{"name": "Ada", "age": 36}', "yes no maybe red green blue",
                             "hello world 0123456789"], trainer)
    tok.save(os.path.join(d, "tokenizer.json"))
    with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>"}, f)
    with open(os.path.join(rv.model_dir(), "config.json")) as f:
        cfg = json.load(f)
    cfg.update(vocab_size=tok.get_vocab_size(), bos_token_id=0, eos_token_id=1)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f)
    return d


class _Batch:  # what apply_grammar_bitmask reads from the runner's InputBatch
    def __init__(self, req_ids: list[str]) -> None:
        self.req_ids = req_ids


def run_requests(requests: dict[str, dict[str, Any]], *, max_tokens: int, seed: int = 0,
                 max_steps: int = 400) -> StructuredRun:
    """Run ``requests`` ({id: StructuredOutputsParams keywords}) to completion on a fresh real scheduler.

    Prompts are ``"hello"``; every request is greedy over seeded standard-normal logits (one
    ``torch.Generator(seed)``, one draw of ``[scheduled requests, V]`` per step). Raises
    RuntimeError when the requests are not all finished after ``max_steps`` steps.
    """
    d = _tokenizer_dir()
    vc = VllmConfig(
        model_config=ModelConfig(model=d, tokenizer=d, dtype="float32", max_model_len=256, seed=0),
        scheduler_config=SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=256, max_model_len=256,
                                         is_encoder_decoder=False, async_scheduling=False),
        cache_config=CacheConfig(block_size=16),
        device_config=DeviceConfig(device="cpu"),
        structured_outputs_config=StructuredOutputsConfig(backend="xgrammar"),
    )
    vc.cache_config.num_gpu_blocks = 64
    manager = StructuredOutputManager(vc)
    manager._use_async_grammar_compilation = False  # deterministic: compile inside grammar_init
    sched = Scheduler(vllm_config=vc, kv_cache_config=rv.make_kv_cache_config(vc), structured_output_manager=manager,
                         block_size=vc.cache_config.block_size, log_stats=False)
    tok = manager.tokenizer
    hasher = rv.make_block_hasher(vc)
    for rid, kwargs in requests.items():
        sp = SamplingParams(max_tokens=max_tokens, temperature=0.0, structured_outputs=StructuredOutputsParams(**kwargs))
        sp._validate_structured_outputs(vc.structured_outputs_config, tok)  # the front end's job
        sp.update_from_generation_config({}, tok.eos_token_id)
        req = Request(request_id=rid, prompt_token_ids=tok.encode("hello"), sampling_params=sp,
                      pooling_params=None, block_hasher=hasher)
        manager.grammar_init(req)  # EngineCore.preprocess_add_request does this
        sched.add_request(req)

    gen = torch.Generator().manual_seed(seed)
    V = vc.model_config.get_vocab_size()
    tokens: dict[str, list[int]] = {rid: [] for rid in requests}
    finish: dict[str, str] = {}
    rows: dict[str, list[tuple[list[int], np.ndarray]]] = {rid: [] for rid in requests}
    steps = 0
    while sched.has_unfinished_requests():
        if steps == max_steps:
            raise RuntimeError(f"the real scheduler did not finish {len(requests)} requests in {max_steps} steps")
        steps += 1
        out = sched.schedule()
        grammar_out = sched.get_grammar_bitmask(out)
        ids = list(out.num_scheduled_tokens)
        if grammar_out is not None:
            for i, rid in enumerate(grammar_out.structured_output_request_ids):
                rows[rid].append((list(tokens[rid]), grammar_out.grammar_bitmask[i].copy()))
        logits = torch.randn(len(ids), V, generator=gen)
        if grammar_out is not None:
            apply_grammar_bitmask(out, grammar_out, _Batch(ids), logits)
        picks = logits.argmax(-1).tolist()
        sampled = [[] if sched.requests[r].is_prefill_chunk else [t] for r, t in zip(ids, picks, strict=True)]
        outputs = sched.update_from_output(out, ModelRunnerOutput(
            req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)}, sampled_token_ids=sampled))
        for eco in outputs.values():
            for o in eco.outputs:
                tokens[o.request_id].extend(o.new_token_ids)
                if o.finish_reason is not None:
                    finish[o.request_id] = str(o.finish_reason)
    texts = {rid: tok.decode(t, skip_special_tokens=True) for rid, t in tokens.items()}
    return StructuredRun(tokenizer=tok, vocab_size=V, texts=texts, tokens=tokens, finish=finish, steps=steps,
                         rows=rows)


@lru_cache(maxsize=1)
def standard_run() -> StructuredRun:
    """``STANDARD_REQUESTS`` at ``max_tokens=STANDARD_MAX_TOKENS``, seed 0 (computed once per process)."""
    return run_requests(STANDARD_REQUESTS, max_tokens=STANDARD_MAX_TOKENS, seed=0)
