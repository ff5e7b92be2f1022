"""One benchmark, two engines: vLLM's own benchmark client against mini's server and vLLM's server.

    .venv/bin/python phase-18-performance-engineering/bench_two_servers.py [--num-prompts 40] [--rate 20]

The same dataset (vLLM's ``RandomDataset``, seeded, on the tiny Llama's tokenizer), the same Poisson
arrivals (vLLM's ``get_request``), the same request function (``async_request_openai_completions``,
streamed) and the same arithmetic (``calculate_metrics``, with a goodput SLO) run against two
servers on ``build/tiny-llama``, one after the other: mini's (``python -m mini_vllm serve`` in this
process) and the real ``vllm.entrypoints.openai.api_server`` in the tier-2 engine venv
(``make engine``; what ``vllm serve`` runs). It prints both reports side by side with the ratio
mini / vLLM per figure (for times: above 1 means mini is slower), and where mini's server time
goes with ``--profile`` (its engine steps' share of the run, and a cProfile of the steps; the
profiler slows mini's steps, so take the table from a run without it).

A benchmark, not a test: the figures are wall-clock and depend on the machine and its load (run it
on a quiet machine; both servers get the same CPU threads budget). Nothing here is a README figure.
"""

from __future__ import annotations

import argparse
import asyncio
import time

METRICS = [
    ("request_throughput", "requests/s", False),
    ("output_throughput", "output tok/s", False),
    ("median_ttft_ms", "TTFT p50 ms", True),
    ("p99_ttft_ms", "TTFT p99 ms", True),
    ("median_itl_ms", "ITL p50 ms", True),
    ("p99_itl_ms", "ITL p99 ms", True),
    ("median_e2el_ms", "E2EL p50 ms", True),
    ("p99_e2el_ms", "E2EL p99 ms", True),
    ("request_goodput", "goodput req/s", False),
]


def run_client(base_url: str, model: str, requests: list, rate: float, tokenizer, slo: dict) -> dict:
    """vLLM's client: Poisson arrivals at ``rate``, streamed completions, then ``calculate_metrics``."""
    import aiohttp
    from vllm.benchmarks.lib.endpoint_request_func import RequestFuncInput, async_request_openai_completions
    from vllm.benchmarks.serve import calculate_metrics, get_request

    async def go() -> tuple[list, float]:
        timeout = aiohttp.ClientTimeout(total=600)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            tasks, start = [], time.perf_counter()
            async for req, _ in get_request(requests, rate):
                x = RequestFuncInput(
                    prompt=req.prompt, api_url=base_url + "/v1/completions", prompt_len=req.prompt_len,
                    output_len=req.expected_output_len, model=model, ignore_eos=True,
                )  # fmt: skip
                tasks.append(asyncio.create_task(async_request_openai_completions(x, session)))
            outs = await asyncio.gather(*tasks)
            return outs, time.perf_counter() - start

    outs, duration = asyncio.run(go())
    metrics, _ = calculate_metrics(requests, outs, duration, tokenizer, [50, 99], slo)
    failed = sum(not o.success for o in outs)
    report = {"failed": failed, "duration": duration}
    for key, _, _ in METRICS:
        if key.startswith("p99_"):  # percentiles_<name>: [(50, v), (99, v)]
            report[key] = dict(getattr(metrics, "percentiles_" + key[len("p99_"):]))[99]
        else:
            report[key] = getattr(metrics, key)
    return report


def one_rate(args, rate, model_dir, requests, tokenizer, slo, engine):
    """Mini's server, then the real one, at ``rate``: (mini's report, vLLM's, profile, step seconds)."""
    from mini_vllm.testing.live_server import LiveServer

    mini = LiveServer(checkpoint=model_dir, served_model_name="tiny-llama", num_gpu_blocks=512, block_size=16,
                      max_num_seqs=128)  # fmt: skip
    prof, step_time = None, [0.0]
    try:
        run_client(mini.base_url, "tiny-llama", requests[:4], 1000.0, tokenizer, slo)  # warm-up
        if args.profile:  # the engine's steps run on the server's thread: profile each step there
            import cProfile

            prof, step = cProfile.Profile(time.process_time), mini.engine.step

            def profiled_step():
                t0 = time.perf_counter()
                prof.enable()
                try:
                    return step()
                finally:
                    prof.disable()
                    step_time[0] += time.perf_counter() - t0

            mini.engine.step = profiled_step
        ours = run_client(mini.base_url, "tiny-llama", requests, rate, tokenizer, slo)
    finally:
        mini.stop()
    real = engine.RealServer("--max-num-seqs", "128")
    try:
        run_client(real.base_url, "tiny-llama", requests[:4], 1000.0, tokenizer, slo)  # warm-up
        theirs = run_client(real.base_url, "tiny-llama", requests, rate, tokenizer, slo)
    finally:
        real.stop()
    return ours, theirs, prof, step_time[0]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--num-prompts", type=int, default=40)
    parser.add_argument("--rate", type=float, nargs="+", default=[20.0], help="requests per second (Poisson), one run each")
    parser.add_argument("--input-len", type=int, default=64)
    parser.add_argument("--output-len", type=int, default=32)
    parser.add_argument("--slo-ttft-ms", type=float, default=500.0)
    parser.add_argument("--profile", action="store_true", help="where mini's server time goes")
    parser.add_argument("--save", default=None, help="write the reports as JSON (figures/two_servers.py draws it)")
    args = parser.parse_args(argv)

    from course.runtime import engine, real_vllm  # noqa: F401  (tier-1 wiring: vLLM imports on CPU)

    missing = engine.missing_reason()
    if missing:
        print(f"the real server needs tier 2: {missing}")
        return 1
    from transformers import AutoTokenizer
    from vllm.benchmarks.datasets.datasets import RandomDataset

    model_dir = str(engine.model_path())
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    requests = RandomDataset(random_seed=0).sample(
        tokenizer, num_requests=args.num_prompts, input_len=args.input_len, output_len=args.output_len
    )
    slo = {"ttft": args.slo_ttft_ms}
    runs = []
    for rate in args.rate:
        print(f"{args.num_prompts} prompts of {args.input_len} tokens -> {args.output_len} tokens, "
              f"Poisson {rate:g} req/s, goodput SLO TTFT <= {args.slo_ttft_ms:g} ms\n")  # fmt: skip
        ours, theirs, prof, step_time = one_rate(args, rate, model_dir, requests, tokenizer, slo, engine)
        runs.append({"rate": rate, "mini": ours, "vllm": theirs})
        print(f"{'':16}{'mini':>12}{'vLLM':>12}{'mini / vLLM':>14}")
        for key, label, _ in METRICS:
            a, b = ours[key], theirs[key]
            print(f"{label:16}{a:12.1f}{b:12.1f}{(a / b if b else float('nan')):14.2f}")
        print(f"{'failed requests':16}{ours['failed']:12d}{theirs['failed']:12d}\n")
        if prof is not None:
            import pstats

            print(f"mini's engine steps took {step_time:.2f} s of the run's {ours['duration']:.2f} s "
                  "(the rest: HTTP, the event loop, detokenizing, waiting for arrivals)")  # fmt: skip
            print("inside the steps, top 10 by own CPU time:")
            pstats.Stats(prof).sort_stats("tottime").print_stats(10)
    if args.save:
        import json
        import os

        setup = {"num_prompts": args.num_prompts, "input_len": args.input_len, "output_len": args.output_len,
                 "slo_ttft_ms": args.slo_ttft_ms, "cpus": os.cpu_count(),
                 "threads": os.environ.get("OMP_NUM_THREADS", "unset")}  # fmt: skip
        with open(args.save, "w", encoding="utf-8") as f:
            json.dump({"setup": setup, "runs": runs}, f, indent=2, sort_keys=True)
            f.write("\n")
        print(f"wrote {args.save}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
