import importlib

import pytest
import torch

from course.runtime import lab_module

lab = lab_module(__file__)  # solution.py by default; LAB_IMPL=starter grades starter.py

pytestmark = pytest.mark.triton


def layers_of(num_layers, num_blocks, bs, heads, d, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(2, num_blocks, bs, heads, d, generator=g).to(dtype) for _ in range(num_layers)]


def cross_layer(num_layers, num_blocks, bs, heads, d, seed=0):
    """Every layer a non-contiguous view into one buffer ordered (block, layer, K/V, row, head, dim)."""
    g = torch.Generator().manual_seed(seed)
    big = torch.randn(num_blocks, num_layers, 2, bs, heads, d, generator=g)
    return big, [big[:, i].permute(1, 0, 2, 3, 4) for i in range(num_layers)]


def slots(*xs):
    return torch.tensor(xs, dtype=torch.int64)


@pytest.mark.parametrize(
    "L,nb,bs,h,d,sl,dtype",
    [
        (3, 12, 4, 2, 8, (17, 18, 19, 4, 5, 40), torch.float32),  # unsorted, a partial block
        (1, 5, 16, 1, 3, (79,), torch.float32),  # one token, the last slot, a row narrower than BLOCK
        (4, 9, 8, 3, 50, tuple(range(5, 15)), torch.float16),  # rows of 150 values: 3 BLOCK chunks
    ],
)
def test_gather_matches_torch_indexing(L, nb, bs, h, d, sl, dtype):
    layers = layers_of(L, nb, bs, h, d, dtype)
    got = lab.gather_kv(layers, slots(*sl))
    want = lab.gather_kv_torch(layers, slots(*sl))
    assert got.shape == (L, 2, len(sl), h * d), (
        f"buffer must be (layers, 2, tokens, hidden), got {tuple(got.shape)}"
    )
    for layer in range(L):
        for kv in (0, 1):
            assert torch.equal(got[layer, kv], want[layer, kv]), (
                f"layer {layer} {'KV'[kv]} rows differ: buffer row t must be slot {sl}[t]'s row of that layer"
            )


def test_scatter_round_trips_and_touches_only_the_slots():
    src = layers_of(3, 12, 4, 2, 8, seed=1)
    buf = lab.gather_kv(src, slots(17, 18, 19, 4, 5, 40))
    dst = [torch.zeros_like(t) for t in src]
    where = slots(45, 0, 1, 2, 3, 30)
    lab.scatter_kv(dst, where, buf)
    assert torch.equal(lab.gather_kv(dst, where), buf), (
        "scatter then gather of the same slots must give the buffer back"
    )
    for t in dst:
        flat = t.reshape(2, -1, 16).clone()
        flat[:, where] = 0
        assert not flat.any(), "scatter may write only the given slots (K and V rows of every layer)"


def test_non_contiguous_layers_use_their_strides():
    big, layers = cross_layer(3, 6, 4, 2, 8, seed=2)
    assert not layers[0].is_contiguous()
    sl = slots(0, 5, 9, 23, 22)
    assert torch.equal(lab.gather_kv(layers, sl), lab.gather_kv_torch(layers, sl)), (
        "layers that are views of a cross-layer buffer: address rows with the layer's strides"
    )
    before = big.clone()
    buf = torch.full((3, 2, 5, 16), 7.0)
    lab.scatter_kv(layers, sl, buf)
    assert torch.equal(lab.gather_kv_torch(layers, sl), buf), "scatter must write through the views"
    assert int((big != before).sum()) == 3 * 2 * 5 * 16, "exactly 3 layers x K,V x 5 rows x 16 values change"


def test_offsets_are_int64():
    """Offsets past 2**31 elements, computed by your two helpers inside a kernel (no memory touched)."""
    import triton
    import triton.language as tl

    @triton.jit
    def probe(out_ptr, num_tokens, hidden, block_size, stride_block, stride_off):
        layer = tl.program_id(0) + 79
        tok = tl.program_id(1) + 32767
        slot = tl.program_id(0) + 3_000_000
        tl.store(out_ptr, lab.buffer_offset(layer, tok, num_tokens, hidden).to(tl.int64))
        tl.store(out_ptr + 1, lab.cache_offset(slot, block_size, stride_block, stride_off).to(tl.int64))

    out = torch.zeros(2, dtype=torch.int64)
    probe[(1, 1)](out, 32768, 1024, 16, 16 * 1024, 1024)
    want = [(79 * 2 * 32768 + 32767) * 1024, (3_000_000 // 16) * 16 * 1024 + (3_000_000 % 16) * 1024]
    assert out.tolist() == want, (
        f"80 layers x 32k tokens x 1,024 values: offsets {out.tolist()} should be {want}; "
        "program ids and int arguments are int32: cast to tl.int64 before multiplying"
    )


def test_bad_input_is_refused_before_any_launch():
    layers = layers_of(2, 4, 4, 2, 8)
    buf = lab.gather_kv(layers, slots(1, 2))
    with pytest.raises(TypeError, match="int64"):
        lab.gather_kv(layers, torch.tensor([1, 2], dtype=torch.int32))
    with pytest.raises(ValueError, match="slots must lie"):
        lab.gather_kv(layers, slots(16))
    with pytest.raises(ValueError, match="share shape"):
        lab.gather_kv([layers[0], layers[1][:, :3]], slots(1))
    with pytest.raises(ValueError, match="buffer must be"):
        lab.scatter_kv(layers, slots(1, 2), buf[:, :, :1])
    assert lab.gather_kv(layers, slots()).shape == (2, 2, 0, 16), "no tokens: an empty buffer, no launch"


@pytest.fixture(scope="module")
def hf3fs():
    importlib.import_module("course.runtime.real_vllm")  # the CPU wiring upstream's kernels need
    return importlib.import_module(
        "vllm.distributed.kv_transfer.kv_connector.v1.hf3fs.utils.gather_scatter_helper"
    )


@pytest.mark.upstream
def test_matches_upstreams_hf3fs_helper(hf3fs):
    """vLLM's hf3fs gather/scatter (one layer = a contiguous (2, slots, hidden) tensor) agrees with
    yours on contiguous layers, buffer for buffer; on cross-layer views it reads the wrong rows."""
    layers = layers_of(3, 10, 4, 2, 8, seed=3)
    sl = [33, 2, 3, 17, 16]
    ptrs = torch.tensor([t.data_ptr() for t in layers], dtype=torch.int64)
    theirs = torch.zeros(3, 2, len(sl), 16)
    hf3fs.gather_kv_caches(ptrs, 40, theirs, sl)
    assert torch.equal(lab.gather_kv(layers, torch.tensor(sl)), theirs), (
        "your buffer differs from vLLM's helper"
    )
    back = [torch.zeros_like(t) for t in layers]
    hf3fs.scatter_kv_caches(torch.tensor([t.data_ptr() for t in back], dtype=torch.int64), 40, theirs, sl)
    assert torch.equal(lab.gather_kv(back, torch.tensor(sl)), theirs), (
        "vLLM's scatter of your buffer must round-trip"
    )

    _, views = cross_layer(3, 10, 4, 2, 8, seed=4)
    stale = torch.zeros(3, 2, len(sl), 16)
    hf3fs.gather_kv_caches(torch.tensor([t.data_ptr() for t in views], dtype=torch.int64), 40, stale, sl)
    assert not torch.equal(stale, lab.gather_kv_torch(views, torch.tensor(sl)))
    assert torch.equal(lab.gather_kv(views, torch.tensor(sl)), lab.gather_kv_torch(views, torch.tensor(sl)))


@pytest.mark.gpu
def test_full_size_on_a_gpu():
    """32 layers, 8 KV heads x 128 dims, fp16, a 2,048-token request scattered over 4,096 blocks."""
    g = torch.Generator(device="cuda").manual_seed(0)
    layers = [
        torch.randn(2, 4096, 16, 8, 128, device="cuda", dtype=torch.float16, generator=g) for _ in range(32)
    ]
    sl = torch.randperm(4096 * 16, device="cuda", generator=g)[:2048].to(torch.int64)
    buf = lab.gather_kv(layers, sl)
    assert torch.equal(buf, lab.gather_kv_torch(layers, sl))
    dst = [torch.zeros_like(t) for t in layers]
    lab.scatter_kv(dst, sl, buf)
    assert torch.equal(lab.gather_kv(dst, sl), buf)
