"""Speculative-decoding traces, and the driver that runs one through mini's ``Scheduler``.

The "model" is a deterministic function of the context, so drafts can be verified without
weights: ``periodic_target`` repeats the token six back (``next = ctx[-6]``) and puts a fresh
token at every 13th position, which an n-gram drafter predicts well but not always. One step::

    out = schedule()
    per request that caught up: target at ctx + drafts[:j] for each draft j, and after them all
    verify (greedy rejection sampling) -> accepted drafts + one bonus/correction token
    update_from_output(out, those lists)
    propose (n-gram) for every request that sampled and still runs -> update_draft_token_ids

``real_spec_decode.run_real_spec_trace`` runs the same trace through the real vLLM classes;
both produce ``SpecStepRecord``s. Nothing here imports vllm or torch.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from ..config import SpeculativeConfig, VllmConfig
from ..request import Request
from ..sampling_params import SamplingParams
from ..scheduler import Scheduler
from ..spec_decode import NgramProposer, parse_output, rejection_sample
from .traces import FAKE_EOS, Arrival, SchedConfig

VOCAB = 256
Target = Callable[[Sequence[int]], int]


@dataclass(frozen=True)
class SpecTraceConfig:
    """Scheduler knobs plus the n-gram settings; ``num_speculative_tokens=0`` runs without speculation."""

    sched: SchedConfig
    num_speculative_tokens: int = 3
    prompt_lookup_min: int = 2
    prompt_lookup_max: int = 4

    def to_vllm_config(self) -> VllmConfig:
        base = self.sched.to_vllm_config()
        if not self.num_speculative_tokens:
            return base
        spec = SpeculativeConfig(
            num_speculative_tokens=self.num_speculative_tokens,
            prompt_lookup_min=self.prompt_lookup_min,
            prompt_lookup_max=self.prompt_lookup_max,
        )
        return VllmConfig(base.cache_config, base.scheduler_config, speculative_config=spec)


@dataclass
class SpecStepRecord:
    num_scheduled_tokens: dict[str, int]
    spec_tokens: dict[str, list[int]]  # scheduled_spec_decode_tokens
    generated: dict[str, list[int]]  # tokens each request kept this step (after a stop cut the list)
    num_emitted: dict[str, int]  # tokens the verifier emitted (more than kept when a stop cut the list)
    num_computed_tokens: dict[str, int]  # after the step, requests still unfinished
    finished: list[tuple[str, str]]
    preempted: set[str]
    block_ids: dict[str, list[int]] = field(default_factory=dict)
    num_free_blocks: int = 0
    spec_stats: tuple | None = None  # (drafts, draft tokens, accepted, accepted per position)


def periodic_target(prompt_len: int, eos_at: int | None = None) -> Target:
    """``next = ctx[-6]``, a fresh token at every 13th position, FAKE_EOS as output ``eos_at``."""

    def target(ctx: Sequence[int]) -> int:
        if eos_at is not None and len(ctx) - prompt_len == eos_at:
            return FAKE_EOS
        if len(ctx) % 13 == 0:
            return 32 + (len(ctx) * 37 + ctx[0]) % 200
        return int(ctx[-6])

    return target


def target_logits(target: Target, ctx: Sequence[int], drafts: Sequence[int]) -> np.ndarray:
    """Rows ``len(drafts) + 1``: one-hot-ish logits of ``target`` after ``ctx + drafts[:j]``."""
    rows = np.full((len(drafts) + 1, VOCAB), -10.0)
    for j in range(len(drafts) + 1):
        rows[j, target([*ctx, *drafts[:j]])] = 10.0
    return rows


def greedy_verify(target: Target, ctx: Sequence[int], drafts: Sequence[int]) -> list[int]:
    """The reference rule: accept drafts while they equal the target, then one target token."""
    out: list[int] = []
    for j, d in enumerate(drafts):
        t = target([*ctx, *drafts[:j]])
        out.append(t)
        if t != d:
            return out
    return [*out, target([*ctx, *drafts])]


def mini_verify(targets: list[Target], ctxs: list[Sequence[int]], drafts: list[list[int]]) -> list[list[int]]:
    """Mini's ``rejection_sample`` (greedy path) on the targets' logits, batched like upstream."""
    rows = [target_logits(t, c, d) for t, c, d in zip(targets, ctxs, drafts)]
    flat = [r[:-1] for r in rows]
    out = rejection_sample(
        np.array([t for d in drafts for t in d], dtype=np.int64),
        [len(d) for d in drafts],
        None,
        np.concatenate(flat) if flat else np.zeros((0, VOCAB)),
        np.array([int(r[-1].argmax()) for r in rows]),
        np.ones(len(drafts), dtype=bool),
        uniform_probs=np.zeros(sum(len(d) for d in drafts)),
        exponentials=np.ones((len(drafts), VOCAB)),
    )
    return parse_output(out, VOCAB)


def run_mini_spec_trace(config: SpecTraceConfig, trace: Iterable[Arrival], max_steps: int = 2000) -> list[SpecStepRecord]:
    """Drive mini's Scheduler, ``NgramProposer`` and ``rejection_sample`` through ``trace``."""
    sched = Scheduler(config.to_vllm_config())
    kv = sched.kv_cache_manager
    proposer = None
    if config.num_speculative_tokens:
        proposer = NgramProposer(
            config.num_speculative_tokens, config.prompt_lookup_min, config.prompt_lookup_max,
            config.sched.max_model_len,
        )
    arrivals = sorted(trace, key=lambda a: a.step)
    targets: dict[str, Target] = {}
    requests: dict[str, Request] = {}
    records: list[SpecStepRecord] = []
    step = 0
    while arrivals or sched.has_unfinished_requests():
        while arrivals and arrivals[0].step <= step:
            a = arrivals.pop(0)
            params = SamplingParams(max_tokens=a.max_tokens, ignore_eos=a.eos_at is None)
            r = Request(a.request_id, list(a.prompt_token_ids), params, eos_token_id=FAKE_EOS,
                        block_hasher=kv.block_hasher)
            sched.add_request(r)
            requests[a.request_id] = r
            targets[a.request_id] = periodic_target(len(a.prompt_token_ids), a.eos_at)
        out = sched.schedule()
        spec = {rid: list(d) for rid, d in out.scheduled_spec_decode_tokens.items()}
        due = [r for r in out.scheduled_requests
               if Scheduler.needs_sample(r, out.num_scheduled_tokens[r.request_id])]
        before = {rid: requests[rid].num_output_tokens for rid in out.num_scheduled_tokens}
        emitted = mini_verify(
            [targets[r.request_id] for r in due], [list(r.all_token_ids) for r in due],
            [spec.get(r.request_id, []) for r in due],
        )
        finished = sched.update_from_output(out, {r.request_id: e for r, e in zip(due, emitted)})
        alive = [r for r in due if not r.is_finished]
        if alive and proposer is not None:
            counts = np.array([r.num_tokens for r in alive])
            rows = np.zeros((len(alive), config.sched.max_model_len), dtype=np.int32)
            for i, r in enumerate(alive):
                rows[i, : counts[i]] = list(r.all_token_ids)
            drafts = proposer.propose([[1]] * len(alive), counts, rows)
            sched.update_draft_token_ids({r.request_id: d for r, d in zip(alive, drafts)})
        stats = sched.make_spec_decoding_stats()
        records.append(SpecStepRecord(
            num_scheduled_tokens=dict(out.num_scheduled_tokens),
            spec_tokens=spec,
            generated={rid: list(requests[rid].output_token_ids[n:]) for rid, n in before.items()},
            num_emitted={r.request_id: len(e) for r, e in zip(due, emitted)},
            num_computed_tokens={r.request_id: r.num_computed_tokens for r in requests.values() if not r.is_finished},
            finished=[(r.request_id, r.get_finished_reason() or "") for r in finished],
            preempted=set(out.preempted_req_ids),
            block_ids={r.request_id: kv.get_block_ids(r.request_id) for r in sched.running},
            num_free_blocks=kv.block_pool.get_num_free_blocks(),
            spec_stats=None if stats is None else (
                stats.num_drafts, stats.num_draft_tokens, stats.num_accepted_tokens,
                tuple(stats.num_accepted_tokens_per_pos),
            ),
        ))
        step += 1
        if step > max_steps:
            raise RuntimeError("spec trace did not finish")
    return records


def spec_trace_family(seed: int) -> tuple[SpecTraceConfig, list[Arrival]]:
    """Random traces that hit every speculation edge: budgets and ``max_model_len`` that cut
    drafts, pools small enough to preempt, shared prefixes, EOS and ``max_tokens`` landing
    inside an accepted list, block sizes 1 to 16, caching on and off."""
    import random

    rng = random.Random(500 + seed)
    block_size = [1, 2, 4, 8, 16][seed % 5]
    max_model_len = rng.choice([24, 40, 64])
    num_blocks = -(-max_model_len // block_size) + rng.randint(1, 3 if seed % 2 else 40)
    max_num_seqs = rng.randint(1, 4)
    sched = SchedConfig(
        num_gpu_blocks=num_blocks,
        block_size=block_size,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=rng.randint(max_num_seqs, 3 * max_num_seqs + 8),
        long_prefill_token_threshold=rng.choice([0, 0, 3, 8]),
        enable_prefix_caching=seed % 3 != 2,
        max_model_len=max_model_len,
    )
    lo = rng.randint(1, 3)
    config = SpecTraceConfig(sched, rng.randint(1, 6), lo, lo + rng.randint(0, 2))
    base = [32 + (7 * i + seed) % 11 for i in range(max_model_len)]  # few symbols: drafts are found
    trace = []
    for i in range(rng.randint(2, 5)):
        plen = rng.randint(6, max_model_len // 2)
        prompt = base[:plen] if rng.random() < 0.6 else [32 + (5 * j + i) % 200 for j in range(plen)]
        eos_at = rng.randint(0, 12) if rng.random() < 0.3 else None
        trace.append(Arrival(rng.randint(0, 4), f"s{i}", tuple(prompt), rng.randint(1, max_model_len - plen), eos_at))
    return config, trace


PERIODIC_TRACE = [
    Arrival(0, "a", tuple(32 + (7 * i) % 200 for i in range(8)), 40),
    Arrival(0, "b", tuple(32 + (7 * i + 5) % 200 for i in range(8)), 40),
]


def main() -> None:
    """The periodic trace (2 requests x 40 tokens) through mini's scheduler, k drafts per step."""
    sched = SchedConfig(num_gpu_blocks=64, block_size=4, max_model_len=128)
    base = None
    print(f"{'k':>2} {'steps':>5} {'drafted':>7} {'accepted':>8}  same tokens as k=0")
    for k in (0, 1, 3, 5):
        records = run_mini_spec_trace(SpecTraceConfig(sched, k, 2, 4), PERIODIC_TRACE)
        tokens: dict[str, list[int]] = {}
        for s in records:
            for rid, toks in s.generated.items():
                tokens.setdefault(rid, []).extend(toks)
        base = tokens if base is None else base
        drafted = sum(s.spec_stats[1] for s in records if s.spec_stats)
        accepted = sum(s.spec_stats[2] for s in records if s.spec_stats)
        print(f"{k:>2} {len(records):>5} {drafted:>7} {accepted:>8}  {tokens == base}")


if __name__ == "__main__":
    main()
