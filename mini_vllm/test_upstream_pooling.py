"""Differential test: mini's poolers against vLLM 0.22.1's on the same flat batch.

vLLM's own ``SequencePooler`` (a pooling method from ``get_seq_pooling_method`` and an
``EmbeddingPoolerHead`` with ``PoolerNormalize``, as ``pooler_for_embed`` builds it) runs on CPU
with a real ``PoolingMetadata`` whose cursor ``build_pooling_cursor`` lays out the requests; mini's
``EmbeddingPooler`` gets the same rows and lengths. Requests of different lengths, one of them
with ``use_activation=False``, so both the pooling and the per-request normalisation are compared.
"""

import numpy as np
import pytest

from mini_vllm.models.pooler import EmbeddingPooler, PoolingMetadata
from mini_vllm.pooling_params import PoolingParams

pytestmark = pytest.mark.upstream

LENS = [2, 1, 7, 4]
NORMALISE = [True, False, True, True]


@pytest.mark.parametrize("pooling_type", ["CLS", "LAST", "MEAN"])
def test_mini_pooler_equals_vllms_sequence_pooler(pooling_type):
    import torch
    from vllm.model_executor.layers.pooler.activations import PoolerNormalize
    from vllm.model_executor.layers.pooler.seqwise.heads import EmbeddingPoolerHead
    from vllm.model_executor.layers.pooler.seqwise.methods import get_seq_pooling_method
    from vllm.model_executor.layers.pooler.seqwise.poolers import SequencePooler
    from vllm.pooling_params import PoolingParams as VllmPoolingParams
    from vllm.v1.pool.metadata import PoolingMetadata as VllmPoolingMetadata
    from vllm.v1.pool.metadata import PoolingStates

    hidden = np.random.default_rng(0).standard_normal((sum(LENS), 8)).astype(np.float32) * 3
    real_md = VllmPoolingMetadata(
        prompt_lens=torch.tensor(LENS),
        prompt_token_ids=None,
        prompt_token_ids_cpu=None,
        pooling_params=[VllmPoolingParams(task="embed", use_activation=u) for u in NORMALISE],
        pooling_states=[PoolingStates() for _ in LENS],
    )
    real_md.build_pooling_cursor(np.array(LENS), torch.tensor(LENS), torch.device("cpu"))
    real = SequencePooler(
        pooling=get_seq_pooling_method(pooling_type), head=EmbeddingPoolerHead(activation=PoolerNormalize())
    )
    with torch.no_grad():
        want = [v.numpy() for v in real(torch.from_numpy(hidden), real_md)]

    md = PoolingMetadata(np.array(LENS), [PoolingParams(use_activation=u).verify("embed") for u in NORMALISE])
    md.build_pooling_cursor(LENS)
    got = EmbeddingPooler(pooling_type)(hidden, md)
    for i, (g, w) in enumerate(zip(got, want)):
        np.testing.assert_allclose(
            g,
            w,
            rtol=1e-5,
            atol=1e-6,
            err_msg=f"{pooling_type}, request {i} ({LENS[i]} rows, normalise={NORMALISE[i]})",
        )


class Recorder:
    """Wraps a model's pooler: keeps each step's rows, layout and mini's outputs."""

    def __init__(self, pooler):
        self.pooler, self.steps = pooler, []

    def __call__(self, hidden, metadata):
        out = self.pooler(hidden, metadata)
        c = metadata.get_pooling_cursor()
        self.steps.append((hidden.copy(), c.num_scheduled_tokens.copy(), c.seq_lens.copy(), c.prompt_lens.copy(),
                           [p.task for p in metadata.pooling_params], out))  # fmt: skip
        return out


@pytest.mark.parametrize("task", ["embed", "token_embed"])
def test_the_engines_pooling_steps_equal_vllms_poolers_chunk_by_chunk(tmp_path, task):
    """Each step of a chunked pooling run, replayed through vLLM's own ``SequencePooler`` (LAST) or
    ``AllPool`` (token_embed, caching chunks in real ``PoolingStates``) with a real
    ``PoolingMetadata`` built from the step's ``num_scheduled_tokens`` and ``seq_lens``: the same
    requests finish on the same step with the same output; the others pool to nothing yet."""
    import shutil
    from pathlib import Path

    import torch
    from vllm.model_executor.layers.pooler.activations import PoolerNormalize
    from vllm.model_executor.layers.pooler.seqwise.heads import EmbeddingPoolerHead
    from vllm.model_executor.layers.pooler.seqwise.methods import get_seq_pooling_method
    from vllm.model_executor.layers.pooler.seqwise.poolers import SequencePooler
    from vllm.model_executor.layers.pooler.tokwise.methods import AllPool
    from vllm.pooling_params import PoolingParams as VllmPoolingParams
    from vllm.v1.pool.metadata import PoolingMetadata as VllmPoolingMetadata
    from vllm.v1.pool.metadata import PoolingStates

    from mini_vllm import LLMEngine
    from mini_vllm.models import get_model

    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = dict(vocab_size=64, hidden_size=16, intermediate_size=24, num_hidden_layers=1, num_attention_heads=4,
               num_key_value_heads=2, head_dim=4, max_position_embeddings=128)  # fmt: skip
    transformers.LlamaModel(transformers.LlamaConfig(**cfg)).save_pretrained(tmp_path)
    shutil.copy(Path(__file__).parent / "checkpoints/course-llama/tokenizer.json", tmp_path)
    engine = LLMEngine(model=str(tmp_path), block_size=4, num_gpu_blocks=64, max_num_batched_tokens=7,
                       max_model_len=64)  # fmt: skip
    model = engine.model_executor.driver_worker.model_runner.model
    assert type(model) is type(get_model(engine.vllm_config.model_config))
    recorder = model.pooler = Recorder(model.pooler)
    rng = np.random.default_rng(3)
    engine.encode([rng.integers(0, 64, size=n).tolist() for n in (5, 11, 2, 9)], pooling_task=task)
    assert any((s[2] < s[3]).any() for s in recorder.steps), "the run must hold partial prefills"

    if task == "embed":
        real = SequencePooler(
            get_seq_pooling_method("LAST"), EmbeddingPoolerHead(activation=PoolerNormalize())
        )
    else:  # AllPool reads enable_chunked_prefill from the current vLLM config; set it as the engine has it
        real = AllPool.__new__(AllPool)
        torch.nn.Module.__init__(real)
        real.enable_chunked_prefill = True
    states: dict[int, PoolingStates] = {}
    for n, (hidden, scheduled, seq_lens, prompt_lens, tasks, got) in enumerate(recorder.steps):
        md = VllmPoolingMetadata(
            prompt_lens=torch.from_numpy(prompt_lens), prompt_token_ids=None, prompt_token_ids_cpu=None,
            pooling_params=[VllmPoolingParams(task=t, use_activation=True) for t in tasks],
            pooling_states=[states.setdefault(int(p), PoolingStates()) for p in prompt_lens],  # lengths differ
        )  # fmt: skip
        md.build_pooling_cursor(scheduled, torch.from_numpy(seq_lens), torch.device("cpu"))
        with torch.no_grad():
            want = real(torch.from_numpy(hidden), md)
        finished = md.get_pooling_cursor().is_finished().tolist()
        for i, (g, w, done) in enumerate(zip(got, want, finished)):
            if task == "token_embed":
                w = None if w is None else torch.nn.functional.normalize(w, dim=-1)
                assert (g is None) == (w is None), (
                    f"step {n} request {i}: finished differs from vLLM's AllPool"
                )
            elif not done:
                continue  # the runner drops an unfinished request's LAST row, as vLLM's finished_mask does
            if w is not None:
                np.testing.assert_allclose(
                    g, w.numpy(), rtol=1e-5, atol=1e-6, err_msg=f"{task} step {n} request {i}"
                )
