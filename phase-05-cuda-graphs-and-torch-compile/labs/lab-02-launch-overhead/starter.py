"""Lab 03-02 — launch overhead: when does a CUDA graph pay for itself? (starter: write the seven formulas)

Two small models, both counted rather than timed.

**Launch counts** (the unit is one kernel launch, i.e. some microseconds of CPU):

* ``eager_launches(n, k)``: ``k`` eager calls of an ``n``-kernel step cost ``k * n`` launches.
* ``graph_launches(n, k, c)``: one capture (``c`` launches, ``n`` by default) plus ``k - 1``
  single-launch replays.
* ``crossover(n, c)``: the first call count ``k`` at which the graph total is strictly below
  eager; solving ``c + k - 1 < k * n`` gives ``k > (c - 1) / (n - 1)``. ``None`` when ``n == 1``.
* ``asymptotic_speedup(n, k, c)``: eager / graph launches after ``k`` calls; it climbs toward
  ``n`` from below and never reaches it.

**Step time** (microseconds), for one decode step of ``n`` kernels of ``kernel_us`` GPU time
each, launched by a CPU that needs ``launch_us`` per launch:

* eager: launches and kernels pipeline, so after the first launch the step advances by
  ``max(launch_us, kernel_us)`` per kernel: ``launch_us + (n - 1) * max(launch_us, kernel_us) + kernel_us``.
* graph: one replay launch, then the kernels back to back: ``replay_us + n * kernel_us``.

The ratio is the predicted speedup: about ``n * launch_us / (launch_us + n * kernel_us)``
while the GPU waits on the CPU, falling to about 1 once ``kernel_us >= launch_us``.
"""

from __future__ import annotations


def _check_n(num_ops: int) -> None:
    if isinstance(num_ops, bool) or not isinstance(num_ops, int) or num_ops < 1:
        raise ValueError(f"num_ops must be a positive int, got {num_ops!r}")


def _check_k(k: int) -> None:
    if isinstance(k, bool) or not isinstance(k, int) or k < 0:
        raise ValueError(f"k (number of calls) must be an int >= 0, got {k!r}")


def _capture(num_ops: int, capture_cost_ops: int | None) -> int:
    c = num_ops if capture_cost_ops is None else capture_cost_ops
    if isinstance(c, bool) or not isinstance(c, int) or c < 1:
        raise ValueError(f"capture_cost_ops must be a positive int (or None for num_ops), got {c!r}")
    return c


def eager_launches(num_ops: int, k: int) -> int:
    """Launches for ``k`` eager calls of a ``num_ops``-kernel step: ``k * num_ops``."""
    raise NotImplementedError("k eager calls pay num_ops launches each: return k * num_ops (validate with _check_n/_check_k)")


def graph_launches(num_ops: int, k: int, capture_cost_ops: int | None = None) -> int:
    """Launches for ``k`` graphed calls: one capture, then ``k - 1`` one-launch replays (0 if ``k == 0``)."""
    raise NotImplementedError("one capture (capture_cost_ops, default num_ops) + (k - 1) single-launch replays; 0 when k == 0")


def crossover(num_ops: int, capture_cost_ops: int | None = None) -> int | None:
    """First call count at which graphs have launched strictly less than eager; None if never."""
    raise NotImplementedError(
        "None when num_ops == 1; else the smallest int k with c + k - 1 < k * n, i.e. (c - 1) // (n - 1) + 1"
    )


def asymptotic_speedup(num_ops: int, k: int, capture_cost_ops: int | None = None) -> float:
    """Eager launches / graph launches after ``k >= 1`` calls; rises toward ``num_ops``."""
    raise NotImplementedError("return eager_launches(...) / graph_launches(...) for k >= 1 (ValueError for k == 0)")


# --- step time: the launch model with the GPU put back in -------------------------------------


def _check_time(name: str, value: float) -> None:
    if not value >= 0:
        raise ValueError(f"{name} must be a time >= 0 in microseconds, got {value!r}")


def eager_step_us(num_kernels: int, launch_us: float, kernel_us: float) -> float:
    """One eager step: launches and kernels overlap, so the slower of the two sets the pace."""
    raise NotImplementedError("pipelined: launch_us + (n - 1) * max(launch_us, kernel_us) + kernel_us")


def graph_step_us(num_kernels: int, launch_us: float, kernel_us: float, replay_us: float | None = None) -> float:
    """One replayed step: a single launch (``replay_us``, default ``launch_us``), then the kernels back to back."""
    raise NotImplementedError("one replay launch (replay_us, default launch_us) + n * kernel_us back to back")


def predicted_speedup(num_kernels: int, launch_us: float, kernel_us: float, replay_us: float | None = None) -> float:
    """Eager step time / graph step time."""
    raise NotImplementedError("return eager_step_us(...) / graph_step_us(...)")


def main() -> None:
    n, launch = 300, 5.0
    print(f"CPU cost of launching one step: {n} kernels x {launch:.0f} us = {n * launch:.0f} us")
    print("\nstep time for n=300 kernels, launch 5 us (pipelined eager vs one replay)")
    print(f"{'kernel_us':>9} {'gpu_us':>7} {'eager_us':>9} {'gpu_busy':>9} {'graph_us':>9} {'speedup':>8}")
    for k_us in (0.5, 1.0, 2.0, 5.0, 10.0, 20.0):
        e, g = eager_step_us(n, launch, k_us), graph_step_us(n, launch, k_us)
        print(f"{k_us:>9.1f} {n * k_us:>7.0f} {e:>9.0f} {n * k_us / e:>9.0%} {g:>9.0f} {e / g:>8.2f}")
    serial = n * launch + n * launch
    print(f"\nno overlap at all (CPU and GPU take turns), kernel_us=5: {serial:.0f} us, GPU busy "
          f"{n * launch / serial:.0%}")

    print("\nlaunch counts after k calls (capture cost = n)")
    print(f"{'n':>4} {'k':>6} {'eager':>8} {'graph':>7} {'ratio':>7}")
    for num_ops in (3, 300):
        for k in (1, 2, 10, 100, 1000):
            print(f"{num_ops:>4} {k:>6} {eager_launches(num_ops, k):>8} {graph_launches(num_ops, k):>7} "
                  f"{asymptotic_speedup(num_ops, k):>7.2f}")

    print("\ncrossover call (first k where graph < eager)")
    print(f"{'n':>4} {'c=n':>5} {'c=5n':>5}")
    for num_ops in (1, 4, 32, 300):
        a, b = crossover(num_ops), crossover(num_ops, 5 * num_ops)
        print(f"{num_ops:>4} {a!s:>5} {b!s:>5}")


if __name__ == "__main__":
    main()
