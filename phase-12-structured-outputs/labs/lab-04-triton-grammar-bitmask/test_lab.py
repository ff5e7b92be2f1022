import numpy as np
import pytest

from course.runtime import lab_module

lab = lab_module(__file__)   # solution.py by default; LAB_IMPL=starter grades starter.py

torch = pytest.importorskip("torch")

NEG = float("-inf")


@pytest.fixture(scope="module", autouse=True)
def _imported_once():
    """Import the lab (and triton) here, in the parent, and run the interpreter once on a kernel of this file.

    Each triton test runs in a forked child; what the parent has already paid for (imports, the
    interpreter's first launch) the children inherit, which cuts each test by a few tenths of a second.
    The lab's own kernel is never launched in the parent: a crashing kernel stays one failed test.
    """
    lab.apply_token_bitmask  # noqa: B018
    if not torch.cuda.is_available():
        import triton
        import triton.language as tl

        @triton.jit
        def _add_one(x_ptr, n, BLOCK: tl.constexpr):
            offs = tl.arange(0, BLOCK)
            tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=offs < n, other=0) + 1, mask=offs < n)

        x = torch.zeros(4, dtype=torch.int32)
        _add_one[(1,)](x, 4, BLOCK=4)
        assert x.tolist() == [1] * 4, "the Triton interpreter itself is broken here"


@pytest.fixture(scope="module")
def vllm_kernel():
    """vLLM's own kernel, imported once in the parent (importing vllm takes seconds) and launched once there."""
    pytest.importorskip("xgrammar")
    from vllm.triton_utils import triton
    from vllm.v1.worker.gpu.structured_outputs import _apply_grammar_bitmask_kernel

    kernel = (triton, _apply_grammar_bitmask_kernel)
    if not torch.cuda.is_available():
        _vllm(kernel, _logits(2, 40, seed=0), _words(1, 40, seed=0), [1])
    return kernel


def _device():
    return "cuda" if torch.cuda.is_available() else "cpu"


def _words(n, vocab, seed, extra_words=0):
    """Random int32 words over the whole range (about half negative: bit 31 set)."""
    g = torch.Generator().manual_seed(seed)
    w = -(-vocab // 32) + extra_words
    return torch.randint(-2**31, 2**31, (n, w), generator=g, dtype=torch.int64).to(torch.int32)


def _logits(rows, vocab, seed):
    g = torch.Generator().manual_seed(seed + 100)
    return torch.randn(rows, vocab, generator=g)


def _xgrammar(logits, bitmask, indices):
    """xgrammar's CPU kernel: its bitmask rows follow the logits rows, so scatter ours into a full one first."""
    xgr = pytest.importorskip("xgrammar")
    full = torch.full((logits.shape[0], bitmask.shape[1]), -1, dtype=torch.int32)
    full[indices] = bitmask
    out = logits.clone()
    xgr.apply_token_bitmask_inplace(out, full, vocab_size=logits.shape[1], indices=indices)
    return out


def _vllm(vllm_kernel, logits, bitmask, indices):
    """vLLM's model-runner-v2 kernel, launched the way StructuredOutputsWorker.apply_grammar_bitmask does."""
    triton, _apply_grammar_bitmask_kernel = vllm_kernel
    out = logits.clone()
    idx = torch.tensor(indices, dtype=torch.int32)
    grid = (bitmask.shape[0], triton.cdiv(out.shape[1], 8192))
    _apply_grammar_bitmask_kernel[grid](out, out.stride(0), idx, bitmask, bitmask.stride(0), out.shape[1], BLOCK_SIZE=8192)
    return out


def _apply(logits, bitmask, indices, **kw):
    dev = _device()
    out = logits.to(dev)
    lab.apply_token_bitmask(out, bitmask.to(dev), torch.tensor(indices, dtype=torch.int32, device=dev), **kw)
    return out.cpu()


def _same(a, b):
    return torch.equal(a, b)


# --- the layout, in plain torch ------------------------------------------------------------------

def test_unpack_matches_mini_vllm_and_the_bit_order():
    from mini_vllm.grammar import unpack_bitmask as mini_unpack

    for vocab in (1, 31, 32, 33, 70, 100):
        words = _words(3, vocab, seed=vocab)
        got = lab.unpack_bitmask(words, vocab)
        assert got.dtype == torch.bool and tuple(got.shape) == (3, vocab), (
            f"want bool [3, {vocab}], got {got.dtype} {tuple(got.shape)}"
        )
        assert np.array_equal(got.numpy(), mini_unpack(words.numpy(), vocab)), (
            f"V={vocab}: bit j of word w is token 32*w + j (least significant bit first), 1 = allowed"
        )
    edge = torch.tensor([[-2**31, 2**31 - 1, 1, -1]], dtype=torch.int32)
    got = lab.unpack_bitmask(edge, 128)[0]
    assert got[:32].nonzero().flatten().tolist() == [31], "word -2**31 is bit 31 alone: only token 31 is allowed"
    assert got[32:64].tolist() == [True] * 31 + [False], "word 2**31 - 1 allows tokens 32..62 and bans 63 (its sign bit)"
    assert got[64:96].nonzero().flatten().tolist() == [0] and got[96:].all(), "word 1 allows its first token; -1 allows all"
    wide = lab.unpack_bitmask(edge, 40)
    assert tuple(wide.shape) == (1, 40), "bits beyond vocab_size are dropped, even whole words"


# --- the kernel, against xgrammar's CPU kernel and vLLM's own Triton kernel -------------------

@pytest.mark.triton
@pytest.mark.upstream
def test_matches_xgrammar_and_vllm(vllm_kernel):
    # One test, six shapes: each triton test costs a forked child, the shapes share it.
    for vocab, block in [(31, 64), (32, 64), (33, 64), (100, 64), (300, 64), (2500, 1024)]:
        rows, indices = 5, [3, 0, 4]                  # rows 1 and 2 have no grammar
        logits = _logits(rows, vocab, seed=vocab)
        bitmask = _words(len(indices), vocab, seed=vocab + 1)
        got = _apply(logits, bitmask, indices, block_size=block)
        want = _xgrammar(logits, bitmask, indices)
        assert _same(want, _vllm(vllm_kernel, logits, bitmask, indices)), f"V={vocab}: xgrammar and vLLM disagree (harness)"
        bad = (got != want) & ~(got.isinf() & want.isinf())
        assert _same(got, want), (
            f"V={vocab}, BLOCK={block}: {int(bad.sum())} logits differ from xgrammar / vLLM, first at "
            f"{bad.nonzero()[:3].tolist()} (row, token): bit j of word w is token 32*w + j, bitmask row k goes to "
            f"logits row logits_indices[k], and a vocabulary larger than one block needs a second grid axis"
        )


@pytest.mark.triton
def test_bit_31_is_a_token_not_a_sign():
    vocab = 64
    bitmask = torch.tensor([[-2**31, 2**31 - 1], [-1, 0]], dtype=torch.int32)
    logits = _logits(2, vocab, seed=5)
    got = _apply(logits, bitmask, [0, 1], block_size=32)
    allowed0 = (~got[0].isinf()).nonzero().flatten().tolist()
    assert allowed0 == [31, *range(32, 63)], (
        f"row 0 should allow token 31 (word -2**31: only the sign bit) and 32..62 (word 2**31 - 1), got {allowed0}: "
        f"test bit j with (word >> j) & 1; (word & (1 << j)) > 0 is negative for j = 31"
    )
    assert _same(got[1, :32], logits[1, :32]) and got[1, 32:].isinf().all(), "word -1 allows all 32, word 0 none"


@pytest.mark.triton
def test_tail_bits_and_wider_masks_never_write_past_the_vocab():
    vocab, rows, pad = 70, 3, 9
    buf = torch.full((rows, vocab + pad), 7.0)
    logits = buf[:, :vocab]                            # row stride vocab + pad: a column slice of a padded buffer
    for extra in (0, 2):                               # ceil(70/32) = 3 words, or 5 for a larger padded vocab
        buf.fill_(7.0)
        bitmask = torch.zeros(2, 3 + extra, dtype=torch.int32)    # every bit 0, tail bits included
        dev_buf = buf.to(_device())
        view = dev_buf[:, :vocab]
        lab.apply_token_bitmask(view, bitmask.to(view.device), torch.tensor([2, 0], dtype=torch.int32, device=view.device))
        out = dev_buf.cpu()
        assert out[[0, 2], :vocab].isinf().all(), f"{3 + extra} words, all zero: every token of rows 0 and 2 is banned"
        assert (out[:, vocab:] == 7.0).all(), (
            f"{3 + extra} words per row: the bits past token {vocab - 1} are padding, and the columns past the logits "
            f"belong to someone else; mask the store with token < vocab_size"
        )
        assert (out[1] == 7.0).all(), "row 1 has no grammar: untouched"
    assert logits.shape == (rows, vocab)


@pytest.mark.triton
def test_rows_without_a_grammar_and_the_index_order():
    vocab = 96
    logits = _logits(4, vocab, seed=9)
    bitmask = torch.tensor([[-1, 0, -1], [0, -1, 0]], dtype=torch.int32)   # two different rows
    got = _apply(logits, bitmask, [2, 0], block_size=32)
    assert got[2, :32].isfinite().all() and got[2, 32:64].isinf().all(), (
        "bitmask row 0 applies to logits row logits_indices[0] = 2 (not to logits row 0)"
    )
    assert got[0, :32].isinf().all() and got[0, 32:64].isfinite().all(), "bitmask row 1 applies to logits row 0"
    for r in (1, 3):
        assert _same(got[r], logits[r]), f"logits row {r} has no grammar and must be bit-for-bit unchanged"
    assert _same(got[2, :32], logits[2, :32]), "allowed logits keep their exact value"


@pytest.mark.triton
def test_all_allowed_and_all_banned_rows():
    vocab = 200
    bitmask = torch.stack([torch.full((7,), -1, dtype=torch.int32), torch.zeros(7, dtype=torch.int32)])
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        logits = _logits(2, vocab, seed=3).to(dtype)
        logits[0, 5] = -0.0
        logits[0, 6] = NEG                                 # already banned by someone else: stays -inf
        try:
            got = _apply(logits, bitmask, [0, 1], block_size=64)
        except TypeError as exc:
            pytest.fail(f"{dtype} logits refused ({exc}): any floating-point dtype is valid (models sample from "
                        f"bf16/fp16 logits too); refuse only integer logits")
        assert got.dtype == dtype and _same(got[0], logits[0]) and str(got[0, 5].item()) == "-0.0", (
            f"{dtype}: an all -1 row changes nothing"
        )
        assert (got[1] == NEG).all(), f"{dtype}: an all-zero row bans every token (xgrammar fills it so once a grammar is dead)"


@pytest.mark.triton
@pytest.mark.upstream
def test_every_operand_strided():
    vocab = 100
    g = torch.Generator().manual_seed(11)
    base = torch.randn(vocab, 6, generator=g)
    logits_t = base.t()                                    # [6, 100] with strides (1, 6): a transposed view
    wide = _words(3, vocab, seed=12, extra_words=3)        # [3, 7]
    bitmask = wide[:, 1:5]                                 # column slice: row stride 7, 4 words (ceil(100/32))
    every_other = _words(6, vocab, seed=13)[::2]           # row stride 8
    column_major = _words(3, vocab, seed=14).t().contiguous().t()   # strides (1, 3): word w of row k at w * 3 + k
    for bm in (bitmask, every_other, column_major):
        want = _xgrammar(logits_t.contiguous(), bm.contiguous(), [4, 1, 5])
        dev = _device()
        out = base.clone().to(dev).t()
        lab.apply_token_bitmask(out, bm.to(dev), torch.tensor([4, 1, 5], dtype=torch.int32, device=dev), block_size=32)
        assert _same(out.cpu(), want), (
            f"logits strides {tuple(logits_t.stride())}, bitmask strides {tuple(bm.stride())}: pass every stride of "
            f"both tensors; never assume a contiguous row of ceil(V/32) words or of V logits"
        )


def _huge_fp32(n):
    """n float32 elements; on CPU an untouched anonymous mapping, so only the pages written cost memory."""
    if torch.cuda.is_available():
        return torch.zeros(n, dtype=torch.float32, device="cuda"), None
    import mmap
    flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | getattr(mmap, "MAP_NORESERVE", 0)
    mm = mmap.mmap(-1, 4 * n, flags=flags)
    return torch.frombuffer(mm, dtype=torch.float32, count=n), mm


@pytest.mark.triton
@pytest.mark.crash_hint(
    "row 2 of the logits starts 2**31 + 16 elements in; an int32 row * stride wraps negative and the store "
    "lands outside the tensor. Cast the loaded row index to int64 before multiplying by the row stride."
)
def test_row_offsets_past_2_pow_31_elements():
    # Row 2 starts 2 * (2**30 + 8) = 2**31 + 16 elements in: in int32, row * stride wraps to -2**31 + 16.
    # (A 256k vocabulary with 8k sampled rows, speculative positions included, passes 2**31 logits.)
    vocab, stride = 64, (1 << 30) + 8
    big, keep = _huge_fp32(2 * stride + vocab)
    logits = torch.as_strided(big, (3, vocab), (stride, 1))
    logits[2] = 1.0
    logits[0] = 1.0
    bitmask = torch.tensor([[0, -1]], dtype=torch.int32, device=big.device)
    lab.apply_token_bitmask(logits, bitmask, torch.tensor([2], dtype=torch.int32, device=big.device), block_size=64)
    row2, row0 = logits[2].cpu().clone(), logits[0].cpu().clone()
    del logits, big, keep
    assert row2[:32].isinf().all() and (row2[32:] == 1.0).all(), (
        "logits row 2 starts 2**31 + 16 elements in and was not masked: cast the loaded row index to int64 "
        "before multiplying by the row stride"
    )
    assert (row0 == 1.0).all(), "an int32 wrap-around wrote into another row"


@pytest.mark.triton   # a check that lets a bad index through launches the kernel: keep a crash in a child
def test_errors():
    logits = torch.zeros(2, 40)
    idx = torch.tensor([0], dtype=torch.int32)
    # The exception type is the contract; the message may use any words but must name the offending value.
    def refused(kind, fact, *args):
        with pytest.raises(kind) as err:
            lab.apply_token_bitmask(*args)
        assert fact in str(err.value), f"raise {kind.__name__} naming {fact!r} (the offending value); got: {err.value}"

    refused(TypeError, "int64", logits, torch.zeros(1, 2, dtype=torch.int64), idx)  # the bitmask's dtype
    refused(TypeError, "int32", torch.zeros(2, 40, dtype=torch.int32), torch.zeros(1, 2, dtype=torch.int32), idx)
    refused(ValueError, "40", logits, torch.zeros(1, 1, dtype=torch.int32), idx)  # 1 word = 32 tokens < V = 40
    refused(ValueError, "2", logits, torch.zeros(2, 2, dtype=torch.int32), idx)  # 2 bitmask rows, 1 index
    refused(ValueError, "2", logits, torch.zeros(1, 2, dtype=torch.int32), torch.tensor([2], dtype=torch.int32))
    refused(ValueError, "-1", logits, torch.zeros(1, 2, dtype=torch.int32), torch.tensor([-1], dtype=torch.int32))
    refused(ValueError, "40", torch.zeros(40), torch.zeros(1, 2, dtype=torch.int32), idx)  # 1-D logits
    assert (logits == 0).all(), "a refused call changes nothing"
    lab.apply_token_bitmask(logits, torch.zeros(0, 2, dtype=torch.int32), torch.zeros(0, dtype=torch.int32))
    assert (logits == 0).all(), "no grammar rows: nothing to do (and no launch with an empty grid)"
    for what, bitmask, indices in [
        ("a 1-word bitmask (32 tokens) for V = 40", torch.zeros(0, 1, dtype=torch.int32), torch.zeros(0, dtype=torch.int32)),
        ("0 bitmask rows with 1 logits index", torch.zeros(0, 2, dtype=torch.int32), idx),
    ]:
        try:
            lab.apply_token_bitmask(logits, bitmask, indices)
        except ValueError:
            continue
        pytest.fail(f"{what} was accepted because the bitmask has no rows: an empty batch is still checked "
                    "(width, one index per row) before the early return")


@pytest.mark.gpu
@pytest.mark.triton
@pytest.mark.upstream
def test_full_vocab_matches_vllm_on_gpu(vllm_kernel):
    vocab, rows = 151936, 256
    g = torch.Generator(device="cuda").manual_seed(0)
    logits = torch.randn(rows, vocab, device="cuda", generator=g)
    indices = list(range(0, rows, 2))
    bitmask = torch.randint(-2**31, 2**31, (len(indices), -(-vocab // 32)), device="cuda", generator=g,
                            dtype=torch.int64).to(torch.int32)
    _, _apply_grammar_bitmask_kernel = vllm_kernel
    want = logits.clone()
    idx = torch.tensor(indices, dtype=torch.int32, device="cuda")
    _apply_grammar_bitmask_kernel[(len(indices), -(-vocab // 8192))](want, want.stride(0), idx, bitmask, bitmask.stride(0),
                                                                      vocab, BLOCK_SIZE=8192)
    got = logits.clone()
    lab.apply_token_bitmask(got, bitmask, idx)
    assert torch.equal(got, want), "full Qwen2.5 vocabulary, 128 of 256 rows constrained: differs from vLLM's kernel"
