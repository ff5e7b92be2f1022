import numpy as np
import pytest

from course.runtime import lab_module

lab = lab_module(__file__)   # solution.py by default; LAB_IMPL=starter grades starter.py


def _rel(a, b):
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def _banded(seed, out=64, inp=1024, band=16):
    rng = np.random.default_rng(seed)
    gains = np.exp(rng.uniform(-2.0, 2.0, size=inp // band))
    return (rng.standard_normal((out, inp)) * np.repeat(gains, band)[None, :]).astype(np.float32)


def test_pack_unpack_roundtrip_is_exact():
    rng = np.random.default_rng(0)
    q = rng.integers(-8, 8, size=(16, 64)).astype(np.int8)
    packed = lab.pack_int4(q)
    assert packed.dtype == np.uint8, f"packed nibbles are stored as uint8, got {packed.dtype}"
    assert packed.shape == (16, 32), f"two int4 per byte: (16, 64) packs to (16, 32), got {packed.shape}"
    back = lab.unpack_int4(packed)
    assert back.shape == (16, 64), f"unpack must restore (16, 64), got {back.shape}"
    assert np.array_equal(back, q), (
        "pack -> unpack must be lossless: offset by +8 before packing and subtract 8 after unpacking, "
        "and put the halves back at the same (even, odd) positions"
    )


def test_nibble_order_is_low_then_high():
    q = np.array([[1, -2, 7, -7]], dtype=np.int8)
    packed = lab.pack_int4(q)
    assert packed.tolist() == [[0x69, 0x1F]], (
        f"[1, -2] -> offsets [9, 6] -> byte 9 | 6 << 4 = 0x69; [7, -7] -> [15, 1] -> 0x1F. Got "
        f"{[hex(b) for b in packed[0]]}: the EVEN index goes in the LOW nibble (a swapped order is the classic "
        f"cause of garbage output from a correct-looking checkpoint)"
    )
    with pytest.raises(ValueError):
        lab.pack_int4(np.array([[1, 2, 3]], dtype=np.int8))      # odd length cannot be paired


def test_pack_rejects_values_outside_int4():
    edge = lab.pack_int4(np.array([[-8, 7, 7, -8]], dtype=np.int8))
    assert edge.tolist() == [[0xF0, 0x0F]], (
        f"-8 and 7 are the two ends of int4 and must pack (to nibbles 0 and 15): [-8, 7] -> 0 | 15 << 4 = 0xF0, "
        f"[7, -8] -> 0x0F; got {[hex(b) for b in edge[0]]}"
    )
    for bad in ([[8, 0]], [[0, -9]], [[3, 100]]):
        try:
            packed = lab.pack_int4(np.array(bad, dtype=np.int8))
        except ValueError:
            continue
        raise AssertionError(
            f"pack_int4({bad}) returned {[hex(b) for b in packed[0]]} instead of raising ValueError: a value outside "
            f"[-8, 7] does not fit in a nibble (q + 8 would spill into the neighbour's nibble); check both ends"
        )


def test_quantize_rejects_group_size_zero():
    W = np.ones((2, 8), dtype=np.float32)
    try:
        lab.quantize_grouped(W, 0)
    except ValueError:
        return
    except ZeroDivisionError:
        raise AssertionError("group_size 0 raised ZeroDivisionError: reject group_size <= 0 with a ValueError first") from None
    raise AssertionError("group_size 0 must raise ValueError: no group of zero weights can carry a scale")


def test_grouped_roundtrip_error_bounded():
    W = np.random.default_rng(1).standard_normal((64, 256)).astype(np.float32)
    q, s = lab.quantize_grouped(W, 32)
    assert q.shape == W.shape and q.dtype == np.int8, f"q must be int8 of W's shape, got {q.dtype} {q.shape}"
    assert np.abs(q).max() == 7, f"symmetric int4 uses -7..7 and each group's max hits +/-7, got max |q| = {np.abs(q).max()}"
    assert s.shape == (64, 8), f"256 inputs / group 32 = 8 scales per row: expected (64, 8), got {s.shape}"
    assert s.dtype == np.float16, f"scales are stored as float16 (2 bytes each), got {s.dtype}"
    steps = np.abs(lab.dequantize_grouped(q, s, 32) - W) / np.repeat(s.astype(np.float32), 32, axis=1)
    assert steps.max() <= 0.5 + 1e-3, (
        f"no weight may move more than half a grid step (scale / 2), got {steps.max():.3f} steps: the scale must be "
        f"max|group| / 7 so the group's largest weight lands exactly on +/-7 instead of being clipped"
    )
    err = _rel(lab.dequantize_grouped(q, s, 32), W)
    assert err < 0.15, f"group-32 int4 should lose < 15% on Gaussian weights, got {err:.2%}"
    with pytest.raises(ValueError):
        lab.quantize_grouped(W, 48)                                 # 48 does not divide 256


def test_group_boundaries_and_exact_ties():
    # two groups of 4 per row; group 0's max is 7 (scale exactly 1.0), group 1's is 0.07: each group keeps its
    # own scale, and the ties 2.5, -2.5, 0.5 in group 0 round half to even like np.round / torch.round
    W = np.array([[7.0, 2.5, -2.5, 0.5, 0.07, 0.035, -0.07, 0.0]], dtype=np.float32)
    q, s = lab.quantize_grouped(W, 4)
    assert s[0, 0] == np.float16(1.0), f"group 0's scale is 7 / 7 = 1.0 exactly, got {s[0, 0]}"
    assert q[0, :4].tolist() == [7, 2, -2, 0], (
        f"group 0 is exactly [7, 2.5, -2.5, 0.5] / 1.0: ties round half to EVEN (2.5 -> 2, 0.5 -> 0), as np.round "
        f"and vLLM's torch.round do; got {q[0, :4].tolist()}"
    )
    assert q[0, 4] == 7 and q[0, 6] == -7, (
        f"group 1 has its own scale (0.07 / 7): its max must land on +/-7, got {q[0, 4:].tolist()}; a group "
        f"boundary every group_size columns, not one scale for the whole row"
    )


def test_smaller_groups_capture_local_magnitude():
    W = _banded(2)
    e = {}
    for g in (16, 256):
        q, s = lab.quantize_grouped(W, g)
        e[g] = _rel(lab.dequantize_grouped(q, s, g), W)
    assert e[16] < 0.6 * e[256], (
        f"the magnitude changes every 16 columns: group 16 gives each band its own scale, group 256 lets the "
        f"loudest band set the scale for 16 bands. Expected error(16) well below error(256), got "
        f"{e[16]:.2%} vs {e[256]:.2%}"
    )


def test_memory_about_8x_smaller_than_fp32():
    W = np.random.default_rng(3).standard_normal((256, 1024)).astype(np.float32)
    q, s = lab.quantize_grouped(W, 128)
    nbytes = lab.memory_bytes_grouped(lab.pack_int4(q), s)
    assert nbytes == 256 * 1024 // 2 + 256 * 8 * 2, (
        f"0.5 byte per weight (131,072 B) + 2,048 fp16 scales (4,096 B) = 135,168 B, got {nbytes}"
    )
    ratio = W.nbytes / nbytes
    assert ratio > 7, f"W4A16 g128 stores 0.515625 B/weight: 4 / 0.515625 = 7.76x smaller than fp32, got {ratio:.2f}x"


def test_group_scale_overhead_is_the_tradeoff():
    W = np.random.default_rng(4).standard_normal((32, 1024)).astype(np.float32)
    _, s16 = lab.quantize_grouped(W, 16)
    _, s128 = lab.quantize_grouped(W, 128)
    assert s16.size == 8 * s128.size, f"group 16 stores exactly 8x the scales of group 128, got {s16.size} vs {s128.size}"
    o128, o16 = lab.scale_overhead(128), lab.scale_overhead(16)
    assert o128 == 0.03125, (
        f"group 128, fp16 scales: 16 / 128 = 0.125 bit per weight on a 4-bit payload = 3.125%, got {o128:.4%} "
        f"(1.5625% would be the overhead on an 8-bit payload)"
    )
    assert o16 == 0.25, f"group 16: 16 / 16 = 1 bit per weight on 4 bits = 25%, got {o16:.4%} (8x group 128's 3.125%)"
    assert lab.scale_overhead(128, weight_bits=8) == 0.015625, "the same scales on int8 weights cost 0.125 / 8 = 1.5625%"


def test_scale_overhead_honours_the_scale_width():
    # fp32 scales (some GPTQ exports) cost twice fp16's; fp8 scales half of it.
    for scale_bits, want in ((32, 0.0625), (8, 0.015625)):
        got = lab.scale_overhead(128, scale_bits=scale_bits)
        assert got == want, (
            f"group 128 with {scale_bits}-bit scales on 4-bit weights: {scale_bits} / 128 / 4 = {want:.4%}, got "
            f"{got:.4%}: use the scale_bits argument, not a fixed 16"
        )


def test_all_zero_and_underflowing_groups_get_scale_one():
    # group 0 is all zero (max 0 -> scale 0 -> 0 / 0); group 1's max / 7 underflows float16 to 0:
    # both must store scale 1 and quantize to zeros, with no NaN and no division warning
    W = np.array([[0.0, 0.0, 0.0, 0.0, 1e-9, -1e-9, 0.0, 1e-10, 7.0, 1.0, -3.5, 0.0]], dtype=np.float32)
    with np.errstate(divide="raise", invalid="raise"):
        try:
            q, s = lab.quantize_grouped(W, 4)
        except FloatingPointError as exc:
            raise AssertionError(
                f"quantizing an all-zero group raised {exc}: max|group| = 0 gives scale 0 and 0 / 0; "
                "replace a zero stored scale by 1 before dividing"
            ) from None
    assert s[0].tolist() == [1.0, 1.0, 1.0], (
        f"scales {s[0].tolist()}: an all-zero group and one whose scale underflows float16 store 1.0, "
        "the third group 7 / 7 = 1.0"
    )
    assert q[0, :8].tolist() == [0] * 8, f"those two groups must quantize to zeros, got {q[0, :8].tolist()}"
    assert np.all(np.isfinite(lab.dequantize_grouped(q, s, 4))), "the round trip must stay finite"
