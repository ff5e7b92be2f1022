"""Lab 06-03 starter: what a decoding stream feels when a long prompt lands next to it.

Write ``run_collision``: a short request A is decoding when a 256-token prompt B arrives; record,
for every step in which A decodes, the step's total scheduled tokens (its cost). ``decode_step_costs``,
``summarize``, ``plot`` and ``main`` are provided.
Grade with: LAB_IMPL=starter pytest phase-03-continuous-batching-scheduler/labs/lab-03-decode-latency-spikes -q
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import NamedTuple

import mini_vllm  # noqa: F401 (you will use these)
from mini_vllm import LLMEngine, SamplingParams  # noqa: F401

VICTIM_PROMPT = "Tell me a joke."
HERE = Path(__file__).resolve().parent


class Collision(NamedTuple):
    costs: list[int]  # total scheduled tokens of each step in which A decoded, after B arrived
    victim_tokens: list[int]  # tokens A got in each of those steps
    steps_while_alive: int  # steps from B's arrival until A finished
    victim_output: list[int]  # A's generated token ids
    intruder_ttft_steps: int  # steps B needed to produce its first token (its TTFT, in steps)


def long_prompt(n: int) -> str:
    """A deterministic n-byte prompt (one byte = one token)."""
    return "".join(chr(97 + (7 * i) % 26) for i in range(n))


def run_collision(
    threshold: int,
    long_prompt_len: int = 256,
    max_tokens: int = 16,
    long_max_tokens: int = 2,
    budget: int = 2048,
) -> Collision:
    """Stage the collision and measure it from A's point of view.

    Build ``LLMEngine(max_num_batched_tokens=budget, long_prefill_token_threshold=threshold)``,
    add A (``max_tokens`` greedy tokens, ``ignore_eos``) and run one step (A's prefill). Then add
    B (``long_prompt_len`` tokens, ``long_max_tokens`` tokens) and wrap ``engine.scheduler.schedule``
    so every later step records its ``total_num_scheduled_tokens`` and A's share, until A finishes.
    """
    raise NotImplementedError(
        "run_collision: build LLMEngine(max_num_batched_tokens=budget, long_prefill_token_threshold=threshold); "
        "add A (VICTIM_PROMPT) and step once; add B (long_prompt(long_prompt_len)); wrap engine.scheduler.schedule "
        "to record out.total_num_scheduled_tokens and A's share whenever A is scheduled, and the step where B "
        "first samples (Scheduler.needs_sample); step until A's output comes back"
    )


def decode_step_costs(threshold: int, long_prompt_len: int = 256, max_tokens: int = 16) -> list[int]:
    """A's per-step costs (see ``run_collision``)."""
    return run_collision(threshold, long_prompt_len, max_tokens).costs


def summarize(costs: list[int]) -> str:
    """max, mean and median of a cost profile, as one line."""
    return f"max {max(costs)}, mean {statistics.mean(costs):.1f}, median {statistics.median(costs):g}"


def plot(profiles: dict[int, list[int]], path: Path) -> None:
    """Per-step cost of A's decode steps, one line per threshold (small, deterministic PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 3.2), dpi=100)
    for threshold, costs in profiles.items():
        label = "no chunking (threshold 0)" if threshold == 0 else f"threshold {threshold}"
        ax.step(range(1, len(costs) + 1), costs, where="mid", marker="o", markersize=3, label=label)
    ax.set_xlabel("A's decode step after B arrives")
    ax.set_ylabel("tokens in the step")
    ax.set_title("One decode stream while a 256-token prompt lands")
    ax.set_yscale("log")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, metadata={"Software": None})
    plt.close(fig)


def main() -> None:
    profiles = {}
    for threshold in (0, 32, 64):
        result = run_collision(threshold)
        profiles[threshold] = result.costs
        print(f"threshold={threshold:<3}: {result.costs}")
        print(f"               {len(result.costs)} steps, sum {sum(result.costs)}; {summarize(result.costs)}; "
              f"B's first token after {result.intruder_ttft_steps} step(s)")
    same = profiles and all(run_collision(t).victim_output == run_collision(0).victim_output for t in (32, 64))
    print(f"A's tokens identical across thresholds: {same}")
    plot(profiles, HERE / "decode_latency.png")
    print("wrote decode_latency.png")


if __name__ == "__main__":
    main()
