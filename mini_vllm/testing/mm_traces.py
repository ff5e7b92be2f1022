"""Multimodal step tables on the same requests from three drivers: ``run_mini`` (mini_vllm's
``Scheduler``, which applies the encoder rules itself), ``run_real`` (the real vLLM ``Scheduler``
with ``mm_features``) and ``simulate`` (the encoder rule alone, pluggable, for lab 02).

Every request has ``max_tokens=1``, so a step table shows only prefill chunks and encoder work,
the part the encoder rules change. ``simulate`` follows the real scheduler's order: running
requests first (a request the rules give 0 tokens is skipped), then waiting ones in arrival
order (a waiting request given 0 tokens stops admission for this step). KV blocks are ample.
Importing this module is cheap; ``run_real`` imports torch and vLLM on first use.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from mini_vllm.multimodal import (
    EncoderCacheManager,
    MultiModalFeature,
    PlaceholderRange,
    free_consumed_encoder_inputs,
    try_schedule_encoder_inputs,
)


@dataclass(frozen=True)
class MMArrival:
    request_id: str
    prompt_token_ids: tuple[int, ...]
    features: tuple[MultiModalFeature, ...]
    prefix_hit: int = 0  # tokens the prefix cache supplies at admission (simulate only)


@dataclass
class MMStep:
    """One step: request id -> (tokens scheduled, encoder inputs run), and the evicted hashes
    the step tells the workers about."""

    scheduled: dict[str, tuple[int, tuple[int, ...]]]
    freed: list[str] = field(default_factory=list)


def three_requests(prefix_hit_for_c: int = 16) -> list[MMArrival]:
    """The phase's running example: A (80-token image "imgA" at 40), B ("imgB" at 10), C (A's image
    again, at 20). A and C share their first 20 text tokens, so with prefix caching C's first
    16-token block (all text) is a hit: ``prefix_hit_for_c`` is what ``simulate`` gives C (the real
    scheduler and mini_vllm's ``Scheduler`` find it themselves). Token budget 256 and encoder
    budget 100 give: step 0 A 130 tokens + imgA, B 10 (its doorstep), C 94 (imgA is a hit);
    step 1 B 90 + imgB."""
    shared = tuple(range(3, 23))

    def image(name: str, at: int) -> tuple[MultiModalFeature, ...]:
        return (MultiModalFeature(name, PlaceholderRange(at, 80)),)

    return [
        MMArrival("A", shared + tuple(range(100, 210)), image("imgA", 40)),
        MMArrival("B", tuple(range(300, 400)), image("imgB", 10)),
        MMArrival("C", shared + tuple(range(400, 490)), image("imgA", 20), prefix_hit=prefix_hit_for_c),
    ]


def simulate(
    arrivals: Sequence[MMArrival],
    token_budget: int,
    encoder_budget: int,
    cache_size: int,
    rule: Callable[..., tuple] = try_schedule_encoder_inputs,
    max_steps: int = 200,
) -> list[MMStep]:
    """All requests arrive before step 0; returns one ``MMStep`` per step until all finish."""
    cache = EncoderCacheManager(cache_size)
    waiting = list(arrivals)
    running: list[MMArrival] = []
    computed: dict[str, int] = {}
    steps: list[MMStep] = []
    for _ in range(max_steps):
        if not waiting and not running:
            return steps
        left = {"tokens": token_budget, "encoder": encoder_budget}
        table: dict[str, tuple[int, tuple[int, ...]]] = {}
        for a in running:
            if left["tokens"] > 0:
                _plan_one(a, computed[a.request_id], left, table, cache, rule)
        while waiting and left["tokens"] > 0:
            a = waiting[0]
            computed[a.request_id] = a.prefix_hit
            if _plan_one(a, a.prefix_hit, left, table, cache, rule) == 0:
                break  # upstream keeps any hit the rule recorded: the request still holds it
            running.append(waiting.pop(0))
        freed = cache.get_freed_mm_hashes()
        for a in list(running):
            if a.request_id not in table:
                continue
            computed[a.request_id] += table[a.request_id][0]
            free_consumed_encoder_inputs(a.request_id, list(a.features), computed[a.request_id], cache)
            if computed[a.request_id] == len(a.prompt_token_ids):  # prefill done: samples 1 token, finishes
                cache.free(a.request_id)
                running.remove(a)
        steps.append(MMStep(table, freed))
    raise RuntimeError(f"not finished after {max_steps} steps: {[a.request_id for a in waiting + running]} left")


def _plan_one(a, done, left, table, cache, rule) -> int:
    """One request's chunk this step; books it in ``table`` and ``left``; returns its tokens."""
    n = min(len(a.prompt_token_ids) - done, left["tokens"])
    to_encode, n, new_encoder_budget = rule(a.request_id, done, n, list(a.features), left["encoder"], cache)
    if n > 0:
        left["encoder"] = new_encoder_budget
        for i in to_encode:
            cache.allocate(a.request_id, a.features[i].identifier, a.features[i].mm_position.get_num_embeds())
        left["tokens"] -= n
        table[a.request_id] = (n, tuple(to_encode))
    return n


def _table_config(arrivals: Sequence[MMArrival], token_budget: int, enable_prefix_caching: bool):
    """One config for both schedulers: ample KV blocks, seats for everyone, room for every prompt."""
    from mini_vllm.testing.traces import SchedConfig

    longest = max(len(a.prompt_token_ids) for a in arrivals)
    return SchedConfig(
        num_gpu_blocks=4 * sum(len(a.prompt_token_ids) // 16 + 2 for a in arrivals),
        max_num_seqs=max(16, len(arrivals)),
        max_num_batched_tokens=token_budget,
        enable_prefix_caching=enable_prefix_caching,
        max_model_len=max(2 * longest, token_budget) + 16,
    )


def run_mini(
    arrivals: Sequence[MMArrival],
    token_budget: int,
    encoder_budget: int,
    cache_size: int,
    enable_prefix_caching: bool = False,
    max_steps: int = 200,
) -> list[MMStep]:
    """mini_vllm's ``Scheduler`` with ``max_num_encoder_input_tokens = encoder_budget`` and
    ``encoder_cache_size = cache_size``; prefix hits come from its own KV cache (``prefix_hit``
    is ignored)."""
    from mini_vllm import Request, SamplingParams, Scheduler, create_engine_config

    c = _table_config(arrivals, token_budget, enable_prefix_caching)
    sched = Scheduler(create_engine_config(
        block_size=16, num_gpu_blocks=c.num_gpu_blocks, enable_prefix_caching=enable_prefix_caching,
        max_num_seqs=c.max_num_seqs, max_num_batched_tokens=token_budget, max_model_len=c.max_model_len,
        max_num_encoder_input_tokens=encoder_budget, encoder_cache_size=cache_size,
    ))
    for a in arrivals:
        sched.add_request(Request(a.request_id, list(a.prompt_token_ids), SamplingParams(max_tokens=1, ignore_eos=True),
                                  mm_features=a.features))
    steps: list[MMStep] = []
    for _ in range(max_steps):
        if not sched.has_unfinished_requests():
            return steps
        out = sched.schedule()
        enc = out.scheduled_encoder_inputs
        table = {rid: (n, tuple(enc.get(rid, ()))) for rid, n in out.num_scheduled_tokens.items()}
        steps.append(MMStep(table, list(out.free_encoder_mm_hashes)))
        sampled = {r.request_id: 1 for r in out.scheduled_requests if sched.needs_sample(r, out.num_scheduled_tokens[r.request_id])}
        sched.update_from_output(out, sampled)
    raise RuntimeError(f"mini scheduler not finished after {max_steps} steps")


def run_real(
    arrivals: Sequence[MMArrival],
    token_budget: int,
    encoder_budget: int,
    cache_size: int,
    enable_prefix_caching: bool = False,
    max_steps: int = 200,
) -> list[MMStep]:
    """The real ``Scheduler`` (fake runner) with an ``EncoderCacheManager(cache_size)`` and
    ``max_num_encoder_input_tokens = encoder_budget`` set by hand (the stub model is text-only)."""
    from vllm.multimodal.inputs import MultiModalFeatureSpec
    from vllm.multimodal.inputs import PlaceholderRange as VllmPlaceholderRange
    from vllm.v1.core.encoder_cache_manager import EncoderCacheManager as VllmEncoderCacheManager

    from mini_vllm.testing.real_vllm import RealScheduler, VllmRequest, VllmSamplingParams

    real = RealScheduler(_table_config(arrivals, token_budget, enable_prefix_caching))
    sched = real.scheduler
    sched.max_num_encoder_input_tokens = encoder_budget
    sched.encoder_cache_manager = VllmEncoderCacheManager(cache_size=cache_size)
    for a in arrivals:
        specs = [
            MultiModalFeatureSpec(
                data=None,
                modality="image",
                identifier=f.identifier,
                mm_position=VllmPlaceholderRange(offset=f.mm_position.offset, length=f.mm_position.length),
            )
            for f in a.features
        ]
        sched.add_request(
            VllmRequest(
                request_id=a.request_id,
                prompt_token_ids=list(a.prompt_token_ids),
                sampling_params=VllmSamplingParams(max_tokens=1, ignore_eos=True),
                pooling_params=None,
                block_hasher=real.block_hasher,
                mm_features=specs or None,
            )
        )
    steps: list[MMStep] = []
    for _ in range(max_steps):
        if not sched.has_unfinished_requests():
            return steps
        out = sched.schedule()
        enc = out.scheduled_encoder_inputs
        table = {rid: (n, tuple(enc.get(rid, ()))) for rid, n in out.num_scheduled_tokens.items()}
        steps.append(MMStep(table, list(out.free_encoder_mm_hashes)))
        sched.update_from_output(out, real.fake_model_runner_output(out))
    raise RuntimeError(f"real scheduler not finished after {max_steps} steps")
