"""Lab 09-04 — parallel sampling (``n > 1``): the fan-out and the blocks the children share.

Your file. Replace every ``NotImplementedError``; ``python starter.py`` prints the README's figures once it works.

Part 1 is the front end's bookkeeping: one request with ``n`` samples becomes ``n`` child requests
(ids ``"{index}_{parent_id}"``, seeds ``seed + index``) and their outputs come back as one answer.
Part 2 is the arithmetic of what the children share: the prompt's full blocks, through the prefix
cache, and the blocks and hits that follow. Part 3 checks it on ``mini_vllm``'s scheduler.
"""

from __future__ import annotations

from dataclasses import dataclass

from mini_vllm.config import create_engine_config  # noqa: F401  (what measure_mini needs)
from mini_vllm.request import Request  # noqa: F401
from mini_vllm.sampling_params import SamplingParams  # noqa: F401
from mini_vllm.scheduler import Scheduler  # noqa: F401


# --- part 1: the fan-out ----------------------------------------------------------------------
@dataclass(frozen=True)
class ChildOutput:
    """What one child produced so far: its index among the ``n``, its tokens, whether it is done."""

    index: int
    token_ids: tuple[int, ...]
    finished: bool


class ParentRequest:
    """One request with ``n`` samples, split into ``n`` independent child requests.

    ``final_only=True`` (a non-streaming call) hands back all ``n`` outputs at once, in index
    order, when the last child finishes; ``final_only=False`` (streaming) hands back each output
    as it arrives, and never a finished child a second time.
    """

    def __init__(self, request_id: str, n: int, seed: int | None = None, final_only: bool = True) -> None:
        if not isinstance(request_id, str) or not request_id:
            raise ValueError(f"request_id must be a non-empty str, got {request_id!r}")
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"n must be an int >= 1, got {n!r}")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
            raise ValueError(f"seed must be an int or None, got {seed!r}")
        self.request_id = request_id
        self.n = n
        self.seed = seed
        self.final_only = final_only
        self.child_requests: set[str] = set()  # children not finished yet
        self.output_aggregator: list[ChildOutput | None] = [None] * n if final_only else []

    def get_child_info(self, index: int) -> tuple[str, int | None]:
        """``(child request id, child seed)`` for child ``index``; registers the child as running."""
        raise NotImplementedError(
            "child id f'{index}_{request_id}', seed + index (None stays None); add the id to child_requests"
        )

    def get_outputs(self, child_request_id: str, output: ChildOutput) -> tuple[list[ChildOutput], bool]:
        """What to hand the caller now, and whether the whole request is finished."""
        raise NotImplementedError(
            "a finished child leaves child_requests (absent: already returned); streaming: pass the output on "
            "unless already returned; else fill output_aggregator[output.index], return it when no child is left"
        )


# --- part 2: the arithmetic -------------------------------------------------------------------
def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def shared_prompt_blocks(prompt_len: int, block_size: int) -> int:
    """Blocks of the prompt a later child finds cached: whole blocks, never the last prompt token."""
    raise NotImplementedError("whole blocks of the prompt, capped so the last prompt token is never a hit")


def predict_child_hits(prompt_len: int, n: int, block_size: int) -> list[int]:
    """Prefix-cache hit tokens per child, in admission order (child 0 first)."""
    raise NotImplementedError("child 0 hits nothing; each later child hits the shared blocks")


def predict_counters(prompt_len: int, n: int, block_size: int) -> tuple[int, int]:
    """``(queries, hits)`` the prefix cache records: every child looks up its whole prompt."""
    raise NotImplementedError("queries: every child looks up its whole prompt; hits: the sum of predict_child_hits")


def blocks_used(prompt_len: int, n: int, max_tokens: int, block_size: int, sharing: bool) -> int:
    """KV blocks held at the last step, when ``n`` children generate ``max_tokens`` in lockstep.

    A child's last step computes the KV of ``prompt_len + max_tokens - 1`` tokens (the last
    sampled token's KV is never computed). With sharing, children 1..n-1 reuse the shared blocks.
    """
    raise NotImplementedError(
        "n x cdiv(prompt_len + max_tokens - 1, block_size), minus what children 1..n-1 reuse when sharing"
    )


# --- part 3: on mini_vllm's scheduler ---------------------------------------------------------
@dataclass(frozen=True)
class Measured:
    queries: int  # prompt tokens looked up in the prefix cache
    hits: int  # of those, found cached
    peak_blocks: int  # most KV blocks in use at once
    first_step_tokens: int  # tokens computed in the step that admitted the children
    block_tables: list[list[int]]  # each child's block ids after that step
    first_block_ref_cnt: int  # ref_cnt of child 0's first block after that step


def measure_mini(
    prompt: list[int], n: int, max_tokens: int, block_size: int = 16, enable_caching: bool = True, seed: int = 0
) -> Measured:
    """Run the ``n`` children of one request through ``mini_vllm``'s ``Scheduler``, no model.

    The children are added before the first step, as the engine adds them. Each step, every
    child that needs a token gets ``1000 + its index`` (distinct tails, as sampling would give).
    """
    raise NotImplementedError(
        "a Scheduler from create_engine_config; add the n children (ParentRequest.get_child_info); step with "
        "schedule/update_from_output until done (a token only where Scheduler.needs_sample), tracking peak blocks; "
        "read kv.make_prefix_cache_stats()"
    )


# --- the README's figures ---------------------------------------------------------------------
PROMPT_LEN, N, MAX_TOKENS, BLOCK_SIZE = 100, 4, 24, 16


def make_prompt(length: int = PROMPT_LEN) -> list[int]:
    return [(7 * i + 3) % 350 + 5 for i in range(length)]


def main() -> None:
    parent = ParentRequest("cmpl-7", 3, seed=10)
    print("fan-out of request 'cmpl-7', n=3, seed=10:")
    for i in range(3):
        print(f"  child {i}: {parent.get_child_info(i)}")
    print(f"\none prompt of {PROMPT_LEN} tokens, n={N}, max_tokens={MAX_TOKENS}, block_size={BLOCK_SIZE}")
    q, h = predict_counters(PROMPT_LEN, N, BLOCK_SIZE)
    print(f"predicted hits per child {predict_child_hits(PROMPT_LEN, N, BLOCK_SIZE)}; queries {q}, hits {h}, "
          f"hit rate {h / q:.2%}")
    print(f"predicted blocks: {blocks_used(PROMPT_LEN, N, MAX_TOKENS, BLOCK_SIZE, True)} shared vs "
          f"{blocks_used(PROMPT_LEN, N, MAX_TOKENS, BLOCK_SIZE, False)} unshared")
    print("\nmini_vllm's Scheduler, the children added together:")
    print(f"  {'run':<12} {'queries':>7} {'hits':>5} {'peak blocks':>11} {'step-1 tokens':>13}  child block tables")
    for caching in (True, False):
        m = measure_mini(make_prompt(), N, MAX_TOKENS, BLOCK_SIZE, caching)
        tables = " ".join(str(t[:8]) for t in m.block_tables[:2])
        print(f"  {'caching ' + ('ON' if caching else 'OFF'):<12} {m.queries:>7} {m.hits:>5} {m.peak_blocks:>11} "
              f"{m.first_step_tokens:>13}  {tables} ...")
    print("\nhit rate and blocks against n (same prompt, predicted):")
    print(f"  {'n':>2} {'hit rate':>8} {'blocks shared':>13} {'unshared':>8}")
    for n in (1, 2, 4, 8):
        q, h = predict_counters(PROMPT_LEN, n, BLOCK_SIZE)
        print(f"  {n:>2} {h / q:>8.2%} {blocks_used(PROMPT_LEN, n, MAX_TOKENS, BLOCK_SIZE, True):>13} "
              f"{blocks_used(PROMPT_LEN, n, MAX_TOKENS, BLOCK_SIZE, False):>8}")


if __name__ == "__main__":
    main()
