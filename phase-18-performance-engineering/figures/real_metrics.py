"""Print what vLLM's own Prometheus logger exports for a few steps of vLLM's own scheduler.

Tier 1, on CPU: the real ``Scheduler`` (``mini_vllm.testing.real_vllm.RealScheduler``, a fake model
runner that samples one token per request that has caught up) runs five requests of 48 prompt
tokens, the last three sharing a 32-token prefix with the first, under ``max_num_seqs=2`` and a
64-token budget. Every step's ``SchedulerStats`` (from ``update_from_output``) goes to the real
``PrometheusStatLogger.record``, as ``AsyncLLM``'s output handler does; the script prints the
scheduler's state per step and then the ``vllm:`` gauges and counters a scrape of ``/metrics``
would show.
Run: python phase-18-performance-engineering/figures/real_metrics.py
"""

from __future__ import annotations

# isort: off
from mini_vllm.testing.real_vllm import RealScheduler, rv  # first: wires the CPU environment

from prometheus_client import REGISTRY, generate_latest
from vllm.v1.metrics.loggers import PrometheusStatLogger
# isort: on

from mini_vllm.testing.traces import SchedConfig

SHOWN = (
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:kv_cache_usage_perc",
    "vllm:prefix_cache_queries_total",
    "vllm:prefix_cache_hits_total",
)


def scrape(title: str) -> None:
    """The lines of ``SHOWN`` a Prometheus scrape of ``/metrics`` would return now."""
    print(title)
    for line in generate_latest(REGISTRY).decode().splitlines():
        name = line.split("{")[0]
        if name in SHOWN:
            print(f"  {name} {line.rsplit(' ', 1)[1]}")


def main() -> None:
    config = SchedConfig(num_gpu_blocks=64, max_num_seqs=2, max_num_batched_tokens=64)
    real = RealScheduler(config)
    prom = PrometheusStatLogger(
        rv.make_vllm_config(num_gpu_blocks=64, max_num_seqs=2, max_num_batched_tokens=64), engine_indexes=[0]
    )
    shared = list(range(100, 132))
    prompts = [shared + list(range(200, 216)), list(range(300, 348))] + [
        shared + list(range(400 + 16 * i, 416 + 16 * i)) for i in range(3)
    ]
    for i, prompt in enumerate(prompts):
        real.add_request(f"r{i}", prompt, max_tokens=4)
    print(f"{len(prompts)} requests of 48 prompt tokens (r2-r4 share r0's first 32), 4 output tokens each")
    print(f"max_num_seqs={config.max_num_seqs}, max_num_batched_tokens={config.max_num_batched_tokens}\n")
    print("step  tokens  running  waiting  kv usage  prefix queries/hits (this step)")
    sched, step = real.scheduler, 0
    while sched.has_unfinished_requests():
        out = sched.schedule()
        engine_outputs = sched.update_from_output(out, real.fake_model_runner_output(out))
        for eco in engine_outputs.values():
            stats = eco.scheduler_stats
            if stats is None:
                continue
            prom.record(scheduler_stats=stats, iteration_stats=None, engine_idx=0)
            pc = stats.prefix_cache_stats
            print(
                f"{step:4} {out.total_num_scheduled_tokens:7} {stats.num_running_reqs:8} {stats.num_waiting_reqs:8}"
                f" {stats.kv_cache_usage:9.3f}  {pc.queries:3} / {pc.hits}"
            )
        if step == 4:
            gauges = generate_latest(REGISTRY).decode()
        step += 1
    print("\na scrape of /metrics after step 4 (gauges hold the last step's value):")
    for line in gauges.splitlines():
        if line.split("{")[0] in SHOWN[:3]:
            print(f"  {line.split('{')[0]} {line.rsplit(' ', 1)[1]}")
    scrape("and after the last step (counters only ever grow):")


if __name__ == "__main__":
    main()
