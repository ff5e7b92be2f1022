"""Lab 14-04 spec: the float64 reference, the kernel under the interpreter, vLLM's own kernel, the byte model."""

import math

import pytest

from course.runtime import lab_module

lab = lab_module(__file__)  # solution.py by default; LAB_IMPL=starter grades starter.py

torch = pytest.importorskip("torch")

# (batch, nheads, dim, dstate, ngroups): groups of 2 and of 1, one group for all heads, a dim that is not a
# multiple of the 16-row block, a dstate that is not a power of two
CONFIGS = [(2, 4, 8, 16, 2), (3, 2, 20, 8, 1), (1, 4, 5, 12, 4), (2, 6, 3, 4, 3)]
IDS = [f"b{c[0]}-h{c[1]}-d{c[2]}-n{c[3]}-g{c[4]}" for c in CONFIGS]


def _inputs(cfg, seed, slots=None):
    return lab.make_inputs(*cfg, slots=slots, seed=seed)


@pytest.fixture(scope="module")
def vllm_ssu():
    """vLLM's own Triton ``selective_state_update``, imported once (before the per-test fork)."""
    pytest.importorskip("vllm")
    from vllm.model_executor.layers.mamba.ops.mamba_ssm import selective_state_update

    return selective_state_update


def _vllm_with_slots(ssu, t, idx, null_slot=0):
    """vLLM's kernel on gathered slots, scattered back. (Its own state_batch_indices path stops in the Triton
    3.9 interpreter on a scalar mask; on a GPU it does the same gather and scatter in place.)"""
    state = t["state"].clone()
    live = [b for b in range(len(idx)) if int(idx[b]) != null_slot]
    gathered = torch.zeros(len(idx), *state.shape[1:])
    for b in live:
        gathered[b] = state[idx[b]]
    out = torch.empty_like(t["x"])
    ssu(
        gathered,
        t["x"],
        t["dt"],
        t["A"],
        t["B"],
        t["C"],
        t["D"],
        t["dt_bias"],
        z=t["z"],
        dt_softplus=True,
        out=out,
    )
    for b in live:
        state[idx[b]] = gathered[b]
    return out, state


# --------------------------------------------------------------------------- the reference
def test_reference_by_hand():
    # one request, one head, dim 1, dstate 2: every step of the recurrence in plain floats
    s0, x, dt, bias, a, B, C, D, z = (
        [0.5, -1.0],
        2.0,
        0.3,
        -0.1,
        [-1.0, -0.5],
        [0.4, -0.2],
        [1.5, 0.25],
        0.7,
        0.8,
    )
    step = math.log1p(math.exp(dt + bias))
    s1 = [s0[i] * math.exp(step * a[i]) + step * B[i] * x for i in range(2)]
    want = (sum(s1[i] * C[i] for i in range(2)) + D * x) * z / (1 + math.exp(-z))
    T = torch.tensor
    out, state = lab.ssu_reference(
        T(s0).reshape(1, 1, 1, 2),
        T([[[x]]]),
        T([[[dt]]]),
        T(a).reshape(1, 1, 2),
        T(B).reshape(1, 1, 2),
        T(C).reshape(1, 1, 2),
        T([[D]]),
        T([[bias]]),
        T([[[z]]]),
    )
    assert abs(out.item() - want) < 1e-6, (
        f"out = (C·state_new + D·x)·silu(z) with state_new = state·exp(dt·A) + dt·B·x and dt = softplus(dt + "
        f"dt_bias): want {want:.6f}, got {out.item():.6f}"
    )
    assert torch.allclose(state.flatten().double(), T(s1).double(), atol=1e-6), (
        f"new state {s1}, got {state.flatten()}"
    )


@pytest.mark.triton
@pytest.mark.upstream
@pytest.mark.parametrize("cfg", CONFIGS, ids=IDS)
def test_reference_matches_vllms_kernel(vllm_ssu, cfg):
    ssu = vllm_ssu
    t = _inputs(cfg, seed=1)
    want_state = t["state"].clone()
    want = torch.empty_like(t["x"])
    ssu(
        want_state,
        t["x"],
        t["dt"],
        t["A"],
        t["B"],
        t["C"],
        t["D"],
        t["dt_bias"],
        z=t["z"],
        dt_softplus=True,
        out=want,
    )
    out, state = lab.ssu_reference(**t)
    err_y, err_s = (out - want.double()).abs().max().item(), (state - want_state.double()).abs().max().item()
    assert err_y < 1e-5 and err_s < 1e-5, (
        f"{cfg}: your float64 reference is off vLLM's selective_state_update by {err_y:.1e} (out) and {err_s:.1e} "
        f"(state). Head h reads group h // (nheads // ngroups); y reads the updated state; the gate is silu(z)"
    )


# --------------------------------------------------------------------------- the kernel
@pytest.mark.triton
@pytest.mark.parametrize("cfg", CONFIGS, ids=IDS)
def test_kernel_matches_reference(cfg):
    t = _inputs(cfg, seed=2)
    want_out, want_state = lab.ssu_reference(**t)
    out = lab.selective_state_update(**t)
    err_y = (out.double() - want_out).abs().max().item()
    err_s = (t["state"].double() - want_state).abs().max().item()
    assert err_y < 1e-5 and err_s < 1e-5, (
        f"{cfg}: kernel vs float64 reference: out {err_y:.1e}, state {err_s:.1e}. Mask the dim rows past {cfg[2]} "
        f"and the dstate columns past {cfg[3]}; update the state in place"
    )


@pytest.mark.triton
@pytest.mark.upstream
def test_kernel_equals_vllm_with_cache_slots(vllm_ssu):
    ssu = vllm_ssu
    cfg = (4, 4, 8, 16, 2)
    t = _inputs(cfg, seed=3, slots=7)
    idx = torch.tensor([5, 0, 2, 6], dtype=torch.int32)  # request 1 is padding: slot 0 is the null slot
    want_out, want_state = _vllm_with_slots(ssu, t, idx)
    before = t["state"].clone()
    out = lab.selective_state_update(**t, state_indices=idx)
    for b in (0, 2, 3):
        err = (out[b] - want_out[b]).abs().max().item()
        assert err < 1e-5, f"request {b} (slot {int(idx[b])}): out differs from vLLM's by {err:.1e}"
    err = (t["state"] - want_state).abs().max().item()
    assert err < 1e-5, (
        f"the slot cache differs from vLLM's by {err:.1e}: request b reads and writes slot state_indices[b]"
    )
    for s in (0, 1, 3, 4):
        assert torch.equal(t["state"][s], before[s]), f"slot {s} changed, but no live request uses it" + (
            " (slot 0 is the null slot: padding never writes)" if s == 0 else ""
        )


@pytest.mark.triton
def test_padding_reads_a_zero_state_and_writes_nothing():
    cfg = (3, 2, 4, 8, 1)
    t = _inputs(cfg, seed=4, slots=4)
    idx = torch.tensor([0, 3, 0])
    want_out, want_state = lab.ssu_reference(**t, state_indices=idx)
    before = t["state"].clone()
    out = lab.selective_state_update(**t, state_indices=idx)
    assert torch.equal(t["state"][0], before[0]), (
        "the null slot (0) was written: mask the state store for padding"
    )
    assert (out[0].double() - want_out[0]).abs().max() < 1e-5, (
        "a padded request sees a zero state (vLLM masks the state load): out = D·x·silu(z) for it"
    )
    assert (t["state"].double() - want_state).abs().max() < 1e-5


@pytest.mark.triton
def test_large_dt_stays_finite():
    cfg = (2, 2, 4, 4, 1)
    t = _inputs(cfg, seed=5)
    t["dt"][0] = 100.0  # softplus(100) = 100; exp(100) overflows float32
    want_out, want_state = lab.ssu_reference(**t)
    out = lab.selective_state_update(**t)
    assert torch.isfinite(out).all() and torch.isfinite(t["state"]).all(), (
        "dt + bias = ~100 gave inf/nan: softplus(v) is v itself above 20 (log(1 + exp(v)) overflows float32)"
    )
    assert (out.double() - want_out).abs().max() < 1e-3 * max(1.0, want_out.abs().max().item())


@pytest.mark.triton
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 5e-2)])
def test_strided_views_of_one_projection(dtype, tol):
    # Mamba2's in_proj emits z | x | B | C | dt in one row per request; the layer passes column slices of it.
    batch, nheads, dim, dstate, ngroups = 2, 2, 6, 8, 1
    g = torch.Generator().manual_seed(6)
    width = (
        2 * nheads * dim + 2 * ngroups * dstate + nheads * dim + 5
    )  # 5 columns of padding: row stride != width
    proj = torch.randn(batch, width, generator=g).to(dtype)
    o = 0
    z = proj[:, o : o + nheads * dim].view(batch, nheads, dim)
    o += nheads * dim
    x = proj[:, o : o + nheads * dim].view(batch, nheads, dim)
    o += nheads * dim
    B = proj[:, o : o + ngroups * dstate].view(batch, ngroups, dstate)
    o += ngroups * dstate
    C = proj[:, o : o + ngroups * dstate].view(batch, ngroups, dstate)
    o += ngroups * dstate
    dt = proj[:, o : o + nheads * dim].view(batch, nheads, dim)
    big = torch.randn(batch, nheads, dim, dstate + 3, generator=g)  # a state cache whose rows are padded
    state = big[..., :dstate]
    A = -torch.rand(nheads, dim, dstate, generator=g) - 0.1
    D, bias = torch.randn(nheads, dim, generator=g), torch.randn(nheads, dim, generator=g)
    want_out, want_state = lab.ssu_reference(state, x, dt, A, B, C, D, bias, z)
    pad_before = big[..., dstate:].clone()
    out = lab.selective_state_update(state, x, dt, A, B, C, D, bias, z)
    err = (out.double() - want_out).abs().max().item() / max(1.0, want_out.abs().max().item())
    assert err < tol, (
        f"{dtype}: strided x/z/dt/B/C (row stride {proj.stride(0)}): error {err:.1e}. Use every stride"
    )
    assert (state.double() - want_state).abs().max() < 1e-4, "the state (a strided view) was updated wrongly"
    assert torch.equal(big[..., dstate:], pad_before), (
        "the state cache's padding columns changed: mask dstate"
    )


def _huge(n, dtype=torch.float16):
    """n elements; on CPU an untouched anonymous mapping, so only the pages written cost memory."""
    if torch.cuda.is_available():
        return torch.zeros(n, dtype=dtype, device="cuda"), None
    import mmap

    flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | getattr(mmap, "MAP_NORESERVE", 0)
    mm = mmap.mmap(-1, n * torch.tensor([], dtype=dtype).element_size(), flags=flags)
    return torch.frombuffer(mm, dtype=dtype, count=n), mm


@pytest.mark.triton
def test_slot_offsets_past_2_pow_31_elements():
    # Slot 2 starts 2 * STRIDE = 2**31 + 16 elements into the cache (a virtual 4 GiB fp16 buffer on CPU). A hybrid
    # model's cache of thousands of slots x 80 heads x 64 x 128 passes 2**31 elements the same way.
    stride = (1 << 30) + 8
    nheads, dim, dstate = 1, 2, 4
    big, keep = _huge(2 * stride + nheads * dim * dstate + 16)
    state = torch.as_strided(big, (3, nheads, dim, dstate), (stride, dim * dstate, dstate, 1))
    t = lab.make_inputs(1, nheads, dim, dstate, 1, slots=3, seed=7)
    init = t.pop("state").to(torch.float16)
    state[2] = init[2].to(state.device)
    want_out, want_state = lab.ssu_reference(init, **t, state_indices=torch.tensor([2]))
    out = lab.selective_state_update(
        state,
        **{k: v.to(state.device) for k, v in t.items()},
        state_indices=torch.tensor([2], dtype=torch.int32, device=state.device),
    )
    got = state[2].cpu().double()
    del state, big, keep
    err = max((out.cpu().double() - want_out).abs().max().item(), (got - want_state[2]).abs().max().item())
    assert err < 2e-2, (
        f"slot 2 starts 2**31 + 16 elements into the cache and the result is off by {err:.1e}: slot * slot stride "
        f"overflowed int32; load the slot index as int64 before multiplying"
    )


@pytest.mark.triton
def test_zero_requests_is_a_no_op():
    t = lab.make_inputs(0, 2, 4, 4, 1, slots=2, seed=8)
    t["state"] = torch.randn(2, 2, 4, 4)
    before = t["state"].clone()
    out = lab.selective_state_update(**t)
    assert out.shape == (0, 2, 4) and torch.equal(t["state"], before)


@pytest.mark.triton  # a wrong solution may launch on a bad slot and crash: run it in a forked child
def test_every_promised_error():
    cfg = (2, 4, 4, 8, 2)
    bad = {
        "x with the wrong dim": lambda t: t.update(x=t["x"][..., :3]),
        "B with a group count that does not divide nheads": lambda t: t.update(
            B=t["B"][:, :1].repeat(1, 3, 1)
        ),
        "A of the wrong dstate": lambda t: t.update(A=t["A"][..., :4]),
        "a 3-D state": lambda t: t.update(state=t["state"][0]),
    }
    for what, breaks in bad.items():
        t = _inputs(cfg, seed=9, slots=3)
        breaks(t)
        before = t["state"].clone()
        with pytest.raises(ValueError):
            lab.selective_state_update(**t)
        assert torch.equal(t["state"], before), f"{what}: refused, but the state changed"
    for idx in ([0, 3], [-1, 1], [0, 1, 2]):
        t = _inputs(cfg, seed=9, slots=3)
        with pytest.raises(ValueError, match="state_indices"):
            lab.selective_state_update(**t, state_indices=torch.tensor(idx))
    t = _inputs((4, 4, 4, 8, 2), seed=9, slots=3)
    with pytest.raises(ValueError):
        lab.selective_state_update(**t)  # 4 requests, 3 slots, no state_indices


def test_byte_model():
    assert lab.ssu_bytes(1, 1, 1, 1, 1, state_bytes=4, elem_bytes=2) == 2 * 4 + 4 * 2 + 2 * 2 + 4 + 8
    b, h, d, n, g = 256, 80, 64, 128, 1
    got = lab.ssu_bytes(b, h, d, n, g, state_bytes=4, elem_bytes=2)
    want = 2 * b * h * d * n * 4 + 4 * b * h * d * 2 + 2 * b * g * n * 2 + h * d * n * 4 + 2 * h * d * 4
    assert got == want, (
        f"bytes = state read + written (2·b·h·d·n·state_bytes) + x, dt, z read and out written (4·b·h·d·elem) + "
        f"B, C (2·b·g·n·elem) + A (h·d·n·4) + D, dt_bias (2·h·d·4): want {want:,}, got {got:,}"
    )
    assert lab.ssu_bytes(b, h, d, n, g, state_bytes=2) < got, "a bf16 state halves the dominant term"


@pytest.mark.gpu
@pytest.mark.triton
def test_mamba2_shape_gpu():
    b, h, d, n, g = 64, 80, 64, 128, 1  # Mamba2-2.7B: 80 heads of 64, dstate 128, one group
    t = lab.make_inputs(b, h, d, n, g, seed=10, dtype=torch.bfloat16, device="cuda")
    want_out, want_state = lab.ssu_reference(**{k: v.cpu() for k, v in t.items()})
    out = lab.selective_state_update(**t)
    err = (out.cpu().double() - want_out).abs().max().item() / want_out.abs().max().item()
    assert err < 2e-2, f"Mamba2-2.7B shape, bf16 activations: relative error {err:.1e}"
    assert (t["state"].cpu().double() - want_state).abs().max().item() < 1e-3
