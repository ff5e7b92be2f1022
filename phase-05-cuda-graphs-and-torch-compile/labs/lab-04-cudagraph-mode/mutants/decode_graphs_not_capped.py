"""MUTANT — captures a FULL decode graph for every rung, even sizes larger than max_num_seqs requests can ever fill.

Lab 03-04 — CUDAGraphMode routing and the cudagraph dispatcher (reference solution).

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

from mini_vllm.cudagraph import select_capture_size

MODES = ("NONE", "PIECEWISE", "FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE")
RUNTIME_MODES = ("NONE", "PIECEWISE", "FULL")
ROUTINES = {"FULL_DECODE_ONLY": ("FULL", "NONE"), "FULL_AND_PIECEWISE": ("FULL", "PIECEWISE")}


def _check(mode: str) -> str:
    if mode not in MODES:
        raise ValueError(f"unknown CUDAGraphMode {mode!r}; expected one of {MODES}")
    return mode


def separate_routine(mode: str) -> bool:
    """True for a composite mode: decode and mixed batches get different routines."""
    return _check(mode) in ROUTINES


def decode_mode(mode: str) -> str:
    """The runtime mode for pure-decode batches: element 0 of a composite, else the mode itself."""
    return ROUTINES[mode][0] if separate_routine(mode) else mode


def mixed_mode(mode: str) -> str:
    """The runtime mode for mixed prefill+decode batches: element 1 of a composite, else the mode."""
    return ROUTINES[mode][1] if separate_routine(mode) else mode


def has_mode(mode: str, target: str) -> bool:
    """Does any routine of ``mode`` run as ``target``? ``target`` must be a runtime mode."""
    if _check(target) not in RUNTIME_MODES:
        raise ValueError(f"has_mode asks about a runtime mode (NONE, PIECEWISE or FULL), got {target!r}")
    return target in ROUTINES[mode] if separate_routine(mode) else mode == target


def requires_piecewise_compilation(mode: str) -> bool:
    """Must the compiler split the model at attention? Only if some routine is PIECEWISE."""
    return has_mode(mode, "PIECEWISE")


def runtime_mode_for(mode: str, is_decode: bool) -> str:
    """The runtime mode one batch runs in, before any size check."""
    return decode_mode(mode) if is_decode else mixed_mode(mode)


class Dispatcher:
    """Which graphs exist, and which one a batch replays (upstream: ``CudagraphDispatcher``).

    ``keys["PIECEWISE"]`` and ``keys["FULL"]`` hold ``(num_tokens, uniform)`` pairs, one per graph
    to capture. Upstream's key is a ``BatchDescriptor``; its ``num_reqs`` is a function of these
    two (and LoRA fields are left out), so the pair identifies the same graphs.
    """

    def __init__(
        self, mode: str, capture_sizes: Iterable[int], max_num_seqs: int, uniform_decode_query_len: int = 1
    ) -> None:
        self.mode = _check(mode)
        self.capture_sizes = sorted(set(capture_sizes))
        self.max_num_seqs = max_num_seqs
        self.q = uniform_decode_query_len
        self.keys: dict[str, set[tuple[int, bool]]] = {"PIECEWISE": set(), "FULL": set()}
        if mode == "NONE":
            return
        if mixed_mode(mode) != "NONE":  # the general routine: every rung, any batch shape
            for n in self.capture_sizes:
                self.keys[mixed_mode(mode)].add((n, False))
        if separate_routine(mode) and decode_mode(mode) == "FULL":  # decode routine: <= max_num_seqs requests
            for n in self.capture_sizes:
                if self.q <= n:  # BUG: a decode batch never has more than max_num_seqs requests
                    self.keys["FULL"].add((n, True))

    def dispatch(self, num_tokens: int, uniform_decode: bool = False) -> tuple[str, int]:
        """(runtime mode, padded num_tokens) for one batch; ``("NONE", num_tokens)`` when no graph fits."""
        if self.mode == "NONE" or not self.capture_sizes or num_tokens > self.capture_sizes[-1]:
            return "NONE", num_tokens
        padded = select_capture_size(num_tokens, self.capture_sizes)
        uniform = uniform_decode and separate_routine(self.mode)
        if (padded, uniform) in self.keys["FULL"]:
            return "FULL", padded
        if (padded, False) in self.keys["PIECEWISE"]:  # the relaxed key serves any batch shape
            return "PIECEWISE", padded
        return "NONE", num_tokens

    def capture_plan(self) -> list[tuple[str, list[int]]]:
        """What startup captures: PIECEWISE first, then FULL, each largest size first."""
        plan = []
        for rt in ("PIECEWISE", "FULL"):
            sizes = sorted((n for n, _ in self.keys[rt]), reverse=True)
            if sizes:
                plan.append((rt, sizes))
        return plan


def main() -> None:
    print(f"{'mode':<20} {'decode batch':<13} {'mixed batch':<12} piecewise compile")
    for m in MODES:
        yes = "yes" if requires_piecewise_compilation(m) else "no"
        print(f"{m:<20} {runtime_mode_for(m, True):<13} {runtime_mode_for(m, False):<12} {yes}")

    from mini_vllm.cudagraph import default_capture_sizes

    ladder = default_capture_sizes(512)
    print(f"\ngraphs captured at startup, default ladder ({len(ladder)} sizes, top {ladder[-1]})")
    for seqs in (256, 1024):
        for m in MODES:
            plan = Dispatcher(m, ladder, max_num_seqs=seqs).capture_plan()
            parts = ", ".join(f"{rt} {len(s)}" for rt, s in plan) or "none"
            print(f"max_num_seqs={seqs:<5} {m:<20} {sum(len(s) for _, s in plan):>3}  ({parts})")

    d = Dispatcher("FULL_AND_PIECEWISE", ladder, max_num_seqs=256)
    print("\nFULL_AND_PIECEWISE, max_num_seqs=256: dispatch(num_tokens, uniform_decode)")
    for n, u in ((1, True), (5, True), (5, False), (33, False), (200, True), (300, False), (600, False)):
        print(f"  ({n:>3}, {u!s:<5}) -> {d.dispatch(n, u)}")


if __name__ == "__main__":
    main()
