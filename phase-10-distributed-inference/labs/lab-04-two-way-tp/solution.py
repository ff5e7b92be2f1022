"""Lab 10-04 reference: two-way tensor parallelism, one rank at a time.

Lab 01 simulated every rank in one loop. Here each function is what ONE rank runs, as in vLLM's
worker processes: ``load_*_shard`` cut a full checkpoint tensor down to the rank's piece (what
``ColumnParallelLinear.weight_loader`` and ``RowParallelLinear.weight_loader`` keep),
``mlp_rank_forward`` runs the rank's share of a column → row block and calls the group's
collective itself, and ``predict_step_collectives`` counts what a whole Llama forward step sends
at a given TP size. The tests run the ranks as threads (``ThreadGroup``), as two gloo processes
beside vLLM's real layers (marked ``slow``) and against the real engine's TP=2 workers (``engine``).
Convention: ``y = x @ W.T`` with ``W`` shaped ``(out_features, in_features)``.
"""

from __future__ import annotations

from typing import NamedTuple, Protocol

import numpy as np

from course.runtime import use_lab
from mini_vllm.executor import pad_vocab_size

LAB01 = use_lab("phase-10/lab-01-tp-sharding-math")  # shard(n, num_ranks, rank): the equal, in-order slice
LAB02 = use_lab("phase-10/lab-02-tp-comm-cost")  # the ring cost model: allreduce_time_s, Link, LINKS


class Group(Protocol):
    """What a rank can call on its TP group (``ThreadGroup`` in the tests, gloo in the slow test)."""

    world: int  # ranks in the group
    def all_reduce(self, array: np.ndarray) -> np.ndarray: ...  # element-wise sum over ranks, on every rank
    def all_gather(self, array: np.ndarray) -> np.ndarray: ...  # ranks' arrays side by side (last axis)


class MLPShard(NamedTuple):
    w1: np.ndarray  # (inter / tp, hidden): this rank's output rows of the column-parallel weight
    b1: np.ndarray | None  # (inter / tp,): its slice of the column-parallel bias
    w2: np.ndarray  # (hidden, inter / tp): this rank's input columns of the row-parallel weight
    b2: np.ndarray | None  # (hidden,): the row-parallel bias, whole on every rank


class StepCollectives(NamedTuple):
    all_reduces: int  # sums over the TP group in one forward step
    all_reduce_bytes: int  # payload of each one: the full-shaped activation every rank holds
    all_gathers: int  # the logits gather
    all_gather_bytes: int  # what each rank contributes to it: its vocabulary slice of each sequence's logits


def load_column_shard(weight: np.ndarray, bias: np.ndarray | None, rank: int,
                      tp_size: int) -> tuple[np.ndarray, np.ndarray | None]:
    """Rank ``rank``'s piece of a column-parallel layer: output rows ``s`` of ``weight`` and ``bias[s]``.

    ``s = LAB01.shard(out_features, tp_size, rank)``. Raises ``ValueError`` (from ``shard``) when
    ``out_features`` does not split evenly or the rank is out of range.
    """
    s = LAB01.shard(weight.shape[0], tp_size, rank)
    return weight[s], None if bias is None else bias[s]


def load_row_shard(weight: np.ndarray, bias: np.ndarray | None, rank: int,
                   tp_size: int) -> tuple[np.ndarray, np.ndarray | None]:
    """Rank ``rank``'s piece of a row-parallel layer: input columns ``s`` of ``weight``, and the WHOLE bias.

    The bias is per output feature and the outputs are not split, so every rank keeps all of it
    (and only rank 0 adds it: see ``mlp_rank_forward``). Raises ``ValueError`` when
    ``in_features`` does not split evenly or the rank is out of range.
    """
    s = LAB01.shard(weight.shape[1], tp_size, rank)
    return weight[:, s], bias


def load_mlp_shard(w1: np.ndarray, b1: np.ndarray | None, w2: np.ndarray, b2: np.ndarray | None,
                   rank: int, tp_size: int) -> MLPShard:
    """The rank's pieces of ``relu(x @ w1.T + b1) @ w2.T + b2``: ``w1`` column-, ``w2`` row-parallel."""
    if w1.shape[0] != w2.shape[1]:
        raise ValueError(f"w1 makes {w1.shape[0]} features but w2 takes {w2.shape[1]}")
    c_w, c_b = load_column_shard(w1, b1, rank, tp_size)
    r_w, r_b = load_row_shard(w2, b2, rank, tp_size)
    return MLPShard(c_w, c_b, r_w, r_b)


def mlp_rank_forward(x: np.ndarray, shard: MLPShard, rank: int, group: Group) -> np.ndarray:
    """One rank's share of the block, finished by exactly one ``group.all_reduce`` (none when alone).

    The rank's hidden slice ``relu(x @ w1.T + b1)`` never leaves it; its product with ``w2`` is a
    full-shaped partial sum. ``b2`` joins on rank 0 only, before the sum, so it is counted once.
    Returns the block's output, the same on every rank.
    """
    h = x @ shard.w1.T
    if shard.b1 is not None:
        h = h + shard.b1
    partial = np.maximum(h, 0.0) @ shard.w2.T
    if shard.b2 is not None and rank == 0:
        partial = partial + shard.b2
    if group.world == 1:  # alone: nothing to sum with (vLLM's RowParallelLinear skips it too)
        return partial
    return group.all_reduce(partial)


def _check_int(name: str, value: object, low: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{name} must be an int >= {low}, got {value!r}")


def predict_step_collectives(num_layers: int, hidden: int, vocab_size: int, num_tokens: int, num_seqs: int,
                             tp_size: int, dtype_bytes: int = 2) -> StepCollectives:
    """What one Llama forward step sends over a TP group of ``tp_size``: counts and bytes per rank.

    Each decoder layer has two column → row blocks (attention, MLP): one all-reduce each. The
    vocabulary-parallel embedding adds one more (each rank looks up only its ids, the sum fills
    in the rest). Every all-reduce carries ``num_tokens × hidden`` values. The LM head is
    vocabulary parallel too: each rank computes the logits of its slice of the padded vocabulary
    (``pad_vocab_size``) for the ``num_seqs`` rows that get sampled, and one all-gather assembles
    them. At TP=1 nothing is sent. Raises ``ValueError`` for a count below 1, ``num_seqs > num_tokens``,
    or a padded vocabulary that does not split evenly over ``tp_size`` (vLLM's ``divide`` refuses it).
    """
    for name, value, low in (("num_layers", num_layers, 1), ("hidden", hidden, 1), ("vocab_size", vocab_size, 1),
                             ("num_tokens", num_tokens, 1), ("num_seqs", num_seqs, 1), ("tp_size", tp_size, 1),
                             ("dtype_bytes", dtype_bytes, 1)):
        _check_int(name, value, low)
    if num_seqs > num_tokens:
        raise ValueError(f"num_seqs ({num_seqs}) cannot exceed num_tokens ({num_tokens}): each sequence "
                         f"schedules at least one token")
    if tp_size == 1:
        return StepCollectives(0, 0, 0, 0)
    padded = pad_vocab_size(vocab_size)
    if padded % tp_size:
        raise ValueError(f"the padded vocabulary ({padded}) does not split over {tp_size} ranks")
    return StepCollectives(
        all_reduces=2 * num_layers + 1,
        all_reduce_bytes=num_tokens * hidden * dtype_bytes,
        all_gathers=1,
        all_gather_bytes=num_seqs * (padded // tp_size) * dtype_bytes,
    )


def predict_generate_collectives(prompt_lens: list[int], max_tokens: int, num_layers: int, hidden: int,
                                 vocab_size: int, tp_size: int, dtype_bytes: int = 2) -> list[StepCollectives]:
    """One ``StepCollectives`` per engine step of a greedy ``generate`` with ``max_tokens`` each.

    Assumes every prompt fits the first step's token budget (no chunking) and no request stops
    early: step 0 schedules all prompt tokens and samples one token per sequence, then each of
    the ``max_tokens - 1`` decode steps schedules one token per sequence. Raises ``ValueError`` for no
    prompts, a prompt length below 1 or ``max_tokens`` below 1 (vLLM's ``SamplingParams`` refuses 0).
    """
    if not prompt_lens:
        raise ValueError("no prompts: nothing is scheduled, there is no step to predict")
    for n in prompt_lens:
        _check_int("a prompt length", n, 1)
    _check_int("max_tokens", max_tokens, 1)
    seqs = len(prompt_lens)
    steps = [predict_step_collectives(num_layers, hidden, vocab_size, sum(prompt_lens), seqs, tp_size, dtype_bytes)]
    decode = predict_step_collectives(num_layers, hidden, vocab_size, seqs, seqs, tp_size, dtype_bytes)
    return steps + [decode] * (max_tokens - 1)


def predicted_comm_s(step: StepCollectives, tp_size: int, link: LAB02.Link) -> float:
    """Predicted wire time of one step's collectives on ``link`` (ring algorithms, no overlap).

    All-reduce: lab 02's ``allreduce_time_s`` (``2 (n - 1) / n × bytes / bandwidth`` plus
    ``2 (n - 1)`` hop latencies). All-gather: each rank sends ``(n - 1)`` contributions over
    ``n - 1`` hops.
    """
    if tp_size == 1:
        return 0.0
    reduce_s = LAB02.allreduce_time_s(step.all_reduce_bytes, tp_size, link)
    gather_s = (tp_size - 1) * (step.all_gather_bytes / link.bandwidth_bytes_per_s + link.latency_s)
    return step.all_reduces * reduce_s + step.all_gathers * gather_s


# The tiny Llama of the tier-2 engine (course/runtime/tiny_model.py) and a real small Llama for run.py.
TINY = {"num_layers": 2, "hidden": 256, "vocab_size": 512}
TINYLLAMA_1B = {"num_layers": 22, "hidden": 2048, "vocab_size": 32000}


def main() -> None:
    from mini_vllm.testing.tp_gloo import ThreadGroup

    rng = np.random.default_rng(0)
    hidden, inter, tokens = 8, 16, 4
    x = rng.standard_normal((tokens, hidden))
    w1, b1 = rng.standard_normal((inter, hidden)), rng.standard_normal(inter)
    w2, b2 = rng.standard_normal((hidden, inter)), rng.standard_normal(hidden)
    dense = np.maximum(x @ w1.T + b1, 0) @ w2.T + b2
    print(f"MLP block: x {x.shape}, w1 {w1.shape} column-parallel, w2 {w2.shape} row-parallel, biases, float64")
    print("tp | w1 shard | w2 shard | b2 kept | = dense (1e-12) | all-reduces | all-gathers | bytes reduced")
    for tp in (1, 2, 4):
        group = ThreadGroup(tp)
        shards = [load_mlp_shard(w1, b1, w2, b2, r, tp) for r in range(tp)]
        outs = group.run(lambda r, g, shards=shards: mlp_rank_forward(x, shards[r], r, g))
        err = max(np.abs(o - dense).max() for o in outs)
        print(f"{tp:>2} | {str(shards[0].w1.shape):>8} | {str(shards[0].w2.shape):>8} | {str(shards[0].b2.shape):>7} |"
              f" {str(bool(err < 1e-12)):>15} | {group.calls['all_reduce']:>11} | {group.calls['all_gather']:>11} |"
              f" {group.bytes['all_reduce']:>13}")
    try:
        load_column_shard(np.zeros((10, 4)), None, 0, 4)
    except ValueError as exc:
        print(f"10 output rows over 4 ranks: ValueError: {exc}")

    print()
    print("the tiny engine model (2 layers, hidden 256, vocab 512, float32), prompts of 16 and 3 tokens,")
    print("max_tokens=4, TP=2 — predicted per step, per rank:")
    steps = predict_generate_collectives([16, 3], 4, tp_size=2, dtype_bytes=4, **TINY)
    for i, s in enumerate(steps):
        kind = "prefill" if i == 0 else "decode "
        print(f"  step {i} ({kind}): {s.all_reduces} all-reduces x {s.all_reduce_bytes:>6} B,"
              f" {s.all_gathers} all-gather x {s.all_gather_bytes} B")
    total = sum(s.all_reduces for s in steps), sum(s.all_reduces * s.all_reduce_bytes for s in steps)
    print(f"  whole generate: {total[0]} all-reduces, {total[1]} B summed per rank")

    print()
    print("predicted, not measured — TinyLlama-1.1B (22 layers, hidden 2048, bf16) at TP=2, one decode token:")
    step = predict_step_collectives(num_tokens=1, num_seqs=1, tp_size=2, **TINYLLAMA_1B)
    print(f"  {step.all_reduces} all-reduces of {step.all_reduce_bytes} B (2 per layer + the embedding),"
          f" 1 all-gather of {step.all_gather_bytes} B per rank")
    ring = LAB02.ring_allreduce_traffic_per_rank(step.all_reduce_bytes, 2)
    print(f"  ring traffic per all-reduce per rank = 2(n-1)/n x bytes = {ring:.0f} B")
    for key in ("nvlink", "ethernet"):
        link = LAB02.LINKS[key]
        print(f"  {link.name:<22} predicted comm per decode step: {predicted_comm_s(step, 2, link) * 1e6:8.1f} us")


if __name__ == "__main__":
    main()
