"""A hand driver for a model on the paged KV cache: what a model runner does, in 80 lines.

The tests of ``mini_vllm/attention.py`` and ``mini_vllm/models/`` run a model without the engine:
this driver keeps each request's block table (blocks handed out in a shuffled order, so tables
are never contiguous; block 0 is never used, like the block pool's null block), builds each
step's flat batch (``input_ids``, ``positions``, ``AttentionMetadata``) as the runner's
``_prepare_inputs`` does, runs ``forward`` and returns the logits of the rows asked for.
``PagedDriver.pool`` / ``pool_requests`` embed whole prompts through a pooling model's ``pooler``,
refusing what the model does not support. ``generate_greedy`` staggers requests so prefill chunks and decodes share steps.
``hf_greedy`` is the Hugging Face side of those comparisons. ``llama_checkpoint_shapes`` lists the tensors of a Hugging Face Llama checkpoint (names and shapes)
for tests that make one without transformers.
"""

from __future__ import annotations

import numpy as np

from mini_vllm.attention import AttentionMetadata, allocate_kv_caches
from mini_vllm.models.interfaces import get_supported_tasks, is_pooling_model
from mini_vllm.models.pooler import PoolingMetadata
from mini_vllm.pooling_params import PoolingParams


class PagedDriver:
    def __init__(self, model, num_blocks: int = 256, block_size: int = 16, seed: int = 0) -> None:
        spec = model.get_kv_cache_spec()
        self.model, self.block_size = model, block_size
        self.kv_caches = allocate_kv_caches(
            spec.num_layers, num_blocks, block_size, spec.num_kv_heads, spec.head_size
        )
        self.free = [int(b) for b in np.random.default_rng(seed).permutation(np.arange(1, num_blocks))]
        self.tables: dict[object, list[int]] = {}
        self.lens: dict[object, int] = {}

    def step(self, chunks: dict[object, list[int]], all_logits: bool = False) -> dict[object, np.ndarray]:
        """Feed each request its next tokens; the logits of its last token (or of every token)."""
        hidden, md = self.forward(chunks)
        out = {}
        for r, rid in enumerate(chunks):
            lo, hi = int(md.query_start_loc[r]), int(md.query_start_loc[r + 1])
            out[rid] = self.model.compute_logits(hidden[lo:hi] if all_logits else hidden[hi - 1 : hi])
        return out

    def forward(self, chunks: dict[object, list[int]]) -> tuple[np.ndarray, AttentionMetadata]:
        """One step's flat hidden states ``[T, H]`` (requests in ``chunks`` order) and its metadata."""
        ids, positions, query_lens, seq_lens = [], [], [], []
        for rid, tokens in chunks.items():
            start = self.lens.get(rid, 0)
            end = start + len(tokens)
            table = self.tables.setdefault(rid, [])
            while len(table) * self.block_size < end:
                table.append(self.free.pop())
            self.lens[rid] = end
            ids += list(tokens)
            positions += range(start, end)
            query_lens.append(len(tokens))
            seq_lens.append(end)
        width = max(len(self.tables[rid]) for rid in chunks)
        table = np.zeros((len(chunks), width), dtype=np.int32)
        for r, rid in enumerate(chunks):
            table[r, : len(self.tables[rid])] = self.tables[rid]
        md = AttentionMetadata.build(query_lens, seq_lens, table, self.block_size)
        hidden = self.model.forward(
            np.array(ids, dtype=np.int64), np.array(positions, dtype=np.int64), self.kv_caches, md
        )
        return hidden, md

    def pool(self, prompts: list[list[int]], pooling_params, pooling_task: str = "embed") -> list[np.ndarray]:
        """Embed whole prompts in one step, by hand (``LLMEngine.embed`` / ``encode`` go through the scheduler).

        ``pooling_params`` is one ``PoolingParams`` (or None) for all prompts, or one per prompt;
        each is resolved to ``pooling_task`` (``PoolingParams.verify``). Refused, before anything
        runs: a model that does not pool, a task its pooler lacks, an empty prompt. Every prompt
        is prefilled whole (no chunked prefill: MEAN and CLS pooling need all rows in one step).
        """
        tasks = get_supported_tasks(self.model)
        if not is_pooling_model(self.model):
            raise ValueError(
                f"{type(self.model).__name__} does not support pooling (its tasks: {list(tasks)})"
            )
        if pooling_task not in tasks:
            raise ValueError(f"unsupported pooling task {pooling_task!r}; this model supports {list(tasks)}")
        if pooling_params is None or isinstance(pooling_params, PoolingParams):
            pooling_params = [pooling_params] * len(prompts)
        if len(pooling_params) != len(prompts):
            raise ValueError(f"{len(pooling_params)} PoolingParams for {len(prompts)} prompts")
        params = [(p or PoolingParams()).verify(pooling_task) for p in pooling_params]
        if not prompts or any(len(p) == 0 for p in prompts):
            raise ValueError("every prompt to pool needs at least one token")
        rids = [("pool", len(self.lens) + i) for i in range(len(prompts))]
        hidden, _ = self.forward({rid: list(p) for rid, p in zip(rids, prompts)})
        metadata = PoolingMetadata(np.array([len(p) for p in prompts]), params)
        metadata.build_pooling_cursor([len(p) for p in prompts])
        return self.model.pooler(hidden, metadata)


def pool_requests(model, prompts, pooling_params=None, pooling_task: str = "embed", **driver_args):
    """``PagedDriver(model, **driver_args).pool(prompts, pooling_params, pooling_task)``."""
    return PagedDriver(model, **driver_args).pool(prompts, pooling_params, pooling_task)


def generate_greedy(
    model,
    prompts,
    max_tokens: int,
    chunk_size: int = 8,
    stagger: int = 1,
    steps: list | None = None,
    **driver_args,
) -> list[list[int]]:
    """Greedy continuations of ``prompts``; request ``i`` starts at step ``i * stagger``.

    A prompt is fed ``chunk_size`` tokens per step; once it is in, each step feeds the token just
    sampled. With several requests in flight one step holds prefill chunks and decodes together.
    ``steps``, when given, receives each step's ``{request index: tokens fed}``.
    """
    driver = PagedDriver(model, **driver_args)
    fed = [0] * len(prompts)
    outputs: list[list[int]] = [[] for _ in prompts]
    step = 0
    while any(len(o) < max_tokens for o in outputs):
        chunks = {}
        for i, prompt in enumerate(prompts):
            if step < i * stagger or len(outputs[i]) >= max_tokens:
                continue
            if fed[i] < len(prompt):
                chunks[i] = list(prompt[fed[i] : fed[i] + chunk_size])
            else:
                chunks[i] = [outputs[i][-1]]
        logits = driver.step(chunks) if chunks else {}
        if steps is not None:
            steps.append({i: len(t) for i, t in chunks.items()})
        for i, tokens in chunks.items():
            if fed[i] < len(prompts[i]):
                fed[i] += len(tokens)
                if fed[i] < len(prompts[i]):
                    continue  # mid-prompt: the logits of a partial prefill are not sampled
            outputs[i].append(int(np.argmax(logits[i][-1])))
        step += 1
    return outputs


def hf_greedy(hf, prompt: list[int], max_tokens: int) -> list[int]:
    """A Hugging Face causal LM's greedy continuation of one prompt, decoding with its own cache."""
    import torch

    out, cache = [], None
    ids = torch.tensor([prompt])
    with torch.no_grad():
        for _ in range(max_tokens):
            result = hf(ids, cache=cache, use_cache=True)
            cache = result.cache
            out.append(int(result.logits[0, -1].argmax()))
            ids = torch.tensor([[out[-1]]])
    return out


def llama_checkpoint_shapes(config: dict) -> dict[str, tuple[int, ...]]:
    """Name → shape of every tensor in a Hugging Face Llama checkpoint with ``config`` (untied head)."""
    h, i, vocab = config["hidden_size"], config["intermediate_size"], config["vocab_size"]
    d = config.get("head_dim") or h // config["num_attention_heads"]
    q = config["num_attention_heads"] * d
    kv = config.get("num_key_value_heads", config["num_attention_heads"]) * d
    shapes = {
        "model.embed_tokens.weight": (vocab, h),
        "model.norm.weight": (h,),
        "lm_head.weight": (vocab, h),
    }
    for n in range(config["num_hidden_layers"]):
        p = f"model.layers.{n}"
        shapes |= {
            f"{p}.input_layernorm.weight": (h,),
            f"{p}.post_attention_layernorm.weight": (h,),
            f"{p}.self_attn.q_proj.weight": (q, h),
            f"{p}.self_attn.k_proj.weight": (kv, h),
            f"{p}.self_attn.v_proj.weight": (kv, h),
            f"{p}.self_attn.o_proj.weight": (h, q),
            f"{p}.mlp.gate_proj.weight": (i, h),
            f"{p}.mlp.up_proj.weight": (i, h),
            f"{p}.mlp.down_proj.weight": (h, i),
        }
    return shapes
