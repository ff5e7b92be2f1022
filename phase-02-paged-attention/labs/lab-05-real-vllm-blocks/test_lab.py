import pytest

from course.runtime import lab_module

lab = lab_module(__file__)   # solution.py by default; LAB_IMPL=starter grades starter.py


GiB = 1 << 30

# A startup log in the format a GPU box prints (prefixes vary; the messages are what run.py parses).
# The figures are made up but consistent: 218,448 tokens / 16 = 13,653 blocks; / 128 = 106.66x.
GPU_LOG = """\
INFO 11-21 10:00:01 [gpu_worker.py:465] Available KV cache memory: 7.50 GiB
INFO 11-21 10:00:01 [kv_cache_utils.py:1733] GPU KV cache size: 218,448 tokens
INFO 11-21 10:00:01 [kv_cache_utils.py:1734] Maximum concurrency for 2,048 tokens per request: 106.66x
"""


def test_kv_bytes_per_token_and_per_block():
    assert lab.kv_bytes_per_token(lab.LLAMA3_8B) == 131_072, (
        "Llama-3-8B: 2 (K,V) x 32 layers x 8 KV heads x 128 dims x 2 bytes = 131,072 B per token")
    assert lab.kv_bytes_per_token(lab.OPT_125M) == 36_864, "OPT-125m: 2 x 12 x 12 x 64 x 2 = 36,864 B per token"
    assert lab.bytes_per_block(lab.LLAMA3_8B, 16) == 2 * 2**20, (
        "a 16-token block spans every layer: 16 x 131,072 B = 2 MiB for Llama-3-8B")
    assert 2000 * lab.kv_bytes_per_token(lab.LLAMA3_8B) == 262_144_000, "a 2,000-token chat holds 262,144,000 B"


def test_concurrency_formula():
    assert lab.max_concurrency(4096, 16, 2048) == 32.0, "4,096 blocks / (2,048 / 16 = 128 blocks per request) = 32"
    assert lab.max_concurrency(8788, 16, 2048) == pytest.approx(68.65625), (
        "8,788 blocks / 128 blocks per request = 68.65625 (vLLM prints 68.66x)")
    assert lab.max_concurrency(100, 16, 2050) == 100 / 129, "a partial block still costs a whole block: ceil(2050/16)"
    for block_size, per_request in ((32, 65), (8, 257)):
        got = lab.max_concurrency(100, block_size, 2050)
        assert got == 100 / per_request, (
            f"at block_size {block_size} a 2,050-token request needs ceil(2050 / {block_size}) = {per_request} "
            f"blocks, so 100 blocks serve {100 / per_request:.4f} of them, got {got:.4f}: use the block_size argument"
        )


def test_parse_startup_log_reads_gpu_lines():
    got = lab.parse_startup_log(GPU_LOG)
    assert got == {"kv_cache_tokens": 218_448, "max_model_len": 2048, "max_concurrency": 106.66,
                   "available_gib": 7.5}, f"parsed {got}: strip thousands separators and the trailing 'x'"
    with pytest.raises(ValueError):
        lab.parse_startup_log("INFO nothing about the KV cache here")



def test_parse_startup_log_optional_line_and_refusals():
    big = ("(EngineCore pid=7) INFO [kv_cache_utils.py:1733] GPU KV cache size: 1,048,576 tokens\n"
           "(EngineCore pid=7) INFO [kv_cache_utils.py:1734] Maximum concurrency for 131,072 tokens per request: 8.00x\n")
    got = lab.parse_startup_log(big)
    assert got == {"kv_cache_tokens": 1_048_576, "max_model_len": 131_072, "max_concurrency": 8.0,
                   "available_gib": None}, (
        f"parsed {got}: a log without the 'Available KV cache memory' line gives available_gib None (not a crash), "
        f"and a count with two thousands separators is still one number")
    for only_one in GPU_LOG.splitlines()[1:]:     # just ONE of the two capacity lines
        try:
            lab.parse_startup_log(only_one)
        except ValueError:
            continue
        except Exception as exc:
            raise AssertionError(
                f"a log with only {only_one.split('] ')[-1]!r} must raise ValueError (both capacity lines are "
                f"required: refuse when EITHER is missing), got {type(exc).__name__}: {exc}") from exc
        raise AssertionError(f"a log with only {only_one!r} must raise ValueError")

def test_hit_rate_for_identical_prompts():
    assert lab.predicted_hit_rate(8, 100, 16) == pytest.approx(672 / 800), (
        "7 later requests x 96 hit tokens (6 whole blocks, cap 99) / (8 x 100) = 84%")
    assert lab.predicted_hit_rate(8, 64, 16) == pytest.approx(336 / 512), (
        "a 64-token prompt hits only 48 tokens per later request: the cap num_tokens - 1 drops a whole block")
    assert lab.predicted_hit_rate(8, 6, 16) == 0.0, "a 6-token prompt has no full block: nothing can be cached"
    assert lab.predicted_hit_rate(8, 16_001, 16) < 7 / 8, "7/8 = 87.5% is a ceiling, never reached"


def test_every_knob_reaches_the_arithmetic():
    # Non-default block sizes and cache dtypes: each parameter must be used, not its default.
    for block_size, want in ((8, 7 * 32 / (8 * 40)), (32, 7 * 32 / (8 * 40)), (64, 0.0)):
        got = lab.predicted_hit_rate(8, 40, block_size)
        assert got == pytest.approx(want), (
            f"8 copies of a 40-token prompt at block_size {block_size}: each later copy hits "
            f"(39 // {block_size}) x {block_size} tokens, so the rate is {want:.4f}, got {got:.4f}; "
            f"pass block_size on to num_shared_blocks"
        )
    for dtype_bytes in (1, 4):
        shape = lab.ModelShape("Llama-3-8B", 32, 8, 128, dtype_bytes=dtype_bytes)
        per_token = lab.kv_bytes_per_token(shape)
        assert per_token == 65_536 * dtype_bytes, (
            f"a {dtype_bytes}-byte KV cache for Llama-3-8B holds 2 x 32 x 8 x 128 x {dtype_bytes} = "
            f"{65_536 * dtype_bytes:,} B per token, got {per_token:,}: use shape.dtype_bytes"
        )
        got = lab.predict_num_blocks(shape, 8 * GiB)
        want = 8 * GiB // (16 * 65_536 * dtype_bytes)
        assert got == want, (
            f"8 GiB of {dtype_bytes}-byte KV for Llama-3-8B is {want:,} blocks of 16 tokens, got {got:,}: "
            f"size the block with shape.dtype_bytes"
        )
    for block_size in (8, 32):
        per_block = block_size * 131_072
        assert lab.bytes_per_block(lab.LLAMA3_8B, block_size) == per_block, (
            f"a {block_size}-token Llama-3-8B block is {block_size} x 131,072 = {per_block:,} B, got "
            f"{lab.bytes_per_block(lab.LLAMA3_8B, block_size):,}"
        )
        got = lab.predict_num_blocks(lab.LLAMA3_8B, 8 * GiB, block_size)
        want = 8 * GiB // per_block
        assert got == want, (
            f"8 GiB at block_size {block_size} is 8 GiB // {per_block:,} B = {want:,} blocks, got {got:,}: "
            f"predict_num_blocks must size blocks with the block_size it is given, not 16"
        )


@pytest.fixture(scope="module")
def real():
    """One real vLLM engine on CPU for the whole module (the import is the slow part)."""
    engine = lab.real_engine()
    return {
        "engine": engine,
        "llama_8g": lab.real_kv_cache_config(engine, lab.LLAMA3_8B, 8 * GiB),
        "opt_odd": lab.real_kv_cache_config(engine, lab.OPT_125M, 5 * GiB + 12345),
        "shared": lab.real_identical_prompts(8, 100, engine=engine),
    }


@pytest.mark.upstream
def test_block_count_matches_real_vllm(real):
    blocks, _ = real["llama_8g"]
    assert lab.predict_num_blocks(lab.LLAMA3_8B, 8 * GiB) == blocks == 4096, (
        f"real vLLM carves {blocks} blocks from 8 GiB for Llama-3-8B: available // (16 x 131,072 B)")
    blocks, _ = real["opt_odd"]
    assert lab.predict_num_blocks(lab.OPT_125M, 5 * GiB + 12345) == blocks, (
        f"real vLLM carves {blocks} OPT-125m blocks from 5 GiB + 12,345 B: round DOWN to whole blocks")


@pytest.mark.upstream
def test_parser_reads_the_lines_vllm_really_logs(real):
    blocks, log = real["llama_8g"]
    got = lab.parse_startup_log(log)
    assert got["kv_cache_tokens"] == blocks * 16 == 65_536, f"parsed {got} from the real log {log!r}"
    assert got["max_model_len"] == 2048
    assert got["max_concurrency"] == pytest.approx(lab.max_concurrency(blocks, 16, 2048)), (
        "your concurrency formula must reproduce what vLLM logs")


@pytest.mark.upstream
def test_identical_prompts_share_physical_blocks(real):
    tables = list(real["shared"]["tables"].values())
    ref = real["shared"]["ref_cnt"]
    n = lab.num_shared_blocks(100, 16)
    assert n == 6, f"a 100-token prompt can share (100 - 1) // 16 = 6 whole blocks, got {n}"
    assert len(tables) == 8 and all(len(t) == 7 for t in tables), "100 tokens need ceil(100/16) = 7 blocks each"
    assert all(t[:n] == tables[0][:n] for t in tables), "the shared prompt blocks are the SAME physical blocks"
    assert all(ref[b] == 8 for b in tables[0][:n]), "each shared block is referenced by all 8 requests"
    tails = {t[n] for t in tables}
    assert len(tails) == 8 and all(ref[b] == 1 for b in tails), "each request's partial 7th block is private"
    assert lab.num_shared_blocks(64, 16) == 3, "64 tokens: the cap of 63 leaves 3 whole blocks, not 4"


@pytest.mark.upstream
def test_hit_rate_matches_real_prefix_cache_stats(real):
    hits, queries = real["shared"]["hits"], real["shared"]["queries"]
    assert (hits, queries) == (672, 800)
    assert lab.predicted_hit_rate(8, 100, 16) == pytest.approx(hits / queries), (
        f"the real engine counted {hits}/{queries}; your prediction disagrees")
