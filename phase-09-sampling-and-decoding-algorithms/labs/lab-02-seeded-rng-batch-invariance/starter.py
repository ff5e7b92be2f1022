"""Lab 09-02 starter: per-request generators make a seeded request's tokens independent of
its batch companions; one shared generator does not; and vLLM 0.22.1's CPU sampling path has the
shared-generator bug for mixed batches (issue #51226), fixed here.

Write ``SeededSampler.generator_for`` and ``step``, ``seeded_draws`` (the demonstration on the
real sampler) and ``fixed_forward_cpu`` (the fix).
Grade with: LAB_IMPL=starter pytest phase-09-sampling-and-decoding-algorithms/labs/lab-02-seeded-rng-batch-invariance -q
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from mini_vllm import Sampler, SamplingParams

Request = tuple[str, SamplingParams]  # (request id, its params), one per row of the batch


class SeededSampler:
    """The engine side of sampling: one generator per seeded request, made once from its seed
    when the request is first seen and kept (advancing) until it finishes; unseeded requests
    share the engine's generator (their tokens are allowed to depend on the batch)."""

    def __init__(self, engine_seed: int = 0) -> None:
        self.engine_rng = np.random.default_rng(engine_seed)
        self.generators: dict[str, np.random.Generator] = {}
        self.sampler = Sampler()

    def generator_for(self, request_id: str, params: SamplingParams) -> np.random.Generator:
        """The generator row ``request_id`` draws from: its own (created on first use from
        ``params.seed``, then the same object every step) when seeded, else the engine's."""
        raise NotImplementedError(
            "unseeded: self.engine_rng; seeded: create np.random.default_rng(params.seed) once per "
            "request id, store it in self.generators, return the same object after"
        )

    def step(self, logits: np.ndarray, requests: Sequence[Request]) -> list[int]:
        """One token per row with ``mini_vllm.Sampler``, each row drawing from ``generator_for``."""
        raise NotImplementedError(
            "gens = [self.generator_for(rid, sp) for rid, sp in requests]; "
            "return self.sampler.sample_batch(logits, params, gens)"
        )

    def finish(self, request_id: str) -> None:
        """Forget a finished request's generator (provided)."""
        self.generators.pop(request_id, None)


class SharedRNGSampler(SeededSampler):
    """The broken design (provided): every random row draws from one engine generator, in row
    order, so a seeded request's draw depends on how many rows come before it."""

    def generator_for(self, request_id: str, params: SamplingParams) -> np.random.Generator:
        return self.engine_rng


def fixed_forward_cpu(self, logits, generators, k, p):
    """vLLM's ``TopKTopPSampler.forward_cpu`` with the seed bug fixed: the fast path (one
    compiled draw with the global RNG) only when *no* row has a generator; otherwise fill every
    row's exponential noise from the global RNG and then overwrite each seeded row's from its
    own generator, as ``random_sample`` does. ``self`` is a ``TopKTopPSampler``."""
    raise NotImplementedError(
        "copy TopKTopPSampler.forward_cpu (upstream/vllm/v1/sample/ops/topk_topp_sampler.py) "
        "and change the shortcut's condition: only when no row has a generator"
    )


def seeded_draws(
    forward: Callable, seed: int = 7, companions: int = 0, steps: int = 8, vocab: int = 16
) -> list[int]:
    """Drive the real ``TopKTopPSampler`` on CPU: row 0 is a request seeded with
    ``seed`` (one ``torch.Generator``, kept across steps), followed by ``companions`` unseeded
    rows; the logits are flat (every token equally likely). Returns row 0's token at each step."""
    raise NotImplementedError(
        "torch.manual_seed(1234); sampler = TopKTopPSampler('raw_logprobs'); one "
        "torch.Generator().manual_seed(seed); each step "
        "forward(sampler, torch.zeros(1 + companions, vocab), {0: gen}, None, None)"
    )


def main() -> None:
    rng = np.random.default_rng(0)
    mine: Request = ("mine", SamplingParams(seed=7))
    mine_row, others_rows = rng.normal(size=(1, 32)), rng.normal(size=(3, 32))
    for name, cls in (("per-request generators", SeededSampler), ("one shared generator", SharedRNGSampler)):
        print(name)
        for n in (0, 1, 3):
            s = cls()
            others = [(f"o{j}", SamplingParams()) for j in range(n)]
            batch = np.vstack([others_rows[:n], mine_row])  # the seeded request last, same logits
            toks = [s.step(batch, [*others, mine])[-1] for _ in range(8)]
            print(f"  seed 7 behind {n} unseeded companions: {toks}")
    import os

    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")
    try:
        from vllm.v1.sample.ops import topk_topp_sampler as ops
    except ImportError:
        print("\n(vLLM not installed: skipping the real TopKTopPSampler)")
        return
    ops.compiled_random_sample = getattr(
        ops.compiled_random_sample, "_torchdynamo_orig_callable", ops.compiled_random_sample
    )  # eager: no 35 s compile on CPU
    print("\nvLLM 0.22.1 TopKTopPSampler on CPU, seed 7, 8 steps, vocab 16")
    for name, fwd in (
        ("forward_cpu (as shipped)", ops.TopKTopPSampler.forward_cpu),
        ("fixed_forward_cpu", fixed_forward_cpu),
        ("forward_native", ops.TopKTopPSampler.forward_native),
    ):
        print(f"  {name}")
        for n in (0, 1, 3):
            print(f"    +{n} companions: {seeded_draws(fwd, companions=n)}")


if __name__ == "__main__":
    main()
