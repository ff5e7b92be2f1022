"""Pooling: ``PoolingParams``, the poolers (CLS / LAST / MEAN, normalise after pooling), the Llama
embedding adapter against Hugging Face's ``LlamaModel`` hidden states, and the refusals of
``PagedDriver.pool`` (the hand driver; ``test_engine_pooling.py`` runs the engine's ``embed`` / ``encode``).

The Hugging Face side is a tiny random ``LlamaModel`` (std 0.2 weights) saved with
``save_pretrained``: a bare ``*Model`` checkpoint (``layers.0...``, no ``model.`` prefix, no
head) whose ``config.json`` names ``LlamaModel``, the way embedding checkpoints ship. Its
reference embeddings are computed here from ``last_hidden_state`` one prompt at a time (no
padding), so nothing about batching leaks into the reference.
"""

import numpy as np
import pytest

from mini_vllm.config import ModelConfig, PoolerConfig
from mini_vllm.models import ModelRegistry, get_model
from mini_vllm.models.interfaces import get_supported_tasks, is_pooling_model
from mini_vllm.models.llama import LlamaForCausalLM, LlamaForEmbedding
from mini_vllm.models.loader import load_weights_into
from mini_vllm.models.pooler import (
    DispatchPooler,
    EmbeddingPooler,
    PoolingMetadata,
    l2_normalize,
    mean_pool,
)
from mini_vllm.pooling_params import PoolingParams
from mini_vllm.testing.paged import PagedDriver, pool_requests

CONFIG = dict(
    vocab_size=64, hidden_size=16, intermediate_size=24, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, head_dim=4, rms_norm_eps=1e-5, max_position_embeddings=256,
    initializer_range=0.2,
)  # fmt: skip


def metadata(lens, use_activation=True, task="embed", scheduled=None):
    params = [PoolingParams(use_activation=use_activation).verify(task) for _ in lens]
    md = PoolingMetadata(np.array(lens), params)
    md.build_pooling_cursor(scheduled if scheduled is not None else lens)
    return md


# ------------------------------------------------------------------ PoolingParams
def test_pooling_params_default_to_normalised_and_check_their_task():
    p = PoolingParams()
    assert (p.use_activation, p.task) == (None, None), "unset until the task is known"
    v = p.verify("embed")
    assert (v.use_activation, v.task) == (True, "embed"), "embed defaults to use_activation=True"
    assert p.task is None, "verify returns a copy; the caller's params are not changed"
    assert PoolingParams(use_activation=False).verify("token_embed").use_activation is False
    with pytest.raises(ValueError, match="unknown pooling task 'encode'"):
        PoolingParams(task="encode")
    with pytest.raises(ValueError, match="for task 'embed', not 'token_embed'"):
        PoolingParams(task="embed").verify("token_embed")
    with pytest.raises(TypeError, match="use_activation"):
        PoolingParams(use_activation=1)


# ------------------------------------------------------------------ poolers on hand-made rows
def test_cls_last_and_mean_take_each_requests_own_rows():
    # 3 requests of 2, 1 and 3 rows in one flat batch; row t is [t, 10 t]
    hidden = np.array([[t, 10 * t] for t in range(6)], dtype=np.float32)
    md = metadata([2, 1, 3], use_activation=False)
    pooled = {k: np.stack(EmbeddingPooler(k)(hidden, md)) for k in ("CLS", "LAST", "MEAN")}
    np.testing.assert_array_equal(pooled["CLS"], hidden[[0, 2, 3]], err_msg="CLS: each request's first row")
    np.testing.assert_array_equal(pooled["LAST"], hidden[[1, 2, 5]], err_msg="LAST: each request's last row")
    want = np.array([[0.5, 5.0], [2.0, 20.0], [4.0, 40.0]], np.float32)
    np.testing.assert_allclose(
        pooled["MEAN"],
        want,
        rtol=1e-6,
        err_msg="MEAN: the average of the request's own rows, over its length",
    )


def test_mean_sums_low_precision_rows_in_float32():
    # float16 rows: 3 x 40000 overflows float16 (max 65504) if summed in the rows' own dtype
    hidden = np.full((3, 2), 40000, dtype=np.float16)
    got = mean_pool(hidden, metadata([3]).get_pooling_cursor())
    assert np.isfinite(got).all() and np.allclose(got, 40000.0), (
        f"MEAN of three float16 rows of 40000 must be 40000, got {got.tolist()}: sum in float32, not float16"
    )


def test_normalise_after_pooling_not_before():
    hidden = np.array([[3.0, 4.0], [0.0, 1.0], [1.0, 1.0]], dtype=np.float32)
    got = np.stack(EmbeddingPooler("MEAN")(hidden, metadata([2, 1])))
    # request 0: mean (1.5, 2.5), normalised (3, 5)/sqrt(34); request 1: (1, 1)/sqrt(2)
    want = np.array([[3 / np.sqrt(34), 5 / np.sqrt(34)], [1 / np.sqrt(2), 1 / np.sqrt(2)]], np.float32)
    np.testing.assert_allclose(
        got, want, rtol=1e-6, err_msg="normalise the pooled mean; averaging unit rows gives (0.3, 0.9)/|.|"
    )
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, rtol=1e-6)
    np.testing.assert_array_equal(l2_normalize(np.zeros((1, 3), np.float32)), 0.0, err_msg="zero stays zero")


def test_mean_and_cls_refuse_a_partial_prefill_last_does_not():
    hidden = np.ones((4, 2), np.float32)
    md = metadata([3, 5], scheduled=[3, 1])  # the second prompt only 1 of its 5 tokens this step
    for kind in ("MEAN", "CLS"):
        with pytest.raises(ValueError, match=f"{kind} pooling needs the whole prompt"):
            EmbeddingPooler(kind)(hidden, md)
    assert len(EmbeddingPooler("LAST")(hidden, md)) == 2
    with pytest.raises(ValueError, match="unknown pooling type 'MAX'"):
        EmbeddingPooler("MAX")
    with pytest.raises(RuntimeError, match="build_pooling_cursor"):
        mean_pool(hidden, PoolingMetadata(np.array([4]), []).get_pooling_cursor())


def test_dispatch_pooler_routes_by_task_and_refuses_mixed_or_missing_tasks():
    hidden = np.arange(8, dtype=np.float32).reshape(4, 2)
    pooler = DispatchPooler.for_embedding("LAST")
    assert pooler.get_supported_tasks() == {"embed", "token_embed"}
    rows = pooler(hidden, metadata([1, 3], task="token_embed"))
    assert [r.shape for r in rows] == [(1, 2), (3, 2)], "token_embed keeps every row of each request"
    np.testing.assert_allclose(rows[1], l2_normalize(hidden[1:]), rtol=1e-6)
    md = metadata([1, 3])
    md.pooling_params[1] = PoolingParams().verify("token_embed")
    with pytest.raises(ValueError, match="same resolved task"):
        pooler(hidden, md)
    with pytest.raises(ValueError, match="unsupported pooling task 'token_embed'"):
        DispatchPooler({"embed": EmbeddingPooler()})(hidden, metadata([1, 3], task="token_embed"))
    with pytest.raises(ValueError, match="does not support task 'token_embed'"):
        DispatchPooler({"token_embed": EmbeddingPooler()})


# ------------------------------------------------------------------ the adapter and the registry
def test_llama_model_registers_as_a_pooling_model():
    info = ModelRegistry.inspect_model_cls("LlamaModel")
    assert info.is_pooling_model and not info.is_text_generation_model, info
    cls, _ = ModelRegistry.resolve_model_cls("LlamaModel")
    assert cls is LlamaForEmbedding and cls.__name__ == "LlamaForEmbedding"
    assert issubclass(cls, LlamaForCausalLM) and not is_pooling_model(LlamaForCausalLM)
    assert get_supported_tasks(cls) == ("embed", "token_embed")
    assert get_supported_tasks(LlamaForCausalLM) == ("generate",)
    model = LlamaForEmbedding(CONFIG)
    assert "lm_head.weight" not in model.params, "a pooling model has no LM head"
    with pytest.raises(TypeError, match="pooling model"):
        model.compute_logits(np.zeros((1, 16), np.float32))


# ------------------------------------------------------------------ against Hugging Face
@pytest.fixture(scope="module")
def hf_llama(tmp_path_factory):
    """(HF LlamaForCausalLM, the path of its bare LlamaModel checkpoint, torch)."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    hf = transformers.LlamaForCausalLM(transformers.LlamaConfig(**CONFIG)).eval()
    path = tmp_path_factory.mktemp("tiny-llama-embed")
    hf.model.save_pretrained(path)  # LlamaModel: architectures ["LlamaModel"], names without "model."
    return hf, path, torch


def prompts(seed=0):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 64, size=n).tolist() for n in (1, 4, 9, 23)]


def hf_embeddings(hf, torch, batch, pooling_type, normalise=True):
    out = []
    for prompt in batch:
        with torch.no_grad():
            rows = hf.model(torch.tensor([prompt])).last_hidden_state[0]
        vec = {"CLS": rows[0], "LAST": rows[-1], "MEAN": rows.mean(dim=0)}[pooling_type]
        out.append((torch.nn.functional.normalize(vec, p=2, dim=-1) if normalise else vec).numpy())
    return out


@pytest.mark.parametrize("pooling_type", ["LAST", "MEAN", "CLS"])
def test_embeddings_equal_hugging_face_pooled_hidden_states(hf_llama, pooling_type):
    hf, path, torch = hf_llama
    model = get_model(ModelConfig(path, pooler_config=PoolerConfig(seq_pooling_type=pooling_type)))
    assert isinstance(model, LlamaForEmbedding), type(model)
    assert model.pooler.poolers_by_task["embed"].pooling_type == pooling_type
    batch = prompts()
    got = pool_requests(model, batch, PoolingParams())  # 4 prompts of 1..23 tokens, one step
    for i, (g, w) in enumerate(zip(got, hf_embeddings(hf, torch, batch, pooling_type))):
        err = float(np.abs(g - w).max())
        assert err < 1e-4, f"{pooling_type} prompt {i} ({len(batch[i])} tokens): differs from HF by {err:.2e}"
        assert abs(np.linalg.norm(g) - 1) < 1e-5, f"prompt {i}: the embedding is not unit length"
    raw = pool_requests(model, batch, PoolingParams(use_activation=False))
    for i, (g, w) in enumerate(zip(raw, hf_embeddings(hf, torch, batch, pooling_type, normalise=False))):
        assert np.abs(g - w).max() < 1e-4, (
            f"{pooling_type} prompt {i}: use_activation=False must not normalise"
        )


def test_causal_lm_checkpoint_loads_as_embedding_and_token_embed_matches(hf_llama):
    hf, _, torch = hf_llama
    model = LlamaForEmbedding(CONFIG)
    state = {k: v.numpy() for k, v in hf.state_dict().items()}  # model.layers..., lm_head.weight
    load_weights_into(model, state.items())
    batch = prompts(seed=1)
    rows = PagedDriver(model).pool(batch, None, pooling_task="token_embed")
    for i, prompt in enumerate(batch):
        with torch.no_grad():
            want = torch.nn.functional.normalize(
                hf.model(torch.tensor([prompt])).last_hidden_state[0], dim=-1
            )
        assert rows[i].shape == (len(prompt), 16)
        assert np.abs(rows[i] - want.numpy()).max() < 1e-4, f"token_embed prompt {i} differs from HF"


def test_pool_refuses_what_the_model_does_not_support_and_changes_nothing():
    generator = LlamaForCausalLM(CONFIG)
    with pytest.raises(
        ValueError, match=r"LlamaForCausalLM does not support pooling \(its tasks: \['generate'\]\)"
    ):
        pool_requests(generator, [[1, 2]])
    model = LlamaForEmbedding(CONFIG)
    model.pooler = DispatchPooler({"embed": EmbeddingPooler("MEAN")})
    driver = PagedDriver(model)
    free = len(driver.free)
    for kwargs, match in (
        (dict(prompts=[[1, 2]], pooling_params=None, pooling_task="token_embed"), "unsupported pooling task"),
        (dict(prompts=[[1, 2], []], pooling_params=None), "at least one token"),
        (dict(prompts=[[1, 2]], pooling_params=[None, None]), "2 PoolingParams for 1 prompts"),
        (dict(prompts=[[1, 2]], pooling_params=PoolingParams(task="token_embed")), "not 'embed'"),
    ):
        with pytest.raises(ValueError, match=match):
            driver.pool(**kwargs)
        assert len(driver.free) == free and not driver.lens, f"a refused pool ({match}) must allocate nothing"
    assert len(driver.pool([[1, 2], [3]], None)) == 2


def test_pooler_config_chooses_pooling_and_turns_off_chunking_for_mean_and_cls(hf_llama, tmp_path):
    _, path, _ = hf_llama
    default = ModelConfig(path)
    assert get_model(default).pooler.poolers_by_task["embed"].pooling_type == "LAST", "the class default"
    for kind, chunkable in (("LAST", True), ("MEAN", False), ("CLS", False)):
        mc = ModelConfig(path, pooler_config=PoolerConfig(seq_pooling_type=kind))
        assert (mc.is_chunked_prefill_supported, mc.is_prefix_caching_supported) == (chunkable, chunkable), (
            kind
        )
    assert default.is_chunked_prefill_supported and default.is_prefix_caching_supported
    with pytest.raises(ValueError, match="seq_pooling_type must be one of"):
        PoolerConfig(seq_pooling_type="MAX")
    with pytest.raises(TypeError, match="pooler_config must be a PoolerConfig"):
        ModelConfig(path, pooler_config="MEAN")
    (tmp_path / "config.json").write_text('{"architectures": ["ToyForCausalLM"], "vocab_size": 20}')
    with pytest.raises(ValueError, match="pooler_config is for pooling models; ToyForCausalLM generates"):
        get_model(ModelConfig(tmp_path, pooler_config=PoolerConfig("MEAN")))
