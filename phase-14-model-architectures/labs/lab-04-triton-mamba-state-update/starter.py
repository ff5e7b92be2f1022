"""Lab 14-04 starter — the Mamba decode step in Triton: one selective state update.

An attention layer remembers a request by its KV cache, which grows a block per 16 tokens. A Mamba
layer remembers it by a fixed-size state per head, ``(dim, dstate)``, rewritten in place on every
token. One decode step, for each request ``b`` and head ``h`` (``g`` is the head's group)::

    dt    = softplus(dt[b, h] + dt_bias[h])                    (dim,)    step size, always > 0
    dA    = exp(dt[:, None] * A[h])                            (dim, dstate)  decay in (0, 1) when A < 0
    state = state * dA + (dt[:, None] * B[b, g][None, :]) * x[b, h][:, None]
    y     = state @ C[b, g] + D[h] * x[b, h]                   (dim,)    read the *new* state
    out   = y * silu(z[b, h])                                  gate

Heads share ``B`` and ``C`` in groups: head ``h`` reads group ``h // (nheads // ngroups)`` (the
heads of a group are adjacent, as in grouped-query attention). The state lives in a cache of
slots, ``(num_slots, nheads, dim, dstate)``; ``state_indices[b]`` names request ``b``'s slot (vLLM's
``state_batch_indices``), and a request whose slot is ``null_slot`` is padding: its state is not
read (it counts as zero) and never written.

``softplus(v) = log(1 + exp(v))`` overflows float32 for ``v`` past ~88, so it is ``v`` itself above
20, as vLLM's kernel does. The kernel is one program per ``(block of dim rows, request, head)``,
works in float32 whatever the storage dtype, and computes every pointer offset in int64.
Grade with: LAB_IMPL=starter .venv/bin/python -m pytest phase-14-model-architectures/labs/lab-04-triton-mamba-state-update -q
"""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():  # no GPU: run the kernel in Triton's CPU interpreter
    os.environ.setdefault("TRITON_INTERPRET", "1")

import triton
import triton.language as tl


# --------------------------------------------------------------------------- the lab: the reference
def ssu_reference(state, x, dt, A, B, C, D, dt_bias, z, state_indices=None, null_slot: int = 0):
    raise NotImplementedError(
        "ssu_reference: float64 copies; dt = softplus(dt + dt_bias) (threshold 20); dA = exp(dt·A); "
        "state = state·dA + dt·B·x with head h reading group h // (nheads // ngroups); y = C·state + "
        "D·x; out = y·silu(z); padded requests (slot == null_slot) start from zero and write nothing"
    )


# --------------------------------------------------------------------------- the lab: the kernel
@triton.jit
def _ssu_kernel(
    STATE,
    X,
    DT,
    DT_BIAS,
    A,
    B,
    C,
    D,
    Z,
    OUT,
    IDX,
    null_slot,
    dim,
    dstate,
    heads_per_group,
    s_sb,
    s_sh,
    s_sd,
    s_sn,
    s_xb,
    s_xh,
    s_xd,
    s_tb,
    s_th,
    s_td,
    s_bh,
    s_bd,
    s_ah,
    s_ad,
    s_an,
    s_Bb,
    s_Bg,
    s_Bn,
    s_Cb,
    s_Cg,
    s_Cn,
    s_Dh,
    s_Dd,
    s_zb,
    s_zh,
    s_zd,
    s_ob,
    s_oh,
    s_od,
    s_idx,
    HAS_IDX: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    tl.static_assert(
        False,
        "TODO _ssu_kernel: program (m-block, request b, head h); slot from IDX (int64) or b; load the"
        " state block (masked: dim, dstate, and padding -> zeros), x, dt + bias -> softplus, A, B and"
        " C of group h // heads_per_group, D, z; update the state, y = sum(state·C) + D·x, gate by "
        "silu(z); store out and the state (not for padding)",
    )


def _check(state, x, dt, A, B, C, D, dt_bias, z, state_indices):
    if state.ndim != 4 or x.ndim != 3:
        raise ValueError(
            f"state must be (slots, nheads, dim, dstate) and x (batch, nheads, dim); "
            f"got {tuple(state.shape)} and {tuple(x.shape)}"
        )
    _, nheads, dim, dstate = state.shape
    batch = x.shape[0]
    ngroups = B.shape[1] if B.ndim == 3 else -1
    want = {
        "x": (x, (batch, nheads, dim)),
        "dt": (dt, (batch, nheads, dim)),
        "z": (z, (batch, nheads, dim)),
        "A": (A, (nheads, dim, dstate)),
        "D": (D, (nheads, dim)),
        "dt_bias": (dt_bias, (nheads, dim)),
        "B": (B, (batch, ngroups, dstate)),
        "C": (C, (batch, ngroups, dstate)),
    }
    for name, (t, shape) in want.items():
        if tuple(t.shape) != shape:
            raise ValueError(
                f"{name} has shape {tuple(t.shape)}, expected {shape} for state {tuple(state.shape)}"
            )
    if ngroups < 1 or nheads % ngroups:
        raise ValueError(f"nheads {nheads} must be a multiple of ngroups {ngroups}")
    if state_indices is None:
        if batch > state.shape[0]:
            raise ValueError(
                f"without state_indices request b uses slot b: {batch} requests, {state.shape[0]} slots"
            )
    else:
        if state_indices.shape != (batch,) or state_indices.dtype not in (torch.int32, torch.int64):
            raise ValueError(
                f"state_indices must be int32/int64 of shape ({batch},), got "
                f"{state_indices.dtype} {tuple(state_indices.shape)}"
            )
        if batch and (int(state_indices.min()) < 0 or int(state_indices.max()) >= state.shape[0]):
            raise ValueError(f"state_indices must lie in [0, {state.shape[0]}), got {state_indices.tolist()}")


def selective_state_update(
    state, x, dt, A, B, C, D, dt_bias, z, state_indices=None, null_slot: int = 0, out=None, block_m: int = 16
):
    raise NotImplementedError(
        "selective_state_update: _check(...) the inputs, allocate out, return early for zero "
        "requests, then launch _ssu_kernel on the grid (cdiv(dim, block_m), batch, nheads) with every"
        " stride"
    )


# --------------------------------------------------------------------------- the lab: the byte model
def ssu_bytes(
    batch: int, nheads: int, dim: int, dstate: int, ngroups: int, state_bytes: int = 4, elem_bytes: int = 2
) -> int:
    """Bytes one decode step must move at minimum: each request's state read and written, its x,
    dt, z read and out written, its B and C read, and the parameters A (float32), D and dt_bias
    (float32) read once."""
    raise NotImplementedError(
        "ssu_bytes: state read + written, x/dt/z read + out written, B and C read, A (float32) and D,"
        " dt_bias (float32) read once"
    )


def make_inputs(batch, nheads, dim, dstate, ngroups, slots=None, seed=0, dtype=torch.float32, device="cpu"):
    """Provided: seeded inputs in Mamba's ranges (A < 0, so every decay lies in (0, 1))."""
    g = torch.Generator().manual_seed(seed)
    slots = batch if slots is None else slots

    def r(*shape, scale=1.0):
        return (scale * torch.randn(*shape, generator=g)).to(device)

    return dict(
        state=r(slots, nheads, dim, dstate),
        x=r(batch, nheads, dim).to(dtype),
        dt=r(batch, nheads, dim, scale=0.5).to(dtype),
        A=-torch.rand(nheads, dim, dstate, generator=g).add(0.1).to(device),
        B=r(batch, ngroups, dstate).to(dtype),
        C=r(batch, ngroups, dstate).to(dtype),
        D=r(nheads, dim),
        dt_bias=r(nheads, dim, scale=0.5),
        z=r(batch, nheads, dim).to(dtype),
    )


def main() -> None:
    batch, nheads, dim, dstate, ngroups, slots = 3, 4, 8, 16, 2, 6
    t = make_inputs(batch, nheads, dim, dstate, ngroups, slots=slots)
    idx = torch.tensor([4, 0, 2])  # request 1 is padding (slot 0 is the null slot)
    want_out, want_state = ssu_reference(**t, state_indices=idx)
    before = t["state"].clone()
    out = selective_state_update(**t, state_indices=idx)
    print(
        f"Mamba selective state update (Triton; the CPU interpreter when there is no GPU): {batch} requests, "
        f"{nheads} heads in {ngroups} groups, dim {dim}, dstate {dstate}, {slots} cache slots"
    )
    print(f"  slots {idx.tolist()} (slot 0 is the null slot: request 1 is padding)")
    print(f"  max |out - float64 reference|   = {(out.double() - want_out).abs().max().item():.1e}")
    print(f"  max |state - float64 reference| = {(t['state'].double() - want_state).abs().max().item():.1e}")
    changed = [s for s in range(slots) if not torch.equal(t["state"][s], before[s])]
    print(f"  slots rewritten: {changed}; every other slot, the null slot included, is untouched")
    print()
    print(
        "One request, one layer: a Mamba2-2.7B mixer's SSM state (80 heads x 64 x dstate 128, 4-byte state)"
    )
    print("against a Llama-3-8B attention layer's KV (8 kv heads x 128, K and V, bf16)")
    mamba = 80 * 64 * 128 * 4
    per_token = 2 * 8 * 128 * 2
    print(f"{'tokens so far':>14} {'Mamba state bytes':>18} {'attention KV bytes':>19}")
    for tokens in (1, 1024, 32768):
        print(f"{tokens:>14,} {mamba:>18,} {tokens * per_token:>19,}")
    print(f"the KV passes the state after {mamba // per_token:,} tokens; the state never grows")


if __name__ == "__main__":
    main()
