"""Lab 14-02 spec: the checkpoint-name table, the GQA slices, the fused copy, and vLLM's own loader."""

import numpy as np
import pytest

from course.runtime import lab_module

lab = lab_module(__file__)  # solution.py by default; LAB_IMPL=starter grades starter.py

STACKED = [
    ("q_proj", "qkv_proj", "q"),
    ("k_proj", "qkv_proj", "k"),
    ("v_proj", "qkv_proj", "v"),
    ("gate_proj", "gate_up_proj", 0),
    ("up_proj", "gate_up_proj", 1),
]

# (num_heads, num_kv_heads, head_dim): GQA 4:1 with q = 128 rows, Llama-3-8B, MHA, MQA, odd head counts
CONFIGS = [(8, 2, 16), (32, 8, 128), (4, 4, 64), (8, 1, 32), (6, 3, 8)]


def _rng(seed=0):
    return np.random.default_rng(seed)


def _fused_qkv(nh, nkv, hd, hidden, seed=0):
    rng = _rng(seed)
    w = {s: rng.standard_normal((n * hd, hidden)) for s, n in (("q", nh), ("k", nkv), ("v", nkv))}
    fused = np.zeros(((nh + 2 * nkv) * hd, hidden))
    for s in ("q", "k", "v"):
        lab.load_stacked(fused, w[s], s, nh, nkv, hd)
    return fused, w


# --------------------------------------------------------------------------- names
@pytest.mark.parametrize(
    "prefix", ["model.layers.3", "model.layers.0", "model.layers.31", "language_model.model.layers.7"]
)
@pytest.mark.parametrize("hf,fused,shard", STACKED, ids=[s[0] for s in STACKED])
def test_name_mapping(prefix, hf, fused, shard):
    block = "self_attn" if fused == "qkv_proj" else "mlp"
    for leaf in ("weight", "bias"):
        name = f"{prefix}.{block}.{hf}.{leaf}"
        got = lab.map_weight_name(name)
        want = (f"{prefix}.{block}.{fused}.{leaf}", shard)
        assert got == want, (
            f"{name} must become {want}: rewrite only the {hf!r} segment to {fused!r} and keep the prefix "
            f"{prefix!r} (layer index included) and the leaf {leaf!r}; got {got}"
        )


@pytest.mark.parametrize(
    "name",
    [
        "model.embed_tokens.weight",
        "model.norm.weight",
        "lm_head.weight",
        "model.layers.3.input_layernorm.weight",
        "model.layers.3.post_attention_layernorm.weight",
        "model.layers.3.self_attn.o_proj.weight",
        "model.layers.3.mlp.down_proj.weight",
        "model.layers.3.mlp.gate_up_proj.weight",  # an already-fused checkpoint (Phi-3 style): up_proj is inside it
        "model.layers.3.self_attn.qkv_proj.weight",
        "model.layers.3.self_attn.rotary_emb.inv_freq",
    ],
)
def test_unstacked_names_pass_through(name):
    got = lab.map_weight_name(name)
    assert got == (name, None), (
        f"{name} is not one of the five stacked tensors, so it maps to itself with shard None; got {got}. "
        f"Match whole dotted segments: 'up_proj' is a substring of 'gate_up_proj' but not a segment of it"
    )


# --------------------------------------------------------------------------- slices
@pytest.mark.parametrize("nh,nkv,hd", CONFIGS)
def test_qkv_slices_account_for_gqa(nh, nkv, hd):
    s = lab.qkv_slices(nh, nkv, hd)
    assert set(s) == {"q", "k", "v"}, f"qkv_slices returns a dict with keys 'q', 'k', 'v', got {sorted(s)}"
    sizes = {k: s[k].stop - s[k].start for k in s}
    assert sizes == {"q": nh * hd, "k": nkv * hd, "v": nkv * hd}, (
        f"({nh} heads, {nkv} kv heads, head_dim {hd}): q has num_heads·head_dim = {nh * hd} rows, k and v "
        f"num_kv_heads·head_dim = {nkv * hd} each (GQA makes them narrower); got {sizes}"
    )
    assert s["q"].start == 0 and s["q"].stop == s["k"].start and s["k"].stop == s["v"].start, (
        f"the slices tile the fused rows in the order q, k, v with no gap or overlap; got {s}"
    )
    assert s["v"].stop == (nh + 2 * nkv) * hd, (
        f"v ends at the last fused row, (nh + 2·nkv)·hd = {(nh + 2 * nkv) * hd}"
    )
    if (nh, nkv, hd) == (8, 2, 16):
        assert (s["q"].stop, s["k"].stop, s["v"].stop) == (128, 160, 192)


@pytest.mark.parametrize("bad", [(8, 3, 16), (0, 1, 16), (8, 0, 16), (8, 2, 0), (8, 2, -16), (True, 1, 16)])
def test_qkv_slices_reject_impossible_configs(bad):
    with pytest.raises(ValueError):
        lab.qkv_slices(*bad)


# --------------------------------------------------------------------------- the copy
@pytest.mark.parametrize("nh,nkv,hd", CONFIGS[:3] + CONFIGS[4:])
def test_fused_matmul_equals_separate_projections(nh, nkv, hd):
    hidden = 24
    fused, w = _fused_qkv(nh, nkv, hd, hidden, seed=nh + nkv)
    x = _rng(1).standard_normal((7, 2 * hidden))[:, ::2]  # a strided activation, as a view
    y = x @ fused.T
    s = lab.qkv_slices(nh, nkv, hd)
    for shard in ("q", "k", "v"):
        err = np.abs(y[:, s[shard]] - x @ w[shard].T).max()
        assert err <= 1e-12, (
            f"({nh}, {nkv}, {hd}): columns {s[shard].start}:{s[shard].stop} of x @ fused.T must equal x @ W{shard}.T "
            f"(block-matrix algebra); error {err:.1e}. Check that load_stacked wrote {shard} into its own slice"
        )
    inter = 10
    gate, up = _rng(2).standard_normal((inter, hidden)), _rng(3).standard_normal((inter, hidden))
    gu = np.zeros((2 * inter, hidden))
    lab.load_stacked(gu, gate, 0, nh, nkv, hd)
    lab.load_stacked(gu, up, 1, nh, nkv, hd)
    z = x @ gu.T
    assert (
        np.abs(z[:, :inter] - x @ gate.T).max() <= 1e-12 and np.abs(z[:, inter:] - x @ up.T).max() <= 1e-12
    ), "gate_up_proj: shard 0 (gate_proj) fills the first half of the rows, shard 1 (up_proj) the second"


def _refused(fused, shard, shard_id, cfg, exc=ValueError):
    before = fused.copy()
    with pytest.raises(exc) as info:
        lab.load_stacked(fused, shard, shard_id, *cfg)
    assert np.array_equal(fused, before), (
        f"a refused load_stacked ({shard_id!r}, shard {shard.shape}) changed the fused weight"
    )
    return str(info.value)


def test_shape_mismatch_is_loud():
    nh, nkv, hd, hidden = 8, 2, 16, 12
    fused, _ = _fused_qkv(nh, nkv, hd, hidden)
    mha_k = _rng(4).standard_normal((nh * hd, hidden))  # a k_proj from an MHA checkpoint
    msg = _refused(fused, mha_k, "k", (nh, nkv, hd))
    assert str(mha_k.shape) in msg and str((nkv * hd, hidden)) in msg, (
        f"the error must name the shard's shape {mha_k.shape} and its slot's shape {(nkv * hd, hidden)}; got: {msg}"
    )
    one_row = _rng(5).standard_normal((1, hidden))  # numpy would broadcast it over the whole slot
    _refused(fused, one_row, "v", (nh, nkv, hd))
    _refused(fused, _rng(6).standard_normal((nkv * hd, hidden + 1)), "k", (nh, nkv, hd))
    # a fused buffer sized for MHA, loaded with a GQA config: q fits, but the buffer is wrong
    mha_fused = np.zeros((3 * nh * hd, hidden))
    msg = _refused(mha_fused, _rng(7).standard_normal((nh * hd, hidden)), "q", (nh, nkv, hd))
    assert str(mha_fused.shape) in msg, f"name the fused weight's shape {mha_fused.shape}; got: {msg}"
    # gate_up: a gate_proj of the wrong intermediate size must not land anywhere
    gu = np.zeros((20, hidden))
    _refused(gu, _rng(8).standard_normal((5, hidden)), 0, (nh, nkv, hd))
    _refused(gu, _rng(8).standard_normal((5, hidden)), 1, (nh, nkv, hd))
    _refused(np.zeros((21, hidden)), _rng(9).standard_normal((10, hidden)), 1, (nh, nkv, hd))
    for bad_id in ("o", 2, True, None):
        _refused(fused, _rng(10).standard_normal((nkv * hd, hidden)), bad_id, (nh, nkv, hd), exc=KeyError)


def test_missing_table_row_is_a_keyerror_naming_the_tensor():
    params = {"model.layers.0.mlp.gate_up_proj.weight": np.zeros((8, 4))}
    ckpt = [("model.layers.0.block_sparse_moe.experts.0.w1.weight", np.ones((4, 4)))]
    with pytest.raises(KeyError, match="block_sparse_moe.experts.0.w1"):
        lab.load_checkpoint(params, ckpt, 2, 1, 2)


# --------------------------------------------------------------------------- against vLLM's own loader
@pytest.mark.upstream
@pytest.mark.parametrize("nh,nkv,hd", [(4, 2, 64), (8, 2, 32), (4, 4, 64), (4, 1, 64)])
def test_mapping_equals_real_llama_load_weights(nh, nkv, hd):
    real_llama = pytest.importorskip("course.runtime.real_llama")
    got = real_llama.loaded(seed=nh * 10 + nkv, num_attention_heads=nh, num_key_value_heads=nkv, head_dim=hd)
    theirs = {k: v.detach().numpy() for k, v in got.vllm_model.named_parameters()}
    ours = {k: np.zeros_like(v) for k, v in theirs.items()}
    written = lab.load_checkpoint(ours, ((k, v.numpy()) for k, v in got.state_dict.items()), nh, nkv, hd)
    assert written == got.loaded_names == set(theirs), (
        f"every vLLM parameter is written exactly by name: yours {sorted(written ^ set(theirs))[:4]} differ"
    )
    for name, want in theirs.items():
        bad = (
            np.flatnonzero(np.any(ours[name] != want, axis=tuple(range(1, want.ndim))))
            if want.ndim > 1
            else (np.flatnonzero(ours[name] != want))
        )
        assert bad.size == 0, (
            f"({nh} heads, {nkv} kv heads, head_dim {hd}) {name}: rows {bad[:3].tolist()}... differ from what "
            f"vLLM's LlamaForCausalLM.load_weights wrote (its QKVParallelLinear puts q, then k, then v)"
        )


# --------------------------------------------------------------------------- against mini_vllm's loader
@pytest.mark.parametrize("nh,nkv,hd,tie", [(8, 2, 4, False), (4, 4, 8, False), (6, 1, 4, True)])
def test_mapping_equals_mini_vllm_llama_load_weights(nh, nkv, hd, tie):
    from mini_vllm.models.llama import LlamaForCausalLM

    hidden, inter = nh * hd, 24
    cfg = dict(architectures=["LlamaForCausalLM"], vocab_size=40, hidden_size=hidden, intermediate_size=inter,
               num_hidden_layers=2, num_attention_heads=nh, num_key_value_heads=nkv, head_dim=hd,
               tie_word_embeddings=tie)  # fmt: skip
    mini = LlamaForCausalLM(cfg)
    rng = _rng(nh * 7 + nkv)
    ckpt = [(name, rng.standard_normal(shape).astype(np.float32)) for name, shape in _hf_shapes(cfg)]
    mini.load_weights(iter(ckpt))
    theirs = dict(mini.named_parameters())
    ours = {k: np.zeros_like(v) for k, v in theirs.items()}
    lab.load_checkpoint(ours, ((n, t) for n, t in ckpt if not (tie and n == "lm_head.weight")), nh, nkv, hd)
    for name, want in theirs.items():
        assert np.array_equal(ours[name], want), (
            f"({nh}, {nkv}, {hd}) {name}: your mapping and mini_vllm's LlamaForCausalLM.load_weights disagree"
        )


def _hf_shapes(cfg):
    h, i, v = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    q, kv = cfg["num_attention_heads"] * cfg["head_dim"], cfg["num_key_value_heads"] * cfg["head_dim"]
    yield "model.embed_tokens.weight", (v, h)
    for n in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{n}."
        yield from [(p + "self_attn.q_proj.weight", (q, h)), (p + "self_attn.k_proj.weight", (kv, h)),
                    (p + "self_attn.v_proj.weight", (kv, h)), (p + "self_attn.o_proj.weight", (h, q)),
                    (p + "mlp.gate_proj.weight", (i, h)), (p + "mlp.up_proj.weight", (i, h)),
                    (p + "mlp.down_proj.weight", (h, i)), (p + "input_layernorm.weight", (h,)),
                    (p + "post_attention_layernorm.weight", (h,))]  # fmt: skip
    yield "model.norm.weight", (h,)
    yield "lm_head.weight", (v, h)
