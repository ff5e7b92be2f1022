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
