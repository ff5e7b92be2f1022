import numpy as np
import pytest

from course.runtime import lab_module

lab = lab_module(__file__)   # solution.py by default; LAB_IMPL=starter grades starter.py


torch = pytest.importorskip("torch")

# (head_size, rotary_dim, q heads, kv heads, mrope_section): Qwen2-VL's split scaled down, GQA with odd
# head counts, partial rotary with a frequency count that is not a power of two, empty sections.
CONFIGS = [
    (32, 32, 4, 2, [4, 6, 6]),
    (16, 16, 3, 1, [2, 3, 3]),
    (40, 24, 2, 1, [4, 4, 4]),
    (16, 16, 2, 2, [8, 0, 0]),
    (20, 16, 5, 3, [1, 1, 6]),
]


def _positions(num_tokens, seed, high=64):
    """Three streams that differ token by token, so a frequency reading the wrong stream shows."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, high, (3, num_tokens), generator=g)


def _qk(num_tokens, nq, nk, head_size, seed, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(num_tokens, nq * head_size, generator=g).to(dtype),
            torch.randn(num_tokens, nk * head_size, generator=g).to(dtype))


@pytest.fixture(scope="module")
def vllm_mrope():
    """A factory for vLLM's own ``MRotaryEmbedding`` (cos_sin_cache, forward_native, forward_cuda = its Triton kernel)."""
    pytest.importorskip("vllm")
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.model_executor.layers.rotary_embedding.mrope import MRotaryEmbedding

    ctx = set_current_vllm_config(VllmConfig())
    ctx.__enter__()

    def make(head_size, rotary_dim, section, max_pos=32):
        return MRotaryEmbedding(head_size=head_size, rotary_dim=rotary_dim, max_position_embeddings=max_pos,
                                base=10000.0, is_neox_style=True, dtype=torch.float32, mrope_section=list(section))

    yield make
    ctx.__exit__(None, None, None)


# --------------------------------------------------------------------------- the numpy reference
@pytest.mark.parametrize("section", [[2, 3, 3], [8, 0, 0], [0, 0, 8], [0, 8, 0], [1, 6, 1]])
def test_cos_sin_reads_one_stream_per_frequency(section):
    cache = lab.rope_cache(64, 16)
    pos = _positions(5, 1).numpy()
    cos, sin = lab.mrope_cos_sin(pos, cache, section)
    assert cos.shape == sin.shape == (5, 8), f"cos and sin are (tokens, rotary_dim // 2) = (5, 8), got {cos.shape}"
    bounds = np.cumsum(section)
    for i in range(8):
        stream = int(np.searchsorted(bounds, i, side="right"))
        assert np.array_equal(cos[:, i], cache[pos[stream], i]), (
            f"section {section}: frequency {i} must rotate by stream {'thw'[stream]}'s position "
            f"(t for i < {bounds[0]}, h for i < {bounds[1]}, w after)"
        )
        assert np.array_equal(sin[:, i], cache[pos[stream], 8 + i]), (
            f"sin of frequency {i} lives in column rotary_dim // 2 + {i} = {8 + i} of the cache row"
        )


@pytest.mark.upstream
@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: f"{c[0]}-{c[1]}-{c[2]}q{c[3]}kv-{c[4]}")
def test_reference_matches_vllm_forward_native(vllm_mrope, cfg):
    head_size, rotary_dim, nq, nk, section = cfg
    m = vllm_mrope(head_size, rotary_dim, section)
    cache = m.cos_sin_cache
    assert np.allclose(lab.rope_cache(cache.shape[0], rotary_dim), cache.numpy(), atol=1e-5)
    pos = _positions(6, 2, high=cache.shape[0])
    q, k = _qk(6, nq, nk, head_size, 3)
    want_q, want_k = m.forward_native(pos, q.clone(), k.clone())
    got_q, got_k = lab.mrope_reference(pos.numpy(), q.numpy(), k.numpy(), cache.numpy(), head_size, rotary_dim, section)
    for name, got, want in (("q", got_q, want_q), ("k", got_k, want_k)):
        err = np.abs(got - want.double().numpy()).max()
        assert err < 1e-5, (
            f"{cfg}: the float64 reference's {name} is off vLLM's forward_native by {err:.1e}: neox style rotates "
            f"x[i] with x[i + rotary_dim // 2] (not adjacent pairs), and features past rotary_dim pass through"
        )


# --------------------------------------------------------------------------- the kernel
@pytest.mark.triton
@pytest.mark.upstream
@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: f"{c[0]}-{c[1]}-{c[2]}q{c[3]}kv-{c[4]}")
def test_kernel_equals_vllm_native_and_vllms_triton_kernel(vllm_mrope, cfg):
    head_size, rotary_dim, nq, nk, section = cfg
    m = vllm_mrope(head_size, rotary_dim, section)
    pos = _positions(3, 4, high=m.cos_sin_cache.shape[0])   # 3 tokens: each is one interpreted program
    q, k = _qk(3, nq, nk, head_size, 5)
    native = m.forward_native(pos, q.clone(), k.clone())
    theirs = m.forward_cuda(pos, q.clone(), k.clone())        # vLLM's _triton_mrope_forward, same interpreter
    ours = lab.mrope_forward(pos, q.clone(), k.clone(), m.cos_sin_cache, head_size, rotary_dim, section)
    for name, i in (("q", 0), ("k", 1)):
        assert torch.equal(theirs[i], native[i]), "vLLM's own kernel and forward_native agree exactly in fp32"
        err = (ours[i] - native[i]).abs().max().item()
        assert err == 0.0, (
            f"{cfg}: your kernel's {name} differs from vLLM's forward_native by {err:.1e} (vLLM's Triton kernel: 0.0). "
            f"Check the stream each frequency reads, the neox halves, masks for padded heads/frequencies"
            + (", and the key head count (GQA: fewer kv heads than q heads)" if name == "k" else "")
        )


@pytest.mark.triton
@pytest.mark.upstream
def test_text_tokens_reduce_to_plain_rope(vllm_mrope):
    head_size, rotary_dim, section = 16, 16, [2, 3, 3]
    m = vllm_mrope(head_size, rotary_dim, section)
    flat = torch.tensor([0, 3, 7, 20, 63])
    q, k = _qk(5, 2, 1, head_size, 6)
    plain = m.forward_native(flat, q.clone(), k.clone())           # 1-D positions: vLLM's plain RoPE path
    same3 = lab.mrope_forward(flat.expand(3, 5).contiguous(), q.clone(), k.clone(), m.cos_sin_cache,
                              head_size, rotary_dim, section)
    one_d = lab.mrope_forward(flat, q.clone(), k.clone(), m.cos_sin_cache, head_size, rotary_dim, section)
    for got, what in ((same3, "(3, T) positions with t = h = w"), (one_d, "(T,) positions")):
        assert torch.equal(got[0], plain[0]) and torch.equal(got[1], plain[1]), (
            f"{what} must give plain RoPE exactly: every frequency reads the same position. With (T,) positions, "
            f"read the one stream for all three (a stream stride of 0)"
        )


@pytest.mark.triton
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 3e-2)])
def test_fused_qkv_slices_partial_rotary_in_place(dtype, tol):
    head_size, rotary_dim, nq, nk, section = 24, 16, 3, 1, [3, 2, 3]
    cache = torch.from_numpy(lab.rope_cache(128, rotary_dim))
    # the model runner passes a column slice of its persistent (3, max_num_tokens + 1) buffer: stream stride 17, not 6
    pos = _positions(17, 7, high=128)[:, :6]
    g = torch.Generator().manual_seed(8)
    qkv = torch.randn(6, (nq + 2 * nk) * head_size, generator=g).to(dtype)
    before = qkv.clone()
    q, k = qkv[:, : nq * head_size], qkv[:, nq * head_size : (nq + nk) * head_size]   # row stride 120, widths 72 and 24
    want_q, want_k = lab.mrope_reference(pos.numpy(), q.double().numpy(), k.double().numpy(), cache.numpy(),
                                         head_size, rotary_dim, section)
    out_q, out_k = lab.mrope_forward(pos, q, k, cache, head_size, rotary_dim, section)
    assert out_q.data_ptr() == q.data_ptr() and out_k.data_ptr() == k.data_ptr(), (
        "rotate in place and return the same tensors (vLLM's triton_mrope copies non-contiguous q/k first)"
    )
    assert torch.equal(qkv[:, (nq + nk) * head_size :], before[:, (nq + nk) * head_size :]), (
        "v (the columns after k in the fused row) changed: the key loop must use the key head count and k's own offsets"
    )
    heads = qkv[:, : (nq + nk) * head_size].reshape(6, nq + nk, head_size)
    assert torch.equal(heads[..., rotary_dim:], before[:, : (nq + nk) * head_size].reshape(6, nq + nk, head_size)[..., rotary_dim:]), (
        "features past rotary_dim (24 - 16 = 8 per head) must pass through untouched: rotate pairs (i, i + rotary_dim // 2)"
        " for i < rotary_dim // 2, not (i, i + head_size // 2)"
    )
    for name, got, want in (("q", q, want_q), ("k", k, want_k)):
        err = np.abs(got.double().numpy() - want).max()
        assert err < tol, (
            f"{dtype}: {name} is off the reference by {err:.1e}; q and k are slices of a fused qkv with row stride "
            f"{qkv.stride(0)} and positions a column slice of a (3, 17) buffer: use each tensor's own strides "
            f"(q.stride(0), k.stride(0), positions.stride(0)), not a width or the token count"
        )


def _huge(n, dtype=torch.float16):
    """n elements; on CPU an untouched anonymous mapping, so only the pages written cost memory."""
    if torch.cuda.is_available():
        return torch.zeros(n, dtype=dtype, device="cuda"), None
    import mmap
    flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | getattr(mmap, "MAP_NORESERVE", 0)
    mm = mmap.mmap(-1, n * torch.tensor([], dtype=dtype).element_size(), flags=flags)
    return torch.frombuffer(mm, dtype=dtype, count=n), mm


STRIDE = (1 << 30) + 8    # an int32 stride; token (or position) 2 starts 2**31 + 16 elements in: int32 math wraps


@pytest.mark.triton
def test_token_offsets_past_2_pow_31_elements():
    # Token 2's row starts 2 * STRIDE = 2**31 + 16 elements past q. In int32, token * stride wraps to
    # -2**31 + 16: still inside the (all-zero) mapping q sits in, so a wrong kernel reads zeros instead of
    # crashing. The 8 GiB buffer is virtual on CPU. A real prefill of 16k tokens x 28 heads x 128 x 3 (qkv)
    # has 172M elements per row block: batches of long prompts cross 2**31.
    head_size, rotary_dim, section = 16, 16, [2, 3, 3]
    big, keep = _huge((1 << 31) + 2 * STRIDE + 2 * head_size)
    q = torch.as_strided(big, (3, 2 * head_size), (STRIDE, 1), 1 << 31)
    g = torch.Generator().manual_seed(9)
    vals = torch.randn(3, 2 * head_size, generator=g).to(torch.float16)
    for t in range(3):
        q[t] = vals[t].to(q.device)
    k = torch.randn(3, head_size, generator=g).to(torch.float16).to(q.device)
    cache = torch.from_numpy(lab.rope_cache(16, rotary_dim)).to(q.device)
    pos = _positions(3, 10, high=16).to(q.device)
    want_q, _ = lab.mrope_reference(pos.cpu().numpy(), vals.double().numpy(), k.double().cpu().numpy(),
                                    cache.cpu().numpy(), head_size, rotary_dim, section)
    lab.mrope_forward(pos, q, k, cache, head_size, rotary_dim, section)
    got = torch.stack([q[t].cpu() for t in range(3)]).double().numpy()
    del q, big, keep
    err = np.abs(got - want_q).max()
    assert err < 1e-2, (
        f"token 2's row starts 2**31 + 16 elements into q and the result is off by {err:.1e}: token * row stride "
        f"overflowed int32; cast program_id to int64 before multiplying"
    )


@pytest.mark.triton
def test_position_offsets_past_2_pow_31_elements():
    # The cache row of position 2 starts 2 * STRIDE = 2**31 + 16 elements in: position * cache stride must be
    # computed in int64 (positions are int64; do not narrow them). Wrapped, it reads the mapping's zero pages.
    head_size, rotary_dim, section = 16, 16, [2, 3, 3]
    big, keep = _huge((1 << 31) + 2 * STRIDE + rotary_dim, dtype=torch.float32)
    cache = torch.as_strided(big, (3, rotary_dim), (STRIDE, 1), 1 << 31)
    small = torch.from_numpy(lab.rope_cache(3, rotary_dim))
    for p in range(3):
        cache[p] = small[p].to(cache.device)
    pos = torch.tensor([[2, 1, 0], [0, 2, 2], [2, 2, 1]], device=cache.device)
    q, k = _qk(3, 2, 1, head_size, 11)
    want_q, want_k = lab.mrope_reference(pos.cpu().numpy(), q.numpy(), k.numpy(), small.numpy(), head_size, rotary_dim, section)
    q, k = q.to(cache.device), k.to(cache.device)
    lab.mrope_forward(pos, q, k, cache, head_size, rotary_dim, section)
    del cache, big, keep
    err = max(np.abs(q.cpu().double().numpy() - want_q).max(), np.abs(k.cpu().double().numpy() - want_k).max())
    assert err < 1e-5, (
        f"position 2's cache row starts 2**31 + 16 elements in and the result is off by {err:.1e}: "
        f"position * cache stride overflowed int32; keep the loaded positions int64"
    )


@pytest.mark.triton
def test_zero_tokens_is_a_no_op():
    cache = torch.from_numpy(lab.rope_cache(8, 8))
    q, k = torch.empty(0, 16), torch.empty(0, 8)
    out = lab.mrope_forward(torch.empty(3, 0, dtype=torch.int64), q, k, cache, 8, 8, [2, 1, 1])
    assert out[0] is q and out[1] is k, "no tokens: return q and k untouched without launching"
    pos0 = torch.empty(3, 0, dtype=torch.int64)
    for what, kind, args in [
        ("int32 positions", TypeError, (pos0.to(torch.int32), q, k, cache)),
        # the int64 rule holds for (T,) text positions too, not only for (3, T)
        ("int32 (T,) text positions", TypeError, (torch.empty(0, dtype=torch.int32), q, k, cache)),
        ("a cos_sin_cache 16 wide for rotary_dim 8", ValueError, (pos0, q, k, torch.zeros(8, 16))),
        ("positions for 2 tokens", ValueError, (torch.zeros(3, 2, dtype=torch.int64), q, k, cache)),
        ("k with 5 columns for head_size 8", ValueError, (pos0, q, torch.empty(0, 5), cache)),
    ]:
        try:
            lab.mrope_forward(*args, 8, 8, [2, 1, 1])
        except kind:
            continue
        pytest.fail(f"zero tokens with {what} was accepted: every promised check runs before the early return for an "
                    f"empty batch ({kind.__name__} expected)")


# --------------------------------------------------------------------------- errors
def test_every_promised_error():
    cache = torch.from_numpy(lab.rope_cache(32, 16))
    pos = torch.zeros(3, 4, dtype=torch.int64)
    q, k = torch.zeros(4, 32), torch.zeros(4, 16)

    def call(**kw):
        args = dict(positions=pos, q=q, k=k, cos_sin_cache=cache, head_size=16, rotary_dim=16, mrope_section=[2, 3, 3])
        args.update(kw)
        return lab.mrope_forward(**args)

    with pytest.raises(ValueError, match=r"sums to 9, but rotary_dim 16 has 8 frequencies"):
        call(mrope_section=[3, 3, 3])
    with pytest.raises(ValueError, match="three non-negative"):
        call(mrope_section=[4, 4])
    with pytest.raises(ValueError, match="three non-negative"):
        call(mrope_section=[-1, 4, 5])
    with pytest.raises(ValueError, match="rotary_dim must be even"):
        call(rotary_dim=18, head_size=16, mrope_section=[3, 3, 3], cos_sin_cache=torch.zeros(32, 18))
    with pytest.raises(ValueError, match="rotary_dim must be even"):
        call(rotary_dim=7, mrope_section=[1, 1, 1])
    with pytest.raises(TypeError, match="int64"):
        call(positions=pos.to(torch.int32))
    with pytest.raises(ValueError, match="must be \\(tokens, heads"):
        call(q=torch.zeros(4, 30))
    with pytest.raises(ValueError, match="token counts disagree"):
        call(positions=torch.zeros(3, 5, dtype=torch.int64))
    with pytest.raises(ValueError, match="token counts disagree"):
        call(positions=torch.zeros(2, 4, dtype=torch.int64))
    with pytest.raises(ValueError, match="token counts disagree"):
        call(k=torch.zeros(3, 16))
    with pytest.raises(ValueError, match="cos_sin_cache must be"):
        call(cos_sin_cache=torch.zeros(32, 32))
    with pytest.raises(ValueError, match="unit column stride"):
        call(q=torch.zeros(32, 4).t())
    with pytest.raises(ValueError, match="sums to"):
        lab.mrope_cos_sin(pos.numpy(), cache.numpy(), [4, 4, 4])


# --------------------------------------------------------------------------- the byte model
def test_byte_model():
    assert lab.mrope_bytes(1, 1, 1, 2, 2) == 2 * 1 * 2 * 2 * 2 + 24 + 4, (
        "read + write the rotary part of each q and k head (2 · T · (nq + nk) · rotary_dim · elem), 24 bytes of "
        "int64 positions per token, and one cos + one sin half-row (rotary_dim · elem) per token"
    )
    assert lab.mrope_bytes(4096, 28, 4, 128) == 2 * 4096 * 32 * 128 * 2 + 24 * 4096 + 4096 * 128 * 2
    assert lab.mrope_bytes(10, 4, 4, 64, elem_bytes=4) == 2 * 10 * 8 * 64 * 4 + 240 + 10 * 64 * 4, "elem_bytes scales q, k and the cache"
    assert lab.mrope_bytes(10, 4, 2, 32) != lab.mrope_bytes(10, 4, 2, 64), "only the rotary part of a head is moved"


# --------------------------------------------------------------------------- full size, on a GPU
@pytest.mark.gpu
@pytest.mark.triton
def test_qwen2_vl_7b_shape_bf16_gpu():
    head_size, rotary_dim, nq, nk, section = 128, 128, 28, 4, [16, 24, 24]
    cache = torch.from_numpy(lab.rope_cache(32768, rotary_dim)).cuda()
    g = torch.Generator(device="cuda").manual_seed(0)
    pos = torch.randint(0, 32768, (3, 4096), device="cuda", generator=g)
    qkv = torch.randn(4096, (nq + 2 * nk) * head_size, device="cuda", generator=g, dtype=torch.bfloat16)
    q, k = qkv[:, : nq * head_size], qkv[:, nq * head_size : (nq + nk) * head_size]
    want_q, want_k = lab.mrope_reference(pos.cpu().numpy(), q.float().cpu().numpy(), k.float().cpu().numpy(),
                                         cache.cpu().numpy(), head_size, rotary_dim, section)
    lab.mrope_forward(pos, q, k, cache, head_size, rotary_dim, section)
    err = max(np.abs(q.float().cpu().numpy() - want_q).max(), np.abs(k.float().cpu().numpy() - want_k).max())
    assert err < 5e-2, f"4096 tokens, Qwen2-VL-7B heads, bf16: max error {err:.1e} vs the float64 reference"
