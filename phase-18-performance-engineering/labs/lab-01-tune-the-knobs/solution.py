"""Lab 18-01 — tune the knobs on a cheap simulator, under a hard SLO (reference solution).

mini_vllm's engine is the simulator: requests arrive at given steps (so queueing exists), the
real scheduler decides every step, and a probe on ``engine.scheduler.schedule`` (Phase 01 lab-04's
pattern) records what each step carried. Three numbers come out of a run:

* ``ttft_steps``: per request, the steps from its *arrival* to the step that emits its first token,
  that step included (an idle engine answers in the arrival step: 1);
* ``max_step_tokens``: the biggest step, the stand-in for the worst decode stall (Phase 03 lab-03);
* ``total_steps``: the schedule's length, the inverse of throughput at a fixed step cost.

``grid_search`` picks a config under a spike SLO: the SLO filters, the objective ranks, and an
impossible SLO raises. ``StepCost`` turns steps into seconds (fixed + per-token, fitted by
``calibrate``), and ``pareto_front`` keeps the configs no other config beats on both throughput
and the worst step (the inter-token-latency tail).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from mini_vllm import LLMEngine, SamplingParams

Arrival = tuple[int, str, int]  # (arrival step, prompt, max_tokens)


@dataclass
class Metrics:
    ttft_steps: dict[str, int]  # request id ("r0", "r1", ... in the arrivals' order) -> steps
    step_tokens: list[int]  # scheduled tokens of every step, 0 for a step the engine sat idle

    @property
    def max_step_tokens(self) -> int:
        return max(self.step_tokens, default=0)

    @property
    def total_steps(self) -> int:
        return len(self.step_tokens)

    @property
    def worst_ttft(self) -> int:
        return max(self.ttft_steps.values(), default=0)


def _check_arrivals(arrivals: Sequence[Arrival]) -> None:
    if not arrivals:
        raise ValueError("arrivals is empty: give at least one (arrival_step, prompt, max_tokens)")
    for a in arrivals:
        step, prompt, max_tokens = a
        if not isinstance(step, int) or step < 0:
            raise ValueError(f"arrival step must be an int >= 0, got {a!r}")
        if not isinstance(max_tokens, int) or max_tokens < 1:
            raise ValueError(f"max_tokens must be an int >= 1, got {a!r}")


def simulate(
    arrivals: Sequence[Arrival],
    max_num_batched_tokens: int,
    long_prefill_token_threshold: int = 0,
    max_num_seqs: int = 256,
) -> Metrics:
    """Run the arrival schedule through mini's engine (greedy, ``ignore_eos``) and measure it.

    Request ``i`` of ``arrivals`` is ``"r{i}"``. Before step ``s`` runs, every request arriving at
    ``s`` is added. A step with nothing to run still passes (it counts, with 0 tokens): time goes
    on while the engine waits for the next arrival.
    """
    _check_arrivals(arrivals)
    engine = LLMEngine(
        num_gpu_blocks=2048,
        block_size=16,
        max_num_batched_tokens=max_num_batched_tokens,
        long_prefill_token_threshold=long_prefill_token_threshold,
        max_num_seqs=max_num_seqs,
    )
    step_tokens: list[int] = []
    original = engine.scheduler.schedule

    def probe():
        out = original()
        step_tokens.append(out.total_num_scheduled_tokens)
        return out

    engine.scheduler.schedule = probe
    order = sorted(range(len(arrivals)), key=lambda i: arrivals[i][0])
    live: dict[str, object] = {}
    arrived: dict[str, int] = {}
    ttft: dict[str, int] = {}
    step, nxt = 0, 0
    while nxt < len(order) or engine.has_unfinished_requests():
        while nxt < len(order) and arrivals[order[nxt]][0] == step:
            i = order[nxt]
            rid = f"r{i}"
            params = SamplingParams(max_tokens=arrivals[i][2], temperature=0.0, ignore_eos=True)
            engine.add_request(arrivals[i][1], params, request_id=rid)
            live[rid] = engine.scheduler.requests[rid]
            arrived[rid] = step
            nxt += 1
        if engine.has_unfinished_requests():
            engine.step()
        else:
            step_tokens.append(0)
        for rid, req in list(live.items()):
            if req.output_token_ids:
                ttft[rid] = step - arrived[rid] + 1
                del live[rid]
        step += 1
    return Metrics(ttft_steps=ttft, step_tokens=step_tokens)


def grid_search(
    arrivals: Sequence[Arrival],
    budgets: Sequence[int],
    thresholds: Sequence[int],
    spike_slo: int,
    max_num_seqs: int = 256,
) -> tuple[int, int]:
    """The ``(budget, threshold)`` with the fewest steps among configs whose biggest step <= ``spike_slo``.

    Ties on steps go to the lower worst TTFT, then to the earlier config in grid order. When no
    config meets the SLO, raise ``ValueError`` naming the smallest spike any config reached.
    """
    best: tuple[int, int] | None = None
    choice: tuple[int, int] | None = None
    smallest_spike = None
    for budget, threshold in itertools.product(budgets, thresholds):
        m = simulate(arrivals, budget, threshold, max_num_seqs)
        smallest_spike = (
            m.max_step_tokens if smallest_spike is None else min(smallest_spike, m.max_step_tokens)
        )
        if m.max_step_tokens > spike_slo:
            continue
        key = (m.total_steps, m.worst_ttft)
        if best is None or key < best:
            best, choice = key, (budget, threshold)
    if choice is None:
        raise ValueError(
            f"no config keeps every step within {spike_slo} tokens (the smallest spike on this grid is "
            f"{smallest_spike}): relax the SLO, add smaller budgets, or shed load"
        )
    return choice


# ----------------------------------------------------------------------------- steps -> seconds
@dataclass(frozen=True)
class StepCost:
    """A step lasts ``fixed_s + per_token_s * tokens`` seconds (an idle step: ``fixed_s``)."""

    fixed_s: float
    per_token_s: float

    def step_seconds(self, step_tokens: Sequence[int]) -> np.ndarray:
        return self.fixed_s + self.per_token_s * np.asarray(step_tokens, dtype=np.float64)


def calibrate(samples: Sequence[tuple[int, float]]) -> StepCost:
    """Least-squares fit of step time against tokens, from ``(tokens, seconds)`` measurements.

    Needs at least two distinct token counts (one count cannot separate the two constants).
    """
    tokens = np.array([s[0] for s in samples], dtype=np.float64)
    seconds = np.array([s[1] for s in samples], dtype=np.float64)
    if len(set(tokens.tolist())) < 2:
        raise ValueError(
            "calibrate needs steps of at least two different sizes to separate fixed from per-token"
        )
    a = np.stack([np.ones_like(tokens), tokens], axis=1)
    (fixed, per_token), *_ = np.linalg.lstsq(a, seconds, rcond=None)
    return StepCost(float(fixed), float(per_token))


def ttft_seconds(arrivals: Sequence[Arrival], metrics: Metrics, cost: StepCost) -> dict[str, float]:
    """Each request's TTFT in seconds: the durations of the steps from its arrival through its first token."""
    ends = np.cumsum(cost.step_seconds(metrics.step_tokens))
    out = {}
    for i, (step, _, _) in enumerate(arrivals):
        rid = f"r{i}"
        start = ends[step - 1] if step > 0 else 0.0
        out[rid] = float(ends[step + metrics.ttft_steps[rid] - 1] - start)
    return out


@dataclass(frozen=True)
class Point:
    config: tuple[int, int]  # (max_num_batched_tokens, max_num_seqs)
    throughput: float  # output tokens per second
    worst_step_s: float  # the longest step: the worst gap a decoding request can see (ITL tail)
    worst_ttft_s: float


def pareto_front(points: Sequence[Point]) -> list[Point]:
    """The points no other point beats: none has throughput >= and worst step <=, one of them strictly.

    Identical points do not beat each other (both stay). Returned by rising throughput.
    """

    def beats(q: Point, p: Point) -> bool:
        return (
            q.throughput >= p.throughput
            and q.worst_step_s <= p.worst_step_s
            and (q.throughput > p.throughput or q.worst_step_s < p.worst_step_s)
        )

    front = [p for p in points if not any(beats(q, p) for q in points)]
    return sorted(front, key=lambda p: (p.throughput, p.worst_step_s))


def sweep(
    arrivals: Sequence[Arrival], budgets: Sequence[int], seqs: Sequence[int], cost: StepCost
) -> list[Point]:
    """Every ``(budget, max_num_seqs)`` config (threshold 0) as a ``Point``, in grid order."""
    out_tokens = sum(a[2] for a in arrivals)
    points = []
    for budget, n in itertools.product(budgets, seqs):
        m = simulate(arrivals, budget, 0, n)
        seconds = cost.step_seconds(m.step_tokens)
        ttft = max(ttft_seconds(arrivals, m, cost).values())
        points.append(Point((budget, n), out_tokens / float(seconds.sum()), float(seconds.max()), ttft))
    return points


# ----------------------------------------------------------------------------- the demo workload
def prompt(n: int, salt: int = 0) -> str:
    """A deterministic n-token prompt (one byte = one token); ``salt`` keeps prompts from sharing blocks."""
    return "".join(chr(97 + (7 * i + 3 * salt) % 26) for i in range(n))


def chat_workload() -> list[Arrival]:
    """A 24-token decode stream, then two 64-token prompts landing together while it decodes."""
    return [(0, prompt(8, 0), 24), (2, prompt(64, 1), 4), (2, prompt(64, 2), 4)]


def lone_prompt() -> list[Arrival]:
    """One 256-token prompt and nothing to hide its chunks behind."""
    return [(0, prompt(256, 3), 4)]


def burst_workload(n: int = 12) -> list[Arrival]:
    """``n`` requests of 64, 256 and 448 prompt tokens arriving four per step."""
    return [(i // 4, prompt(64 + 192 * (i % 3), i), 16 + 8 * (i % 2)) for i in range(n)]


# Predicted step cost of Qwen2.5-0.5B-Instruct in bf16 on an L4 (not measured): a step reads all
# weights once (0.494e9 params x 2 bytes / 300 GB/s) and spends 2 FLOPs per param per token at the
# dense bf16 peak (2 x 0.494e9 / 121e12).
PREDICTED_L4 = StepCost(fixed_s=0.494e9 * 2 / 300e9, per_token_s=2 * 0.494e9 / 121e12)


def main() -> None:
    print("chat workload: a 24-token decode stream, two 64-token prompts arriving at step 2")
    print(f"  {'budget':>6} {'threshold':>9} {'steps':>5} {'max step':>8} {'worst TTFT':>10}")
    for budget, threshold in itertools.product([40, 512], [0, 32, 64]):
        m = simulate(chat_workload(), budget, threshold)
        print(f"  {budget:>6} {threshold:>9} {m.total_steps:>5} {m.max_step_tokens:>8} {m.worst_ttft:>10}")
    alone = {t: simulate(lone_prompt(), 512, t).total_steps for t in (0, 32)}
    print(f"lone 256-token prompt: {alone[0]} steps unchunked, {alone[32]} with threshold 32")
    for slo in (80, 48):
        print(f"grid_search(spike_slo={slo}) -> {grid_search(chat_workload(), [40, 512], [0, 32, 64], slo)}")
    try:
        grid_search(chat_workload(), [40, 512], [0, 32, 64], 8)
    except ValueError as e:
        print(f"grid_search(spike_slo=8) -> ValueError: {e}")
    print()
    print("burst of 12 requests, threshold 0; step cost PREDICTED for Qwen2.5-0.5B on an L4:")
    print(f"  fixed {PREDICTED_L4.fixed_s * 1e3:.2f} ms + {PREDICTED_L4.per_token_s * 1e6:.1f} us/token")
    points = sweep(burst_workload(), [64, 512, 2048], [2, 4, 12], PREDICTED_L4)
    front = pareto_front(points)
    print(f"  {'budget':>6} {'seqs':>4} {'tok/s':>7} {'worst step ms':>13} {'worst TTFT ms':>13}  front")
    for p in points:
        mark = "*" if p in front else ""
        print(
            f"  {p.config[0]:>6} {p.config[1]:>4} {p.throughput:>7.0f} {p.worst_step_s * 1e3:>13.2f}"
            f" {p.worst_ttft_s * 1e3:>13.1f}  {mark}"
        )


if __name__ == "__main__":
    main()
