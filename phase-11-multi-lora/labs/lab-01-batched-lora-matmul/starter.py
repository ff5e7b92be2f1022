"""Lab 11-01 starter: apply many LoRA adapters to one batch with one shared base matmul.

Every matrix product goes through the ``matmul`` argument (``np.matmul`` by default) so the
tests can count them: a batch costs one base product plus one shrink and one expand per
distinct adapter, however many rows it has.
Grade with: LAB_IMPL=starter pytest phase-11-multi-lora/labs/lab-01-batched-lora-matmul -q
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from mini_vllm.lora import LoRAAdapter

Matmul = Callable[[np.ndarray, np.ndarray], np.ndarray]


def lora_delta(x: np.ndarray, A: np.ndarray, B: np.ndarray, scaling: float, matmul: Matmul = np.matmul) -> np.ndarray:
    """``scaling · (x @ Aᵀ) @ Bᵀ`` for rows ``x`` of shape ``(n, in)``; ``A`` is ``(r, in)``, ``B`` ``(out, r)``.

    Two products through the rank-r bottleneck (shrink to r, expand to out). Never form ``B @ A``:
    that is an ``(out, in)`` matrix, as big as the base weight.
    """
    raise NotImplementedError(
        'shrink with matmul(x, A.T), expand with matmul(s, B.T), multiply by scaling once'
    )


def apply_single(x: np.ndarray, W: np.ndarray, adapter: LoRAAdapter | None, matmul: Matmul = np.matmul) -> np.ndarray:
    """One request's output: ``x @ Wᵀ`` plus its adapter's delta (none when ``adapter`` is None)."""
    raise NotImplementedError(
        'return matmul(x, W.T), plus lora_delta(...) when adapter is not None'
    )


def apply_batched(
    x: np.ndarray,
    W: np.ndarray,
    adapter_index_per_row: Sequence[int],
    slots: Sequence[LoRAAdapter | None],
    matmul: Matmul = np.matmul,
) -> np.ndarray:
    """Row i's output is ``apply_single(x[i], W, slots[adapter_index_per_row[i]])``, computed grouped.

    1. One base product ``x @ Wᵀ`` for the whole batch.
    2. For each distinct slot index (ascending), gather its rows, compute their delta with one
       shrink and one expand, and add it back into those rows.
    Rows with index −1 use no adapter: they keep the base output exactly.
    Raises ``ValueError`` when the index list's length differs from the number of rows, when an
    index is outside ``-1 .. len(slots) - 1``, or when a row points at an empty slot.
    """
    raise NotImplementedError(
        "validate the indices, do ONE matmul(x, W.T), then for each distinct slot index "
        ">= 0 gather its rows and add lora_delta; skip -1 rows"
    )


class CountingMatmul:
    """``np.matmul`` that counts its calls and the multiply-adds they did."""

    def __init__(self) -> None:
        self.calls = 0
        self.macs = 0

    def __call__(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        self.calls += 1
        self.macs += a.shape[0] * a.shape[1] * b.shape[1]
        return np.matmul(a, b)


def demo() -> None:
    rng = np.random.default_rng(0)
    d_in, d_out, rank, rows = 256, 256, 8, 64
    W = rng.standard_normal((d_out, d_in)) / np.sqrt(d_in)
    slots = [LoRAAdapter.random(d_in, d_out, rank, seed=s, std=0.1, alpha=16) for s in range(4)]
    x = rng.standard_normal((rows, d_in))
    idx = [(i % 5) - 1 for i in range(rows)]  # -1, 0, 1, 2, 3, -1, ...
    grouped = CountingMatmul()
    y = apply_batched(x, W, idx, slots, grouped)
    loop = CountingMatmul()
    ref = np.stack([apply_single(x[i : i + 1], W, None if s < 0 else slots[s], loop)[0] for i, s in enumerate(idx)])
    base = sum(1 for s in idx if s < 0)
    print(f"batch: {rows} rows, d_in={d_in}, d_out={d_out}, rank {rank}; {base} base rows, 4 adapters")
    print(f"  grouped : {grouped.calls:3d} matmul calls, {grouped.macs:9,d} multiply-adds")
    print(f"  per row : {loop.calls:3d} matmul calls, {loop.macs:9,d} multiply-adds")
    print(f"  grouped equals per row (to 1e-12): {np.allclose(y, ref, rtol=0, atol=1e-12)}")
    base_rows = np.array(idx) < 0
    print(f"  base rows equal x @ W.T exactly: {np.array_equal(y[base_rows], (x @ W.T)[base_rows])}")
    lora_macs = grouped.macs - rows * d_in * d_out
    print(f"  LoRA share of the work: {lora_macs:,d} / {grouped.macs:,d} = {lora_macs / grouped.macs:.1%}"
          f" (per LoRA row r(in+out)/(in*out) = {rank * (d_in + d_out) / (d_in * d_out):.2%})")
    d = np.stack([lora_delta(x, a.A, a.B, a.scaling) for a in slots[:1]])[0]
    print(f"  rank of one adapter's delta over {rows} rows: {np.linalg.matrix_rank(d)}")


if __name__ == "__main__":
    demo()
