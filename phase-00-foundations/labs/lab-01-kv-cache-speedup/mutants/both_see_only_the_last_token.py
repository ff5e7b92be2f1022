"""MUTANT — both generators feed next_token only the newest token, so they agree with each other but not with the model (only a check against next_token of the full context catches it).

Lab 00-01 — the KV-cache speedup, counted instead of timed (reference solution).

A toy "model" generates tokens one at a time. Every forward pass must have the keys and
values (K/V) of every earlier token available. You write two generators:

* ``generate_no_cache`` recomputes K/V for *every* token in the sequence before each new token;
* ``generate_with_cache`` keeps the K/V it already computed and only computes K/V for the
  tokens that are not in the cache yet (the whole prompt once, then one token per step).

Both must emit exactly the same tokens: a cache changes how much work is done, never the
answer. Work is counted by ``KVWork`` (one unit per token whose K/V is computed), so the
figures are exact and the same on every machine.
"""

from __future__ import annotations

import zlib
from array import array
from dataclasses import dataclass

VOCAB_SIZE = 1000


# --------------------------------------------------------------------------- provided helpers
@dataclass
class KVWork:
    """A work meter: one unit per token whose key/value vectors are computed."""

    units: int = 0

    def compute_kv(self, tok: int, pos: int) -> tuple[int, int]:
        """Pretend to run the K and V projections for ``tok`` at ``pos``; costs one unit.

        The returned pair is a deterministic stand-in for the real K and V vectors.
        """
        self.units += 1
        return (tok * 31 + pos) % 97, (tok * 17 + pos * 3) % 89


def next_token(tokens: list[int]) -> int:
    """The toy model's prediction: a deterministic hash (CRC-32) of the *whole* context.

    Change any earlier token, or drop one, and the prediction changes: just like a real
    model, it depends on everything it has seen.
    """
    return zlib.crc32(array("q", tokens).tobytes()) % VOCAB_SIZE


def _check(prompt: list[int], n_new: int) -> None:
    if len(prompt) == 0:
        raise ValueError("prompt must hold at least one token")
    if n_new < 0:
        raise ValueError(f"n_new must be >= 0, got {n_new}")


# --------------------------------------------------------------------------- the lab
def generate_no_cache(
    prompt: list[int], n_new: int, meter: KVWork | None = None
) -> tuple[list[int], int]:
    """Generate ``n_new`` tokens, recomputing K/V for every token before each prediction.

    Step ``i`` (0-indexed) sees ``len(prompt) + i`` tokens and computes K/V for all of them,
    then appends ``next_token(tokens)``. Returns ``(prompt + generated tokens, total work)``.
    """
    _check(prompt, n_new)
    meter = meter if meter is not None else KVWork()
    tokens = list(prompt)
    for _ in range(n_new):
        kv = [meter.compute_kv(t, pos) for pos, t in enumerate(tokens)]  # thrown away each step
        assert len(kv) == len(tokens)
        tokens.append(next_token(tokens[-1:]))
    return tokens, meter.units


def generate_with_cache(
    prompt: list[int], n_new: int, meter: KVWork | None = None
) -> tuple[list[int], int]:
    """Generate ``n_new`` tokens, computing each token's K/V exactly once.

    Before each prediction, compute K/V only for tokens not yet in the cache: the whole
    prompt on the first step (prefill), then the single token appended by the previous step
    (decode). The prediction still sees the full token list. Returns
    ``(prompt + generated tokens, total work)``.
    """
    _check(prompt, n_new)
    meter = meter if meter is not None else KVWork()
    tokens = list(prompt)
    cache: list[tuple[int, int]] = []  # cache[pos] = (K, V) of tokens[pos]
    for _ in range(n_new):
        for pos in range(len(cache), len(tokens)):  # catch the cache up with the sequence
            cache.append(meter.compute_kv(tokens[pos], pos))
        tokens.append(next_token(tokens[-1:]))
    return tokens, meter.units


# --------------------------------------------------------------------------- what you should see
def main() -> None:
    prompt = [11, 22, 33, 44, 55]
    toks_a, work_a = generate_no_cache(prompt, 10)
    toks_b, work_b = generate_with_cache(prompt, 10)
    print(f"prompt P={len(prompt)}, n_new=10")
    print(f"  tokens (no cache)  : {toks_a}")
    print(f"  tokens (with cache): {toks_b}")
    print(f"  identical: {toks_a == toks_b}")
    print(f"  K/V work without cache: {work_a}  (5+6+...+14)")
    print(f"  K/V work with cache   : {work_b}  (5 for the prompt + 9 decode steps x 1)")
    print()
    print(f"{'n_new':>6} {'no cache':>10} {'cached':>8} {'ratio':>8}")
    for n in (1, 10, 100, 1000, 2000):
        _, w0 = generate_no_cache(prompt, n)
        _, w1 = generate_with_cache(prompt, n)
        print(f"{n:>6} {w0:>10} {w1:>8} {w0 / w1:>7.1f}x")


if __name__ == "__main__":
    main()
