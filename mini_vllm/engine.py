"""The engine loop: tokenize, then ``schedule → forward → sample → update_from_output`` per step.

Mirrors ``vllm/v1/engine/llm_engine.py`` (``LLMEngine``: ``add_request``, ``step``,
``has_unfinished_requests``), the offline ``vllm/entrypoints/llm.py`` (``LLM.generate``) and the
heart of ``vllm/v1/engine/core.py`` (``EngineCore.step``). Everything runs in one process and one
thread: no ZMQ front end, no executor/worker processes, no detokenizer process, no async
scheduling, no streaming outputs.

One step, exactly as upstream orders it::

    out = scheduler.schedule()                           # who runs, how many tokens each
    logits = model.forward(last token, its position)     # one row per scheduled request
    tokens = sampler.sample_batch(rows that needs_sample) # mid-prefill chunks sample nothing
    finished = scheduler.update_from_output(out, tokens) # advance counters, stop, free KV

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

The rows of a draft position go through the sampler's own logits processing, with the same
inputs a decode step gives it (the engine hands the sampler no token history, so penalties,
bad words and min-tokens see none, with or without speculation), so greedy output is exactly
the output without speculation. Random requests verify
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

from .config import VllmConfig, create_engine_config
from .model import ToyModel
from .outputs import RequestOutput
from .request import Request, RequestStatus
from .sampler import Sampler, apply_min_p, apply_top_k_top_p
from .sampling_params import SamplingParams
from .scheduler import Scheduler, SchedulerOutput
from .spec_decode import NgramProposer, parse_output, rejection_sample
from .tokenizer import ByteTokenizer

Prompt = str | Sequence[int]


class LLMEngine:
    """A whole (tiny) inference engine: ``add_request`` + ``step``, or just ``generate``."""

    def __init__(self, vllm_config: VllmConfig | None = None, *, seed: int = 0, **engine_args: Any) -> None:
        """Build tokenizer, model, sampler and scheduler (which owns the KV cache).

        Pass a ``VllmConfig``, or the flat engine arguments it is made from (``num_gpu_blocks``,
        ``block_size``, ``enable_prefix_caching``, ``max_num_seqs``, ``max_num_batched_tokens``,
        ``max_model_len``, ``long_prefill_token_threshold``, ``enable_chunked_prefill``,
        ``speculative_config``; see ``config.py``). ``max_model_len`` (prompt + output tokens) defaults to what the pool
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
        self.model = ToyModel(vocab_size=self.tokenizer.vocab_size)  # fixed "weights": seed is for sampling
        self.sampler = Sampler()
        self.seed = seed
        self.max_model_len = vllm_config.max_model_len
        self.scheduler = Scheduler(vllm_config)
        spec = vllm_config.speculative_config
        self.drafter: NgramProposer | None = None
        if spec is not None:
            self.drafter = NgramProposer(
                spec.num_speculative_tokens, spec.prompt_lookup_min, spec.prompt_lookup_max, self.max_model_len
            )
        self.num_steps = 0  # engine steps run (speculation's saving shows here)
        self._next_index = 0  # per-engine request counter: ids req-0, req-1, ...
        self._prompts: dict[str, str | None] = {}  # request id -> prompt text (None for token ids)
        self._generators: dict[str, np.random.Generator] = {}  # one RNG per request

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

    @staticmethod
    def _check_params(sampling_params: SamplingParams | None) -> SamplingParams:
        if sampling_params is None:
            return SamplingParams()
        if not isinstance(sampling_params, SamplingParams):
            raise TypeError(f"sampling_params must be a SamplingParams, got {type(sampling_params).__name__}")
        return sampling_params

    def add_request(
        self,
        prompt: Prompt,
        sampling_params: SamplingParams | None = None,
        request_id: str | None = None,
    ) -> str:
        """Tokenize and queue a prompt (``str`` or token ids); returns its request id.

        Nothing is scheduled yet: admission happens in the next ``step()``. Ids default to
        ``req-0, req-1, ...`` per engine (upstream's ``LLM`` counts the same way).
        """
        token_ids = self._tokenize(prompt)
        params = self._check_params(sampling_params)
        if request_id is not None and (not isinstance(request_id, str) or not request_id):
            raise ValueError(f"request_id must be a non-empty str, got {request_id!r}")
        if request_id is not None and request_id in self._prompts:
            raise ValueError(f"request id {request_id!r} is already in use")
        index = self._next_index
        self._next_index += 1
        if request_id is None:
            request_id = f"req-{index}"
            while request_id in self._prompts:  # a caller took this name explicitly
                request_id = f"req-{self._next_index}"
                self._next_index += 1
        request = Request(
            request_id,
            token_ids,
            params,
            eos_token_id=self.tokenizer.eos_token_id,
            block_hasher=self.scheduler.kv_cache_manager.block_hasher,
            arrival_time=float(index),
        )
        self.scheduler.add_request(request)
        seed = params.seed if params.seed is not None else self.seed + index
        self._generators[request_id] = np.random.default_rng(seed)
        self._prompts[request_id] = prompt if isinstance(prompt, str) else None
        return request_id

    def abort_request(self, request_id: str | Sequence[str]) -> list[RequestOutput]:
        """Finish request(s) now with reason ``"abort"``; returns their outputs."""
        finished = self.scheduler.finish_requests(request_id, RequestStatus.FINISHED_ABORTED)
        return [self._make_output(r) for r in finished]

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished_requests()

    # -- the loop --------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """Run one engine step; return the requests that finished during it."""
        out = self.scheduler.schedule()
        self.num_steps += 1
        if self.drafter is not None:
            return self._step_with_drafts(out)
        reqs = out.scheduled_requests
        sampled: dict[str, int] = {}
        if reqs:
            n = [out.num_scheduled_tokens[r.request_id] for r in reqs]
            positions = [r.num_computed_tokens + k - 1 for r, k in zip(reqs, n)]
            last_tokens = [r.all_token_ids[p] for r, p in zip(reqs, positions)]
            logits = self.model.forward(np.array(last_tokens), np.array(positions))
            rows = [i for i, (r, k) in enumerate(zip(reqs, n)) if Scheduler.needs_sample(r, k)]
            if rows:
                wanted = [reqs[i] for i in rows]
                tokens = self.sampler.sample_batch(
                    logits[rows],
                    [r.sampling_params for r in wanted],
                    [self._generators[r.request_id] for r in wanted],
                )
                sampled = {r.request_id: t for r, t in zip(wanted, tokens)}
        finished = self.scheduler.update_from_output(out, sampled)
        return [self._make_output(r) for r in finished]

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
            logits = self.model.forward(np.array(tokens), np.array(positions))
            sampled = self._verify(logits, wanted)
        finished = self.scheduler.update_from_output(out, sampled)
        self._propose([r for r, _, _ in wanted if not r.is_finished])
        return [self._make_output(r) for r in finished]

    def _verify(self, logits: np.ndarray, wanted: list[tuple[Request, int, list[int]]]) -> dict[str, int | list[int]]:
        """Bonus tokens from the sampler, drafts checked by the rejection sampler; tokens per request."""
        bonus_rows = [start + len(drafts) for _, start, drafts in wanted]
        bonus = self.sampler.sample_batch(  # exactly the call of a step without speculation
            logits[bonus_rows],
            [r.sampling_params for r, _, _ in wanted],
            [self._generators[r.request_id] for r, _, _ in wanted],
        )
        sampled: dict[str, int | list[int]] = {}
        verify = [(i, w) for i, w in enumerate(wanted) if w[2]]
        for i, (r, _, drafts) in enumerate(wanted):
            if not drafts:
                sampled[r.request_id] = bonus[i]  # no draft: exactly the non-speculative step
        if not verify:
            return sampled
        rows = [start + j for _, (_, start, drafts) in verify for j in range(len(drafts))]
        params = [r.sampling_params for _, (r, _, drafts) in verify for _ in drafts]
        no_history: list[list[int]] = [[] for _ in rows]  # as the bonus call above: no token history
        target = self.sampler.apply_logits_processors(logits[rows].astype(np.float64), params, no_history, no_history)
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

    def _propose(self, requests: list[Request]) -> None:
        """n-gram drafts for every request that sampled this step and is still running."""
        assert self.drafter is not None
        if not requests:
            return
        counts = np.array([r.num_tokens for r in requests])
        rows = np.zeros((len(requests), int(counts.max())), dtype=np.int64)
        for i, r in enumerate(requests):
            rows[i, : counts[i]] = r.all_token_ids[:]
        drafts = self.drafter.propose([[1]] * len(requests), counts, rows)
        self.scheduler.update_draft_token_ids({r.request_id: d for r, d in zip(requests, drafts)})

    def _make_output(self, request: Request) -> RequestOutput:
        rid = request.request_id
        prompt = self._prompts.pop(rid, None)
        self._generators.pop(rid, None)
        token_ids = list(request.output_token_ids)
        return RequestOutput(
            request_id=rid,
            prompt=prompt,
            prompt_token_ids=list(request.prompt_token_ids),
            token_ids=token_ids,
            text=self.tokenizer.decode(token_ids),
            finish_reason=request.get_finished_reason(),
            finished=request.is_finished,
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
                if output.request_id in wanted:
                    results[output.request_id] = output
        return [results[rid] for rid in ids]
