"""Tier 2: one role of a P/D pair on the whole vLLM CPU engine (run in the engine venv).

    .venv-engine/bin/python engine_pair.py '{"role": "producer", "model": ..., "store": ...,
        "prompts": [[...]], "max_tokens": 8, "connector": "stock" | "fixed", "lab_file": ...}' out.json

``role`` is ``single`` (no connector), ``producer`` (``max_tokens = 1``, saves the prompts' KV) or
``consumer`` (loads, then generates). ``connector = "fixed"`` loads ``CPULayoutExampleConnector``
from ``lab_file`` (your starter or solution) through ``kv_connector_module_path``; ``"stock"`` is
vLLM's ``ExampleConnector``. Writes the greedy token ids and the engine's external-hit counters.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

SHIM = """import importlib.util
spec = importlib.util.spec_from_file_location("course_pd_lab_impl", {path!r})
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
CPULayoutExampleConnector = module.CPULayoutExampleConnector
"""


def main(argv: list[str]) -> int:
    args, out = json.loads(argv[0]), Path(argv[1])
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    kwargs = {"dtype": "float32", "enforce_eager": True, "max_model_len": 512, "seed": 0, "block_size": 16}
    if args["role"] != "single":
        config = {
            "kv_connector": "ExampleConnector",
            "kv_role": f"kv_{args['role']}",
            "kv_connector_extra_config": {"shared_storage_path": args["store"]},
        }
        if args["connector"] == "fixed":
            shim_dir = tempfile.mkdtemp(prefix="course_pd_shim_")
            Path(shim_dir, "course_pd_connector.py").write_text(SHIM.format(path=args["lab_file"]))
            sys.path.insert(0, shim_dir)  # this process, and (below) the spawned worker
            os.environ["PYTHONPATH"] = os.pathsep.join([shim_dir, os.environ.get("PYTHONPATH", "")])
            config.update(
                kv_connector="CPULayoutExampleConnector", kv_connector_module_path="course_pd_connector"
            )
        kwargs["kv_transfer_config"] = config

    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    llm = LLM(model=args["model"], **kwargs)
    max_tokens = 1 if args["role"] == "producer" else args["max_tokens"]
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    outs = llm.generate(
        [TokensPrompt(prompt_token_ids=list(p)) for p in args["prompts"]], params, use_tqdm=False
    )
    result = {
        "tokens": [list(o.outputs[0].token_ids) for o in outs],
        "num_cached_tokens": [o.num_cached_tokens for o in outs],
        "stored_folders": len(os.listdir(args["store"])) if args["role"] != "single" else 0,
    }
    out.write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
