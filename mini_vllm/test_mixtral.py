"""mini_vllm.models.mixtral: the router, the fused experts, the expert weight mapping, and the whole
model against Hugging Face's ``MixtralForCausalLM`` (logits and greedy tokens on the paged cache).

The Hugging Face model is a tiny random Mixtral (4 experts, 2 per token, 2 layers) initialised
with std 0.2 so the router's choices and weights are far from uniform; it is saved with
``save_pretrained`` (the ``block_sparse_moe.experts.{e}.w1/w2/w3`` checkpoint layout real Mixtral
checkpoints use) and loaded into mini through ``ModelConfig`` + ``get_model``.
"""

import re

import numpy as np
import pytest

from mini_vllm.config import ModelConfig
from mini_vllm.models import ModelRegistry, get_model
from mini_vllm.models.loader import load_weights_into
from mini_vllm.models.mixtral import MixtralForCausalLM, fused_experts, fused_topk, make_expert_params_mapping
from mini_vllm.testing.paged import PagedDriver, generate_greedy, hf_greedy

CONFIG = dict(
    vocab_size=64, hidden_size=16, intermediate_size=24, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, head_dim=4, num_local_experts=4, num_experts_per_tok=2,
    max_position_embeddings=256, rms_norm_eps=1e-5, initializer_range=0.2,
)  # fmt: skip


def mixtral_checkpoint(config, seed=0):
    """Every tensor of a Hugging Face Mixtral checkpoint, seeded random (numpy only)."""
    rng = np.random.default_rng(seed)
    h, i, e, v = (config[k] for k in ("hidden_size", "intermediate_size", "num_local_experts", "vocab_size"))
    d = config["head_dim"]
    q, kv = config["num_attention_heads"] * d, config["num_key_value_heads"] * d
    shapes = {"model.embed_tokens.weight": (v, h), "model.norm.weight": (h,), "lm_head.weight": (v, h)}
    for n in range(config["num_hidden_layers"]):
        p = f"model.layers.{n}"
        shapes |= {
            f"{p}.input_layernorm.weight": (h,),
            f"{p}.post_attention_layernorm.weight": (h,),
            f"{p}.self_attn.q_proj.weight": (q, h),
            f"{p}.self_attn.k_proj.weight": (kv, h),
            f"{p}.self_attn.v_proj.weight": (kv, h),
            f"{p}.self_attn.o_proj.weight": (h, q),
            f"{p}.block_sparse_moe.gate.weight": (e, h),
        }
        for x in range(e):
            shapes |= {
                f"{p}.block_sparse_moe.experts.{x}.w1.weight": (i, h),
                f"{p}.block_sparse_moe.experts.{x}.w2.weight": (h, i),
                f"{p}.block_sparse_moe.experts.{x}.w3.weight": (i, h),
            }
    return {name: rng.standard_normal(shape).astype(np.float32) for name, shape in shapes.items()}


# ------------------------------------------------------------------ the router and the experts
def test_fused_topk_softmaxes_all_experts_then_renormalises_the_top_k():
    logits = np.array([[2.0, 0.0, 1.0, -1.0], [0.0, 3.0, 3.5, 0.5]], dtype=np.float32)
    weights, ids = fused_topk(logits, 2, renormalize=True)
    assert ids.tolist() == [[0, 2], [2, 1]], f"top-2 experts, largest first: got {ids.tolist()}"
    # renormalised softmax of the top k = softmax over the top-k logits: e^2/(e^2+e^1), e^3.5/(e^3.5+e^3)
    want = np.array(
        [[1 / (1 + np.exp(-1.0)), 1 / (1 + np.exp(1.0))], [1 / (1 + np.exp(-0.5)), 1 / (1 + np.exp(0.5))]]
    )
    np.testing.assert_allclose(
        weights, want, rtol=1e-6, err_msg="top-k weights must be renormalised to sum to 1"
    )
    raw, _ = fused_topk(logits, 2, renormalize=False)
    full = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
    np.testing.assert_allclose(
        raw, np.take_along_axis(full, ids, -1), rtol=1e-6, err_msg="softmax over all experts"
    )
    np.testing.assert_allclose(fused_topk(logits, 4, True)[0].sum(-1), [1.0, 1.0], rtol=1e-6)
    one, one_ids = fused_topk(logits, 1, True)
    assert one.tolist() == [[1.0], [1.0]] and one_ids.tolist() == [[0], [2]], "top-1 renormalised weight is 1"
    # so "softmax after top-k" (over the kept logits) is the same router, not a different one
    many = np.random.default_rng(0).standard_normal((50, 8)).astype(np.float32)
    w, top = fused_topk(many, 3, renormalize=True)
    kept = np.exp(np.take_along_axis(many, top, -1))
    np.testing.assert_allclose(w, kept / kept.sum(-1, keepdims=True), rtol=1e-5)
    tied, tied_ids = fused_topk(np.array([[0.5, 2.0, 2.0, 2.0]], np.float32), 2, renormalize=True)
    assert tied_ids.tolist() == [[1, 2]] and np.allclose(tied, 0.5), "ties go to the lower expert id"
    for bad in (0, 5):
        with pytest.raises(ValueError, match="topk"):
            fused_topk(logits, bad, True)


def test_fused_experts_is_the_weighted_sum_of_each_chosen_expert():
    rng = np.random.default_rng(0)
    t, h, i, e = 5, 6, 4, 3
    x = rng.standard_normal((t, h)).astype(np.float32)
    w13 = rng.standard_normal((e, 2 * i, h)).astype(np.float32)
    w2 = rng.standard_normal((e, h, i)).astype(np.float32)
    weights, ids = fused_topk(rng.standard_normal((t, e)).astype(np.float32), 2, renormalize=True)
    want = np.zeros((t, h), np.float32)
    for tok in range(t):
        for k in range(2):
            gate, up = w13[ids[tok, k], :i] @ x[tok], w13[ids[tok, k], i:] @ x[tok]
            want[tok] += weights[tok, k] * (w2[ids[tok, k]] @ (gate / (1 + np.exp(-gate)) * up))
    np.testing.assert_allclose(fused_experts(x, w13, w2, weights, ids), want, rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------------ weight mapping
def test_expert_mapping_lands_w1_w3_in_the_halves_of_w13_and_w2_whole():
    mini = MixtralForCausalLM(CONFIG)
    checkpoint = mixtral_checkpoint(CONFIG)
    load_weights_into(mini, checkpoint.items())
    for n in range(2):
        p = f"model.layers.{n}.block_sparse_moe"
        w13, w2 = mini.params[f"{p}.experts.w13_weight"], mini.params[f"{p}.experts.w2_weight"]
        assert w13.shape == (4, 48, 16) and w2.shape == (4, 16, 24), f"{w13.shape}, {w2.shape}"
        for e in range(4):
            for rows, shard in ((slice(0, 24), "w1"), (slice(24, 48), "w3")):
                assert (w13[e, rows] == checkpoint[f"{p}.experts.{e}.{shard}.weight"]).all(), (
                    f"layer {n} expert {e}: w13 rows {rows.start}:{rows.stop} must hold {shard} "
                    "(w1 = gate first, w3 = up second)"
                )
            assert (w2[e] == checkpoint[f"{p}.experts.{e}.w2.weight"]).all(), (
                f"layer {n}: w2[{e}] is expert {e}'s w2"
            )
    rows = make_expert_params_mapping(2)
    assert rows[:3] == [
        ("experts.w13_", "experts.0.w1.", 0, "w1"),
        ("experts.w2_", "experts.0.w2.", 0, "w2"),
        ("experts.w13_", "experts.0.w3.", 0, "w3"),
    ], rows[:3]


def test_missing_and_misshaped_expert_tensors_are_named():
    checkpoint = mixtral_checkpoint(CONFIG)
    gone = "model.layers.1.block_sparse_moe.experts.3.w3.weight"
    with pytest.raises(ValueError, match="lacks tensors.*" + re.escape(gone)):
        load_weights_into(MixtralForCausalLM(CONFIG), ((k, v) for k, v in checkpoint.items() if k != gone))
    bad = {**checkpoint, "model.layers.0.block_sparse_moe.experts.2.w2.weight": np.ones((24, 16), np.float32)}
    with pytest.raises(
        ValueError, match=r"experts\.2\.w2\.weight' has shape \(24, 16\), expected \(16, 24\)"
    ):
        load_weights_into(MixtralForCausalLM(CONFIG), bad.items())
    extra = {
        **checkpoint,
        "model.layers.0.block_sparse_moe.experts.4.w1.weight": np.ones((24, 16), np.float32),
    }
    with pytest.raises(ValueError, match=r"experts\.4\.w1\.weight"):
        load_weights_into(MixtralForCausalLM(CONFIG), extra.items())


def test_unsupported_mixtral_configs_are_refused():
    for extra, match in (
        ({"num_experts_per_tok": 5}, "num_experts_per_tok"),
        ({"num_experts_per_tok": 0}, "num_experts_per_tok"),
        ({"sliding_window": 4096}, "sliding_window"),
    ):
        with pytest.raises(ValueError, match=match):
            MixtralForCausalLM({**CONFIG, **extra})


def test_registry_resolves_mixtral():
    cls, arch = ModelRegistry.resolve_model_cls(["MixtralForCausalLM"])
    assert cls is MixtralForCausalLM and arch == "MixtralForCausalLM"
    info = ModelRegistry.inspect_model_cls("MixtralForCausalLM")
    assert info.is_text_generation_model and not info.is_pooling_model and not info.is_attention_free


# ------------------------------------------------------------------ against Hugging Face
@pytest.fixture(scope="module")
def tiny_mixtral(tmp_path_factory):
    """(mini's Mixtral, HF's MixtralForCausalLM, torch), from one saved checkpoint."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    hf = transformers.MixtralForCausalLM(transformers.MixtralConfig(**CONFIG)).eval()
    path = tmp_path_factory.mktemp("tiny-mixtral")
    hf.save_pretrained(path)
    return get_model(ModelConfig(path)), hf, torch


def prompts(n, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 64, size=length).tolist() for length in [1, 5, 17, 40][:n]]


def test_mixtral_logits_equal_hugging_face_within_1e_4(tiny_mixtral):
    mini, hf, torch = tiny_mixtral
    assert isinstance(mini, MixtralForCausalLM)
    batch = prompts(4)
    got = PagedDriver(mini, block_size=16).step(dict(enumerate(batch)), all_logits=True)
    for i, prompt in enumerate(batch):
        with torch.no_grad():
            want = hf(torch.tensor([prompt])).logits[0].numpy()
        err = float(np.abs(got[i] - want).max())
        assert err < 1e-4, f"prompt {i} ({len(prompt)} tokens): logits differ from HF by {err:.2e} (> 1e-4)"


def test_mixtral_greedy_tokens_equal_hugging_face_through_the_paged_driver(tiny_mixtral):
    mini, hf, _ = tiny_mixtral
    batch = prompts(4, seed=1)
    steps = []
    got = generate_greedy(mini, batch, 12, chunk_size=8, stagger=2, steps=steps, block_size=16)
    mixed = [s for s in steps if max(s.values()) > 1 and min(s.values()) == 1]
    assert len(mixed) >= 3, (
        f"only {len(mixed)} steps mixed prefill chunks with decodes: the test lost its point"
    )
    for i, prompt in enumerate(batch):
        want = hf_greedy(hf, prompt, 12)
        first = next((t for t, (a, b) in enumerate(zip(got[i], want)) if a != b), None)
        assert got[i] == want, (
            f"prompt {i} ({len(prompt)} tokens): greedy tokens diverge from HF at output {first}"
        )
