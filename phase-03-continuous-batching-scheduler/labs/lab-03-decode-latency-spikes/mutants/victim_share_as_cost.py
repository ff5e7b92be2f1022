"""MUTANT (victim_share_as_cost): records A's own tokens as the step cost instead of the whole step's tokens (hides the interference).

Lab 06-03 reference: what a decoding stream feels when a long prompt lands next to it.

A short request A is decoding; a 256-token prompt B arrives. The cost of a step is its total
number of scheduled tokens (a stand-in for its duration: prefill-heavy steps are compute-bound,
so their time grows with tokens). ``run_collision`` stages the collision on ``mini_vllm.LLMEngine``
and returns A's per-step costs; ``long_prefill_token_threshold`` decides whether B's prefill lands
as one spike or as a row of small bumps. ``main`` prints the numbers and draws the plot.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import NamedTuple

import mini_vllm
from mini_vllm import LLMEngine, SamplingParams

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
    engine = LLMEngine(max_num_batched_tokens=budget, long_prefill_token_threshold=threshold)
    greedy = {"temperature": 0.0, "ignore_eos": True}
    a = engine.add_request(VICTIM_PROMPT, SamplingParams(max_tokens=max_tokens, **greedy))
    engine.step()  # A's prefill: A is decoding from now on
    b = engine.add_request(long_prompt(long_prompt_len), SamplingParams(max_tokens=long_max_tokens, **greedy))

    costs: list[int] = []
    victim_tokens: list[int] = []
    b_first_token_step = [0]
    steps = [0]
    schedule = engine.scheduler.schedule

    def probe() -> mini_vllm.SchedulerOutput:
        out = schedule()
        steps[0] += 1
        if a in out.num_scheduled_tokens:
            costs.append(out.num_scheduled_tokens[a])
            victim_tokens.append(out.num_scheduled_tokens[a])
        for request in out.scheduled_requests:
            first_sample = mini_vllm.Scheduler.needs_sample(request, out.num_scheduled_tokens[request.request_id])
            if request.request_id == b and not b_first_token_step[0] and first_sample:
                b_first_token_step[0] = steps[0]
        return out

    engine.scheduler.schedule = probe
    outputs = {}
    steps_while_alive = 0
    while a not in outputs:
        for output in engine.step():
            outputs[output.request_id] = output
        steps_while_alive += 1
    return Collision(costs, victim_tokens, steps_while_alive, outputs[a].token_ids, b_first_token_step[0])


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
