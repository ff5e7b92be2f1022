"""The engine loop: request intake, ``step()``, outputs; the work of a step happens in the runner.

Mirrors ``vllm/v1/engine/llm_engine.py`` (``LLMEngine``: ``add_request``, ``step``,
``has_unfinished_requests``), the offline ``vllm/entrypoints/llm.py`` (``LLM.generate``) and
``vllm/v1/engine/core.py`` (``EngineCore.step``), whose order one step keeps::

    scheduler_output = scheduler.schedule()
    model_executor.execute_model(scheduler_output)         # runner: inputs + forward, every rank
    grammar_output = self._get_grammar_bitmask(scheduler_output)
    model_output = model_executor.sample_tokens(grammar_output)   # runner: mask, sample, verify
    finished = scheduler.update_from_output(scheduler_output, tokens of model_output)

then, with speculative decoding, ``post_step`` takes the drafts the runner's n-gram drafter proposed
and hands them to the scheduler. The model runner (``model_runner.py``) owns the inputs, the
forward, sampling, rejection sampling and drafting; the engine
owns the tokenizer, one seed per request, grammars, ``n > 1`` fan-out (``parallel_sampling.py``)
and the outputs. README.md ("How a step runs") tells the whole story. A pooling model's engine
(``runner_type == "pooling"``) serves ``encode`` / ``embed`` (upstream's ``LLM.encode`` / ``embed``,
vllm/entrypoints/pooling/offline.py:51) instead of ``generate``.

Left out: the ZMQ front end and the detokenizer process, async scheduling, streaming outputs,
logprobs in outputs (``beam_search.py`` reads the toy model's rows instead).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from .beam_search import BeamSearchOutput
from .beam_search import beam_search as run_beam_search
from .config import VllmConfig, create_engine_config
from .executor import Executor, make_executor
from .grammar import GrammarCompiler, StructuredOutputManager, byte_vocab
from .lora import LoRARequest
from .models.interfaces import get_supported_tasks
from .models.registry import ModelRegistry
from .outputs import (
    CompletionOutput,
    DraftTokenIds,
    EmbeddingRequestOutput,
    ModelRunnerOutput,
    PoolingOutput,
    PoolingRequestOutput,
    RequestOutput,
)
from .parallel_sampling import ParentRequest
from .platforms import get_current_platform, load_general_plugins
from .pooling_params import PoolingParams
from .request import Request, RequestStatus, check_cache_salt
from .sampler import Sampler
from .sampling_params import BeamSearchParams, SamplingParams
from .scheduler import GrammarOutput, Scheduler, SchedulerOutput
from .spec_decode import NgramProposer
from .tokenizer import ByteTokenizer, HFTokenizer, Prompt


class LLMEngine:
    """A whole (tiny) inference engine: ``add_request`` + ``step``, or just ``generate``."""

    def __init__(self, vllm_config: VllmConfig | None = None, *, seed: int = 0, **engine_args: Any) -> None:
        """Build tokenizer, model, sampler and scheduler (which owns the KV cache).

        Pass a ``VllmConfig``, or the flat engine arguments it is made from (``num_gpu_blocks``,
        ``block_size``, ``enable_prefix_caching``, ``max_num_seqs``, ``max_num_batched_tokens``,
        ``max_model_len``, ``long_prefill_token_threshold``, ``enable_chunked_prefill``; see
        ``config.py``), the parallel ones (``tensor_parallel_size``,
        ``distributed_executor_backend``), ``speculative_config`` and ``kv_transfer_config`` (a KV
        connector, Phase 15; it needs a checkpoint model). ``max_model_len`` (prompt + output tokens) defaults to what the pool
        holds, ``(num_gpu_blocks - 1) * block_size``, and may not exceed it. ``seed`` seeds
        sampling only. ``model="path/to/checkpoint"`` runs that checkpoint (its ``config.json``'s
        architecture, its weights, its ``tokenizer.json`` and EOS; ``max_model_len`` capped at its
        ``max_position_embeddings``) instead of the toy model; TP > 1 and LoRA are refused for it.
        """
        load_general_plugins()  # phase 17: entry-point plugins run once, before any model is resolved
        if vllm_config is None:
            vllm_config = create_engine_config(**engine_args)
        elif engine_args:
            raise TypeError("pass either a VllmConfig or engine arguments, not both")
        self.platform = get_current_platform()  # resolved once per process; it may adjust the config
        vllm_config = self.platform.check_and_update_config(vllm_config)
        if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
            raise ValueError(f"seed must be an int >= 0, got {seed!r}")
        self.vllm_config = vllm_config
        parallel, model_config = vllm_config.parallel_config, vllm_config.model_config
        self.tokenizer: ByteTokenizer | HFTokenizer = ByteTokenizer()
        if model_config is not None:
            arch = model_config.architectures[0]
            if parallel.tensor_parallel_size > 1:
                raise ValueError(f"tensor_parallel_size={parallel.tensor_parallel_size}: {arch} cannot be sharded "
                                 "(mini_vllm shards only the toy model's output projection); use 1")
            if vllm_config.lora_config is not None:
                raise ValueError(f"enable_lora=True: {arch} has no LoRA layers in mini_vllm (only the toy model "
                                 "takes lora_request)")
            self.tokenizer = HFTokenizer(model_config.model, model_config.vocab_size, model_config.eos_token_id)
        # What the model can serve, from its class alone, before anything is built.
        archs = model_config.architectures if model_config is not None else ["ToyForCausalLM"]
        self.runner_type = model_config.runner_type if model_config is not None else "generate"
        ModelRegistry.verify_supported(archs, runner=self.runner_type)
        self.supported_tasks = get_supported_tasks(ModelRegistry.resolve_model_cls(archs)[0])
        if self.runner_type == "pooling" and vllm_config.speculative_config is not None:
            raise ValueError("speculative decoding needs a generative model; this engine pools")
        # fixed "weights" (the toy's seed 0, or the checkpoint's): ``seed`` is for sampling
        self.model_executor: Executor = make_executor(
            self.tokenizer.vocab_size, parallel.tensor_parallel_size, backend=parallel.distributed_executor_backend,
            vllm_config=vllm_config,
        )
        self.seed = seed
        self.max_model_len = vllm_config.max_model_len
        self.scheduler = Scheduler(vllm_config)
        spec = vllm_config.speculative_config
        # With k drafts a grammar must undo k tentative tokens and fill k + 1 bitmask rows per request.
        num_spec = spec.num_speculative_tokens if spec is not None else 0
        vocab = byte_vocab() if model_config is None else self.tokenizer.grammar_vocab()
        self.structured_output_manager = StructuredOutputManager(
            GrammarCompiler(vocab, num_speculative_tokens=num_spec), vllm_config.scheduler_config.max_num_seqs
        )
        self.use_spec_decode = spec is not None  # the runner drafts; post_step takes its drafts
        self.num_steps = 0  # engine steps run (speculation's saving shows here)
        self._next_index = 0  # per-engine request counter: ids req-0, req-1, ...
        self._prompts: dict[str, str | None] = {}  # request id -> prompt text (None for token ids)
        self._parent_requests: dict[str, ParentRequest] = {}  # parent id -> parent (n > 1), until done
        self._parent_of: dict[str, ParentRequest] = {}  # child id -> its parent, until the child is done

    @property
    def model(self) -> Executor:
        """The model as the engine sees it: the executor answers ``ToyModel.forward``'s contract."""
        return self.model_executor

    @property
    def sampler(self) -> Sampler:
        """The sampler of the in-process worker's runner (the ``"uni"`` backend only)."""
        worker = getattr(self.model_executor, "driver_worker", None)
        if worker is None:
            raise AttributeError("the sampler lives in the worker processes of the 'mp' backend")
        return worker.model_runner.sampler

    @sampler.setter
    def sampler(self, sampler: Sampler) -> None:
        worker = getattr(self.model_executor, "driver_worker", None)
        if worker is None:
            raise AttributeError("the sampler lives in the worker processes of the 'mp' backend")
        worker.model_runner.sampler = sampler

    @property
    def drafter(self) -> NgramProposer | None:
        """The n-gram drafter of the in-process worker's runner (None without speculation)."""
        worker = getattr(self.model_executor, "driver_worker", None)
        if worker is None:
            raise AttributeError("the drafter lives in the worker processes of the 'mp' backend")
        return worker.model_runner.drafter

    @property
    def collectives_per_step(self) -> list[int]:
        """Collectives the TP group issued, one entry per forward (0 at TP=1; 1 all-gather at TP>1)."""
        return self.model_executor.collectives_per_step

    # -- lifetime --------------------------------------------------------------------------
    def shutdown(self) -> None:
        """Stop the workers (idempotent). The engine refuses further steps and requests.

        Without it, the multiprocess executor's own finalizer kills its workers when it is garbage
        collected or at interpreter exit, so no worker outlives the engine's process.
        """
        self.model_executor.shutdown()

    # -- profiling (Phase 18) -----------------------------------------------------------------
    def start_profile(self, profile_dir: str = "mini_vllm_profiles") -> None:
        """Profile every call from now until ``stop_profile()`` (upstream: ``LLMEngine.start_profile``)."""
        from .metrics import Profiler

        if getattr(self, "profiler", None) is None or self.profiler.out_dir != profile_dir:
            if getattr(self, "profiler", None) is not None and self.profiler.running:
                raise RuntimeError("the profiler is already running: call stop_profile() first")
            self.profiler = Profiler(profile_dir)
        self.profiler.start()

    def stop_profile(self) -> str:
        """Stop profiling; returns the cProfile file written (open it with ``python -m pstats``)."""
        if getattr(self, "profiler", None) is None:
            raise RuntimeError("the profiler is not running: call start_profile() first")
        return self.profiler.stop()

    def _check_alive(self) -> None:
        if self.model_executor.is_shut_down:
            raise RuntimeError("the engine is shut down (shutdown() was called or a worker died); build a new one")

    def __enter__(self) -> LLMEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    # -- requests --------------------------------------------------------------------------
    def _tokenize(self, prompt: Prompt) -> list[int]:
        if isinstance(prompt, str):
            token_ids = self.tokenizer.encode(prompt)
        elif isinstance(prompt, (list, tuple, np.ndarray)):
            token_ids = []
            for tok in prompt:
                if isinstance(tok, (bool, np.bool_)) or not isinstance(tok, (int, np.integer)):
                    raise TypeError(f"prompt token ids must be ints, got {tok!r}")
                token_ids.append(int(tok))
        else:
            raise TypeError(f"a prompt must be a str or a list of token ids, got {type(prompt).__name__}")
        if not token_ids:
            raise ValueError("the prompt is empty: give at least one token")
        vocab = self.tokenizer.vocab_size
        if any(not 0 <= t < vocab for t in token_ids):
            raise ValueError(f"prompt token ids must lie in [0, {vocab})")
        if len(token_ids) >= self.max_model_len:
            raise ValueError(
                f"the prompt (length {len(token_ids)}) plus at least one output token is longer than "
                f"max_model_len={self.max_model_len}"
            )
        return token_ids

    def _check_params(self, sampling_params: SamplingParams | None) -> SamplingParams:
        if sampling_params is None:
            return SamplingParams()
        if not isinstance(sampling_params, SamplingParams):
            raise TypeError(f"sampling_params must be a SamplingParams, got {type(sampling_params).__name__}")
        if sampling_params.structured_outputs is not None:  # compiles (cached): a bad regex fails here
            self.structured_output_manager.compile(sampling_params.structured_outputs)
        return sampling_params

    def _check_generative(self, api: str) -> None:
        if self.runner_type != "generate":
            raise ValueError(f"LLMEngine.{api}() is only supported for generative models; "
                             f"{self._arch} is a pooling model (use encode or embed)")

    def _id_taken(self, request_id: str, n: int) -> bool:
        """True when ``request_id`` or (for ``n > 1``) one of its child ids is in use."""
        if request_id in self._prompts or request_id in self._parent_requests:
            return True
        return n > 1 and any(ParentRequest.child_request_id(i, request_id) in self._prompts for i in range(n))

    def add_request(
        self,
        prompt: Prompt,
        sampling_params: SamplingParams | None = None,
        request_id: str | None = None,
        lora_request: LoRARequest | None = None,
        cache_salt: str | None = None,
    ) -> str:
        """Tokenize and queue a prompt (``str`` or token ids); returns its request id.

        Nothing is scheduled yet: admission happens in the next ``step()``. Ids default to
        ``req-0, req-1, ...`` per engine (upstream's ``LLM`` counts the same way). With
        ``n > 1`` the request is queued as ``n`` children ``"{i}_{request_id}"`` (upstream's
        ``ParentRequest``); the id returned is the parent's, which ``abort_request`` accepts.
        An unseeded request draws from ``default_rng(engine seed + its index)``; unseeded
        children from ``default_rng([engine seed + index, child index])``. A ``lora_request``
        needs an engine built with ``enable_lora=True``; the scheduler then admits at most
        ``max_loras`` distinct adapters per step (the toy model itself applies no weights).
        ``cache_salt`` (upstream: the prompt's ``cache_salt``) keys the first block's hash.
        """
        self._check_alive()
        self._check_generative("add_request")
        token_ids = self._tokenize(prompt)
        params = self._check_params(sampling_params)
        if lora_request is not None and not isinstance(lora_request, LoRARequest):
            raise TypeError(f"lora_request must be a LoRARequest or None, got {type(lora_request).__name__}")
        if lora_request is not None and self.vllm_config.lora_config is None:
            raise ValueError(f"Got lora_request {lora_request} but LoRA is not enabled (enable_lora=True)")
        check_cache_salt(cache_salt)
        n = params.n
        if request_id is not None and (not isinstance(request_id, str) or not request_id):
            raise ValueError(f"request_id must be a non-empty str, got {request_id!r}")
        if request_id is not None and self._id_taken(request_id, n):
            raise ValueError(f"request id {request_id!r} (or one of its {n} child ids) is already in use")
        index = self._next_index
        self._next_index += 1
        if request_id is None:
            request_id = f"req-{index}"
            while self._id_taken(request_id, n):  # a caller took this name explicitly
                request_id = f"req-{self._next_index}"
                self._next_index += 1
        text = prompt if isinstance(prompt, str) else None
        if n == 1:
            seed = params.seed if params.seed is not None else self.seed + index
            self._queue(request_id, token_ids, params, index, text, seed, lora_request, cache_salt)
            return request_id
        parent = ParentRequest(request_id, params)
        self._parent_requests[request_id] = parent
        for i in range(n):
            child_id, child_params = parent.get_child_info(i)
            seed = child_params.seed if child_params.seed is not None else [self.seed + index, i]
            self._queue(child_id, token_ids, child_params, index, text, seed, lora_request, cache_salt)
            self._parent_of[child_id] = parent
        return request_id

    def _queue(
        self,
        request_id: str,
        token_ids: list[int],
        params: SamplingParams,
        index: int,
        text: str | None,
        seed: Any,
        lora_request: LoRARequest | None,
        cache_salt: str | None = None,
    ) -> None:
        request = Request(
            request_id,
            token_ids,
            params,
            eos_token_id=self.tokenizer.eos_token_id,
            block_hasher=self.scheduler.kv_cache_manager.block_hasher,
            arrival_time=float(index),
            lora_request=lora_request,
            cache_salt=cache_salt,
        )
        if params.structured_outputs is not None:
            self.structured_output_manager.grammar_init(request_id, params.structured_outputs)
        request.generator_seed = seed  # the runner's generator for this request starts from it
        self.scheduler.add_request(request)
        self._prompts[request_id] = text

    def abort_request(self, request_id: str | Sequence[str]) -> list[RequestOutput]:
        """Finish request(s) now with reason ``"abort"``; returns their outputs.

        A parent id (``n > 1``) aborts its children still running and returns the parent's one
        output (its children finished earlier keep their own finish reasons).
        """
        ids = [request_id] if isinstance(request_id, str) else list(request_id)
        child_ids: list[str] = []
        for rid in ids:
            parent = self._parent_requests.get(rid) if isinstance(rid, str) else None
            if parent is None:
                child_ids.append(rid)
            else:
                child_ids.extend(sorted(parent.child_requests, key=lambda c: int(c.split("_", 1)[0])))
        finished = self.scheduler.finish_requests(child_ids, RequestStatus.FINISHED_ABORTED)
        outputs: dict[str, RequestOutput] = {}
        for r in finished:
            out = self._make_output(r)
            outputs[out.request_id] = out  # a parent's last output is its finished one
        return list(outputs.values())

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished_requests()

    # -- the loop --------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """Run one engine step; return the requests that finished during it."""
        self._check_alive()
        scheduler_output = self.scheduler.schedule()
        self.num_steps += 1
        self.model_executor.execute_model(scheduler_output)
        grammar_output = self._get_grammar_bitmask(scheduler_output)
        model_output = self.model_executor.sample_tokens(grammar_output)
        sampled = self._sampled_token_ids(scheduler_output, model_output)
        self._accept_grammar_tokens(sampled)
        pooled = {rid: out for rid, out in zip(model_output.req_ids, model_output.pooler_output or ())
                  if out is not None}
        finished = self.scheduler.update_from_output(
            scheduler_output, sampled, pooled, kv_connector_output=model_output.kv_connector_output
        )
        if self.use_spec_decode:
            self.post_step({r.request_id for r in finished})
        return [self._make_output(r, pooled.get(r.request_id)) for r in finished]

    @staticmethod
    def _sampled_token_ids(scheduler_output: SchedulerOutput, model_output: ModelRunnerOutput) -> dict[str, Any]:
        """The runner's lists as the scheduler takes them: one int without drafts, a list with them."""
        spec = scheduler_output.scheduled_spec_decode_tokens
        return {rid: tokens if rid in spec else tokens[0]
                for rid, tokens in zip(model_output.req_ids, model_output.sampled_token_ids) if tokens}

    def _get_grammar_bitmask(self, scheduler_output: SchedulerOutput) -> GrammarOutput | None:
        """The bitmask rows of every constrained request that samples this step, in scheduling order.

        A request with k drafts gets k + 1 rows: row j masks with its grammar's state after its
        first j drafts (the manager advances tentatively and rolls back). None when no request
        of the step has a grammar.
        """
        manager = self.structured_output_manager
        if not manager.grammars:
            return None
        scheduled = scheduler_output.num_scheduled_tokens
        reqs = [r for r in scheduler_output.scheduled_requests
                if r.request_id in manager.grammars and Scheduler.needs_sample(r, scheduled[r.request_id])]
        if not reqs:
            return None
        grammars = [manager.grammars[r.request_id] for r in reqs]
        spec = scheduler_output.scheduled_spec_decode_tokens
        bitmask = manager.grammar_bitmask(grammars, [spec.get(r.request_id, []) for r in reqs] if spec else None)
        return GrammarOutput([r.request_id for r in reqs], bitmask)

    def _accept_grammar_tokens(self, sampled: dict[str, int | Sequence[int]]) -> None:
        """Advance each constrained request's grammar by its sampled token(s)."""
        manager = self.structured_output_manager
        if manager.grammars:
            for rid, tokens in sampled.items():
                if manager.should_advance(rid):
                    manager.accept_tokens(rid, [tokens] if isinstance(tokens, int) else tokens)

    def post_step(self, finished_req_ids: set[str]) -> None:
        """Hand the drafts the runner proposed after sampling to the scheduler (``EngineCore.post_step``).

        A request with a grammar keeps only the drafts its grammar accepts, cut before any EOS (as
        upstream's scheduler trims them with ``validate_tokens``): every verified position then has a
        legal token, and the masked rows make the verifier keep the output inside the grammar.
        """
        draft_token_ids = self.model_executor.take_draft_token_ids()
        if draft_token_ids is None:
            return
        manager, eos = self.structured_output_manager, self.tokenizer.eos_token_id
        req_ids, drafts = [], []
        for rid, draft in zip(draft_token_ids.req_ids, draft_token_ids.draft_token_ids):
            if rid in finished_req_ids:
                continue
            if draft and rid in manager.grammars:
                legal = manager.validate_draft_tokens(rid, draft)
                draft = legal[: legal.index(eos)] if eos in legal else legal
            req_ids.append(rid)
            drafts.append(draft)
        self.scheduler.update_draft_token_ids(DraftTokenIds(req_ids, drafts))

    def _make_output(self, request: Request, pooled: Any = None) -> RequestOutput | PoolingRequestOutput:
        """The output for a finished request; a child's is its parent's (finished once all are)."""
        rid = request.request_id
        prompt = self._prompts.pop(rid, None)
        if request.pooling_params is not None:  # its pooled rows (None when it was aborted)
            return PoolingRequestOutput(rid, PoolingOutput(pooled), list(request.prompt_token_ids),
                                        request.is_finished)
        self.structured_output_manager.free(rid)
        token_ids = list(request.output_token_ids)
        parent = self._parent_of.pop(rid, None)
        completion = CompletionOutput(
            index=0 if parent is None else int(rid.split("_", 1)[0]),
            text=self.tokenizer.decode(token_ids),
            token_ids=token_ids,
            finish_reason=request.get_finished_reason(),
            stop_reason=request.stop_reason,
        )
        completions, finished = [completion], request.is_finished
        if parent is not None:
            completions, finished = parent.get_outputs(rid, completion)
            if finished:
                del self._parent_requests[parent.request_id]
            rid = parent.request_id
        return RequestOutput(
            request_id=rid,
            prompt=prompt,
            prompt_token_ids=list(request.prompt_token_ids),
            outputs=completions,
            finished=finished,
        )

    def generate(
        self,
        prompts: Prompt | Sequence[Prompt],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
    ) -> list[RequestOutput]:
        """Run prompts to completion; outputs come back in input order.

        ``prompts`` is one prompt or a list of prompts (each a ``str`` or a list of token ids).
        ``sampling_params`` is one ``SamplingParams`` for all, or one per prompt. Everything is
        validated before the first request is queued, so a bad prompt changes nothing.
        """
        self._check_generative("generate")
        prompts = self._prompt_list(prompts)
        if isinstance(sampling_params, (list, tuple)):
            if len(sampling_params) != len(prompts):
                raise ValueError(f"got {len(sampling_params)} sampling_params for {len(prompts)} prompts")
            params = [self._check_params(p) for p in sampling_params]
        else:
            params = [self._check_params(sampling_params)] * len(prompts)
        for prompt in prompts:
            self._tokenize(prompt)  # raises before anything is queued

        ids = [self.add_request(p, sp) for p, sp in zip(prompts, params)]
        results: dict[str, RequestOutput] = {}
        wanted = set(ids)
        while self.has_unfinished_requests() and len(results) < len(ids):
            for output in self.step():
                if output.request_id in wanted and output.finished:  # a parent reports once per child
                    results[output.request_id] = output
        return [results[rid] for rid in ids]

    @staticmethod
    def _prompt_list(prompts: Prompt | Sequence[Prompt]) -> list[Prompt]:
        if isinstance(prompts, str):
            prompts = [prompts]
        if not isinstance(prompts, (list, tuple)):
            raise TypeError(f"prompts must be a str or a list of prompts, got {type(prompts).__name__}")
        if prompts and all(isinstance(p, (int, np.integer)) and not isinstance(p, bool) for p in prompts):
            raise TypeError("prompts looks like one list of token ids; wrap it in a list: [[...]]")
        return list(prompts)

    def encode(
        self,
        prompts: Prompt | Sequence[Prompt],
        pooling_params: PoolingParams | Sequence[PoolingParams] | None = None,
        *,
        pooling_task: str | None = None,
    ) -> list[PoolingRequestOutput]:
        """Pool each prompt's hidden states (``pooling_task`` ``"embed"`` or ``"token_embed"``).

        The checks of vllm/entrypoints/pooling/offline.py:138 — PoolingOfflineMixin._verify_pooling_task,
        then every prompt and every ``PoolingParams`` (resolved to ``pooling_task``), all before
        the first request is queued: a refused call leaves the engine as it was. Outputs come
        back in input order; ``outputs.data`` is ``[H]`` (embed) or ``[prompt_len, H]``.
        """
        self._check_alive()
        if self.runner_type != "pooling":
            raise ValueError("LLMEngine.encode() is only supported for pooling models; "
                             f"{self._arch} generates text (a LlamaModel checkpoint pools)")
        if pooling_task is None:
            raise ValueError(f"pooling_task required for LLMEngine.encode: one of {list(self.supported_tasks)} "
                             "(or use LLMEngine.embed)")
        if pooling_task not in self.supported_tasks:
            raise ValueError(f"unsupported pooling task {pooling_task!r}; {self._arch} supports {list(self.supported_tasks)}")
        prompts = self._prompt_list(prompts)
        if pooling_params is None or isinstance(pooling_params, PoolingParams):
            pooling_params = [pooling_params or PoolingParams()] * len(prompts)
        if len(pooling_params) != len(prompts):
            raise ValueError(f"got {len(pooling_params)} pooling_params for {len(prompts)} prompts")
        for p in pooling_params:
            if not isinstance(p, PoolingParams):
                raise TypeError(f"pooling_params must be PoolingParams, got {type(p).__name__}")
        params = [p.verify(pooling_task) for p in pooling_params]  # copies: the caller's stay as given
        token_ids = [self._tokenize(p) for p in prompts]  # raises before anything is queued
        ids = []
        for prompt, tokens, p in zip(prompts, token_ids, params):
            index, request_id = self._next_index, f"req-{self._next_index}"
            self._next_index += 1
            while self._id_taken(request_id, 1):
                request_id = f"req-{self._next_index}"
                self._next_index += 1
            request = Request(request_id, tokens, eos_token_id=self.tokenizer.eos_token_id,
                              block_hasher=self.scheduler.kv_cache_manager.block_hasher,
                              arrival_time=float(index), pooling_params=p)
            request.generator_seed = self.seed + index  # unused: a pooling request samples nothing
            self.scheduler.add_request(request)
            self._prompts[request_id] = prompt if isinstance(prompt, str) else None
            ids.append(request_id)
        results: dict[str, PoolingRequestOutput] = {}
        wanted = set(ids)
        while self.has_unfinished_requests() and len(results) < len(ids):
            for output in self.step():
                if output.request_id in wanted:
                    results[output.request_id] = output
        return [results[rid] for rid in ids]

    def embed(
        self,
        prompts: Prompt | Sequence[Prompt],
        *,
        pooling_params: PoolingParams | Sequence[PoolingParams] | None = None,
    ) -> list[EmbeddingRequestOutput]:
        """One embedding per prompt: ``encode(..., pooling_task="embed")``, as lists of floats."""
        items = self.encode(prompts, pooling_params, pooling_task="embed")
        return [EmbeddingRequestOutput.from_base(item) for item in items]

    @property
    def _arch(self) -> str:
        mc = self.vllm_config.model_config
        return mc.architectures[0] if mc is not None else "ToyForCausalLM"

    def beam_search(self, prompts: Prompt | Sequence[Prompt], params: BeamSearchParams) -> list[BeamSearchOutput]:
        """Beam search over this engine, one token per beam per step (see ``beam_search.py``)."""
        if self.vllm_config.model_config is not None:
            raise ValueError("beam search reads logprobs from the toy model's rows (the engine returns none); "
                             "it runs with the toy model only")
        return run_beam_search(self, prompts, params)
