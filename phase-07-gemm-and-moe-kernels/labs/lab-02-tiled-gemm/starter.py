"""Lab 07-02 — tiled GEMM and the memory-traffic model (starter: write the four functions).

``C = A @ B`` with ``A: (M, K)``, ``B: (K, N)``. A GEMM kernel computes ``C`` one output tile of
``tile_m × tile_n`` at a time; to compute a tile it must bring the ``tile_m × K`` panel of ``A``
and the ``K × tile_n`` panel of ``B`` from slow memory (HBM) into fast memory (shared memory /
registers). Everything inside the tile then reuses those panels for free.

Counting element loads from slow memory:

* naive (one output element at a time, tile 1 × 1):  ``M·N·2K``
* tiled:  ``M·K·ceil(N / tile_n) + K·N·ceil(M / tile_m)``
  (every A panel is loaded once per column of tiles, every B panel once per row of tiles)
* reuse = naive / tiled = ``2 / (1/tile_m + 1/tile_n)``: the harmonic mean of the tile sides,
  exact when the tiles divide the matrix.

``LoadMeter`` is the "slow memory": every block a kernel stages through ``meter.load`` is counted,
so the formula can be checked against what the loop really did.
"""

from __future__ import annotations

import numpy as np


# --------------------------------------------------------------------------- provided helper
class LoadMeter:
    """Counts elements loaded from slow memory. ``load(block)`` returns a fast-memory copy."""

    def __init__(self) -> None:
        self.loads = 0

    def load(self, block: np.ndarray) -> np.ndarray:
        self.loads += block.size
        return np.array(block)


# --------------------------------------------------------------------------- the lab
def tiled_gemm(A: np.ndarray, B: np.ndarray, tile_m: int, tile_n: int, meter: LoadMeter | None = None) -> np.ndarray:
    """``A @ B`` computed one ``tile_m × tile_n`` output tile at a time.

    For each tile, stage the A panel ``A[i0:i1, :]`` and the B panel ``B[:, j0:j1]`` through
    ``meter.load`` (exactly once each per tile), multiply them, and write the tile. Edge tiles
    are clipped with ``min(i0 + tile_m, M)`` / ``min(j0 + tile_n, N)``: CUTLASS calls this
    predication, Triton a mask.
    """
    raise NotImplementedError(
        "tiled_gemm: two loops over the tile grid (rows of C in steps of tile_m, columns in steps of tile_n) that "
        "also visit the partial last tile; clip each tile's end to the matrix; stage the tile's A panel (its rows, "
        "all of K) and B panel (all of K, its columns) through meter.load exactly once each, and multiply them"
    )


def naive_traffic(M: int, N: int, K: int) -> int:
    """Element loads of the untiled algorithm: each of the M·N outputs reads a row of A and a column of B."""
    raise NotImplementedError(
        "naive_traffic: count what ONE output element reads (a row of A and a column of B), then how many outputs there are"
    )


def tiled_traffic(M: int, N: int, K: int, tile_m: int, tile_n: int) -> int:
    """Element loads of the tiled algorithm: ``M·K·ceil(N/tile_n) + K·N·ceil(M/tile_m)``."""
    raise NotImplementedError(
        "tiled_traffic: all of A is loaded once per COLUMN of tiles and all of B once per ROW of tiles; a partial "
        "edge tile still loads whole panels, so count the tiles rounding up"
    )


def reuse_factor(tile_m: int, tile_n: int) -> float:
    """How many times fewer loads than naive (tiles dividing the matrix): ``2 / (1/tile_m + 1/tile_n)``."""
    raise NotImplementedError(
        "reuse_factor: divide naive_traffic by tiled_traffic for tiles that divide the matrix and simplify: the "
        "M, N and K cancel and a mean of the two tile sides is left (which mean?)"
    )


# --------------------------------------------------------------------------- what you should see
# Ridge point = dense bf16 FLOP/s / HBM bytes/s. A100: 312 TFLOP/s over ~2.0 TB/s (80 GB SXM: 2,039 GB/s),
# rounded as in Phase 00; H100 SXM: 989 TFLOP/s over 3.35 TB/s. NVIDIA A100 and H100 datasheets.
RIDGES = {"A100": 312e12 / 2.0e12, "H100 SXM": 989e12 / 3.35e12}


def main() -> None:
    M = N = K = 1024
    flops = 2 * M * N * K
    operands = (M * K + K * N + M * N) * 2
    print(f"{M}x{N}x{K} GEMM: {flops / 1e9:.2f} GFLOP; A, B and C in fp16 = {operands / 1e6:.2f} MB"
          f" -> at best {flops / operands:.0f} FLOP/byte")
    print(f"{'tile':>9} {'element loads':>15} {'MB (fp16)':>10} {'naive/tiled':>12} {'harmonic':>9} {'FLOP/byte':>10}")
    for tm, tn in [(1, 1), (16, 16), (64, 64), (128, 128), (256, 16), (256, 128), (256, 256)]:
        loads = tiled_traffic(M, N, K, tm, tn)
        print(f"{tm:>4}x{tn:<4} {loads:>15,} {loads * 2 / 1e6:>10.1f} {naive_traffic(M, N, K) / loads:>12.1f}"
              f" {reuse_factor(tm, tn):>9.1f} {flops / (loads * 2):>10.1f}")
    print("ridge points (dense bf16, datasheet peak / HBM bandwidth): "
          + ", ".join(f"{name} {r:.0f} FLOP/byte" for name, r in RIDGES.items()))
    print()
    print("decode shape: M=1 token, N=K=4096")
    for tm, tn in [(1, 128), (128, 128), (1, 4096)]:
        r = naive_traffic(1, 4096, 4096) / tiled_traffic(1, 4096, 4096, tm, tn)
        print(f"  tile {tm}x{tn}: naive/tiled = {r:.3f}  (weights streamed once: {4096 * 4096:,} loads of B)")
    print()
    A = np.random.default_rng(0).standard_normal((37, 19))
    B = np.random.default_rng(1).standard_normal((19, 23))
    for tm, tn in [(1, 1), (8, 5), (16, 16)]:
        meter = LoadMeter()
        C = tiled_gemm(A, B, tm, tn, meter)
        print(f"ragged 37x23 (K=19), tile {tm}x{tn}: counted {meter.loads:,} loads, formula "
              f"{tiled_traffic(37, 23, 19, tm, tn):,}, equals A @ B: {bool(np.allclose(C, A @ B))}")


if __name__ == "__main__":
    main()
