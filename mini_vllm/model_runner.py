"""The model runner: a worker's persistent batch, its flattened inputs, the forward, and sampling.

Mirrors ``vllm/v1/worker/gpu_model_runner.py`` (``GPUModelRunner``: ``_update_states``,
``_prepare_inputs``, ``execute_model``, ``sample_tokens``, ``_sample``, ``_bookkeeping_sync``),
``vllm/v1/worker/gpu_input_batch.py`` (``CachedRequestState``, ``InputBatch``: ``add_request``,
``remove_request``, ``condense``) and ``vllm/v1/worker/block_table.py`` (``BlockTable``:
``add_row``, ``append_row``, ``compute_slot_mapping``). One step is two calls, as upstream:
``execute_model(scheduler_output)`` syncs the batch with the scheduler's decisions, flattens every
scheduled token into ``input_ids`` / ``positions`` with their attention metadata, runs the model
and keeps the logits of ``logits_indices``; ``sample_tokens(grammar_output)`` masks them with the
grammar bitmask, samples, verifies drafts with the rejection sampler and returns a
``ModelRunnerOutput``; with speculation the n-gram drafter then reads the batch's own
``token_ids_cpu`` and the engine collects its drafts with ``take_draft_token_ids``. README.md ("How a
step runs") walks through it.

The model answers ``forward(input_ids, positions, kv_caches, attn_metadata) -> hidden`` and
``compute_logits(hidden) -> logits`` (``models/interfaces.py``); ``initialize_kv_cache`` gives it
one KV tensor per attention layer, as many blocks as the pool (none for the toy). With a
``kv_transfer_config`` the runner also holds the worker side of the KV connector
(``vllm/v1/worker/kv_connector_model_runner_mixin.py``): it loads external KV into the cache
before the forward, saves each layer after it, and returns a ``KVConnectorOutput``. A pooling
model's step pools instead of sampling (``_pool``: vllm/v1/worker/gpu_model_runner.py:3280); its
output waits for ``sample_tokens`` (upstream returns it from ``execute_model`` at once).

Left out: device tensors and pinned host copies, CUDA graphs and batch padding, async scheduling
(mini's scheduler advances ``num_computed_tokens`` after the step, so the runner reads it before),
pipeline parallelism, logprobs in the output, M-RoPE, prompt embeddings, model-based drafters,
per-request sampling tensors (the sampler takes the params as a list).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from types import SimpleNamespace
from typing import Any, NamedTuple, Protocol

import numpy as np

from .attention import AttentionMetadata, allocate_kv_caches
from .grammar import apply_bitmask
from .kv_connector import KVConnectorBase_V1, KVConnectorFactory, KVConnectorRole, kv_layer_names
from .models.interfaces import is_pooling_model
from .models.pooler import PoolingMetadata, PoolingStates
from .outputs import EMPTY_MODEL_RUNNER_OUTPUT, DraftTokenIds, KVConnectorOutput, ModelRunnerOutput
from .sampler import Sampler, apply_min_p, apply_top_k_top_p
from .sampling_params import SamplingParams
from .spec_decode import NgramProposer, parse_output, rejection_sample


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def reads_output(sp: SamplingParams) -> bool:
    """Whether a request's sampling reads its output so far (penalties, bad words, min-tokens)."""
    return bool(
        sp.presence_penalty
        or sp.frequency_penalty
        or sp.repetition_penalty != 1.0
        or sp.bad_words_token_ids
        or sp.min_tokens
    )


class RunnerModel(Protocol):
    """What the runner needs of a model (``mini_vllm/models/`` implements it)."""

    def forward(
        self, input_ids: np.ndarray, positions: np.ndarray, kv_caches: list, attn_metadata: Any
    ) -> np.ndarray: ...

    def compute_logits(self, hidden_states: np.ndarray) -> np.ndarray: ...


@dataclass
class CachedRequestState:
    """What a worker keeps of one request between steps (it lives until the request finishes)."""

    req_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    generator: np.random.Generator  # the request's own stream: survives preemption
    block_ids: list[int]
    num_computed_tokens: int
    output_token_ids: list[int] = field(default_factory=list)
    lora_request: Any = None
    pooling_params: Any = None  # a pooling request's resolved PoolingParams (None: it samples)
    pooling_states: PoolingStates | None = None  # its rows so far, for a chunked token_embed

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)


class BlockTable:
    """One row of KV block ids per batch slot; turns (row, position) into a KV slot."""

    def __init__(self, max_num_reqs: int, max_num_blocks_per_req: int, block_size: int) -> None:
        self.block_size = block_size
        self.block_table = np.zeros((max_num_reqs, max_num_blocks_per_req), dtype=np.int32)
        self.num_blocks_per_row = np.zeros(max_num_reqs, dtype=np.int32)

    def append_row(self, block_ids: Sequence[int], row_idx: int) -> None:
        start = int(self.num_blocks_per_row[row_idx])
        end = start + len(block_ids)
        if end > self.block_table.shape[1]:
            raise RuntimeError(
                f"row {row_idx} would hold {end} blocks; the table has {self.block_table.shape[1]}"
            )
        self.block_table[row_idx, start:end] = block_ids
        self.num_blocks_per_row[row_idx] = end

    def add_row(self, block_ids: Sequence[int], row_idx: int) -> None:
        self.num_blocks_per_row[row_idx] = 0
        self.append_row(block_ids, row_idx)

    def move_row(self, src: int, tgt: int) -> None:
        n = int(self.num_blocks_per_row[src])
        self.block_table[tgt, :n] = self.block_table[src, :n]
        self.num_blocks_per_row[tgt] = n

    def compute_slot_mapping(self, req_indices: np.ndarray, positions: np.ndarray) -> np.ndarray:
        """``slot = block_table[row, pos // block_size] * block_size + pos % block_size`` per token."""
        block_idx = positions // self.block_size
        if (block_idx >= self.num_blocks_per_row[req_indices]).any():
            bad = int(np.argmax(block_idx >= self.num_blocks_per_row[req_indices]))
            raise RuntimeError(
                f"position {int(positions[bad])} of batch row {int(req_indices[bad])} has no KV block"
            )
        return (
            self.block_table[req_indices, block_idx].astype(np.int64) * self.block_size
            + positions % self.block_size
        )


class InputBatch:
    """The persistent batch: one slot per scheduled request, kept across steps, compacted on removal."""

    def __init__(
        self, max_num_reqs: int, max_model_len: int, max_num_blocks_per_req: int, block_size: int
    ) -> None:
        self.max_num_reqs = max_num_reqs
        self._req_ids: list[str | None] = []
        self.req_id_to_index: dict[str, int] = {}
        self.token_ids_cpu = np.zeros((max_num_reqs, max_model_len), dtype=np.int64)
        self.num_tokens = np.zeros(max_num_reqs, dtype=np.int64)  # with this step's drafts
        self.num_tokens_no_spec = np.zeros(max_num_reqs, dtype=np.int64)
        self.num_computed_tokens_cpu = np.zeros(max_num_reqs, dtype=np.int64)
        self.block_table = BlockTable(max_num_reqs, max_num_blocks_per_req, block_size)

    @property
    def req_ids(self) -> list[str]:
        return [r for r in self._req_ids if r is not None]

    @property
    def num_reqs(self) -> int:
        return len(self.req_id_to_index)

    def add_request(self, request: CachedRequestState) -> int:
        """Put a request in the first empty slot (or a new one at the end); returns its index."""
        holes = [i for i, r in enumerate(self._req_ids) if r is None]
        if holes:
            index = holes[0]
            self._req_ids[index] = request.req_id
        else:
            index = len(self._req_ids)
            if index >= self.max_num_reqs:
                raise RuntimeError(f"the input batch holds at most {self.max_num_reqs} requests")
            self._req_ids.append(request.req_id)
        self.req_id_to_index[request.req_id] = index
        n_prompt, n = len(request.prompt_token_ids), request.num_tokens
        self.token_ids_cpu[index, :n_prompt] = request.prompt_token_ids
        self.token_ids_cpu[index, n_prompt:n] = request.output_token_ids
        self.num_tokens[index] = self.num_tokens_no_spec[index] = n
        self.num_computed_tokens_cpu[index] = request.num_computed_tokens
        self.block_table.add_row(request.block_ids, index)
        return index

    def remove_request(self, req_id: str) -> int | None:
        """Empty a request's slot (``condense`` fills the hole); None if it was not in the batch."""
        index = self.req_id_to_index.pop(req_id, None)
        if index is not None:
            self._req_ids[index] = None
        return index

    def condense(self) -> None:
        """Move the last requests into the holes, so slots ``0 .. num_reqs - 1`` are all taken."""
        holes = [i for i, r in enumerate(self._req_ids) if r is None]
        for hole in holes:
            while self._req_ids and self._req_ids[-1] is None:
                self._req_ids.pop()
            if hole >= len(self._req_ids):
                break
            last = len(self._req_ids) - 1
            req_id = self._req_ids.pop()
            assert req_id is not None
            self._req_ids[hole] = req_id
            self.req_id_to_index[req_id] = hole
            n = self.num_tokens[last]
            self.token_ids_cpu[hole, :n] = self.token_ids_cpu[last, :n]
            for arr in (self.num_tokens, self.num_tokens_no_spec, self.num_computed_tokens_cpu):
                arr[hole] = arr[last]
            self.block_table.move_row(last, hole)
        while self._req_ids and self._req_ids[-1] is None:
            self._req_ids.pop()


class ExecuteModelState(NamedTuple):
    """What ``execute_model`` leaves for ``sample_tokens``: the logits and how rows map to requests."""

    scheduler_output: Any
    req_ids: list[str]  # batch order
    logits: np.ndarray  # float64 [len(logits_indices), vocab]
    first_row: list[int]  # request i's logits rows are first_row[i] .. first_row[i] + num_draft[i]
    num_draft: list[int]
    needs_sample: list[bool]  # False: a mid-prefill chunk, its row is discarded
    num_collectives: int  # collectives the model issued in this forward (TP > 1)


class GPUModelRunner:
    """Owns the model, the KV cache tensors, the persistent batch, the sampler and the rejection sampler."""

    def __init__(self, vllm_config: Any, model: RunnerModel, eos_token_id: int | None) -> None:
        self.vllm_config = vllm_config
        self.model = model
        self.max_num_reqs = vllm_config.scheduler_config.max_num_seqs
        self.max_model_len = vllm_config.max_model_len
        self.block_size = vllm_config.cache_config.block_size
        spec = vllm_config.speculative_config
        lookahead = spec.num_lookahead_tokens if spec is not None else 0
        max_blocks = min(
            cdiv(self.max_model_len + lookahead, self.block_size) + 1, vllm_config.cache_config.num_gpu_blocks
        )
        self.input_batch = InputBatch(self.max_num_reqs, self.max_model_len, max_blocks, self.block_size)
        self.requests: dict[str, CachedRequestState] = {}
        self.sampler = Sampler(eos_token_id=eos_token_id)  # min_tokens bans EOS too
        self.drafter: NgramProposer | None = None
        if spec is not None:
            self.drafter = NgramProposer(
                spec.num_speculative_tokens,
                spec.prompt_lookup_min,
                spec.prompt_lookup_max,
                self.max_model_len,
            )
        self._draft_token_ids: DraftTokenIds | None = None  # proposed after sampling, until taken
        self.kv_caches: list[np.ndarray] = []
        self.execute_model_state: ExecuteModelState | ModelRunnerOutput | None = None
        self.is_pooling_model = is_pooling_model(model)
        self.last_inputs: SimpleNamespace | None = None  # the latest flattened inputs (for tests and labs)
        self.kv_connector: KVConnectorBase_V1 | None = None  # the worker side (Phase 15)
        self._kv_connector_output: KVConnectorOutput | None = None  # this step's, for sample_tokens

    def initialize_kv_cache(self) -> None:
        """One KV tensor per attention layer, as many blocks as the block pool hands out.

        ``(2, num_gpu_blocks, block_size, num_kv_heads, head_size)`` each; a model without
        attention layers (the toy) gets none.
        """
        spec = self.model.get_kv_cache_spec()
        if spec.num_layers:
            cache = self.vllm_config.cache_config
            self.kv_caches = allocate_kv_caches(
                spec.num_layers,
                cache.num_gpu_blocks,
                cache.block_size,
                spec.num_kv_heads,
                spec.head_size,
                spec.dtype,
            )
        kv_transfer = getattr(self.vllm_config, "kv_transfer_config", None)
        if kv_transfer is not None:
            if not self.kv_caches:
                raise ValueError(
                    f"kv_transfer_config needs a model with a KV cache; {type(self.model).__name__} keeps none"
                )
            names = kv_layer_names(len(self.kv_caches))
            self.kv_connector = KVConnectorFactory.create_connector(
                kv_transfer, KVConnectorRole.WORKER, self.block_size, names
            )
            self.kv_connector.register_kv_caches(dict(zip(names, self.kv_caches)))

    # -- the KV connector around the forward (kv_connector_model_runner_mixin.py) -----------
    def _start_kv_transfer(self, scheduler_output: Any) -> None:
        """Bind the step's plan and load the external KV into the paged cache, before the forward."""
        if self.kv_connector is not None:
            self.kv_connector.bind_connector_metadata(scheduler_output.kv_connector_metadata)
            self.kv_connector.start_load_kv()
            for name in self.kv_connector.layer_names:  # upstream waits layer by layer inside attention
                self.kv_connector.wait_for_layer_load(name)

    def _finish_kv_transfer(self, scheduler_output: Any, forward_ran: bool) -> None:
        """Save the layers the forward wrote, then collect what finished and what failed to load."""
        connector = self.kv_connector
        if connector is None:
            return
        if forward_ran:  # upstream saves each layer from inside attention; mini after the forward
            for name, kv in zip(connector.layer_names, self.kv_caches):
                connector.save_kv_layer(name, kv)
        connector.wait_for_save()
        sending, recving = connector.get_finished(scheduler_output.finished_req_ids)
        invalid = connector.get_block_ids_with_load_errors()
        connector.clear_connector_metadata()
        self._kv_connector_output = KVConnectorOutput(sending, recving, invalid or None)

    # -- keeping the batch in step with the scheduler ---------------------------------------
    def _update_states(self, scheduler_output: Any) -> None:
        """Apply one ``SchedulerOutput`` to the cached states and the persistent batch."""
        batch = self.input_batch
        for req_id in scheduler_output.finished_req_ids:
            self.requests.pop(req_id, None)
            batch.remove_request(req_id)
        scheduled = scheduler_output.num_scheduled_tokens
        for req_id in batch.req_ids:  # preempted, or running but given no tokens this step
            if req_id not in scheduled:
                batch.remove_request(req_id)
        new_block_ids = scheduler_output.req_to_new_block_ids
        to_add: list[CachedRequestState] = []
        for request in scheduler_output.scheduled_new_reqs:
            state = CachedRequestState(
                req_id=request.request_id,
                prompt_token_ids=list(request.prompt_token_ids),
                sampling_params=request.sampling_params,
                generator=np.random.default_rng(request.generator_seed),
                block_ids=list(new_block_ids[request.request_id]),
                num_computed_tokens=request.num_computed_tokens,
                output_token_ids=list(request.output_token_ids),
                lora_request=request.lora_request,
                pooling_params=request.pooling_params,
                pooling_states=PoolingStates() if request.pooling_params is not None else None,
            )
            self.requests[request.request_id] = state
            to_add.append(state)
        for request in scheduler_output.scheduled_resumed_reqs:  # its blocks are all new
            state = self.requests[request.request_id]
            state.block_ids = list(new_block_ids[request.request_id])
            state.num_computed_tokens = request.num_computed_tokens
            state.output_token_ids = list(request.output_token_ids)
            if state.pooling_states is not None:  # preempted: its prompt is recomputed from the start
                state.pooling_states.clean()
            to_add.append(state)
        for request in scheduler_output.scheduled_running_reqs:
            state = self.requests[request.request_id]
            state.block_ids.extend(new_block_ids.get(request.request_id, ()))
            state.num_computed_tokens = request.num_computed_tokens
            index = batch.req_id_to_index.get(request.request_id)
            if state.num_tokens != request.num_tokens:  # tokens appended past this runner (a step by hand)
                state.output_token_ids = list(request.output_token_ids)
                if index is not None:
                    batch.remove_request(request.request_id)
                    index = None
            if index is None:
                to_add.append(state)
            else:
                batch.num_computed_tokens_cpu[index] = request.num_computed_tokens
                new = new_block_ids.get(request.request_id)
                if new:
                    batch.block_table.append_row(new, index)
        for state in to_add:
            batch.add_request(state)
        batch.condense()
        # This step's drafts ride behind each request's tokens.
        num_reqs = batch.num_reqs
        batch.num_tokens[:num_reqs] = batch.num_tokens_no_spec[:num_reqs]
        for req_id, drafts in scheduler_output.scheduled_spec_decode_tokens.items():
            index = batch.req_id_to_index[req_id]
            n = batch.num_tokens_no_spec[index]
            batch.token_ids_cpu[index, n : n + len(drafts)] = drafts
            batch.num_tokens[index] = n + len(drafts)

    def _prepare_inputs(self, scheduler_output: Any) -> SimpleNamespace:
        """Flatten the scheduled tokens of every request, in batch order, and say where their KV goes."""
        batch = self.input_batch
        req_ids = batch.req_ids
        num_reqs = len(req_ids)
        num_scheduled = np.array([scheduler_output.num_scheduled_tokens[r] for r in req_ids], dtype=np.int64)
        # [2, 5, 3] -> req_indices [0, 0, 1, 1, 1, 1, 1, 2, 2, 2], query_pos [0, 1, 0, 1, 2, 3, 4, 0, 1, 2]
        req_indices = np.repeat(np.arange(num_reqs), num_scheduled)
        cu_num_tokens = np.cumsum(num_scheduled)
        query_pos = np.arange(int(cu_num_tokens[-1])) - np.repeat(
            cu_num_tokens - num_scheduled, num_scheduled
        )
        positions = batch.num_computed_tokens_cpu[req_indices] + query_pos
        input_ids = batch.token_ids_cpu[req_indices, positions]
        query_start_loc = np.zeros(num_reqs + 1, dtype=np.int32)
        query_start_loc[1:] = cu_num_tokens
        seq_lens = (batch.num_computed_tokens_cpu[:num_reqs] + num_scheduled).astype(np.int32)
        slot_mapping = batch.block_table.compute_slot_mapping(req_indices, positions)
        spec = scheduler_output.scheduled_spec_decode_tokens
        num_draft = np.array([len(spec.get(r, ())) for r in req_ids], dtype=np.int64)
        # logits rows: the last scheduled token of each request, plus the k tokens before it with k drafts
        logits_indices = np.repeat(cu_num_tokens - num_draft - 1, num_draft + 1) + (
            np.arange(int((num_draft + 1).sum()))
            - np.repeat(np.cumsum(num_draft + 1) - num_draft - 1, num_draft + 1)
        )
        attn_metadata = AttentionMetadata(
            num_actual_tokens=int(cu_num_tokens[-1]),
            max_query_len=int(num_scheduled.max()),
            query_start_loc=query_start_loc,
            max_seq_len=int(seq_lens.max()),
            seq_lens=seq_lens,
            block_table=batch.block_table.block_table[:num_reqs],
            slot_mapping=slot_mapping,
        )
        return SimpleNamespace(
            req_ids=req_ids,
            input_ids=input_ids,
            positions=positions,
            attn_metadata=attn_metadata,
            logits_indices=logits_indices,
            num_draft=num_draft,
            needs_sample=(seq_lens >= batch.num_tokens_no_spec[:num_reqs]).tolist(),
        )

    # -- the two calls of a step -----------------------------------------------------------
    def execute_model(self, scheduler_output: Any) -> None:
        """Sync the batch, flatten the inputs, run the forward; the logits wait for ``sample_tokens``."""
        if self.execute_model_state is not None:
            raise RuntimeError("execute_model() called twice: call sample_tokens() first")
        self._update_states(scheduler_output)
        self._start_kv_transfer(scheduler_output)
        if not scheduler_output.total_num_scheduled_tokens:
            self.last_inputs = None
            self._finish_kv_transfer(scheduler_output, forward_ran=False)  # async loads still progress
            return None
        inputs = self._prepare_inputs(scheduler_output)
        self.last_inputs = inputs
        before = getattr(self.model, "num_collectives", 0)
        hidden = self.model.forward(inputs.input_ids, inputs.positions, self.kv_caches, inputs.attn_metadata)
        self._finish_kv_transfer(scheduler_output, forward_ran=True)
        if self.is_pooling_model:
            self.execute_model_state = self._pool(hidden, inputs)
            return None
        logits = self.model.compute_logits(hidden[inputs.logits_indices])
        first_row = (np.cumsum(inputs.num_draft + 1) - inputs.num_draft - 1).tolist()
        self.execute_model_state = ExecuteModelState(
            scheduler_output,
            inputs.req_ids,
            np.asarray(logits, dtype=np.float64),
            first_row,
            inputs.num_draft.tolist(),
            inputs.needs_sample,
            getattr(self.model, "num_collectives", 0) - before,
        )
        return None

    def sample_tokens(self, grammar_output: Any | None) -> ModelRunnerOutput:
        """Mask, sample, verify drafts; record the tokens in the batch; one list of tokens per request."""
        state = self.execute_model_state
        kv_output, self._kv_connector_output = self._kv_connector_output, None
        if state is None:
            return EMPTY_MODEL_RUNNER_OUTPUT if kv_output is None else replace(
                EMPTY_MODEL_RUNNER_OUTPUT, kv_connector_output=kv_output
            )
        self.execute_model_state = None
        if isinstance(state, ModelRunnerOutput):  # a pooling step: nothing to sample
            return state if kv_output is None else replace(state, kv_connector_output=kv_output)
        logits = state.logits
        index = {rid: i for i, rid in enumerate(state.req_ids)}
        if grammar_output is not None and grammar_output.structured_output_request_ids:
            self.apply_grammar_bitmask(logits, grammar_output, index, state)
        wanted = [i for i in range(len(state.req_ids)) if state.needs_sample[i]]
        spec = state.scheduler_output.scheduled_spec_decode_tokens
        sampled: dict[str, list[int]] = {}
        if wanted:
            sampled = self._sample(
                logits, [state.req_ids[i] for i in wanted], [state.first_row[i] for i in wanted], spec
            )
        self._bookkeeping_sync(sampled)
        if self.drafter is not None:
            self._draft_token_ids = self.propose_draft_token_ids(sampled)
        return ModelRunnerOutput(
            req_ids=list(state.req_ids),
            req_id_to_index=index,
            sampled_token_ids=[sampled.get(rid, []) for rid in state.req_ids],
            num_collectives=state.num_collectives,
            kv_connector_output=kv_output,
        )

    # -- the pieces ------------------------------------------------------------------------
    def _pool(self, hidden: np.ndarray, inputs: SimpleNamespace) -> ModelRunnerOutput:
        """The model's pooler over this step's rows; a request's output once its prompt is done.

        The cursor says where each request's rows lie and, from ``seq_lens``, whose prompt this
        step completes (``finished``); the others get ``None`` and wait for their next chunk.
        """
        states = [self.requests[rid] for rid in inputs.req_ids]
        if any(s.pooling_params is None for s in states):
            raise RuntimeError("a pooling model's batch holds pooling requests only")
        md = inputs.attn_metadata
        num_scheduled = np.diff(md.query_start_loc).astype(np.int64)
        metadata = PoolingMetadata(
            np.array([len(s.prompt_token_ids) for s in states], dtype=np.int64),
            [s.pooling_params for s in states],
            pooling_states=[s.pooling_states for s in states],
        )
        metadata.build_pooling_cursor(num_scheduled, md.seq_lens)
        raw = self.model.pooler(hidden, metadata)
        finished = metadata.get_pooling_cursor().is_finished()
        return ModelRunnerOutput(
            req_ids=list(inputs.req_ids),
            req_id_to_index={rid: i for i, rid in enumerate(inputs.req_ids)},
            sampled_token_ids=[[] for _ in inputs.req_ids],
            pooler_output=[out if done else None for out, done in zip(raw, finished)],
        )

    def apply_grammar_bitmask(
        self, logits: np.ndarray, grammar_output: Any, index: dict[str, int], state: ExecuteModelState
    ) -> None:
        """Ban, in place, every token a constrained request's grammar forbids, on each of its rows.

        ``grammar_output.grammar_bitmask`` holds k + 1 rows per request of
        ``structured_output_request_ids`` (k = its drafts this step), in that order.
        """
        rows: list[int] = []
        for rid in grammar_output.structured_output_request_ids:
            i = index[rid]
            rows.extend(range(state.first_row[i], state.first_row[i] + state.num_draft[i] + 1))
        logits[rows] = apply_bitmask(logits[rows], grammar_output.grammar_bitmask)

    def _sample_rows(
        self, states: list[CachedRequestState], logits: np.ndarray, drafts: Sequence[Sequence[int]]
    ) -> list[int]:
        """One token per row: the sampler gets what upstream's ``SamplingMetadata`` carries.

        Per row: the params, the request's own generator, and its token history when a knob
        reads it: output ids for penalties, bad words and min-tokens (plus ``drafts[i]``, the
        drafts before that row), the prompt for the repetition penalty. A batch that sets none
        of them passes no history at all.
        """
        params = [s.sampling_params for s in states]
        generators = [s.generator for s in states]
        needs = [reads_output(sp) for sp in params]
        if not any(needs):
            return self.sampler.sample_batch(logits, params, generators)
        outputs = [[*s.output_token_ids, *d] if n else () for s, n, d in zip(states, needs, drafts)]
        prompts = [
            s.prompt_token_ids if sp.repetition_penalty != 1.0 else () for s, sp in zip(states, params)
        ]
        return self.sampler.sample_batch(
            logits, params, generators, output_token_ids=outputs, prompt_token_ids=prompts
        )

    def _sample(
        self, logits: np.ndarray, req_ids: list[str], first_rows: list[int], spec: dict[str, list[int]]
    ) -> dict[str, list[int]]:
        """The sampler on each request's bonus row, then the rejection sampler on its draft rows."""
        states = [self.requests[rid] for rid in req_ids]
        drafts = [spec.get(rid, []) for rid in req_ids]
        bonus_rows = [start + len(d) for start, d in zip(first_rows, drafts)]
        bonus = self._sample_rows(states, logits[bonus_rows], drafts)
        sampled = {rid: [tok] for rid, tok, d in zip(req_ids, bonus, drafts) if not d}
        verify = [i for i, d in enumerate(drafts) if d]
        if not verify:
            return sampled
        rows = [first_rows[i] + j for i in verify for j in range(len(drafts[i]))]
        params = [states[i].sampling_params for i in verify for _ in drafts[i]]
        # Each draft position's history: the output so far plus the drafts before it (as the bonus row's).
        # The knobs are read once per request, not once per draft position.
        needs = {i: reads_output(states[i].sampling_params) for i in verify}
        outputs = [
            [*states[i].output_token_ids, *drafts[i][:j]] if needs[i] else []
            for i in verify
            for j in range(len(drafts[i]))
        ]
        prompts = [
            states[i].prompt_token_ids if states[i].sampling_params.repetition_penalty != 1.0 else []
            for i in verify
            for _ in drafts[i]
        ]
        target = self.sampler.apply_logits_processors(
            logits[rows].astype(np.float64), params, outputs, prompts
        )
        random_rows = [k for k, sp in enumerate(params) if not sp.is_greedy]
        if random_rows:  # the sampler's distribution at each position, as logits (-inf outside it)
            sub = target[random_rows] / np.array([params[k].temperature for k in random_rows])[:, None]
            min_p = np.array([params[k].min_p for k in random_rows])
            if (min_p > 0).any():
                apply_min_p(sub, min_p)
            kept = apply_top_k_top_p(
                sub,
                np.array([params[k].top_k for k in random_rows]),
                np.array([params[k].top_p for k in random_rows]),
            )
            with np.errstate(divide="ignore"):
                target[random_rows] = np.log(kept)
        vocab = logits.shape[1]
        num_draft = [len(drafts[i]) for i in verify]
        is_greedy = np.array([states[i].sampling_params.is_greedy for i in verify])
        uniforms = np.zeros(len(rows))  # the greedy path draws nothing: zeros and ones stand in
        noise = np.ones((len(verify), vocab))
        start = 0
        for k, i in enumerate(verify):
            if not is_greedy[k]:
                g = states[i].generator
                uniforms[start : start + num_draft[k]] = g.random(num_draft[k])
                noise[k] = g.exponential(size=vocab)
            start += num_draft[k]
        out = rejection_sample(
            np.concatenate([drafts[i] for i in verify]),
            num_draft,
            None,
            target,
            np.array([bonus[i] for i in verify]),
            is_greedy,
            uniform_probs=uniforms,
            exponentials=noise,
        )
        for i, emitted in zip(verify, parse_output(out, vocab)):
            sampled[req_ids[i]] = emitted
        return sampled

    def propose_draft_token_ids(self, sampled: dict[str, list[int]]) -> DraftTokenIds:
        """The n-gram drafts of every request in the batch, read from its persistent rows.

        As upstream, the drafter reads ``InputBatch.token_ids_cpu``, which already holds each
        request's tokens, this step's included (``_bookkeeping_sync``): nothing is rebuilt per
        step. A request that sampled nothing (a mid-prefill chunk) or is full gets ``[]``.
        """
        assert self.drafter is not None
        batch = self.input_batch
        req_ids = batch.req_ids  # after condense: row i holds req_ids[i]
        drafts = self.drafter.propose(
            [sampled.get(rid, ()) for rid in req_ids],
            batch.num_tokens_no_spec[: len(req_ids)],
            batch.token_ids_cpu,
        )
        return DraftTokenIds(req_ids, drafts)

    def take_draft_token_ids(self) -> DraftTokenIds | None:
        """The drafts proposed after the last ``sample_tokens``, once (None when there are none)."""
        drafts, self._draft_token_ids = self._draft_token_ids, None
        return drafts

    def _bookkeeping_sync(self, sampled: dict[str, list[int]]) -> None:
        """Append each request's new tokens to its cached state and its row of the batch."""
        batch = self.input_batch
        width = batch.token_ids_cpu.shape[1]
        for rid, tokens in sampled.items():
            state = self.requests[rid]
            index = batch.req_id_to_index[rid]
            start = state.num_tokens
            end = min(start + len(tokens), width)
            if end - start == 1:  # the decode hot path
                batch.token_ids_cpu[index, start] = tokens[0]
            else:
                batch.token_ids_cpu[index, start:end] = tokens[: end - start]
            batch.num_tokens[index] = batch.num_tokens_no_spec[index] = end
            state.output_token_ids.extend(tokens)
