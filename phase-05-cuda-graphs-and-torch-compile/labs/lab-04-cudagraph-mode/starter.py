"""Lab 03-04 — CUDAGraphMode routing and the cudagraph dispatcher (starter: write the routing functions and the dispatcher).

vLLM names its graph strategy with one enum, ``CUDAGraphMode``. Three members are *runtime*
modes a single forward pass can run in: ``NONE`` (eager), ``PIECEWISE`` (graphs between the
attention ops, attention eager) and ``FULL`` (the whole forward is one graph). Two members are
*composites*, a ``(decode_mode, mixed_mode)`` pair that picks a different routine for pure-decode
batches and for mixed prefill+decode batches:

    FULL_DECODE_ONLY   = (FULL, NONE)
    FULL_AND_PIECEWISE = (FULL, PIECEWISE)     <- the default

Modes are plain strings here. The first six functions mirror the enum's methods; ``Dispatcher``
mirrors ``CudagraphDispatcher``: at startup it turns (mode, capture sizes, max_num_seqs) into
the set of graphs to capture per runtime mode, and per step it turns (num_tokens, is this a
uniform decode batch?) into (runtime mode, padded num_tokens).
"""

from __future__ import annotations

from collections.abc import Iterable

from mini_vllm.cudagraph import select_capture_size  # noqa: F401 (you will need it in dispatch)

MODES = ("NONE", "PIECEWISE", "FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE")
RUNTIME_MODES = ("NONE", "PIECEWISE", "FULL")
ROUTINES = {"FULL_DECODE_ONLY": ("FULL", "NONE"), "FULL_AND_PIECEWISE": ("FULL", "PIECEWISE")}


def _check(mode: str) -> str:
    if mode not in MODES:
        raise ValueError(f"unknown CUDAGraphMode {mode!r}; expected one of {MODES}")
    return mode


def separate_routine(mode: str) -> bool:
    """True for a composite mode: decode and mixed batches get different routines."""
    raise NotImplementedError("a mode is composite iff it is a key of ROUTINES (call _check(mode) first)")


def decode_mode(mode: str) -> str:
    """The runtime mode for pure-decode batches: element 0 of a composite, else the mode itself."""
    raise NotImplementedError("ROUTINES[mode][0] for a composite, else mode itself")


def mixed_mode(mode: str) -> str:
    """The runtime mode for mixed prefill+decode batches: element 1 of a composite, else the mode."""
    raise NotImplementedError("ROUTINES[mode][1] for a composite, else mode itself")


def has_mode(mode: str, target: str) -> bool:
    """Does any routine of ``mode`` run as ``target``? ``target`` must be a runtime mode."""
    raise NotImplementedError(
        "ValueError unless target is NONE/PIECEWISE/FULL; composite: target in ROUTINES[mode]; simple: mode == target"
    )


def requires_piecewise_compilation(mode: str) -> bool:
    """Must the compiler split the model at attention? Only if some routine is PIECEWISE."""
    raise NotImplementedError("return has_mode(mode, \"PIECEWISE\")")


def runtime_mode_for(mode: str, is_decode: bool) -> str:
    """The runtime mode one batch runs in, before any size check."""
    raise NotImplementedError("decode_mode(mode) if is_decode else mixed_mode(mode)")


class Dispatcher:
    """Which graphs exist, and which one a batch replays (upstream: ``CudagraphDispatcher``).

    ``keys["PIECEWISE"]`` and ``keys["FULL"]`` hold ``(num_tokens, uniform)`` pairs, one per graph
    to capture. Upstream's key is a ``BatchDescriptor``; its ``num_reqs`` is a function of these
    two (and LoRA fields are left out), so the pair identifies the same graphs.
    """

    def __init__(
        self, mode: str, capture_sizes: Iterable[int], max_num_seqs: int, uniform_decode_query_len: int = 1
    ) -> None:
        raise NotImplementedError(
            "store mode/capture_sizes (sorted)/max_num_seqs; keys = {'PIECEWISE': set(), 'FULL': set()}; "
            "if mixed_mode != NONE add (n, False) for every size under mixed_mode; if composite with FULL decode "
            "add (n, True) to FULL for sizes q <= n <= q * max_num_seqs"
        )

    def dispatch(self, num_tokens: int, uniform_decode: bool = False) -> tuple[str, int]:
        """(runtime mode, padded num_tokens) for one batch; ``("NONE", num_tokens)`` when no graph fits."""
        raise NotImplementedError(
            "NONE (and num_tokens) if mode is NONE or num_tokens > top rung; else pad with select_capture_size, "
            "try (padded, uniform and composite) in keys['FULL'], then (padded, False) in keys['PIECEWISE']"
        )

    def capture_plan(self) -> list[tuple[str, list[int]]]:
        """What startup captures: PIECEWISE first, then FULL, each largest size first."""
        raise NotImplementedError("for PIECEWISE then FULL: sizes of that key set, sorted descending; skip empty sets")


def main(argv: list[str] | None = None) -> None:
    """Print the routing table, the startup graph counts and a few dispatches (``--graphs``: counts only)."""
    import sys

    from mini_vllm.cudagraph import default_capture_sizes

    only_graphs = "--graphs" in (sys.argv[1:] if argv is None else argv)
    if not only_graphs:
        print(f"{'mode':<20} {'decode batch':<13} {'mixed batch':<12} piecewise compile")
        for m in MODES:
            yes = "yes" if requires_piecewise_compilation(m) else "no"
            print(f"{m:<20} {runtime_mode_for(m, True):<13} {runtime_mode_for(m, False):<12} {yes}")
        print()

    ladder = default_capture_sizes(512)
    print(f"graphs captured at startup, default ladder ({len(ladder)} sizes, top {ladder[-1]})")
    for seqs in (256, 1024):
        for m in MODES:
            plan = Dispatcher(m, ladder, max_num_seqs=seqs).capture_plan()
            parts = ", ".join(f"{rt} {len(s)}" for rt, s in plan) or "none"
            print(f"max_num_seqs={seqs:<5} {m:<20} {sum(len(s) for _, s in plan):>3}  ({parts})")
    if only_graphs:
        return

    d = Dispatcher("FULL_AND_PIECEWISE", ladder, max_num_seqs=256)
    print("\nFULL_AND_PIECEWISE, max_num_seqs=256: dispatch(num_tokens, uniform_decode)")
    for n, u in ((1, True), (5, True), (5, False), (33, False), (200, True), (300, False), (600, False)):
        print(f"  ({n:>3}, {u!s:<5}) -> {d.dispatch(n, u)}")

if __name__ == "__main__":
    main()
