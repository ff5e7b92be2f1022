"""Pooling through the engine: ``LLMEngine.encode`` / ``embed`` on a ``LlamaModel`` checkpoint.

The checkpoint is a tiny random Hugging Face ``LlamaModel`` saved with ``save_pretrained`` (a bare
``*Model`` layout whose ``config.json`` names ``LlamaModel``), plus a ``tokenizer.json``. The
reference embeddings are computed directly: HF's ``last_hidden_state`` of each prompt alone,
pooled and L2-normalised in numpy. The engine runs them through the scheduler, the paged KV cache
and the runner's pooling branch, with chunked prefill where the pooling allows it.
"""

import importlib.util
import shutil
from pathlib import Path

import numpy as np
import pytest

from mini_vllm import LLMEngine
from mini_vllm.config import PoolerConfig
from mini_vllm.pooling_params import PoolingParams

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("torch") is None or importlib.util.find_spec("transformers") is None,
    reason="the checkpoint is written by transformers (pip install -e '.[torch]')",
)

CONFIG = dict(
    vocab_size=64, hidden_size=16, intermediate_size=24, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, head_dim=4, rms_norm_eps=1e-5, max_position_embeddings=256,
    initializer_range=0.2,
)  # fmt: skip
TOKENIZER = Path(__file__).parent / "checkpoints" / "course-llama" / "tokenizer.json"
LENS = (1, 4, 9, 23, 16)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """(path of a LlamaModel checkpoint, the HF LlamaModel it holds)."""
    import torch
    import transformers

    torch.manual_seed(0)
    hf = transformers.LlamaModel(transformers.LlamaConfig(**CONFIG)).eval()
    path = tmp_path_factory.mktemp("llama-embed")
    hf.save_pretrained(path)
    shutil.copy(TOKENIZER, path / "tokenizer.json")  # the engine loads one; prompts here are token ids
    return path, hf


def prompts(seed=0):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 64, size=n).tolist() for n in LENS]


def hf_rows(hf, prompt):
    import torch

    with torch.no_grad():
        return hf(torch.tensor([prompt])).last_hidden_state[0].numpy().astype(np.float64)


def unit(x):
    return x / max(np.linalg.norm(x), 1e-12)


def free_blocks(engine):
    return engine.scheduler.kv_cache_manager.block_pool.get_num_free_blocks()


@pytest.mark.parametrize("pooling_type, budget", [("LAST", 8), ("LAST", 2048), ("MEAN", 2048), ("CLS", 2048)])
def test_embed_equals_the_pooled_hidden_states_computed_directly(checkpoint, pooling_type, budget):
    path, hf = checkpoint
    engine = LLMEngine(
        model=str(path), pooler_config=PoolerConfig(pooling_type), block_size=4, num_gpu_blocks=64,
        max_num_batched_tokens=budget, max_model_len=64,
    )  # fmt: skip
    batch = prompts()
    out = engine.embed(batch)
    assert [o.request_id for o in out] == [f"req-{i}" for i in range(len(batch))], "outputs in input order"
    for i, (o, p) in enumerate(zip(out, batch)):
        rows = hf_rows(hf, p)
        want = unit({"LAST": rows[-1], "MEAN": rows.mean(axis=0), "CLS": rows[0]}[pooling_type])
        got = np.array(o.outputs.embedding)
        assert o.finished and o.prompt_token_ids == p and o.outputs.hidden_size == 16
        err = float(np.abs(got - want).max())
        assert err < 1e-4, (
            f"{pooling_type} budget {budget}: prompt {i} ({len(p)} tokens) differs by {err:.1e}"
        )
    if budget == 8:
        assert engine.num_steps >= sum(LENS) // 8, "a budget of 8 tokens must chunk the 23-token prompt"
    raw = engine.encode(batch[:2], PoolingParams(use_activation=False), pooling_task="embed")
    want = hf_rows(hf, batch[1])
    want = {"LAST": want[-1], "MEAN": want.mean(axis=0), "CLS": want[0]}[pooling_type]
    assert np.abs(raw[1].outputs.data - want).max() < 1e-4, "use_activation=False must not normalise"


def test_token_embed_survives_chunked_prefill_and_a_prefix_cache_hit(checkpoint):
    path, hf = checkpoint
    engine = LLMEngine(model=str(path), block_size=4, num_gpu_blocks=64, max_num_batched_tokens=6,
                       max_model_len=64)  # fmt: skip
    assert engine.vllm_config.scheduler_config.enable_chunked_prefill, "LAST pooling keeps chunked prefill"
    batch = prompts(seed=1)
    engine.embed(batch)  # fills the prefix cache with these prompts' blocks
    for _ in range(2):
        out = engine.encode(batch, pooling_task="token_embed")
        for i, (o, p) in enumerate(zip(out, batch)):
            want = hf_rows(hf, p)
            want /= np.maximum(np.linalg.norm(want, axis=1, keepdims=True), 1e-12)
            assert o.outputs.data.shape == (len(p), 16), (
                f"prompt {i}: token_embed needs one row per prompt token, got {o.outputs.data.shape} "
                "(a chunk lost, or cached rows skipped: token_embed must not read the prefix cache)"
            )
            assert np.abs(o.outputs.data - want).max() < 1e-4, f"token_embed prompt {i} differs from HF"


def test_a_pooling_request_leaves_no_kv_block_behind(checkpoint):
    path, _ = checkpoint
    engine = LLMEngine(model=str(path), pooler_config=PoolerConfig("MEAN"), block_size=4, num_gpu_blocks=16,
                       max_num_seqs=2, max_model_len=32)  # fmt: skip
    total = free_blocks(engine)
    out = engine.embed(prompts())  # 5 prompts, 2 seats, 15 usable blocks: they take turns
    assert len(out) == 5 and all(o.finished for o in out)
    manager = engine.scheduler.kv_cache_manager
    assert free_blocks(engine) == total, f"{total - free_blocks(engine)} KV blocks still held after pooling"
    assert not engine.has_unfinished_requests() and not engine._prompts
    assert not getattr(manager, "req_to_blocks", {}), "the KV manager still maps a finished request"
    for o in out:
        assert o.outputs.embedding and len(o.prompt_token_ids) in LENS


def test_chunking_and_prefix_caching_follow_the_pooling_type(checkpoint):
    path, _ = checkpoint
    for kind, on in (("LAST", True), ("MEAN", False), ("CLS", False), (None, True)):
        cfg = LLMEngine(model=str(path), pooler_config={"seq_pooling_type": kind}).vllm_config
        got = (cfg.scheduler_config.enable_chunked_prefill, cfg.cache_config.enable_prefix_caching)
        assert got == (on, on), f"{kind} pooling: chunked prefill / prefix caching should be {on}, got {got}"
    for arg in ("enable_chunked_prefill", "enable_prefix_caching"):
        with pytest.raises(ValueError, match=f"{arg}: MEAN pooling reads every prompt row"):
            LLMEngine(model=str(path), pooler_config=PoolerConfig("MEAN"), **{arg: True})
    cfg = LLMEngine(
        model=str(path), pooler_config=PoolerConfig("CLS"), enable_chunked_prefill=False
    ).vllm_config
    assert not cfg.cache_config.enable_prefix_caching


def state(engine):
    return (engine._next_index, dict(engine._prompts), engine.has_unfinished_requests(), free_blocks(engine),
            engine.num_steps)  # fmt: skip


def test_the_wrong_runner_refuses_and_leaves_the_engine_clean(checkpoint, tmp_path):
    path, _ = checkpoint
    generator = LLMEngine(num_gpu_blocks=16, block_size=4)  # the toy: generate only
    before = state(generator)
    for call in (lambda: generator.embed([[1, 2]]), lambda: generator.encode([[1]], pooling_task="embed")):
        with pytest.raises(ValueError, match=r"LLMEngine.encode\(\) is only supported for pooling models"):
            call()
        assert state(generator) == before, "a refused embed must queue nothing"
    assert generator.generate([[1, 2]])[0].finished, "the engine still generates after the refusal"

    pooler = LLMEngine(model=str(path), block_size=4, num_gpu_blocks=32, max_model_len=64)
    assert pooler.runner_type == "pooling" and pooler.supported_tasks == ("embed", "token_embed")
    before = state(pooler)
    for call, error, match in (
        (lambda: pooler.generate([[1, 2]]), ValueError, r"generate\(\) is only supported for generative"),
        (lambda: pooler.add_request([1, 2]), ValueError, "LlamaForEmbedding|LlamaModel is a pooling model"),
        (lambda: pooler.encode([[1, 2]]), ValueError, "pooling_task required"),
        (
            lambda: pooler.encode([[1]], pooling_task="classify"),
            ValueError,
            "unsupported pooling task 'classify'",
        ),
        (lambda: pooler.embed([[1, 2], []]), ValueError, "the prompt is empty"),
        (lambda: pooler.embed([[1, 2], [99]]), ValueError, r"prompt token ids must lie in \[0, 64\)"),
        (
            lambda: pooler.embed([[1]], pooling_params=[None, None]),
            ValueError,
            "2 pooling_params for 1 prompts",
        ),
        (
            lambda: pooler.embed([[1]], pooling_params=PoolingParams(task="token_embed")),
            ValueError,
            "not 'embed'",
        ),
        (lambda: pooler.embed([[1]], pooling_params=[3]), TypeError, "must be PoolingParams"),
    ):
        with pytest.raises(error, match=match):
            call()
        assert state(pooler) == before, f"a refused call ({match}) changed the engine"
    assert len(pooler.embed([[1, 2], [3]])) == 2, "the engine still pools after the refusals"


def test_the_registry_refuses_an_engine_the_model_cannot_serve(checkpoint, tmp_path):
    path, _ = checkpoint
    with pytest.raises(ValueError, match="LlamaModel does not support generation"):
        LLMEngine(model=str(path), runner="generate")
    gen = tmp_path / "gen"
    gen.mkdir()
    shutil.copy(TOKENIZER, gen / "tokenizer.json")
    (gen / "config.json").write_text('{"architectures": ["LlamaForCausalLM"], "vocab_size": 64}')
    with pytest.raises(ValueError, match=r"LlamaForCausalLM does not support pooling \(it is a generative"):
        LLMEngine(model=str(gen), runner="pooling")  # refused from the class: no weights are read
    with pytest.raises(ValueError, match="runner must be 'auto', 'generate' or 'pooling'"):
        LLMEngine(model=str(path), runner="encode")
    with pytest.raises(ValueError, match="speculative decoding needs a generative model"):
        LLMEngine(model=str(path), speculative_config={"method": "ngram", "num_speculative_tokens": 2})
    with pytest.raises(ValueError, match=r"\['pooler_config'\] need a model checkpoint"):
        LLMEngine(pooler_config=PoolerConfig("MEAN"))
