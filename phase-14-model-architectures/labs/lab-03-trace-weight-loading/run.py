"""Lab 14-03 on a GPU box: load a real Llama checkpoint in vLLM 0.22.1 and trace where every tensor went.

The script:

* lists the checkpoint's tensor names straight from its ``*.safetensors`` files (``safe_open``
  reads the headers only) and compares the count with ``checkpoint_names`` (Llama-3-8B: 291);
* starts ``LLM(model, enforce_eager=True)`` and reads every parameter's shape with
  ``LLM.apply_model``, against ``predict_rows`` at ``--tp`` (the default 1; ``--tp 2`` needs two GPUs);
* for layer 0, loads each checkpoint tensor and finds its rows in the live parameter with ``trace``
  (TP 1 only: with more ranks each holds a slice of every tensor), and prints the table;
* reads the model card back from the two fused shapes with ``model_card``.

Needs a CUDA GPU, ``pip install vllm==0.22.1`` and the weights:
``hf download meta-llama/Meta-Llama-3-8B-Instruct`` (gated: accept the licence first), or any
Llama-family model with ``--model``. ``--load-format dummy`` skips the weights' contents (shapes only;
the trace then has nothing to match and is skipped).

    python phase-14-model-architectures/labs/lab-03-trace-weight-loading/run.py
    python phase-14-model-architectures/labs/lab-03-trace-weight-loading/run.py --impl starter   # your functions
"""

from __future__ import annotations

import argparse
import glob
import json
import os


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="meta-llama/Meta-Llama-3-8B-Instruct")
    ap.add_argument("--impl", default=None, help="solution (default) or starter")
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--load-format", default="auto")
    ap.add_argument("--max-model-len", type=int, default=2048)
    args = ap.parse_args()

    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    import torch
    from huggingface_hub import snapshot_download
    from safetensors import safe_open
    from vllm import LLM

    from course.runtime.bench import this_lab

    if not torch.cuda.is_available():
        raise SystemExit("run.py needs a CUDA GPU; the CPU path of this lab is solution.py / test_lab.py")
    lab = this_lab(__file__, args.impl)

    path = snapshot_download(args.model, allow_patterns=["*.json", "*.safetensors"])
    with open(os.path.join(path, "config.json")) as f:
        hf = json.load(f)
    cfg = {k: hf.get(k) for k in ("hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim",
                                  "intermediate_size", "num_hidden_layers", "vocab_size", "tie_word_embeddings")}  # fmt: skip
    cfg["head_dim"] = cfg["head_dim"] or cfg["hidden_size"] // cfg["num_attention_heads"]
    files = sorted(glob.glob(os.path.join(path, "*.safetensors")))
    where = {}
    for fn in files:
        with safe_open(fn, framework="pt") as f:
            where.update({k: fn for k in f.keys()})
    predicted_names = lab.checkpoint_names(cfg)
    print(
        f"{args.model}: {len(where)} tensors in {len(files)} safetensors files; checkpoint_names predicts "
        f"{len(predicted_names)}; missing {sorted(set(predicted_names) - set(where))[:3]}, "
        f"extra {sorted(set(where) - set(predicted_names))[:3]}"
    )

    llm = LLM(model=args.model, enforce_eager=True, tensor_parallel_size=args.tp, load_format=args.load_format,
              max_model_len=args.max_model_len, gpu_memory_utilization=0.85)  # fmt: skip
    shapes = llm.apply_model(lambda m: {k: tuple(v.shape) for k, v in m.named_parameters()})[0]
    rows = lab.predict_rows(cfg, tp_size=args.tp, tp_rank=0)
    want = {}
    for r in rows:
        want[r.param] = max(want.get(r.param, 0), r.stop)
    bad = [(p, shapes[p][0], n) for p, n in want.items() if shapes.get(p, (None,))[0] != n]
    print(
        f"parameters: {len(shapes)}; rows per rank predicted for all {len(want)}: "
        f"{'all match' if not bad else f'{len(bad)} differ, e.g. {bad[:3]}'}"
    )
    qkv, gu = (
        shapes["model.layers.0.self_attn.qkv_proj.weight"],
        shapes["model.layers.0.mlp.gate_up_proj.weight"],
    )
    print(f"layer 0: qkv_proj.weight {qkv}, gate_up_proj.weight {gu}")
    if args.tp == 1:
        print(f"model card from the shapes: {lab.model_card(qkv, gu, cfg['head_dim'])}")
    if args.tp != 1 or args.load_format == "dummy":
        print("trace skipped (needs tp 1 and the real weights)")
        return
    layer0 = [n for n in where if n.startswith("model.layers.0.")]
    ckpt = {}
    for n in sorted(layer0, key=predicted_names.index):
        with safe_open(where[n], framework="pt") as f:
            ckpt[n] = f.get_tensor(n).float().numpy()
    targets = {lab_param for lab_param in {r.param for r in rows if r.checkpoint in ckpt}}
    params = llm.apply_model(lambda m: {k: v.detach().float().cpu().numpy() for k, v in m.named_parameters()
                                        if k in targets})[0]  # fmt: skip
    print(f"{'checkpoint tensor':47} {'vLLM parameter':45} {'shard':>5} {'rows':>11}")
    for r in lab.trace(params, ckpt):
        shard = "-" if r.shard is None else str(r.shard)
        print(f"{r.checkpoint:47} {r.param:45} {shard:>5} {f'{r.start}:{r.stop}':>11}")


if __name__ == "__main__":
    main()
