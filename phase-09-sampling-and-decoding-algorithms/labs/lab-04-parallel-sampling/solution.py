"""Lab 09-04 — parallel sampling (``n > 1``): the fan-out and the blocks the children share.

Reference solution. ``python solution.py`` prints the README's figures.

Part 1 is the front end's bookkeeping: one request with ``n`` samples becomes ``n`` child requests
(ids ``"{index}_{parent_id}"``, seeds ``seed + index``) and their outputs come back as one answer.
Part 2 is the arithmetic of what the children share: the prompt's full blocks, through the prefix
cache, and the blocks and hits that follow. Part 3 checks it on ``mini_vllm``'s scheduler.
"""

from __future__ import annotations

from dataclasses import dataclass

from mini_vllm.config import create_engine_config
from mini_vllm.request import Request
from mini_vllm.sampling_params import SamplingParams
from mini_vllm.scheduler import Scheduler


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
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < self.n:
            raise ValueError(f"child index must be in 0..{self.n - 1}, got {index!r}")
        child_id = f"{index}_{self.request_id}"
        self.child_requests.add(child_id)
        return child_id, None if self.seed is None else self.seed + index

    def get_outputs(self, child_request_id: str, output: ChildOutput) -> tuple[list[ChildOutput], bool]:
        """What to hand the caller now, and whether the whole request is finished."""
        already_returned = False
        if output.finished:
            if child_request_id in self.child_requests:
                self.child_requests.remove(child_request_id)
            else:
                already_returned = True  # finished in an earlier step and was handed back then
        if not self.final_only:
            outputs = [] if already_returned else [output]
        else:
            self.output_aggregator[output.index] = output
            outputs = [] if self.child_requests else list(self.output_aggregator)
        return outputs, not self.child_requests


# --- part 2: the arithmetic -------------------------------------------------------------------
def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def shared_prompt_blocks(prompt_len: int, block_size: int) -> int:
    """Blocks of the prompt a later child finds cached: whole blocks, never the last prompt token."""
    if prompt_len < 1 or block_size < 1:
        raise ValueError(f"prompt_len and block_size must be >= 1, got {prompt_len}, {block_size}")
    return (prompt_len - 1) // block_size


def predict_child_hits(prompt_len: int, n: int, block_size: int) -> list[int]:
    """Prefix-cache hit tokens per child, in admission order (child 0 first)."""
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    shared = shared_prompt_blocks(prompt_len, block_size) * block_size
    return [0] + [shared] * (n - 1)


def predict_counters(prompt_len: int, n: int, block_size: int) -> tuple[int, int]:
    """``(queries, hits)`` the prefix cache records: every child looks up its whole prompt."""
    return n * prompt_len, sum(predict_child_hits(prompt_len, n, block_size))


def blocks_used(prompt_len: int, n: int, max_tokens: int, block_size: int, sharing: bool) -> int:
    """KV blocks held at the last step, when ``n`` children generate ``max_tokens`` in lockstep.

    A child's last step computes the KV of ``prompt_len + max_tokens - 1`` tokens (the last
    sampled token's KV is never computed). With sharing, children 1..n-1 reuse the shared blocks.
    """
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    per_child = cdiv(prompt_len + max_tokens - 1, block_size)
    total = n * per_child
    if sharing:
        total -= (n - 1) * shared_prompt_blocks(prompt_len, block_size)
    return total


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
    config = create_engine_config(block_size=block_size, enable_prefix_caching=enable_caching, num_gpu_blocks=257)
    sched = Scheduler(config)
    kv = sched.kv_cache_manager
    parent = ParentRequest("req", n, seed=seed)
    children = []
    for i in range(n):
        child_id, child_seed = parent.get_child_info(i)
        params = SamplingParams(max_tokens=max_tokens, ignore_eos=True, seed=child_seed)
        children.append(Request(child_id, prompt, params))
        sched.add_request(children[-1])
    usable = config.cache_config.num_gpu_blocks - 1
    peak, first_tokens, tables, ref_cnt = 0, -1, [], -1
    for _ in range(10 * (len(prompt) + max_tokens)):
        if not sched.has_unfinished_requests():
            break
        out = sched.schedule()
        peak = max(peak, usable - kv.block_pool.get_num_free_blocks())
        if first_tokens < 0:
            first_tokens = out.total_num_scheduled_tokens
            tables = [kv.get_block_ids(c.request_id) for c in children]
            ref_cnt = kv.get_blocks(children[0].request_id)[0].ref_cnt
        sampled = {
            r.request_id: 1000 + int(r.request_id.split("_")[0])
            for r in out.scheduled_requests
            if Scheduler.needs_sample(r, out.num_scheduled_tokens[r.request_id])
        }
        sched.update_from_output(out, sampled)
    else:
        raise RuntimeError("mini_vllm did not finish the children within the step budget")
    stats = kv.make_prefix_cache_stats()
    return Measured(stats.queries, stats.hits, peak, first_tokens, tables, ref_cnt)


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
