"""Lab 03-03 — the capture-size ladder and the cost of padding (starter: write the five functions).

A CUDA graph replays only for the batch size it was captured with, so vLLM captures a *ladder*
of sizes at startup and pads every batch up to the next rung. You compute that ladder and what
the padding costs:

* ``default_capture_sizes(max_size)``: 1, 2, 4, then every multiple of 8 below 256, then every
  multiple of 16 up to ``max_size``;
* ``select_capture_size(batch, sizes)``: the smallest rung >= ``batch``, or ``None`` above the
  top rung (that batch runs eagerly: a normal path, not an error);
* ``padded_tokens(batch, sizes)``: junk rows the padding adds (rung - batch; 0 when eager);
* ``trace_waste(trace, sizes)``: the junk rows summed over a trace of batch sizes;
* ``engine_capture_sizes(max_num_seqs, max_num_batched_tokens)``: the ladder vLLM 0.22.1
  builds from an engine config when you do not pass one (``VllmConfig._set_cudagraph_sizes``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence


def default_capture_sizes(max_size: int) -> list[int]:
    """The default ladder up to ``max_size``: [1, 2, 4] (those <= max_size), every 8 below 256, every 16 from 256.

    ``ValueError`` unless ``max_size`` is a positive int. ``default_capture_sizes(64)`` is
    ``[1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64]``.
    """
    raise NotImplementedError(
        "three pieces: the rungs 1, 2, 4 that fit, then stride 8 from 8 while below 256, then stride 16 from 256 "
        "up to max_size; range() with a step builds each stride (validate max_size first)"
    )


def select_capture_size(batch: int, sizes: Sequence[int]) -> int | None:
    """The smallest rung >= ``batch`` (``ValueError`` if batch < 1); ``None`` above the top rung."""
    raise NotImplementedError("bisect.bisect_left(sorted(sizes), batch) finds the rung; past the end -> None")


def padded_tokens(batch: int, sizes: Sequence[int]) -> int:
    """Rows of padding a batch pays: ``rung - batch``; 0 on a rung and 0 when it runs eagerly."""
    raise NotImplementedError("rung = select_capture_size(batch, sizes); 0 if rung is None else rung - batch")


def trace_waste(trace: Iterable[int], sizes: Sequence[int]) -> int:
    """Total padded rows over a trace of per-step batch sizes."""
    raise NotImplementedError("sum padded_tokens(b, sizes) over the trace")


def engine_capture_sizes(
    max_num_seqs: int,
    max_num_batched_tokens: int,
    max_capture_size: int | None = None,
    decode_query_len: int = 1,
) -> list[int]:
    """The default ladder an engine with this scheduler config captures.

    The top is ``min(max_num_seqs * decode_query_len * 2, 512)`` unless given, capped by
    ``max_num_batched_tokens``; the ladder follows ``default_capture_sizes``, and
    ``max_num_batched_tokens`` itself is added when it fits under the top.
    """
    raise NotImplementedError(
        "top = min(max_num_batched_tokens, max_capture_size or min(max_num_seqs * decode_query_len * 2, 512)); "
        "ladder = default_capture_sizes(top); append max_num_batched_tokens if <= top and missing"
    )


def main() -> None:
    small = default_capture_sizes(64)
    print(f"ladder for max 64 ({len(small)} rungs): {small}")
    big = default_capture_sizes(512)
    print(f"ladder for max 512: {len(big)} rungs = 3 (1,2,4) + {sum(8 <= s < 256 for s in big)} "
          f"(every 8 below 256) + {sum(s >= 256 for s in big)} (every 16 from 256)")
    rule_of_8 = [1, 2, 4] + list(range(8, 513, 8))
    print(f"'[1,2,4] + every multiple of 8' would give {len(rule_of_8)} rungs for 512; "
          f"23 rungs of that rule means a max of {rule_of_8[22]}")
    for seqs, tokens in ((256, 8192), (1024, 16384), (8, 8192), (256, 100)):
        ladder = engine_capture_sizes(seqs, tokens)
        print(f"engine max_num_seqs={seqs:<5} max_num_batched_tokens={tokens:<6} -> "
              f"{len(ladder):>2} rungs, top {ladder[-1]}")

    print("\npadding on the default 512 ladder")
    print(f"{'batch':>5} {'rung':>5} {'junk':>5} {'extra work':>11} {'junk share':>11}")
    for b in (1, 3, 5, 33, 100, 250, 257, 511, 513):
        rung = select_capture_size(b, big)
        junk = padded_tokens(b, big)
        if rung is None:
            print(f"{b:>5} {'eager':>5} {junk:>5} {'-':>11} {'-':>11}")
        else:
            print(f"{b:>5} {rung:>5} {junk:>5} {junk / b:>11.1%} {junk / rung:>11.1%}")

    trace = [1, 3, 5, 9, 17, 33, 60, 64, 65, 100, 130, 250]
    every4 = list(range(4, 513, 4))
    pow2 = [1 << i for i in range(10)]
    print(f"\ntrace {trace}")
    for name, ladder in (("default", big), ("every 4", [1, 2] + every4), ("powers of 2", pow2)):
        print(f"{name:>12}: {len(ladder):>3} rungs, {trace_waste(trace, ladder):>4} padded rows")


if __name__ == "__main__":
    main()
