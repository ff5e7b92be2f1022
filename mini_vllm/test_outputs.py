"""mini_vllm.outputs: what the engine hands back, and the conversions between its shapes."""

import numpy as np
import pytest

from mini_vllm.outputs import EmbeddingRequestOutput, PoolingOutput, PoolingRequestOutput


def test_an_embedding_is_one_vector_and_a_per_token_output_is_refused():
    vec = PoolingRequestOutput("r0", PoolingOutput(np.array([0.6, 0.8], dtype=np.float32)), [1, 2, 3], True)
    out = EmbeddingRequestOutput.from_base(vec)
    assert out.outputs.embedding == pytest.approx([0.6, 0.8]) and out.outputs.hidden_size == 2
    assert (out.request_id, out.prompt_token_ids, out.finished) == ("r0", [1, 2, 3], True)
    rows = PoolingRequestOutput("r1", PoolingOutput(np.ones((3, 2), dtype=np.float32)), [1, 2, 3], True)
    try:
        got = EmbeddingRequestOutput.from_base(rows)
    except ValueError:
        pass
    else:
        pytest.fail(
            f"from_base turned a token_embed output of shape (3, 2) into an embedding {got.outputs.embedding!r}: "
            "an embedding is one vector per prompt; refuse data whose ndim is not 1"
        )
