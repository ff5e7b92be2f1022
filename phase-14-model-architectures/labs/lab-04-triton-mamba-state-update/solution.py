"""Lab 14-04 — the Mamba decode step in Triton: one selective state update (reference solution).

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
    """float64 torch reference. Returns ``(out, new_state)``; the inputs are not modified.

    ``new_state`` is a float64 copy of the whole slot cache with the requests' slots updated."""
    new = state.double().clone()
    batch, nheads, dim = x.shape
    ngroups = B.shape[1]
    group = torch.arange(nheads) // (nheads // ngroups)  # (nheads,): adjacent heads share a group
    slots = torch.arange(batch) if state_indices is None else state_indices.long()
    live = slots != null_slot if state_indices is not None else torch.ones(batch, dtype=torch.bool)
    s = torch.where(live[:, None, None, None], new[slots], torch.zeros_like(new[slots]))
    dtv = torch.nn.functional.softplus(dt.double() + dt_bias.double(), threshold=20.0)  # (b, h, dim)
    dA = torch.exp(dtv[..., None] * A.double()[None])  # (b, h, dim, dstate)
    Bh, Ch = B.double()[:, group], C.double()[:, group]  # (b, h, dstate)
    s = s * dA + dtv[..., None] * Bh[:, :, None, :] * x.double()[..., None]
    y = (s * Ch[:, :, None, :]).sum(-1) + D.double()[None] * x.double()
    out = y * torch.nn.functional.silu(z.double())
    for b in range(batch):
        if live[b]:
            new[slots[b]] = s[b]
    return out, new


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
    pid_m = tl.program_id(0)
    b = tl.program_id(1).to(tl.int64)
    h = tl.program_id(2).to(tl.int64)
    g = h // heads_per_group
    if HAS_IDX:
        slot = tl.load(IDX + b * s_idx).to(tl.int64)
    else:
        slot = b

    m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    n = tl.arange(0, BLOCK_N)
    m_ok = m < dim
    mn_ok = m_ok[:, None] & (n[None, :] < dstate)
    if (
        HAS_IDX
    ):  # a padded request (null slot) reads a zero state and writes none (a block mask, not a scalar)
        mn_ok_state = mn_ok & ((tl.zeros([BLOCK_M], dtype=tl.int64) + slot) != null_slot)[:, None]
    else:
        mn_ok_state = mn_ok
    st_ptrs = STATE + slot * s_sb + h * s_sh + m[:, None] * s_sd + n[None, :] * s_sn
    st = tl.load(st_ptrs, mask=mn_ok_state, other=0.0).to(tl.float32)

    x = tl.load(X + b * s_xb + h * s_xh + m * s_xd, mask=m_ok, other=0.0).to(tl.float32)
    dt = tl.load(DT + b * s_tb + h * s_th + m * s_td, mask=m_ok, other=0.0).to(tl.float32)
    dt += tl.load(DT_BIAS + h * s_bh + m * s_bd, mask=m_ok, other=0.0).to(tl.float32)
    dt = tl.where(dt <= 20.0, tl.log(1.0 + tl.exp(dt)), dt)  # softplus, linear past 20
    a = tl.load(A + h * s_ah + m[:, None] * s_ad + n[None, :] * s_an, mask=mn_ok, other=0.0).to(tl.float32)
    bb = tl.load(B + b * s_Bb + g * s_Bg + n * s_Bn, mask=n < dstate, other=0.0).to(tl.float32)
    cc = tl.load(C + b * s_Cb + g * s_Cg + n * s_Cn, mask=n < dstate, other=0.0).to(tl.float32)
    d = tl.load(D + h * s_Dh + m * s_Dd, mask=m_ok, other=0.0).to(tl.float32)
    z = tl.load(Z + b * s_zb + h * s_zh + m * s_zd, mask=m_ok, other=0.0).to(tl.float32)

    st = st * tl.exp(a * dt[:, None]) + (dt[:, None] * bb[None, :]) * x[:, None]
    y = tl.sum(st * cc[None, :], axis=1) + d * x
    y = y * (z * tl.sigmoid(z))
    tl.store(OUT + b * s_ob + h * s_oh + m * s_od, y.to(OUT.dtype.element_ty), mask=m_ok)
    tl.store(st_ptrs, st.to(STATE.dtype.element_ty), mask=mn_ok_state)


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
    """One decode step for every request; updates ``state`` in place and returns ``out``.

    Shapes: ``state (slots, nheads, dim, dstate)``, ``x, dt, z (batch, nheads, dim)``,
    ``A (nheads, dim, dstate)``, ``B, C (batch, ngroups, dstate)``, ``D, dt_bias (nheads, dim)``,
    ``state_indices (batch,)`` int32/int64 or ``None`` (request ``b`` uses slot ``b``). Any strides.
    Raises ``ValueError`` for a shape that disagrees with ``state``, ``nheads`` not a multiple of
    ``ngroups``, or a slot outside the cache; nothing is written when it raises."""
    _check(state, x, dt, A, B, C, D, dt_bias, z, state_indices)
    batch, nheads, dim = x.shape
    dstate = state.shape[3]
    if out is None:
        out = torch.empty_like(x)
    if batch == 0:
        return out
    idx = state_indices if state_indices is not None else x  # any tensor: unused without HAS_IDX
    grid = (triton.cdiv(dim, block_m), batch, nheads)
    _ssu_kernel[grid](
        state,
        x,
        dt,
        dt_bias,
        A,
        B,
        C,
        D,
        z,
        out,
        idx,
        null_slot,
        dim,
        dstate,
        nheads // B.shape[1],
        *state.stride(),
        *x.stride(),
        *dt.stride(),
        *dt_bias.stride(),
        *A.stride(),
        *B.stride(),
        *C.stride(),
        *D.stride(),
        *z.stride(),
        *out.stride(),
        state_indices.stride(0) if state_indices is not None else 0,
        HAS_IDX=state_indices is not None,
        BLOCK_M=block_m,
        BLOCK_N=triton.next_power_of_2(dstate),
    )
    return out


# --------------------------------------------------------------------------- the lab: the byte model
def ssu_bytes(
    batch: int, nheads: int, dim: int, dstate: int, ngroups: int, state_bytes: int = 4, elem_bytes: int = 2
) -> int:
    """Bytes one decode step must move at minimum: each request's state read and written, its x,
    dt, z read and out written, its B and C read, and the parameters A (float32), D and dt_bias
    (float32) read once."""
    state = 2 * batch * nheads * dim * dstate * state_bytes
    acts = 4 * batch * nheads * dim * elem_bytes
    bc = 2 * batch * ngroups * dstate * elem_bytes
    params = nheads * dim * dstate * 4 + 2 * nheads * dim * 4
    return state + acts + bc + params


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
