"""Lab 14-03 spec: the checkpoint's names, the predicted rows, the traced rows of a real vLLM load."""

import numpy as np
import pytest

from course.runtime import lab_module, use_lab

lab = lab_module(__file__)  # solution.py by default; LAB_IMPL=starter grades starter.py
mapping = use_lab("phase-14/lab-02-weight-mapping")

L8B = dict(hidden_size=4096, num_attention_heads=32, num_key_value_heads=8, head_dim=128,
           intermediate_size=14336, num_hidden_layers=32, vocab_size=128256, tie_word_embeddings=False)  # fmt: skip
TINY = dict(hidden_size=256, num_attention_heads=4, num_key_value_heads=2, head_dim=64,
            intermediate_size=512, num_hidden_layers=2, vocab_size=512, tie_word_embeddings=False)  # fmt: skip


# --------------------------------------------------------------------------- the checkpoint
def test_checkpoint_names_of_llama_3_8b():
    names = lab.checkpoint_names(L8B)
    assert len(names) == 291, (
        f"Llama-3-8B has 32 layers x 9 tensors + embed, norm, lm_head = 291; got {len(names)}"
    )
    assert len(set(names)) == 291, "every name once"
    assert names[0] == "model.embed_tokens.weight" and names[-1] == "lm_head.weight"
    layer0 = [n for n in names if n.startswith("model.layers.0.")]
    assert len(layer0) == 9 and "model.layers.0.mlp.up_proj.weight" in layer0
    tied = lab.checkpoint_names(dict(L8B, tie_word_embeddings=True))
    assert len(tied) == 290 and "lm_head.weight" not in tied, (
        "a tied model (tie_word_embeddings) stores no lm_head: the output layer reuses the embedding"
    )


def test_checkpoint_names_equal_hugging_faces():
    transformers = pytest.importorskip("transformers")
    for tie in (False, True):
        cfg = dict(TINY, tie_word_embeddings=tie)
        hf = transformers.LlamaForCausalLM(transformers.LlamaConfig(**cfg))
        want = [n for n in hf.state_dict() if not (tie and n == "lm_head.weight")]
        assert lab.checkpoint_names(cfg) == want, (
            f"tie={tie}: Hugging Face saves {want[:3]}..., in that order"
        )


# --------------------------------------------------------------------------- predictions
def test_predicted_rows_for_llama_3_8b():
    rows = {r.checkpoint: r for r in lab.predict_rows(L8B)}
    assert len(rows) == 291
    want = {
        "model.layers.0.self_attn.q_proj.weight": ("model.layers.0.self_attn.qkv_proj.weight", "q", 0, 4096),
        "model.layers.0.self_attn.k_proj.weight": (
            "model.layers.0.self_attn.qkv_proj.weight",
            "k",
            4096,
            5120,
        ),
        "model.layers.0.self_attn.v_proj.weight": (
            "model.layers.0.self_attn.qkv_proj.weight",
            "v",
            5120,
            6144,
        ),
        "model.layers.0.mlp.gate_proj.weight": ("model.layers.0.mlp.gate_up_proj.weight", 0, 0, 14336),
        "model.layers.0.mlp.up_proj.weight": ("model.layers.0.mlp.gate_up_proj.weight", 1, 14336, 28672),
        "model.layers.0.input_layernorm.weight": ("model.layers.0.input_layernorm.weight", None, 0, 4096),
        "model.layers.31.mlp.down_proj.weight": ("model.layers.31.mlp.down_proj.weight", None, 0, 4096),
        "lm_head.weight": ("lm_head.weight", None, 0, 128256),
    }
    for name, (param, shard, start, stop) in want.items():
        got = rows[name]
        assert (got.param, got.shard, got.start, got.stop) == (param, shard, start, stop), (
            f"{name}: want {param} shard {shard!r} rows {start}:{stop}, got {tuple(got)[1:]}"
        )


@pytest.mark.parametrize("tp,qkv,gate_up,vocab", [(1, 6144, 28672, 128256), (2, 3072, 14336, 64128),
                                                 (8, 768, 3584, 16032), (16, 512, 1792, 8016)])  # fmt: skip
def test_rows_per_tensor_parallel_rank(tp, qkv, gate_up, vocab):
    rows = [r for r in lab.predict_rows(L8B, tp_size=tp, tp_rank=tp - 1) if ".layers.5." in r.checkpoint]
    stops = {}
    for r in rows:
        key = r.param.split(".")[-2]
        stops[key] = max(stops.get(key, 0), r.stop)
    assert stops["qkv_proj"] == qkv, (
        f"tp {tp}: each rank holds 32/{tp} q heads and max(1, 8/{tp}) kv heads of 128 rows: qkv has {qkv} rows per "
        f"rank (kv heads are replicated when there are fewer than ranks); got {stops['qkv_proj']}"
    )
    assert stops["gate_up_proj"] == gate_up, (
        f"tp {tp}: gate_up holds 2 x 14336/{tp} = {gate_up} rows per rank"
    )
    assert stops["o_proj"] == stops["down_proj"] == 4096, (
        "row-parallel layers split columns: all 4096 rows stay"
    )
    emb = {r.checkpoint: r.stop for r in lab.predict_rows(L8B, tp_size=tp) if "layers" not in r.checkpoint}
    assert emb["model.embed_tokens.weight"] == emb["lm_head.weight"] == vocab, (
        f"tp {tp}: the vocab splits by rank"
    )


def test_impossible_tensor_parallel_sizes_are_refused():
    for tp, rank in ((3, 0), (64, 0), (2, 2), (2, -1)):
        with pytest.raises(ValueError):
            lab.predict_rows(L8B, tp_size=tp, tp_rank=rank)


# --------------------------------------------------------------------------- the trace
def _loaded_params(cfg, order=("q", "k", "v"), seed=0):
    rng = np.random.default_rng(seed)
    ckpt = {}
    for n in lab.checkpoint_names(cfg):
        shape = {
            "q_proj": (8, 6),
            "k_proj": (4, 6),
            "v_proj": (4, 6),
            "gate_proj": (5, 6),
            "up_proj": (5, 6),
        }.get(
            n.split(".")[-2], (6, 6) if n.endswith("proj.weight") or "embed" in n or "lm_head" in n else (6,)
        )
        ckpt[n] = rng.standard_normal(shape)
    params = {}
    for n, t in ckpt.items():
        p, shard = mapping.map_weight_name(n)
        if shard is None:
            params[p] = t.copy()
        else:
            params.setdefault(p, np.zeros((16 if "qkv" in p else 10, 6)))
    for i in range(cfg["num_hidden_layers"]):
        pre = f"model.layers.{i}."
        qkv, gu = params[pre + "self_attn.qkv_proj.weight"], params[pre + "mlp.gate_up_proj.weight"]
        blocks = {"q": ckpt[pre + "self_attn.q_proj.weight"], "k": ckpt[pre + "self_attn.k_proj.weight"],
                  "v": ckpt[pre + "self_attn.v_proj.weight"]}  # fmt: skip
        qkv[:] = np.concatenate([blocks[s] for s in order])
        gu[:] = np.concatenate([ckpt[pre + "mlp.gate_proj.weight"], ckpt[pre + "mlp.up_proj.weight"]])
    return params, ckpt


SMALL = dict(hidden_size=6, num_attention_heads=4, num_key_value_heads=2, head_dim=2, intermediate_size=5,
             num_hidden_layers=2, vocab_size=6, tie_word_embeddings=False)  # fmt: skip


def test_trace_reads_where_tensors_really_went():
    params, ckpt = _loaded_params(SMALL, order=("q", "v", "k"))  # a loader that swapped k and v
    got = {r.checkpoint: r for r in lab.trace(params, ckpt)}
    assert list(got) == list(ckpt), "one Row per checkpoint tensor, in the checkpoint's order"
    k, v = got["model.layers.1.self_attn.k_proj.weight"], got["model.layers.1.self_attn.v_proj.weight"]
    assert (k.start, k.stop, v.start, v.stop) == (12, 16, 8, 12), (
        f"this loader put v at rows 8:12 and k at 12:16; trace must report what is there, not the prediction: "
        f"got k {k.start}:{k.stop}, v {v.start}:{v.stop}"
    )
    assert got["model.norm.weight"][1:] == ("model.norm.weight", None, 0, 6)


def test_trace_does_not_stop_at_a_matching_first_row():
    params, ckpt = _loaded_params(SMALL)
    name = "model.layers.0.self_attn.v_proj.weight"
    p = params["model.layers.0.self_attn.qkv_proj.weight"]
    ckpt["model.layers.0.self_attn.q_proj.weight"][3] = ckpt[name][0]  # q's row 3 equals v's first row
    p[3] = ckpt[name][0]
    got = {r.checkpoint: r for r in lab.trace(params, ckpt)}[name]
    assert (got.start, got.stop) == (12, 16), (
        f"row 3 of qkv_proj equals v_proj's first row, but v_proj as a block starts at row 12; got {got.start}. "
        f"Check the whole block at each candidate, not just its first row"
    )


def test_trace_reports_a_tensor_that_was_not_loaded():
    params, ckpt = _loaded_params(SMALL)
    params["model.layers.1.mlp.gate_up_proj.weight"][5:] = 0.0  # up_proj never arrived
    with pytest.raises(LookupError, match="model.layers.1.mlp.up_proj.weight"):
        lab.trace(params, ckpt)


# --------------------------------------------------------------------------- reading shapes
def test_model_card_from_shapes():
    card = lab.model_card((6144, 4096), (28672, 4096), 128)
    assert card == dict(
        hidden_size=4096, num_heads=32, num_kv_heads=8, intermediate_size=14336, ffn_ratio=3.5
    ), f"(6144, 4096) = (32 + 2 x 8) x 128 rows: 32 q heads, 8 kv heads; 28672 = 2 x 14336; got {card}"
    assert lab.model_card((12288, 4096), (28672, 4096), 128)["num_kv_heads"] == 32, "(12288, 4096) is MHA"
    assert lab.model_card((4352, 4096), (22016, 4096), 128)["num_kv_heads"] == 1, "(32 + 2) x 128: MQA"
    for bad in (((6144, 4096), (28672, 2048), 128), ((6100, 4096), (28672, 4096), 128),
                ((4096, 4096), (28672, 4096), 128), ((6144, 4096), (28671, 4096), 128)):  # fmt: skip
        with pytest.raises(ValueError):
            lab.model_card(*bad)


def test_stacked_table_coverage():
    c = lab.coverage(L8B)
    layer = 4096 * (4096 + 2 * 1024 + 4096 + 3 * 14336) + 2 * 4096
    stacked = 4096 * (4096 + 2 * 1024 + 2 * 14336)
    total = 32 * layer + 2 * 128256 * 4096 + 4096
    assert (c["tensors"], c["stacked"]) == (291, 160), f"5 of 9 tensors per layer x 32 = 160 of 291; got {c}"
    assert abs(c["by_count"] - 160 / 291) < 1e-12
    assert abs(c["by_bytes"] - 32 * stacked / total) < 1e-12, (
        f"by bytes, over the whole checkpoint (embedding and lm_head included): {32 * stacked / total:.4f}; "
        f"got {c['by_bytes']:.4f}"
    )
    assert abs(c["by_bytes_per_layer"] - stacked / layer) < 1e-12, f"one layer: {stacked / layer:.4f}"


# --------------------------------------------------------------------------- the real load
@pytest.fixture(scope="module")
def real_llama():
    return pytest.importorskip("course.runtime.real_llama")


def _cfg(loaded):
    h = loaded.vllm_config.model_config.hf_config
    return dict(hidden_size=h.hidden_size, num_attention_heads=h.num_attention_heads,
                num_key_value_heads=h.num_key_value_heads, head_dim=h.head_dim,
                intermediate_size=h.intermediate_size, num_hidden_layers=h.num_hidden_layers,
                vocab_size=h.vocab_size, tie_word_embeddings=h.tie_word_embeddings)  # fmt: skip


@pytest.mark.upstream
@pytest.mark.parametrize("nh,nkv,hd", [(4, 2, 64), (8, 2, 32), (4, 1, 64)])
def test_prediction_equals_the_trace_of_a_real_vllm_load(real_llama, nh, nkv, hd):
    got = real_llama.loaded(seed=nh + nkv, num_attention_heads=nh, num_key_value_heads=nkv, head_dim=hd)
    params = {k: v.detach().numpy() for k, v in got.vllm_model.named_parameters()}
    ckpt = {k: v.numpy() for k, v in got.state_dict.items()}
    traced = lab.trace(params, ckpt)
    predicted = lab.predict_rows(_cfg(got))
    assert [r.checkpoint for r in traced] == [r.checkpoint for r in predicted], (
        "the same names in the same order"
    )
    for t, p in zip(traced, predicted):
        assert tuple(t) == tuple(p), (
            f"{t.checkpoint}: vLLM put it at {tuple(t)[1:]}, you predicted {tuple(p)[1:]}"
        )


@pytest.mark.upstream
def test_non_attention_layers_equal_hugging_face(real_llama):
    import torch

    got = real_llama.loaded(seed=3)
    params = {k: v.detach().numpy() for k, v in got.vllm_model.named_parameters()}
    ckpt = {k: v.numpy() for k, v in got.state_dict.items()}
    # undo the fusion with the traced rows: a Hugging Face model rebuilt from vLLM's parameters
    unfused = {
        r.checkpoint: torch.from_numpy(params[r.param][r.start : r.stop].copy())
        for r in lab.trace(params, ckpt)
    }
    hf = type(got.hf_model)(got.hf_model.config).float().eval()
    hf.load_state_dict(unfused)
    vm = got.vllm_model
    x = torch.randn(5, 256, generator=torch.Generator().manual_seed(0))
    ids = torch.tensor([0, 7, 300, 511])
    with torch.no_grad():
        pairs = {
            "embedding": (vm.embed_input_ids(ids), hf.model.embed_tokens(ids)),
            "input_layernorm": (vm.model.layers[1].input_layernorm(x), hf.model.layers[1].input_layernorm(x)),
            "MLP (fused gate_up, SiluAndMul, down)": (vm.model.layers[1].mlp(x), hf.model.layers[1].mlp(x)),
            "final norm": (vm.model.norm(x), hf.model.norm(x)),
            "compute_logits": (vm.compute_logits(x), hf.lm_head(x)),
        }
    for what, (a, b) in pairs.items():
        err = (a - b).abs().max().item()
        assert err == 0.0, f"{what}: vLLM vs Hugging Face rebuilt from your traced rows differ by {err:.1e}"


# --------------------------------------------------------------------------- tier 2: the whole engine
@pytest.mark.engine
def test_real_engine_tp2_shapes_equal_the_prediction():
    """``LLM`` serves the tiny Llama at TP 1 and TP 2 (one CPU worker per rank): both generate the same tokens,
    and every parameter that keeps its loaded shape has, on every rank, the rows ``predict_rows`` gives that
    rank. (The CPU backend repacks linear weights for its GEMM after loading and leaves the parameter empty,
    so those report 0 rows; the embedding, ``lm_head`` and the norms keep theirs.)"""
    import json

    from course.runtime import engine

    hf = json.loads((engine.model_path() / "config.json").read_text())
    cfg = {k: hf.get(k) for k in TINY}
    prompts, runs = [list(range(10, 26)), [7, 8, 9]], {}
    for tp in (1, 2):
        env = engine.engine_env(VLLM_CPU_OMP_THREADS_BIND="0|1" if tp == 2 else "0")
        runs[tp] = engine.run_job(
            "tensor_parallel", env=env, prompts=prompts, max_tokens=4, tensor_parallel_size=tp
        ).result
    assert runs[2]["tokens"] == runs[1]["tokens"], (
        "the same checkpoint, the same greedy tokens at TP 1 and TP 2"
    )
    for tp in (1, 2):
        for rank, shapes in enumerate(runs[tp]["weight_shapes"]):
            want = {}
            for r in lab.predict_rows(cfg, tp_size=tp, tp_rank=rank):
                want[r.param] = max(want.get(r.param, 0), r.stop)
            got = {name: shape[0] for name, shape in shapes.items() if shape and shape[0]}
            assert {"model.embed_tokens.weight", "lm_head.weight", "model.norm.weight"} <= set(got)
            assert set(shapes) == set(want), (
                f"TP {tp} rank {rank}: parameter names {sorted(set(shapes) ^ set(want))}"
            )
            bad = {k: (v, want[k]) for k, v in got.items() if want[k] != v}
            assert not bad, f"TP {tp} rank {rank}: (engine rows, your prediction) differ for {bad}"
