import pytest

from course.runtime import lab_module

lab = lab_module(__file__)   # solution.py by default; LAB_IMPL=starter grades starter.py


KiB, MiB, GiB = 2**10, 2**20, 2**30
LLAMA3_8B = {"num_layers": 32, "num_kv_heads": 8, "head_dim": 128}  # GQA: 32 query heads share 8 KV heads


def test_llama3_8b_per_token():
    b = lab.kv_bytes_per_token(**LLAMA3_8B, dtype_bytes=2)
    assert b == 131_072, (
        f"Llama-3-8B fp16 should need 2 (K and V) x 32 layers x 8 KV heads x 128 dims x 2 bytes "
        f"= 131,072 bytes (128 KiB) per token, got {b}. Did you forget the factor 2 for K AND V?"
    )
    b70 = lab.kv_bytes_per_token(num_layers=80, num_kv_heads=8, head_dim=128, dtype_bytes=2)
    assert b70 == 327_680, f"Llama-3-70B fp16 should need 2 x 80 x 8 x 128 x 2 = 327,680 B (320 KiB)/token, got {b70}"


def test_llama3_8b_concurrency():
    per_seq = lab.kv_bytes_per_seq(**LLAMA3_8B, dtype_bytes=2, seq_len=2048)
    assert per_seq == 256 * MiB, f"a 2,048-token Llama-3-8B sequence holds 131,072 x 2,048 = 256 MiB, got {per_seq}"
    n = lab.max_concurrent_seqs(
        gpu_bytes=24 * GiB, weight_bytes=16 * GiB, **LLAMA3_8B, dtype_bytes=2, seq_len=2048
    )
    assert n == 32, f"(24 GiB - 16 GiB) // 256 MiB = 32 sequences, got {n}"
    n8k = lab.max_concurrent_seqs(
        gpu_bytes=24 * GiB, weight_bytes=16 * GiB, **LLAMA3_8B, dtype_bytes=2, seq_len=8192
    )
    assert n8k == 8, f"at 8,192 tokens each sequence holds 1 GiB, so 8 GiB fits 8 of them, got {n8k}"
    n_gb = lab.max_concurrent_seqs(
        gpu_bytes=24 * 10**9, weight_bytes=16 * 10**9, **LLAMA3_8B, dtype_bytes=2, seq_len=2048
    )
    assert n_gb == 29, (
        f"in decimal units 8e9 // 268,435,456 = 29 (29.8 before flooring), got {n_gb}: "
        f"use integer floor division, a partial sequence cannot be served"
    )
    assert isinstance(n, int), f"max_concurrent_seqs must return an int (whole sequences), got {type(n).__name__}"


def test_fp8_kv_doubles_concurrency():
    fp16 = lab.max_concurrent_seqs(24 * GiB, 16 * GiB, **LLAMA3_8B, dtype_bytes=2, seq_len=2048)
    fp8 = lab.max_concurrent_seqs(24 * GiB, 16 * GiB, **LLAMA3_8B, dtype_bytes=1, seq_len=2048)
    assert fp8 == 2 * fp16 == 64, (
        f"halving the bytes per number (fp16 -> fp8 KV) must double the users: expected 64 vs 32, got {fp8} vs {fp16}"
    )
    int4 = lab.kv_bytes_per_token(**LLAMA3_8B, dtype_bytes=0.5)
    assert int4 == 32 * KiB, f"a 4-bit KV cache (0.5 bytes/number) should need 32 KiB/token, got {int4}"


def test_gqa_saves_vs_mha():
    gqa = lab.kv_bytes_per_token(num_layers=32, num_kv_heads=8, head_dim=128, dtype_bytes=2)
    mha = lab.kv_bytes_per_token(num_layers=32, num_kv_heads=32, head_dim=128, dtype_bytes=2)
    assert mha == 4 * gqa, (
        f"MHA (32 KV heads) must cost exactly 4x GQA (8 KV heads): got {mha} vs {gqa}; "
        f"the formula is linear in num_kv_heads"
    )
    mqa = lab.kv_bytes_per_token(num_layers=32, num_kv_heads=1, head_dim=128, dtype_bytes=2)
    assert gqa == 8 * mqa, f"MQA (1 KV head) must cost 1/8 of GQA with 8 KV heads, got {mqa} vs {gqa}"


def test_no_room_returns_zero():
    for gpu, weights in [(16 * GiB, 16 * GiB), (80 * GiB, 140 * 10**9), (8 * GiB, 16 * GiB)]:
        n = lab.max_concurrent_seqs(gpu, weights, **LLAMA3_8B, dtype_bytes=2, seq_len=2048)
        assert n == 0, (
            f"with {gpu} B of HBM and {weights} B of weights there is no room for KV: expected 0, got {n} "
            f"(never negative; return 0 when weights >= HBM)"
        )
    tiny = lab.max_concurrent_seqs(16 * GiB + 255 * MiB, 16 * GiB, **LLAMA3_8B, dtype_bytes=2, seq_len=2048)
    assert tiny == 0, f"255 MiB free cannot hold one 256 MiB sequence: expected 0, got {tiny}"


def test_per_seq_is_per_token_times_length_and_bad_shapes_are_rejected():
    for seq_len in (1, 17, 4096, 131_072):
        got = lab.kv_bytes_per_seq(**LLAMA3_8B, dtype_bytes=2, seq_len=seq_len)
        assert got == 131_072 * seq_len, f"kv_bytes_per_seq must be per-token bytes x seq_len; seq_len={seq_len} gave {got}"
    with pytest.raises(ValueError):
        lab.kv_bytes_per_token(num_layers=0, num_kv_heads=8, head_dim=128, dtype_bytes=2)
    with pytest.raises(ValueError):
        lab.kv_bytes_per_seq(**LLAMA3_8B, dtype_bytes=2, seq_len=0)


def test_every_shape_argument_is_validated_dtype_bytes_included():
    # Each of the four shape arguments, dtype_bytes too, must be > 0: a zero-byte or negative-byte
    # cache is a typo, and answering 0 (or a negative size) would only fail later, far from it.
    good = {**LLAMA3_8B, "dtype_bytes": 2}
    for name in ("num_layers", "num_kv_heads", "head_dim", "dtype_bytes"):
        for bad in (0, -1):
            kw = {**good, name: bad}
            try:
                got = lab.kv_bytes_per_token(**kw)
            except ValueError:
                continue
            pytest.fail(
                f"kv_bytes_per_token({name}={bad}) returned {got} instead of raising ValueError: "
                f"pass every shape argument, dtype_bytes included, to _positive(...)"
            )


def test_huge_pools_floor_exactly_and_no_room_still_validates():
    # Byte counts past 2**53 are where float division rounds: free / per_seq can land on the next
    # integer even though one byte is missing. Integer floor division never does.
    per_seq = lab.kv_bytes_per_seq(**LLAMA3_8B, dtype_bytes=2, seq_len=2049)
    n = lab.max_concurrent_seqs(2**32 * per_seq, 1, **LLAMA3_8B, dtype_bytes=2, seq_len=2049)
    assert n == 2**32 - 1, (
        f"one byte short of 2**32 sequences of {per_seq:,} B must give {2**32 - 1}, got {n}: "
        f"use free // per_seq (exact integers), not int(free / per_seq) (a float that rounds up here)"
    )
    # A bad shape is rejected whether or not the weights leave room: validate before the 0 shortcut.
    for bad in ({"head_dim": 0}, {"num_layers": -1}, {"seq_len": 0}):
        kw = {**LLAMA3_8B, "dtype_bytes": 2, "seq_len": 2048, **bad}
        for gpu in (24 * GiB, 16 * GiB):
            try:
                got = lab.max_concurrent_seqs(gpu, 16 * GiB, **kw)
            except ValueError:
                continue
            pytest.fail(
                f"max_concurrent_seqs({gpu // GiB} GiB, 16 GiB, {bad}) returned {got} instead of raising "
                f"ValueError: size the sequence (which validates the shape) before returning 0 for no room"
            )
