"""Lab 01-02 on a GPU box: run the real vLLM 0.22.1 engine and watch its step loop.

Needs a CUDA GPU, ``pip install vllm==0.22.1`` (in its own environment: it brings its own
CUDA build of torch) and the model weights (``facebook/opt-125m``,
about 250 MB; ``hf download facebook/opt-125m``). It is never run by the test
suite. What it does:

1. builds ``LLM(model, gpu_memory_utilization, max_model_len, ...)`` with per-step iteration
   logging switched on (``enable_logging_iteration_details=True``) and DEBUG logging, then
   prints how big the KV cache came out and what that means for concurrency;
2. answers one prompt with ``LLM.generate`` (the offline front door);
3. pumps the same engine by hand — ``llm_engine.add_request`` then ``llm_engine.step()`` in a
   loop — printing, per step, how many tokens the request has and how long the step took,
   so you can see the prefill step (the first token) and the decode steps after it.

Usage (from the repository root):

    VLLM_LOGGING_LEVEL=DEBUG python phase-01-architecture-and-request-lifecycle/labs/lab-02-read-the-real-loop/run.py
    python .../run.py --model facebook/opt-125m --max-tokens 16 --prompt "The capital of France is"
"""

from __future__ import annotations

import argparse
import os
import time

# Must be set before vllm is imported: it reads the variable once.
os.environ.setdefault("VLLM_LOGGING_LEVEL", "DEBUG")


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="facebook/opt-125m", help="a small HF model id or local path")
    p.add_argument("--prompt", default="The capital of France is")
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--gpu-memory-utilization", type=float, default=0.4,
                   help="fraction of GPU memory vLLM may take for weights + activations + KV cache")
    p.add_argument("--max-model-len", type=int, default=256, help="longest prompt + output one request may have")
    p.add_argument("--no-iteration-log", action="store_true",
                   help="turn off the per-step 'Iteration(N): ...' log lines")
    return p.parse_args()


def main() -> None:
    args = parse_args()
    import torch

    if not torch.cuda.is_available():
        raise SystemExit("run.py needs a CUDA GPU; on a CPU run solution.py instead (the real Scheduler, stepped by hand)")

    from vllm import LLM, SamplingParams

    llm = LLM(
        model=args.model,
        gpu_memory_utilization=args.gpu_memory_utilization,
        max_model_len=args.max_model_len,
        enable_logging_iteration_details=not args.no_iteration_log,
    )
    cache = llm.llm_engine.vllm_config.cache_config
    blocks, block_size = cache.num_gpu_blocks, cache.block_size
    print("\n=== 1. the KV cache the engine sized at start-up ===")
    print(f"device: {torch.cuda.get_device_name(0)}; gpu_memory_utilization={args.gpu_memory_utilization}")
    print(f"num_gpu_blocks = {blocks}, block_size = {block_size} -> {blocks * block_size:,} tokens of KV")
    per_request = -(-args.max_model_len // block_size)  # blocks one maximal request needs
    print(f"max_model_len = {args.max_model_len} -> one maximal request needs {per_request} blocks, so "
          f"{blocks / per_request:.2f} of them fit at once ({blocks} / {per_request})")
    print("look in the log above for 'GPU KV cache size: ... tokens' and 'Maximum concurrency for ...'")

    params = SamplingParams(max_tokens=args.max_tokens, temperature=0.0)
    print("\n=== 2. the offline front door: LLM.generate ===")
    out = llm.generate([args.prompt], params)[0]
    completion = out.outputs[0]
    print(f"prompt: {args.prompt!r} ({len(out.prompt_token_ids)} prompt tokens)")
    print(f"text:   {completion.text!r}")
    print(f"output tokens: {len(completion.token_ids)}, finish_reason: {completion.finish_reason!r}")

    print("\n=== 3. the same engine, one step() at a time ===")
    engine = llm.llm_engine
    # CUMULATIVE output (the default) returns the request's state after every step;
    # LLM.generate asks for FINAL_ONLY, which is why it returns only at the end.
    engine.add_request("manual-0", args.prompt, SamplingParams(max_tokens=args.max_tokens, temperature=0.0))
    print(f"{'step':>4}  {'output tokens':>13}  {'finished':>8}  {'ms':>8}")
    step = 0
    while engine.has_unfinished_requests():
        t0 = time.perf_counter()
        outputs = engine.step()
        ms = (time.perf_counter() - t0) * 1e3
        step += 1
        for o in outputs:
            n = len(o.outputs[0].token_ids)
            print(f"{step:>4}  {n:>13}  {o.finished!s:>8}  {ms:>8.2f}")
        if not outputs:
            print(f"{step:>4}  {'(no output)':>13}  {'':>8}  {ms:>8.2f}")

    print("\nWhat to look for:")
    print(f"- {args.max_tokens} output tokens should take {args.max_tokens} steps that produce output: the prefill")
    print("  step samples token 1, then one decode step per token (1 prefill + max_tokens - 1 decodes).")
    print("- In the 'Iteration(N)' lines the first step has context tokens = the prompt length and every")
    print("  later step has 1 generation token. Step 1's time is your TTFT (plus queueing); later steps are ITL.")
    print("- With the default multiprocessing front end, step() also waits for the engine process, so a step")
    print("  may report no output while the core is busy; the token counts still add up.")
    print("- finish_reason 'length' is the API face of RequestStatus.FINISHED_LENGTH_CAPPED.")


if __name__ == "__main__":
    main()
