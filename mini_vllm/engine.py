"""The engine loop: tokenize, then ``schedule → forward → sample → update_from_output`` per step.

Mirrors ``vllm/v1/engine/llm_engine.py`` (``LLMEngine``: ``add_request``, ``step``,
``has_unfinished_requests``), the offline ``vllm/entrypoints/llm.py`` (``LLM.generate``) and the
heart of ``vllm/v1/engine/core.py`` (``EngineCore.step``). The engine runs in one process and one
thread: no ZMQ front end, no detokenizer process, no async scheduling, no streaming outputs. The
forward goes through an executor, as upstream's ``EngineCore`` → ``Executor`` → workers
(``executor.py``): ``tensor_parallel_size=1`` with the ``"uni"`` backend (the default) keeps one
worker in this process; ``"mp"`` starts one worker process per rank, and their vocabulary shards
are all-gathered into the same logits, bit for bit. ``shutdown()`` (or ``with LLMEngine(...)``,
or garbage collection, or interpreter exit) stops the workers; a worker that dies makes ``step()`` raise
``WorkerDiedError`` instead of hanging, and the engine is shut down from then on.

A request with ``SamplingParams.n > 1`` is fanned out in ``add_request`` into ``n`` child
requests (``parallel_sampling.py``); ``_make_output`` folds a finished child back into its
parent's output. ``beam_search`` (``beam_search.py``) drives this engine one token at a time.

One step, exactly as upstream orders it::

    out = scheduler.schedule()                           # who runs, how many tokens each
    logits = model_executor.execute_model(out).logits    # one row per scheduled request
    logits = apply the grammar bitmask to constrained rows # Phase 12: illegal tokens -> -inf
    tokens = sampler.sample_batch(rows that needs_sample, # mid-prefill chunks sample nothing
                                  each row's history)     # Phase 09: what penalties etc. read
    advance each constrained request's grammar by its token
    finished = scheduler.update_from_output(out, tokens) # advance counters, stop, free KV

The history (``_sample``) is what upstream's ``InputBatch`` hands the sampler through
``SamplingMetadata``: each request's output ids (penalties, bad words, min-tokens) and, for the
repetition penalty, its prompt ids. A batch whose requests set none of those knobs passes none,
so it samples exactly as before the knobs existed. EOS joins the min-tokens ban, as upstream's
``all_stop_token_ids`` does.

Structured outputs (``_apply_grammar_bitmask``, ``_accept_grammar_tokens``): a request whose
``SamplingParams.structured_outputs`` asks for a regex, a choice or a JSON object gets a grammar
from ``structured_output_manager`` (``grammar.py``; upstream's ``StructuredOutputManager``) when
it is added. Each step the manager fills one row of ``ceil(V / 32)`` int32 words per constrained
request that samples, the engine sets every logit whose bit is 0 to ``-inf`` before the sampler
(upstream's ``apply_grammar_bitmask``; EOS's bit is set only in an accepting state), and the
sampled token advances the grammar. An output that stops (EOS) therefore matches its grammar; one
cut by ``max_tokens`` is a legal prefix. A batch without such requests skips both helpers.

With speculative decoding, a constrained request's drafts are trimmed to what its grammar accepts
(``structured_output_manager.validate_draft_tokens``, cut before EOS) when they are proposed, as
upstream's scheduler does; ``grammar_bitmask(grammars, spec_tokens)`` then masks its k + 1 rows
(row j with the state after its first j drafts) before verification, and
``_accept_grammar_tokens`` advances the grammar by the whole accepted list.

The toy model only needs the *last* scheduled position of each request (it ignores the KV
cache), so a 100-token prefill chunk costs one row, not 100.

With speculative decoding (``speculative_config={"method": "ngram", ...}``) a step becomes::

    out = scheduler.schedule()                           # drafts ride in num_scheduled_tokens
    logits = model.forward(...)                          # one row per request without drafts;
                                                         # k + 1 rows for one with k drafts: the
                                                         # last real token and each draft position
    bonus = sampler(row after the last draft)            # the request's own generator
    accepted = rejection_sample(drafts, rows per draft, bonus)   # greedy: exact argmax match
    finished = scheduler.update_from_output(out, {rid: accepted + [bonus or correction]})
    scheduler.update_draft_token_ids(proposer.propose(...))      # n-gram drafts for next step

The rows of a draft position go through the sampler's own logits processing, with the inputs a
decode step at that position would give it: the token history is the output so far plus the
drafts before that position (the bonus row's includes every draft), so penalties, bad words and
min-tokens judge each position as plain decoding would, and greedy output is exactly the output
without speculation. Random requests verify
with ``p`` = the sampler's distribution at that position (temperature, min-p, top-k, top-p) and
``q`` one-hot on the n-gram draft, drawing the bonus, the uniforms and the recovered token's
noise from the request's generator, in that order (upstream layout:
``vllm/v1/spec_decode/metadata.py`` ``SpecDecodeMetadata``, ``vllm/v1/sample/rejection_sampler.py``
``RejectionSampler.forward``). Left out: logprobs of drafts, draft probabilities (n-gram has
none), upstream's async draft hand-off.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from .beam_search import BeamSearchOutput
from .beam_search import beam_search as run_beam_search
from .config import VllmConfig, create_engine_config
from .executor import Executor, make_executor
from .grammar import GrammarCompiler, StructuredOutputManager, apply_bitmask, byte_vocab
from .lora import LoRARequest
from .outputs import CompletionOutput, RequestOutput
from .parallel_sampling import ParentRequest
from .request import Request, RequestStatus, check_cache_salt
from .sampler import Sampler, apply_min_p, apply_top_k_top_p
from .sampling_params import BeamSearchParams, SamplingParams
from .scheduler import Scheduler, SchedulerOutput
from .spec_decode import NgramProposer, parse_output, rejection_sample
from .tokenizer import ByteTokenizer

Prompt = str | Sequence[int]


def _reads_output(sp: SamplingParams) -> bool:
    """Whether a request's sampling reads its output so far (penalties, bad words, min-tokens)."""
    return bool(sp.presence_penalty or sp.frequency_penalty or sp.repetition_penalty != 1.0
                or sp.bad_words_token_ids or sp.min_tokens)


class LLMEngine:
    """A whole (tiny) inference engine: ``add_request`` + ``step``, or just ``generate``."""

    def __init__(self, vllm_config: VllmConfig | None = None, *, seed: int = 0, **engine_args: Any) -> None:
        """Build tokenizer, model, sampler and scheduler (which owns the KV cache).

        Pass a ``VllmConfig``, or the flat engine arguments it is made from (``num_gpu_blocks``,
        ``block_size``, ``enable_prefix_caching``, ``max_num_seqs``, ``max_num_batched_tokens``,
        ``max_model_len``, ``long_prefill_token_threshold``, ``enable_chunked_prefill``; see
        ``config.py``), the parallel ones (``tensor_parallel_size``,
        ``distributed_executor_backend``) and ``speculative_config``. ``max_model_len`` (prompt + output tokens) defaults to what the pool
        holds, ``(num_gpu_blocks - 1) * block_size``, and may not exceed it. ``seed`` seeds
        sampling only.
        """
        if vllm_config is None:
            vllm_config = create_engine_config(**engine_args)
        elif engine_args:
            raise TypeError("pass either a VllmConfig or engine arguments, not both")
        if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
            raise ValueError(f"seed must be an int >= 0, got {seed!r}")
        self.vllm_config = vllm_config
        self.tokenizer = ByteTokenizer()
        parallel = vllm_config.parallel_config
        # fixed "weights" (model seed 0): ``seed`` is for sampling
        self.model_executor: Executor = make_executor(
            self.tokenizer.vocab_size, parallel.tensor_parallel_size, backend=parallel.distributed_executor_backend
        )
        self.sampler = Sampler(eos_token_id=self.tokenizer.eos_token_id)  # min_tokens bans EOS too
        self.seed = seed
        self.max_model_len = vllm_config.max_model_len
        self.scheduler = Scheduler(vllm_config)
        spec = vllm_config.speculative_config
        # With k drafts a grammar must undo k tentative tokens and fill k + 1 bitmask rows per request.
        num_spec = spec.num_speculative_tokens if spec is not None else 0
        self.structured_output_manager = StructuredOutputManager(
            GrammarCompiler(byte_vocab(), num_speculative_tokens=num_spec), vllm_config.scheduler_config.max_num_seqs
        )
        self.drafter: NgramProposer | None = None
        if spec is not None:
            self.drafter = NgramProposer(
                spec.num_speculative_tokens, spec.prompt_lookup_min, spec.prompt_lookup_max, self.max_model_len
            )
        self.num_steps = 0  # engine steps run (speculation's saving shows here)
        self._next_index = 0  # per-engine request counter: ids req-0, req-1, ...
        self._prompts: dict[str, str | None] = {}  # request id -> prompt text (None for token ids)
        self._generators: dict[str, np.random.Generator] = {}  # one RNG per request
        self._parent_requests: dict[str, ParentRequest] = {}  # parent id -> parent (n > 1), until done
        self._parent_of: dict[str, ParentRequest] = {}  # child id -> its parent, until the child is done

    @property
    def model(self) -> Executor:
        """The model as the engine sees it: the executor answers ``ToyModel.forward``'s contract."""
        return self.model_executor

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
        self.scheduler.add_request(request)
        self._generators[request_id] = np.random.default_rng(seed)
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
        out = self.scheduler.schedule()
        self.num_steps += 1
        if self.drafter is not None:
            return self._step_with_drafts(out)
        reqs = out.scheduled_requests
        sampled: dict[str, int] = {}
        if reqs:
            n = [out.num_scheduled_tokens[r.request_id] for r in reqs]
            logits = self.model_executor.execute_model(out).logits  # rows in scheduling order
            rows = [i for i, (r, k) in enumerate(zip(reqs, n)) if Scheduler.needs_sample(r, k)]
            if rows:
                wanted = [reqs[i] for i in rows]
                tokens = self._sample(wanted, self._apply_grammar_bitmask(wanted, logits[rows]))
                sampled = {r.request_id: t for r, t in zip(wanted, tokens)}
                self._accept_grammar_tokens(sampled)
        finished = self.scheduler.update_from_output(out, sampled)
        return [self._make_output(r) for r in finished]

    def _sample(
        self, wanted: list[Request], logits: np.ndarray, drafts: Sequence[Sequence[int]] | None = None
    ) -> list[int]:
        """One token per row: the sampler gets what upstream's ``SamplingMetadata`` carries.

        Per row: the params, the request's own generator, and its token history when a knob
        reads it (upstream's ``InputBatch`` keeps ``output_token_ids`` and, for penalties, the
        prompt ids). Output history feeds penalties, bad words and min-tokens; the prompt only
        the repetition penalty. A batch that sets none of them passes no history at all. With
        speculation, ``drafts[i]`` are row ``i``'s verified drafts, which its history includes.
        """
        params = [r.sampling_params for r in wanted]
        generators = [self._generators[r.request_id] for r in wanted]
        needs = [_reads_output(sp) for sp in params]
        if not any(needs):
            return self.sampler.sample_batch(logits, params, generators)
        if drafts is None:
            outputs = [r.output_token_ids if n else () for r, n in zip(wanted, needs)]
        else:
            outputs = [[*r.output_token_ids, *d] if n else () for r, n, d in zip(wanted, needs, drafts)]
        prompts = [r.prompt_token_ids if sp.repetition_penalty != 1.0 else () for r, sp in zip(wanted, params)]
        return self.sampler.sample_batch(logits, params, generators, output_token_ids=outputs,
                                         prompt_token_ids=prompts)

    def _apply_grammar_bitmask(self, wanted: list[Request], logits: np.ndarray) -> np.ndarray:
        """Ban, in place, every token a constrained row's grammar does not allow; returns ``logits``.

        ``logits`` holds one row per request of ``wanted`` (a copy the engine owns). Only the
        constrained rows get a bitmask row, in batch order, as upstream's ``GrammarOutput`` lists them.
        """
        grammars = self.structured_output_manager.grammars
        if not grammars:
            return logits
        idx = [i for i, r in enumerate(wanted) if r.request_id in grammars]
        if idx:
            bitmask = self.structured_output_manager.grammar_bitmask([grammars[wanted[i].request_id] for i in idx])
            logits[idx] = apply_bitmask(logits[idx], bitmask)
        return logits

    def _accept_grammar_tokens(self, sampled: dict[str, int | Sequence[int]]) -> None:
        """Advance each constrained request's grammar by its sampled token(s)."""
        manager = self.structured_output_manager
        if manager.grammars:
            for rid, tokens in sampled.items():
                if manager.should_advance(rid):
                    manager.accept_tokens(rid, [tokens] if isinstance(tokens, int) else tokens)

    def _step_with_drafts(self, out: SchedulerOutput) -> list[RequestOutput]:
        """One step with speculation: verify the scheduled drafts, then propose the next ones."""
        reqs = out.scheduled_requests
        spec = out.scheduled_spec_decode_tokens
        tokens: list[int] = []
        positions: list[int] = []
        wanted: list[tuple[Request, int, list[int]]] = []  # request, first logits row, its drafts
        for r in reqs:
            n = out.num_scheduled_tokens[r.request_id]
            if not Scheduler.needs_sample(r, n):
                continue  # a mid-prefill chunk: no logits needed at all
            drafts = spec.get(r.request_id, [])
            wanted.append((r, len(tokens), drafts))
            seq = r.all_token_ids
            last = r.num_tokens - 1  # the last real token, then each draft in turn
            tokens.append(seq[last])
            positions.append(last)
            tokens.extend(drafts)
            positions.extend(range(last + 1, last + 1 + len(drafts)))
        sampled: dict[str, int | list[int]] = {}
        if wanted:
            logits = self.model_executor.forward(np.array(tokens), np.array(positions))
            sampled = self._verify(logits, wanted)
            self._accept_grammar_tokens(sampled)
        finished = self.scheduler.update_from_output(out, sampled)
        self._propose([r for r, _, _ in wanted if not r.is_finished])
        return [self._make_output(r) for r in finished]

    def _verify(self, logits: np.ndarray, wanted: list[tuple[Request, int, list[int]]]) -> dict[str, int | list[int]]:
        """Bonus tokens from the sampler, drafts checked by the rejection sampler; tokens per request."""
        bonus_rows = [start + len(drafts) for _, start, drafts in wanted]
        reqs = [r for r, _, _ in wanted]
        self._apply_spec_grammar_bitmask(logits, wanted)  # every verified position of a constrained request
        # Exactly the sampling of a step without speculation (history, grammar) at the bonus position.
        bonus = self._sample(reqs, logits[bonus_rows], [d for _, _, d in wanted])
        sampled: dict[str, int | list[int]] = {}
        verify = [(i, w) for i, w in enumerate(wanted) if w[2]]
        for i, (r, _, drafts) in enumerate(wanted):
            if not drafts:
                sampled[r.request_id] = bonus[i]  # no draft: exactly the non-speculative step
        if not verify:
            return sampled
        rows = [start + j for _, (_, start, drafts) in verify for j in range(len(drafts))]
        params = [r.sampling_params for _, (r, _, drafts) in verify for _ in drafts]
        # Each draft position's history: the output so far plus the drafts before it (as the bonus row's).
        outputs = [[*r.output_token_ids, *drafts[:j]] if _reads_output(r.sampling_params) else []
                   for _, (r, _, drafts) in verify for j in range(len(drafts))]
        prompts = [list(r.prompt_token_ids) if r.sampling_params.repetition_penalty != 1.0 else []
                   for _, (r, _, drafts) in verify for _ in drafts]
        target = self.sampler.apply_logits_processors(logits[rows].astype(np.float64), params, outputs, prompts)
        random_rows = [k for k, sp in enumerate(params) if not sp.is_greedy]
        if random_rows:  # the sampler's distribution at each position, as logits (-inf outside it)
            sub = target[random_rows] / np.array([params[k].temperature for k in random_rows])[:, None]
            min_p = np.array([params[k].min_p for k in random_rows])
            if (min_p > 0).any():
                apply_min_p(sub, min_p)
            kept = apply_top_k_top_p(
                sub, np.array([params[k].top_k for k in random_rows]), np.array([params[k].top_p for k in random_rows])
            )
            with np.errstate(divide="ignore"):
                target[random_rows] = np.log(kept)
        vocab = logits.shape[1]
        uniforms, noise = [], []
        for _, (r, _, drafts) in verify:
            if r.sampling_params.is_greedy:  # the greedy path draws nothing
                uniforms.append(np.zeros(len(drafts)))
                noise.append(np.ones(vocab))
            else:
                g = self._generators[r.request_id]
                uniforms.append(g.random(len(drafts)))
                noise.append(g.exponential(size=vocab))
        out = rejection_sample(
            np.concatenate([drafts for _, (_, _, drafts) in verify]),
            [len(drafts) for _, (_, _, drafts) in verify],
            None,
            target,
            np.array([bonus[i] for i, _ in verify]),
            np.array([r.sampling_params.is_greedy for _, (r, _, _) in verify]),
            uniform_probs=np.concatenate(uniforms),
            exponentials=np.stack(noise),
        )
        for (_, (r, _, _)), emitted in zip(verify, parse_output(out, vocab)):
            sampled[r.request_id] = emitted
        return sampled

    def _apply_spec_grammar_bitmask(self, logits: np.ndarray, wanted: list[tuple[Request, int, list[int]]]) -> None:
        """Mask, in place, the k + 1 rows of each constrained request: row j with the grammar's state
        after its first j drafts (upstream's ``grammar_bitmask`` with ``scheduled_spec_decode_tokens``)."""
        manager = self.structured_output_manager
        constrained = [(r, start, drafts) for r, start, drafts in wanted if r.request_id in manager.grammars]
        if not constrained:
            return
        bitmask = manager.grammar_bitmask(
            [manager.grammars[r.request_id] for r, _, _ in constrained], [drafts for _, _, drafts in constrained]
        )
        rows = [start + j for _, start, drafts in constrained for j in range(len(drafts) + 1)]
        logits[rows] = apply_bitmask(logits[rows], bitmask)

    def _propose(self, requests: list[Request]) -> None:
        """n-gram drafts for every request that sampled this step and is still running.

        A request with a grammar keeps only the drafts its grammar accepts, cut before any EOS (as
        upstream's scheduler trims them with ``validate_tokens``): every verified position then has a
        legal token, and the masked rows make the verifier keep the output inside the grammar.
        """
        assert self.drafter is not None
        if not requests:
            return
        counts = np.array([r.num_tokens for r in requests])
        rows = np.zeros((len(requests), int(counts.max())), dtype=np.int64)
        for i, r in enumerate(requests):
            rows[i, : counts[i]] = r.all_token_ids[:]
        drafts = self.drafter.propose([[1]] * len(requests), counts, rows)
        manager, eos = self.structured_output_manager, self.tokenizer.eos_token_id
        for i, r in enumerate(requests):
            if r.request_id in manager.grammars:
                legal = manager.validate_draft_tokens(r.request_id, drafts[i])
                drafts[i] = legal[: legal.index(eos)] if eos in legal else legal
        self.scheduler.update_draft_token_ids({r.request_id: d for r, d in zip(requests, drafts)})

    def _make_output(self, request: Request) -> RequestOutput:
        """The output for a finished request; a child's is its parent's (finished once all are)."""
        rid = request.request_id
        prompt = self._prompts.pop(rid, None)
        self._generators.pop(rid, None)
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
        if isinstance(prompts, str):
            prompts = [prompts]
        if not isinstance(prompts, (list, tuple)):
            raise TypeError(f"prompts must be a str or a list of prompts, got {type(prompts).__name__}")
        if prompts and all(isinstance(p, (int, np.integer)) and not isinstance(p, bool) for p in prompts):
            raise TypeError("prompts looks like one list of token ids; wrap it in a list: [[...]]")
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

    def beam_search(self, prompts: Prompt | Sequence[Prompt], params: BeamSearchParams) -> list[BeamSearchOutput]:
        """Beam search over this engine, one token per beam per step (see ``beam_search.py``)."""
        return run_beam_search(self, prompts, params)
