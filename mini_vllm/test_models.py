"""mini_vllm.models: the numpy Llama against Hugging Face, the toy behind the contract, the registry,
the loader and ModelConfig.

The Hugging Face comparisons build the tiny Llama of ``course/runtime/tiny_model.py`` once (random
seeded weights, saved as safetensors), load it into mini through ``ModelConfig`` + ``get_model``,
and into ``transformers.LlamaForCausalLM`` with ``from_pretrained``.
"""

import json
import subprocess
import sys

import numpy as np
import pytest

from mini_vllm.config import ModelConfig
from mini_vllm.model import ToyModel
from mini_vllm.models import ModelRegistry, get_model
from mini_vllm.models.interfaces import IsAttentionFree, SupportsLoRA, SupportsPP
from mini_vllm.models.llama import LlamaForCausalLM, apply_rope, rms_norm, rope_inv_freq
from mini_vllm.models.loader import load_weights_into, read_safetensors
from mini_vllm.models.registry import _ModelRegistry
from mini_vllm.models.toy import ToyForCausalLM
from mini_vllm.testing.paged import PagedDriver, generate_greedy, hf_greedy, llama_checkpoint_shapes

SMALL = dict(  # a 1-layer Llama for the weight-mapping tests: numpy only, microseconds
    vocab_size=32, hidden_size=16, intermediate_size=24, num_hidden_layers=1,
    num_attention_heads=4, num_key_value_heads=2, head_dim=4, rms_norm_eps=1e-5,
)  # fmt: skip


def numbered_weights(config):
    """Every checkpoint tensor filled with its own constant (1, 2, 3, ... in name order)."""
    return {
        name: np.full(shape, k + 1.0, dtype=np.float32)
        for k, (name, shape) in enumerate(sorted(llama_checkpoint_shapes(config).items()))
    }


# ------------------------------------------------------------------ against Hugging Face
@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """(mini's model, HF's model, torch) for the tiny Llama checkpoint, built once."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from course.runtime import tiny_model

    path = tiny_model.build(tmp_path_factory.mktemp("tiny-llama"))
    mini = get_model(ModelConfig(path))
    hf = transformers.LlamaForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    return mini, hf, torch


def prompts(n, seed=0):
    """n prompts of different lengths (1 .. 70 tokens) from a seeded RNG."""
    rng = np.random.default_rng(seed)
    lengths = [1, 3, 9, 16, 17, 33, 48, 70][:n]
    return [rng.integers(0, 512, size=length).tolist() for length in lengths]


def test_tiny_llama_logits_equal_hugging_face_within_1e_4(tiny):
    mini, hf, torch = tiny
    batch = prompts(8)
    driver = PagedDriver(mini, block_size=16)
    got = driver.step(dict(enumerate(batch)), all_logits=True)  # 8 prompts in one varlen step
    for i, prompt in enumerate(batch):
        with torch.no_grad():
            want = hf(torch.tensor([prompt])).logits[0].numpy()
        err = float(np.abs(got[i] - want).max())
        assert err < 1e-4, f"prompt {i} ({len(prompt)} tokens): logits differ from HF by {err:.2e} (> 1e-4)"


@pytest.fixture(scope="module")
def hf_greedy_64(tiny):
    """HF's 64 greedy tokens for each of the 8 prompts, one request at a time."""
    _, hf, _ = tiny
    return [hf_greedy(hf, prompt, 64) for prompt in prompts(8)]


@pytest.mark.parametrize("block_size", [16, 32])
def test_greedy_64_tokens_on_8_batched_prompts_equal_hugging_face(tiny, hf_greedy_64, block_size):
    mini, _, _ = tiny
    batch, steps = prompts(8), []
    got = generate_greedy(mini, batch, 64, chunk_size=8, stagger=2, steps=steps, block_size=block_size)
    mixed = [s for s in steps if max(s.values()) > 1 and min(s.values()) == 1]
    assert len(mixed) >= 5, (
        f"only {len(mixed)} steps mixed prefill chunks with decodes: the test lost its point"
    )
    for i, prompt in enumerate(batch):
        want = hf_greedy_64[i]
        first = next((t for t, (a, b) in enumerate(zip(got[i], want)) if a != b), None)
        assert got[i] == want, (
            f"prompt {i} ({len(prompt)} tokens): greedy tokens diverge from HF at output {first}"
        )


def test_tied_head_and_rope_theta_equal_hugging_face():
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    config = {**SMALL, "tie_word_embeddings": True, "rope_theta": 500000.0, "max_position_embeddings": 128}
    torch.manual_seed(0)
    hf = transformers.LlamaForCausalLM(transformers.LlamaConfig(**config)).eval()
    mini = LlamaForCausalLM(config)
    state = {k: v.numpy() for k, v in hf.state_dict().items()}
    load_weights_into(mini, state.items())
    assert "lm_head.weight" not in mini.params, "a tied model has no head of its own"
    tokens = np.random.default_rng(1).integers(0, 32, size=40).tolist()
    got = PagedDriver(mini, block_size=16).step({0: tokens}, all_logits=True)[0]
    with torch.no_grad():
        want = hf(torch.tensor([tokens])).logits[0].numpy()
    np.testing.assert_allclose(got, want, atol=1e-4, err_msg="tied lm_head with rope_theta 5e5 must match HF")


def test_an_explicit_head_dim_wider_than_hidden_over_heads_equals_hugging_face():
    config = {**SMALL, "head_dim": 8}  # 4 heads x 8 = 32 query features on a hidden size of 16 (Qwen3, Gemma)
    mini = LlamaForCausalLM(config)
    qkv = mini.params["model.layers.0.self_attn.qkv_proj.weight"].shape
    assert qkv == ((4 + 2 * 2) * 8, 16), (
        f"qkv_proj is {qkv}: with head_dim=8 in the config it is ((heads + 2 * kv_heads) * head_dim, hidden) = (64, 16); "
        "read head_dim from the config and fall back to hidden_size // num_attention_heads only when it is absent"
    )
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    hf = transformers.LlamaForCausalLM(transformers.LlamaConfig(**config, max_position_embeddings=64)).eval()
    load_weights_into(mini, ((k, v.numpy()) for k, v in hf.state_dict().items()))
    tokens = np.random.default_rng(2).integers(0, 32, size=20).tolist()
    got = PagedDriver(mini, block_size=16).step({0: tokens}, all_logits=True)[0]
    with torch.no_grad():
        want = hf(torch.tensor([tokens])).logits[0].numpy()
    np.testing.assert_allclose(
        got, want, atol=1e-4, err_msg="head_dim=8 on hidden 16 / 4 heads must match HF"
    )


# ------------------------------------------------------------------ numpy-only building blocks
def test_rms_norm_is_root_mean_square_with_eps():
    x = np.array([[3.0, 4.0]], dtype=np.float32)  # mean of squares 12.5
    np.testing.assert_allclose(rms_norm(x, np.ones(2, np.float32), 0.0), x / np.sqrt(12.5), rtol=1e-6)
    tiny = np.array([[1e-3, 0.0]], dtype=np.float32)  # mean of squares 5e-7: eps = 1e-6 dominates
    np.testing.assert_allclose(
        rms_norm(tiny, np.ones(2, np.float32), 1e-6), tiny / np.sqrt(1.5e-6), rtol=1e-5
    )


def test_rope_rotates_first_half_against_second_half():
    x = np.zeros((1, 1, 4), dtype=np.float32)
    x[0, 0, 0] = 1.0
    out = apply_rope(x, np.array([1]), rope_inv_freq(4, 10000.0))
    # neox style: coordinate 0 pairs with coordinate 2 (half = 2), angle = position * inv_freq[0] = 1
    np.testing.assert_allclose(out[0, 0], [np.cos(1.0), 0.0, np.sin(1.0), 0.0], atol=1e-6)
    np.testing.assert_allclose(rope_inv_freq(4, 10000.0), [1.0, 0.01], rtol=1e-6)


def test_rope_scores_depend_on_relative_position_only():
    rng = np.random.default_rng(0)
    q, k = rng.standard_normal((2, 1, 1, 64)).astype(np.float32)
    inv = rope_inv_freq(64, 10000.0)

    def score(m, n):
        return float((apply_rope(q, np.array([m]), inv) * apply_rope(k, np.array([n]), inv)).sum())

    assert abs(score(5, 2) - score(103, 100)) < 1e-3, "q at m, k at n: the score must depend on m - n only"


def test_stacked_mapping_lands_q_k_v_gate_up_in_their_rows():
    mini = LlamaForCausalLM(SMALL)
    weights = numbered_weights(SMALL)
    load_weights_into(mini, weights.items())
    qkv = mini.params["model.layers.0.self_attn.qkv_proj.weight"]
    q, kv = 4 * 4, 2 * 4
    for rows, shard in ((slice(0, q), "q"), (slice(q, q + kv), "k"), (slice(q + kv, q + 2 * kv), "v")):
        want = weights[f"model.layers.0.self_attn.{shard}_proj.weight"][0, 0]
        assert (qkv[rows] == want).all(), f"qkv_proj rows {rows.start}:{rows.stop} must hold {shard}_proj"
    gate_up = mini.params["model.layers.0.mlp.gate_up_proj.weight"]
    assert (gate_up[:24] == weights["model.layers.0.mlp.gate_proj.weight"][0, 0]).all(), (
        "rows 0:24 are gate_proj"
    )
    assert (gate_up[24:] == weights["model.layers.0.mlp.up_proj.weight"][0, 0]).all(), (
        "rows 24:48 are up_proj"
    )


def test_missing_extra_and_misshaped_tensors_are_named():
    weights = numbered_weights(SMALL)
    missing = {k: v for k, v in weights.items() if k != "model.layers.0.self_attn.k_proj.weight"}
    with pytest.raises(ValueError, match=r"lacks tensors.*model\.layers\.0\.self_attn\.k_proj\.weight"):
        load_weights_into(LlamaForCausalLM(SMALL), missing.items())
    no_norm = {k: v for k, v in weights.items() if k != "model.norm.weight"}
    with pytest.raises(ValueError, match=r"model\.norm\.weight"):
        load_weights_into(LlamaForCausalLM(SMALL), no_norm.items())
    extra = {
        **weights,
        "model.layers.0.self_attn.rotary_emb.inv_freq": np.ones(2),
        "model.extra.weight": np.ones(3),
    }
    with pytest.raises(ValueError, match=r"'model\.extra\.weight' is not a parameter"):
        load_weights_into(LlamaForCausalLM(SMALL), extra.items())
    bad = {**weights, "model.layers.0.self_attn.v_proj.weight": np.ones((9, 16), np.float32)}
    with pytest.raises(
        ValueError,
        match=r"'model\.layers\.0\.self_attn\.v_proj\.weight' has shape \(9, 16\), expected \(8, 16\)",
    ):
        load_weights_into(LlamaForCausalLM(SMALL), bad.items())
    bad = {**weights, "model.norm.weight": np.ones(17, np.float32)}
    with pytest.raises(ValueError, match=r"'model\.norm\.weight' has shape"):
        load_weights_into(LlamaForCausalLM(SMALL), bad.items())
    ignored = {**weights, "model.layers.0.self_attn.rotary_emb.inv_freq": np.ones(2)}
    load_weights_into(
        LlamaForCausalLM(SMALL), ignored.items()
    )  # recomputed from rope_theta, skipped as upstream does


def test_unsupported_llama_variants_are_refused():
    for extra, match in (
        ({"attention_bias": True}, "attention_bias"),
        ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0}}, "llama3"),
        ({"hidden_act": "gelu"}, "hidden_act"),
        ({"num_key_value_heads": 3}, "multiple"),
    ):
        with pytest.raises(ValueError, match=match):
            LlamaForCausalLM({**SMALL, **extra})


def test_forward_refuses_bad_tokens_and_wrong_cache_count():
    mini = LlamaForCausalLM(SMALL)
    driver = PagedDriver(mini)
    with pytest.raises(ValueError, match="token ids"):
        driver.step({0: [32]})
    with pytest.raises(ValueError, match="KV cache tensors"):
        mini.forward(np.array([1]), np.array([0]), [], None)


# ------------------------------------------------------------------ the toy behind the contract
def test_toy_gives_toy_models_exact_logits_and_needs_no_kv():
    toy = ToyForCausalLM({"vocab_size": 257, "seed": 3})
    tokens, positions = np.array([5, 104, 256, 0]), np.array([0, 63, 64, 1000])
    got = toy.compute_logits(toy.forward(tokens, positions, [], None))
    np.testing.assert_array_equal(got, ToyModel(257, seed=3).forward(tokens, positions))
    spec = toy.get_kv_cache_spec()
    assert spec.num_layers == 0 and ModelRegistry.inspect_model_cls("ToyForCausalLM").is_attention_free
    assert toy.load_weights([]) == set()
    with pytest.raises(ValueError, match="no parameters"):
        toy.load_weights([("w", np.ones(1))])
    with pytest.raises(ValueError, match=r"\[N, 2\]"):
        toy.compute_logits(np.ones((2, 3)))


# ------------------------------------------------------------------ registry
def test_registry_resolves_the_first_registered_architecture():
    assert set(ModelRegistry.get_supported_archs()) >= {"LlamaForCausalLM", "ToyForCausalLM"}
    cls, arch = ModelRegistry.resolve_model_cls(["NotAModel", "LlamaForCausalLM"])
    assert cls is LlamaForCausalLM and arch == "LlamaForCausalLM"
    info = ModelRegistry.inspect_model_cls(["LlamaForCausalLM"])
    assert info.is_text_generation_model and not info.is_attention_free and not info.is_pooling_model


def test_of_two_registered_architectures_the_first_listed_wins():
    for archs in (["ToyForCausalLM", "LlamaForCausalLM"], ["LlamaForCausalLM", "ToyForCausalLM"]):
        cls, arch = ModelRegistry.resolve_model_cls(archs)
        assert arch == archs[0] and cls.__name__ == archs[0], (
            f"architectures {archs} resolved to {arch}: the first registered one in the checkpoint's order wins"
        )
        assert ModelRegistry.inspect_model_cls(archs).architecture == archs[0]


def test_unknown_architecture_lists_the_registered_ones():
    with pytest.raises(ValueError, match=r"\['GPT2LMHeadModel'\].*LlamaForCausalLM, .*ToyForCausalLM"):
        ModelRegistry.resolve_model_cls(["GPT2LMHeadModel"])
    with pytest.raises(ValueError, match="non-empty list"):
        ModelRegistry.resolve_model_cls([])


def test_register_model_class_or_lazy_string_and_flags_from_mixins():
    registry = _ModelRegistry({})

    class Mine(SupportsLoRA, SupportsPP, ToyForCausalLM):
        pass

    registry.register_model("MineForCausalLM", Mine)
    registry.register_model("LazyToy", "mini_vllm.models.toy:ToyForCausalLM")
    registry.register_model("Broken", "mini_vllm.models.toy:NoSuchClass")
    info = registry.inspect_model_cls("MineForCausalLM")
    assert (info.supports_lora, info.supports_pp, info.is_attention_free) == (True, True, True)
    assert registry.resolve_model_cls("LazyToy") == (ToyForCausalLM, "LazyToy")
    with pytest.raises(ValueError, match="NoSuchClass"):
        registry.resolve_model_cls("Broken")
    with pytest.raises(ValueError, match="module:Class"):
        registry.register_model("X", "no_colon")
    with pytest.raises(TypeError):
        registry.register_model("X", 42)
    with pytest.warns(UserWarning, match="already registered"):
        registry.register_model("LazyToy", Mine)
    got = registry.resolve_model_cls("LazyToy")
    assert got == (Mine, "LazyToy"), (
        f"re-registering 'LazyToy' warns and then overwrites (upstream's rule): it still resolves to {got[0].__name__}"
    )
    assert issubclass(Mine, IsAttentionFree)


def test_importing_the_registry_imports_no_model():
    code = "import sys, mini_vllm.models; print(any(m.startswith('mini_vllm.models.llama') for m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False", "the registry must import a model's module only when it is resolved"


# ------------------------------------------------------------------ loader and ModelConfig
def test_get_model_builds_the_architecture_config_json_names(tmp_path):
    (tmp_path / "config.json").write_text(
        json.dumps({"architectures": ["ToyForCausalLM"], "vocab_size": 50, "seed": 2})
    )
    model = get_model(ModelConfig(tmp_path))
    assert isinstance(model, ToyForCausalLM) and model.vocab_size == 50
    (tmp_path / "config.json").write_text(json.dumps({**SMALL, "architectures": ["LlamaForCausalLM"]}))
    with pytest.raises(ValueError, match="no \\*.safetensors"):
        get_model(ModelConfig(tmp_path))
    (tmp_path / "config.json").write_text(json.dumps({**SMALL, "architectures": ["Nope"]}))
    with pytest.raises(ValueError, match="registered: LlamaForCausalLM"):
        get_model(ModelConfig(tmp_path))


def test_safetensors_reader_widens_bf16_and_fp16_to_float32(tmp_path):
    torch = pytest.importorskip("torch")
    st = pytest.importorskip("safetensors.torch")
    values = torch.tensor([[1.0, -2.5, 3.140625], [1e-3, 0.0, 65504.0]])
    st.save_file(
        {"a": values.to(torch.bfloat16), "b": values.to(torch.float16), "c": values},
        str(tmp_path / "w.safetensors"),
    )
    got = dict(read_safetensors(tmp_path / "w.safetensors"))
    for name, dtype in (("a", torch.bfloat16), ("b", torch.float16), ("c", torch.float32)):
        assert got[name].dtype == np.float32, f"{name}: {got[name].dtype}"
        np.testing.assert_array_equal(
            got[name], values.to(dtype).float().numpy(), err_msg=f"tensor {name} ({dtype})"
        )


def test_model_config_reads_config_json_and_caps_max_model_len(tmp_path):
    (tmp_path / "config.json").write_text(
        json.dumps(
            {
                "architectures": ["LlamaForCausalLM"],
                "vocab_size": 512,
                "eos_token_id": [1, 7],
                "max_position_embeddings": 2048,
            }
        )
    )
    mc = ModelConfig(tmp_path)
    assert mc.max_model_len == 2048 and mc.eos_token_ids == (1, 7) and mc.eos_token_id == 1
    assert (
        mc.architectures == ["LlamaForCausalLM"]
        and mc.vocab_size == 512
        and mc.hf_config["vocab_size"] == 512
    )
    assert ModelConfig(tmp_path, max_model_len=100).max_model_len == 100
    with pytest.raises(ValueError, match="greater than the model's max_position_embeddings 2048"):
        ModelConfig(tmp_path, max_model_len=2049)
    with pytest.raises(ValueError, match="dtype"):
        ModelConfig(tmp_path, dtype="bfloat16")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        ModelConfig(tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="no config.json"):
        ModelConfig(tmp_path / "empty")
    with pytest.raises(ValueError, match="architectures"):
        ModelConfig(hf_config={"vocab_size": 10})
    with pytest.raises(ValueError, match="eos_token_id"):
        ModelConfig(hf_config={"architectures": ["ToyForCausalLM"], "vocab_size": 10, "eos_token_id": 10})
    toy = ModelConfig(hf_config={"architectures": ["ToyForCausalLM"], "vocab_size": 257})
    assert toy.max_model_len is None and toy.eos_token_id is None
