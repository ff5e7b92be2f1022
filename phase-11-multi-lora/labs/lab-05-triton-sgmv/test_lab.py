"""Lab 11-05: SGMV shrink/expand in Triton. Grades solution.py, or starter.py with LAB_IMPL=starter.

Kernels run under the Triton interpreter on tiny shapes (no GPU needed); the references are a
float64 per-row loop, vLLM's ``PunicaWrapperCPU.add_lora_linear`` and vLLM's own Triton
``_lora_shrink`` / ``_lora_expand`` (run for real under the interpreter).
"""

import pytest

from course.runtime import lab_module

lab = lab_module(__file__)   # solution.py by default; LAB_IMPL=starter grades starter.py

torch = pytest.importorskip("torch")

H_IN, H_OUT, RANK = 40, 24, 5   # hidden not a multiple of 16, rank not a power of 2


def weights(slots=4, rank=RANK, h_in=H_IN, h_out=H_OUT, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    a = (torch.randn(slots, rank, h_in, generator=g) / h_in ** 0.5).to(dtype)
    b = (torch.randn(slots, h_out, rank, generator=g) / rank ** 0.5).to(dtype)
    return a, b


def reference(x, a, b, slots, scale, y0=None, add=True):
    """Float64 per-row loop: row r gets scale · (x[r] @ A[s]ᵀ) @ B[s]ᵀ; base rows keep y0."""
    x64, a64, b64 = x.double(), a.double(), b.double()
    y = torch.zeros(x.shape[0], b.shape[1], dtype=torch.float64) if y0 is None else y0.double().clone()
    for r, s in enumerate(slots.tolist()):
        if s >= 0:
            d = scale * (x64[r] @ a64[s].T) @ b64[s].T
            y[r] = y[r] + d if add else d
    return y


def shrink_ref(x, a, slots, scale):
    s = torch.zeros(x.shape[0], a.shape[1], dtype=torch.float64)
    for r, k in enumerate(slots.tolist()):
        if k >= 0:
            s[r] = scale * x[r].double() @ a[k].double().T
    return s


# --------------------------------------------------------------------------- part 1: metadata
def test_metadata_worked_example():
    meta = lab.sgmv_metadata(torch.tensor([-1, 0, 1, 0, -1, 2, 2, 1]), 4)
    assert meta.sorted_token_ids.tolist() == [0, 4, 1, 3, 2, 7, 5, 6], (
        "rows sorted by slot with a STABLE sort: base rows 0, 4 first (slot -1), then slot 0's rows 1, 3, ..."
    )
    assert meta.slot_ids.tolist() == [-1, 0, 1, 2, -1], (
        "slots present in increasing order (-1, the base group, first), padded with -1 to max_loras + 1 = 5 entries"
    )
    assert meta.num_tokens_per_slot.tolist() == [2, 2, 2, 2, 0], "rows per group, 0 for the padding entries"
    assert meta.slot_start.tolist() == [0, 2, 4, 6, 8, 0], (
        "slot_start[0] = 0 and slot_start[i + 1] = rows in groups 0..i; padded with 0 to max_loras + 2 entries"
    )
    for t in meta:
        assert t.dtype == torch.int32, f"metadata tensors are int32, as vLLM's LoRAKernelMeta; got {t.dtype}"


def test_metadata_without_base_rows_and_with_an_idle_adapter():
    # 4 slots, slot 3 (the highest) holds an adapter that receives no tokens; no base rows at all.
    meta = lab.sgmv_metadata(torch.tensor([2, 0, 2, 1, 0, 2]), 4)
    assert meta.slot_ids.tolist() == [0, 1, 2, -1, -1], (
        f"no base rows: no -1 group at the front; slot 3 has no rows so it is not listed; got {meta.slot_ids.tolist()}"
    )
    assert meta.num_tokens_per_slot.tolist() == [2, 1, 3, 0, 0]
    assert meta.slot_start.tolist() == [0, 2, 3, 6, 0, 0]
    assert meta.sorted_token_ids.tolist() == [1, 4, 3, 0, 2, 5]


def test_metadata_all_base():
    meta = lab.sgmv_metadata(torch.full((3,), -1), 2)
    assert meta.slot_ids.tolist() == [-1, -1, -1] and meta.num_tokens_per_slot.tolist() == [3, 0, 0]


@pytest.mark.parametrize("bad, match", [([0, 3], "-1..2"), ([-2, 0], "-1..2")])
def test_metadata_rejects_slots_out_of_range(bad, match):
    with pytest.raises(ValueError, match=match):
        lab.sgmv_metadata(torch.tensor(bad), 3)


def test_metadata_rejects_2d_slots():
    with pytest.raises(ValueError, match="1-D"):
        lab.sgmv_metadata(torch.zeros(2, 2, dtype=torch.int64), 3)
    try:
        meta = lab.sgmv_metadata(torch.zeros(0, 2, dtype=torch.int64), 3)
    except ValueError:
        return
    pytest.fail(f"an empty (0, 2) slots tensor gave {meta.slot_ids.tolist()}: it is still 2-D; check the shape before "
                "any early return for an empty batch")


# --------------------------------------------------------------------------- part 2: shrink
@pytest.mark.triton
def test_shrink_matches_numpy_with_ragged_shapes_and_scale():
    g = torch.Generator().manual_seed(1)
    slots = torch.tensor([3, -1, 0, 3, 3, -1, 0, 2, 3, 3])      # slot 1 idle; every shape ragged
    x = torch.randn(len(slots), H_IN, generator=g)
    a, _ = weights(rank=20)                                     # rank 20: two BLOCK_N tiles of 16
    meta = lab.sgmv_metadata(slots, 4)
    out = torch.full((len(slots), 20), 7.0)                     # stale values must not survive
    lab.lora_shrink(x, a, meta, 0.25, out=out)
    want = shrink_ref(x, a, slots, 0.25)
    err = (out.double() - want).abs().max().item()
    assert err < 1e-4, (
        f"shrink is off by {err:.2e}: s[r] = scale · x[r] @ A[slot]ᵀ, masking the K tail (hidden 40 = 16 + 16 + 8) "
        f"and the N tail (rank 20 = 16 + 4); base rows stay 0"
    )


@pytest.mark.triton
@pytest.mark.parametrize("layout", ["column-slice", "transposed"])
def test_shrink_reads_x_through_its_strides(layout):
    g = torch.Generator().manual_seed(2)
    slots = torch.tensor([1, 0, -1, 1, 0])
    if layout == "column-slice":
        wide = torch.randn(len(slots), H_IN + 7, generator=g)
        x = wide[:, 3:3 + H_IN]                                  # row stride 47, not 40
        fix = "address rows with stride_xm, not with K"
    else:
        x = torch.randn(H_IN, len(slots), generator=g).T         # strides (1, 5): features are not adjacent
        fix = "address features with stride_xk, not as adjacent elements"
    assert not x.is_contiguous()
    a, _ = weights(slots=2)
    s = lab.lora_shrink(x, a, lab.sgmv_metadata(slots, 2), 1.0)
    err = (s.double() - shrink_ref(x, a, slots, 1.0)).abs().max().item()
    assert err < 1e-4, f"off by {err:.2e} on a {layout} x (strides {x.stride()}): {fix}"


@pytest.mark.triton
def test_shrink_walks_every_m_tile_of_a_large_group():
    # 37 rows on slot 1 need three BLOCK_M = 16 tiles; 3 rows on slot 0 and 4 base rows around them.
    slots = torch.tensor([1] * 20 + [0, -1, 0] + [1] * 17 + [-1, 0, -1, -1])
    x = torch.randn(len(slots), H_IN, generator=torch.Generator().manual_seed(3))
    a, _ = weights(slots=2)
    s = lab.lora_shrink(x, a, lab.sgmv_metadata(slots, 2), 1.0)
    bad = ((s.double() - shrink_ref(x, a, slots, 1.0)).abs().max(dim=1).values > 1e-4).nonzero().flatten().tolist()
    assert not bad, (
        f"rows {bad} are wrong: a group with more rows than BLOCK_M is split over several programs; "
        f"program pid_m takes rows pid_m·BLOCK_M .. of its group"
    )


@pytest.mark.triton
def test_slot_offset_is_int64():
    """Slot 2's A starts 2·(2**30 + 8) = 2**31 + 16 elements into the buffer: int32 arithmetic wraps."""
    import mmap
    stride = (1 << 30) + 8
    n = 2 * stride + RANK * H_IN
    mm = mmap.mmap(-1, 2 * n, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | getattr(mmap, "MAP_NORESERVE", 0))
    big = torch.frombuffer(mm, dtype=torch.float16, count=n)      # virtual: only touched pages cost memory
    a = torch.as_strided(big, (3, RANK, H_IN), (stride, H_IN, 1))
    g = torch.Generator().manual_seed(4)
    for k in range(3):
        a[k] = (torch.randn(RANK, H_IN, generator=g) / 6).half()
    x = torch.randn(3, H_IN, generator=g).half()
    slots = torch.tensor([2, 0, 2])
    s = lab.lora_shrink(x, a, lab.sgmv_metadata(slots, 3), 1.0)
    err = (s.double() - shrink_ref(x, a, slots, 1.0)).abs().max().item()
    del a, big
    assert err < 1e-2, (
        f"off by {err:.2e} when slot 2's weights sit 2**31 + 16 elements into lora_a: "
        f"slot * stride overflowed int32; cast the slot to int64 before multiplying"
    )


# --------------------------------------------------------------------------- part 3: expand
@pytest.mark.triton
@pytest.mark.parametrize("add_inputs", [True, False], ids=["add", "store"])
def test_expand_every_slot_occupied_leaves_base_rows_alone(add_inputs):
    # Every slot holds an adapter, so a kernel that lets -1 wrap to the last slot (the CPU ops' defect
    # at the pin) or forgets the early exit changes base rows.
    g = torch.Generator().manual_seed(5)
    slots = torch.tensor([-1, 2, 0, -1, 1, 2, -1, 0, 1])
    s = torch.randn(len(slots), RANK, generator=g)
    _, b = weights(slots=3)
    y0 = torch.randn(len(slots), H_OUT, generator=g)
    y = lab.lora_expand(s, b, lab.sgmv_metadata(slots, 3), y0.clone(), add_inputs=add_inputs)
    base = slots < 0
    assert torch.equal(y[base], y0[base]), (
        "base rows (slot -1) changed: group -1 must exit before touching any weight or output row"
    )
    want = y0.double().clone()
    for r, k in enumerate(slots.tolist()):
        if k >= 0:
            d = s[r].double() @ b[k].double().T
            want[r] = want[r] + d if add_inputs else d
    err = (y.double() - want).abs().max().item()
    how = "added to" if add_inputs else "stored over (add_inputs=False)"
    assert err < 1e-4, f"adapter rows off by {err:.2e}: s[r] @ B[slot]ᵀ must be {how} the old output row"


@pytest.mark.triton
def test_expand_writes_into_a_column_slice():
    # A fused q/k/v output: this adapter's slice is columns 8 .. 8 + H_OUT of a wider tensor.
    g = torch.Generator().manual_seed(6)
    slots = torch.tensor([0, -1, 1, 1, 0, 1])
    s = torch.randn(len(slots), RANK, generator=g)
    _, b = weights(slots=2)
    full = torch.randn(len(slots), H_OUT + 16, generator=g)
    before = full.clone()
    lab.lora_expand(s, b, lab.sgmv_metadata(slots, 2), full[:, 8:8 + H_OUT], add_inputs=True)
    assert torch.equal(full[:, :8], before[:, :8]) and torch.equal(full[:, 8 + H_OUT:], before[:, 8 + H_OUT:]), (
        "columns outside the slice changed: address the output with its own row stride (stride_om), not N"
    )
    want = before[:, 8:8 + H_OUT].double().clone()
    for r, k in enumerate(slots.tolist()):
        if k >= 0:
            want[r] += s[r].double() @ b[k].double().T
    err = (full[:, 8:8 + H_OUT].double() - want).abs().max().item()
    assert err < 1e-4, f"off by {err:.2e} inside the column slice"


@pytest.mark.triton
def test_expand_reads_s_and_writes_out_through_their_strides():
    # s: the rank columns of a wider buffer (row stride RANK + 3); out: a transposed view (column stride T).
    g = torch.Generator().manual_seed(12)
    slots = torch.tensor([1, -1, 0, 1, 0, 1, -1])
    s = torch.randn(len(slots), RANK + 3, generator=g)[:, 1:1 + RANK]
    _, b = weights(slots=2)
    buf = torch.randn(H_OUT, len(slots), generator=g)
    before = buf.clone()
    lab.lora_expand(s, b, lab.sgmv_metadata(slots, 2), buf.T, add_inputs=True)
    want = before.T.double().clone()
    for r, k in enumerate(slots.tolist()):
        if k >= 0:
            want[r] += s[r].double() @ b[k].double().T
    err = (buf.T.double() - want).abs().max().item()
    assert err < 1e-4, (
        f"off by {err:.2e} with s of strides {s.stride()} and out of strides {buf.T.stride()}: read s with "
        f"stride_sm / stride_sk (not row * rank) and write out with stride_om / stride_on (not adjacent columns)"
    )


@pytest.mark.triton
def test_add_lora_matches_the_per_row_loop_with_padded_ranks():
    # Slot buffers sized for max_lora_rank = 8; the adapters have rank 3 and 5, zero-padded.
    g = torch.Generator().manual_seed(7)
    a = torch.zeros(3, 8, H_IN)
    b = torch.zeros(3, H_OUT, 8)
    for k, r in enumerate([3, 5, 8]):
        a[k, :r] = torch.randn(r, H_IN, generator=g) / 6
        b[k, :, :r] = torch.randn(H_OUT, r, generator=g) / 2
    slots = torch.tensor([1, 1, -1, 0, 2, 1, -1, 0, 0, 2, 1])
    x = torch.randn(len(slots), H_IN, generator=g)
    y0 = torch.randn(len(slots), H_OUT, generator=g)
    y = lab.add_lora(y0.clone(), x, a, b, slots, 2.0)
    err = (y.double() - reference(x, a, b, slots, 2.0, y0)).abs().max().item()
    assert err < 1e-4, f"shrink then expand is off by {err:.2e} (scale 2, ranks 3/5 padded to 8)"


# --------------------------------------------------------------------------- against vLLM
@pytest.fixture(scope="module")
def punica():
    from vllm.lora.layers.utils import LoRAMapping
    from vllm.lora.punica_wrapper.punica_cpu import PunicaWrapperCPU

    from course.runtime.real_vllm import unpinned_h2d
    return PunicaWrapperCPU, LoRAMapping, unpinned_h2d


@pytest.mark.triton
@pytest.mark.upstream
def test_add_lora_equals_punica_wrapper_cpu(punica):
    PunicaWrapperCPU, LoRAMapping, unpinned_h2d = punica
    lora_index_to_id = [11, 22, 33, None]   # slot 3 never loaded: all zeros, as vLLM allocates it
    a, b = weights(slots=4, seed=8)
    a[3].zero_()
    b[3].zero_()
    ids = (0, 22, 11, 33, 0, 33, 22, 22, 0, 11)
    g = torch.Generator().manual_seed(9)
    x = torch.randn(len(ids), H_IN, generator=g)
    y0 = torch.randn(len(ids), H_OUT, generator=g)
    with unpinned_h2d():
        pw = PunicaWrapperCPU(max_num_batched_tokens=64, max_batches=16, device="cpu")
        pw.update_metadata(LoRAMapping(index_mapping=ids, prompt_mapping=ids, is_prefill=True),
                           lora_index_to_id=lora_index_to_id, max_loras=4, vocab_size=512)
        want = y0.clone()
        pw.add_lora_linear(want, x, (a[:, None],), (b[:, None],), scale=0.5, output_slices=(H_OUT,))
    slots = pw.token_lora_indices[: len(ids)].clone()
    assert slots.tolist() == [-1, 1, 0, 2, -1, 2, 1, 1, -1, 0]
    got = lab.add_lora(y0.clone(), x, a, b, slots, 0.5)
    err = (got - want).abs().max().item()
    assert err < 1e-4, f"your add_lora and vLLM's PunicaWrapperCPU.add_lora_linear differ by {err:.2e}"


@pytest.fixture(scope="module")
def vllm_ops():
    from vllm.lora.ops.triton_ops import LoRAKernelMeta
    from vllm.lora.ops.triton_ops.lora_expand_op import _lora_expand
    from vllm.lora.ops.triton_ops.lora_shrink_op import _lora_shrink
    return LoRAKernelMeta, _lora_shrink, _lora_expand


@pytest.mark.triton
@pytest.mark.upstream
@pytest.mark.parametrize("tiles", ["small", pytest.param("vllm-default", marks=pytest.mark.slow)])
def test_matches_vllm_triton_kernels_every_slot_occupied(vllm_ops, monkeypatch, tiles):
    # fp16: vLLM's shrink asserts fp16/bf16, and the interpreter computes bf16 through numpy, which has none.
    dtype = torch.float16
    LoRAKernelMeta, _lora_shrink, _lora_expand = vllm_ops
    if tiles == "small":
        # vLLM's own kernels with 16x16x16 tiles and no split-K (what a tuning file may choose): the default
        # shrink config splits K 64 ways at small batch, 64x the programs for the interpreter to walk.
        import vllm.lora.ops.triton_ops.lora_expand_op as ex
        import vllm.lora.ops.triton_ops.lora_shrink_op as sh
        small = dict(block_m=16, block_n=16, block_k=16, split_k=1, num_warps=4, num_ctas=1, num_stages=1)
        monkeypatch.setattr(sh, "get_lora_op_configs", lambda *a, **k: small)
        monkeypatch.setattr(ex, "get_lora_op_configs", lambda *a, **k: small)
    slots = torch.tensor([-1, 0, 2, 0, -1, 2, 2, 1, -1, 1], dtype=torch.int32)
    a, b = weights(slots=3, seed=10, dtype=dtype)
    g = torch.Generator().manual_seed(11)
    x = torch.randn(len(slots), H_IN, generator=g).to(dtype)
    y0 = torch.randn(len(slots), H_OUT, generator=g).to(dtype)

    meta = LoRAKernelMeta.make(max_loras=3, max_num_tokens=32, device="cpu")
    meta.prepare_tensors(slots)
    args = meta.meta_args(len(slots), specialize_active_lora=False)
    s_vllm = torch.zeros(1, len(slots), RANK, dtype=torch.float32)
    _lora_shrink(x, [a], s_vllm, *args, 0.5)

    ours = lab.sgmv_metadata(slots, 3)
    assert ours.slot_ids.tolist() == meta.active_lora_ids.tolist(), "slot_ids must match vLLM's active_lora_ids"
    assert ours.sorted_token_ids.tolist() == meta.token_indices_sorted_by_lora_ids[: len(slots)].tolist()
    s = lab.lora_shrink(x, a, ours, 0.5)
    assert (s - s_vllm[0]).abs().max().item() < 1e-3, "shrink differs from vLLM's _lora_shrink"
    base = slots < 0
    for add_inputs in (True, False):
        y_vllm = y0.clone()
        _lora_expand(s_vllm, [b], y_vllm, *args, offset_start=0, add_inputs=add_inputs)
        y = lab.lora_expand(s, b, ours, y0.clone(), add_inputs=add_inputs)
        assert torch.equal(y_vllm[base], y0[base]), "vLLM's Triton kernels leave base rows alone (the -1 early exit)"
        assert torch.equal(y[base], y0[base]), "base rows changed: vLLM's kernels exit on slot -1 and so must yours"
        err = (y.float() - y_vllm.float()).abs().max().item()
        assert err < 2e-2, f"expand differs from vLLM's _lora_expand by {err:.2e} ({dtype}, add_inputs={add_inputs})"


# --------------------------------------------------------------------------- GPU, full size
@pytest.mark.gpu
@pytest.mark.triton
def test_full_size_bf16_matches_torch_gpu():
    g = torch.Generator(device="cuda").manual_seed(0)
    T, H, R, S = 512, 4096, 16, 8
    x = torch.randn(T, H, device="cuda", generator=g).to(torch.bfloat16)
    a = (torch.randn(S, R, H, device="cuda", generator=g) / H ** 0.5).to(torch.bfloat16)
    b = (torch.randn(S, H, R, device="cuda", generator=g) / R ** 0.5).to(torch.bfloat16)
    slots = torch.randint(-1, S, (T,), device="cuda", generator=g)
    y0 = torch.randn(T, H, device="cuda", generator=g).to(torch.bfloat16)
    y = lab.add_lora(y0.clone(), x, a, b, slots, 1.0)
    want = y0.float().clone()
    for k in range(S):
        rows = (slots == k).nonzero().flatten()
        want[rows] += (x[rows].float() @ a[k].float().T) @ b[k].float().T
    err = ((y.float() - want).abs().max() / want.abs().max()).item()
    assert err < 2e-2, f"relative error {err:.2e} at T={T}, H={H}, R={R}, {S} slots"
    assert torch.equal(y[slots < 0], y0[slots < 0]), "base rows changed on the GPU"
