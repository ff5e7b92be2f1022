"""Lab 11-02 starter: price a LoRA adapter, and a fleet that shares one base.

Grade with: LAB_IMPL=starter pytest phase-11-multi-lora/labs/lab-02-lora-economics -q
"""

from __future__ import annotations

GIB = 1024**3
MIB = 1024**2


def _positive(**values: int) -> None:
    for name, v in values.items():
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ValueError(f"{name} must be a positive int, got {v!r}")


def lora_params_per_layer(in_features: int, out_features: int, rank: int) -> int:
    """Parameters of one adapted linear layer: ``A (r, in)`` plus ``B (out, r)`` = ``r · (in + out)``.

    Raises ``ValueError`` unless all three are positive ints.
    """
    raise NotImplementedError(
        'validate with _positive(...), then return r * (in_features + out_features)'
    )


def adapter_bytes(hidden: int, layers: int, rank: int, targets: int = 4, bytes_per_param: int = 2) -> int:
    """Bytes of a whole adapter: ``targets`` square ``hidden × hidden`` projections in each of ``layers``.

    The default is the classic attention-only adapter: q, k, v and o (4 targets) in fp16 (2 bytes).
    Raises ``ValueError`` unless every argument is a positive int.
    """
    raise NotImplementedError(
        'params per square layer x targets x layers x bytes_per_param (validate the ints first)'
    )


def adapters_per_gib(hidden: int, layers: int, rank: int, targets: int = 4, bytes_per_param: int = 2) -> float:
    """How many such adapters fit in one GiB (2**30 bytes) of memory."""
    raise NotImplementedError(
        'divide GIB (2**30) by adapter_bytes(...)'
    )


def shrink_ratio(base_params: int, hidden: int, layers: int, rank: int, targets: int = 4) -> float:
    """How many times smaller the adapter is than the model it patches (parameters over parameters)."""
    raise NotImplementedError(
        "base_params divided by the adapter's PARAMETERS (per-layer params x targets x layers), not its bytes"
    )


def gpus_saved(tenants: int, max_loras: int) -> int:
    """GPUs saved by sharing: one GPU per tenant's dedicated copy, versus ``ceil(tenants / max_loras)``
    shared engines, each serving up to ``max_loras`` adapters at once."""
    raise NotImplementedError(
        'tenants minus ceil(tenants / max_loras) engines (validate both first)'
    )


def main() -> None:
    h, layers, r = 4096, 32, 16
    per = lora_params_per_layer(h, h, r)
    print(f"one 4096x4096 projection: {h * h:,} weights; its r={r} adapter: {per:,} ({h * h // per}x smaller)")
    b = adapter_bytes(h, layers, r)
    print(f"adapter (q,k,v,o x {layers} layers, fp16): {b:,} bytes = {b / MIB:g} MiB = {b / GIB:.5f} GiB")
    print(f"adapters per GiB: {adapters_per_gib(h, layers, r):g}")
    print(f"shrink vs a 7B-parameter base: {shrink_ratio(7_000_000_000, h, layers, r):.1f}x")
    print(f"shrink vs the captured 12.55 GiB of weights: {12.55 * GIB / b:.1f}x (bytes over bytes)")
    for rank in (8, 16, 64):
        print(f"  rank {rank:2d}: {adapter_bytes(h, layers, rank) / MIB:5g} MiB")
    for tenants, slots in ((100, 8), (100, 1), (100, 32), (1000, 8)):
        saved = gpus_saved(tenants, slots)
        print(f"fleet: {tenants} tenants, max_loras={slots}: {tenants - saved} engines, {saved} GPUs saved")


if __name__ == "__main__":
    main()
