"""Benchmark the lab's selective-state-update kernel against vLLM's ``selective_state_update``.

On a CUDA machine:   python phase-14-model-architectures/labs/lab-04-triton-mamba-state-update/bench.py
                     (--impl starter benchmarks your starter.py)
Anywhere, no GPU:    python phase-14-model-architectures/labs/lab-04-triton-mamba-state-update/bench.py --predict
                     prints the bytes one decode step moves and its time at the datasheet bandwidth
                     (a floor, not a measurement).

Shapes are Mamba2-2.7B's mixer (80 heads, head dim 64, dstate 128, one B/C group) at decode batches
of 1, 64 and 256 requests, bf16 activations and a float32 state, each request in its own cache slot.
The baseline is vLLM 0.22.1's Triton kernel with ``state_batch_indices`` (the path the engine uses).
A decode step does ~7 FLOPs per state element and moves 8 bytes for it: bandwidth-bound.
"""

from __future__ import annotations

import sys
from functools import partial

from course.runtime.bench import bench_main, device_bandwidth

PREDICT = ("H100 SXM", 3.35e12)
H, D, N, G = 80, 64, 128, 1
BATCHES = [1, 64, 256]


def predict(lab, args) -> None:
    name, bw = PREDICT
    print(
        f"predicted for {name}: {bw / 1e12:.2f} TB/s HBM; Mamba2-2.7B mixer ({H} heads x {D}, dstate {N}, {G} group),"
    )
    print("bf16 activations, float32 state")
    print(f"{'batch':>6} {'state MB':>9} {'step MB':>8} {'floor us':>9} {'64 layers us':>13}")
    for b in BATCHES:
        total = lab.ssu_bytes(b, H, D, N, G, state_bytes=4, elem_bytes=2)
        state = b * H * D * N * 4
        print(
            f"{b:>6} {state / 1e6:9.2f} {total / 1e6:8.2f} {total / bw * 1e6:9.2f} {64 * total / bw * 1e6:13.1f}"
        )
    print("floor = bytes / bandwidth; bytes = 2·b·h·d·n·4 (state read + written) + 4·b·h·d·2 (x, dt, z, out)")
    print(
        "+ 2·b·g·n·2 (B, C) + h·d·n·4 + 2·h·d·4 (A, D, dt_bias). Predicted, not measured: run without --predict on a GPU."
    )


def measure(lab, args) -> int:
    import torch
    from triton.testing import do_bench
    from vllm.model_executor.layers.mamba.ops.mamba_ssm import selective_state_update as vllm_ssu

    bw = device_bandwidth()
    if bw is None:
        return 2
    print(f"{'batch':>6} {'vLLM us':>8} {'lab us':>7} {'ratio':>6} {'GB/s':>7} {'% HBM':>6}")
    for b in BATCHES:
        t = lab.make_inputs(b, H, D, N, G, slots=b + 1, seed=0, dtype=torch.bfloat16, device="cuda")
        idx = torch.arange(1, b + 1, dtype=torch.int32, device="cuda")  # slot 0 is the null slot
        s_vllm, s_lab = t["state"].clone(), t["state"].clone()
        out_v = torch.empty_like(t["x"])
        args_v = (t["x"], t["dt"], t["A"], t["B"], t["C"], t["D"], t["dt_bias"])
        vllm_ssu(s_vllm, *args_v, z=t["z"], dt_softplus=True, state_batch_indices=idx, out=out_v)
        rest = {k: v for k, v in t.items() if k != "state"}
        out_l = lab.selective_state_update(s_lab, **rest, state_indices=idx)
        err = ((out_l.float() - out_v.float()).abs().max() / out_v.float().abs().max()).item()
        if err > 2e-2:
            print(f"{b:>6}: result differs from vLLM's by {err:.1e} of the largest value; not timed")
            return 1
        t_v = (
            do_bench(
                partial(
                    vllm_ssu, s_vllm, *args_v, z=t["z"], dt_softplus=True, state_batch_indices=idx, out=out_v
                )
            )
            * 1e-3
        )
        t_l = (
            do_bench(partial(lab.selective_state_update, s_lab, **rest, state_indices=idx, out=out_l)) * 1e-3
        )
        nbytes = lab.ssu_bytes(b, H, D, N, G, state_bytes=4, elem_bytes=2)
        print(
            f"{b:>6} {t_v * 1e6:8.1f} {t_l * 1e6:7.1f} {t_v / t_l:5.2f}x {nbytes / t_l / 1e9:7.0f} "
            f"{100 * nbytes / t_l / bw:5.1f}%"
        )
    return 0


if __name__ == "__main__":
    sys.exit(bench_main(__file__, __doc__, measure, predict))
