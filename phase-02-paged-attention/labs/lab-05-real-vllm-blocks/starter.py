"""Lab 02.05 — how many blocks the real vLLM carves, and how it shares them (your version).

Implement kv_bytes_per_token, bytes_per_block, predict_num_blocks, max_concurrency,
parse_startup_log, num_shared_blocks and predicted_hit_rate; the real-vLLM helpers at the bottom
are provided.
Grade with:  LAB_IMPL=starter pytest phase-02-paged-attention/labs/lab-05-real-vllm-blocks -q

CPU path of a [GPU-OPT] lab. On a GPU box, run.py starts the real engine and reads its startup log.
Here, the same numbers come from the real vLLM 0.22.1 Python code, driven on CPU:

* vllm.v1.core.kv_cache_utils.get_kv_cache_configs turns "this many bytes are free for KV" into a
  block count and logs the two startup lines ("GPU KV cache size", "Maximum concurrency") —
  the very function EngineCore calls after profiling the GPU;
* the real Scheduler + KVCacheManager + BlockPool (through mini_vllm.testing.real_vllm, a
  model-less driver) admit 8 identical prompts, so we can read the shared block ids and ref counts.

Your job (starter.py): the arithmetic that predicts those numbers, and a parser for the log lines.
Run: python phase-02-paged-attention/labs/lab-05-real-vllm-blocks/solution.py
"""

from __future__ import annotations

import logging
import os
import re
from contextlib import contextmanager

from course.runtime import use_lab

os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")   # keep vLLM's import-time warnings off stdout

GiB = 1 << 30


# The numbers of a model that size its KV cache: the class phase 00's memory calculator defines.
ModelShape = use_lab("phase-00/lab-02-kv-memory-calculator").ModelShape


LLAMA3_8B = ModelShape("Llama-3-8B", num_layers=32, num_kv_heads=8, head_dim=128)
OPT_125M = ModelShape("OPT-125m", num_layers=12, num_kv_heads=12, head_dim=64)


# ----------------------------------------------------------------------------- your arithmetic

def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def kv_bytes_per_token(shape: ModelShape) -> int:
    """K and V, for every layer and KV head: 2 x layers x kv_heads x head_dim x dtype_bytes."""
    raise NotImplementedError(
        'kv_bytes_per_token: every layer stores a key AND a value vector per KV head for each '
        'token; multiply the ModelShape fields that count those vectors and their bytes')


def bytes_per_block(shape: ModelShape, block_size: int) -> int:
    """One block id reserves block_size token slots in EVERY layer."""
    raise NotImplementedError(
        'bytes_per_block: one block id reserves block_size token slots in EVERY layer at once; '
        'build on kv_bytes_per_token')


def predict_num_blocks(shape: ModelShape, available_bytes: int, block_size: int = 16) -> int:
    """Blocks vLLM carves from `available_bytes` of KV memory (whole blocks only, rounded down)."""
    raise NotImplementedError(
        'predict_num_blocks: vLLM only carves whole blocks out of the budget: round down, '
        'never up')


def max_concurrency(num_blocks: int, block_size: int, max_model_len: int) -> float:
    """How many max_model_len-token requests fit at once: blocks / blocks-per-full-request."""
    raise NotImplementedError(
        'max_concurrency: how many blocks does one max_model_len-token request occupy (a '
        'partial last block still costs a whole one)? return the ratio as a float')


_KV_TOKENS = re.compile(r"GPU KV cache size: ([\d,]+) tokens")
_CONCURRENCY = re.compile(r"Maximum concurrency for ([\d,]+) tokens per request: ([\d.]+)x")
_AVAILABLE = re.compile(r"Available KV cache memory: ([\d.]+) GiB")


def parse_startup_log(text: str) -> dict:
    """Pull the KV-capacity facts out of a vLLM startup log (any prefix before the message).

    Returns {"kv_cache_tokens": int, "max_model_len": int, "max_concurrency": float,
    "available_gib": float | None}; raises ValueError when the two capacity lines are missing.
    """
    raise NotImplementedError(
        "parse_startup_log: one regular expression per message (the prefix before it varies); "
        "numbers are printed with thousands separators and the concurrency ends in 'x'; the "
        "'Available KV cache memory' line is optional, the other two are not (ValueError)")


def num_shared_blocks(prompt_len: int, block_size: int = 16) -> int:
    """Blocks a later copy of the same prompt can take from the prefix cache: whole blocks only,
    and never the last token (it must be computed to produce logits), so (prompt_len - 1) // bs."""
    raise NotImplementedError(
        'num_shared_blocks: hits come in whole blocks, and the last prompt token is never a hit '
        '(its logits must be computed)')


def predicted_hit_rate(num_requests: int, prompt_len: int, block_size: int = 16) -> float:
    """Token hit rate when `num_requests` identical prompts arrive together: the first request
    misses everything; each later one hits num_shared_blocks whole blocks."""
    raise NotImplementedError(
        'predicted_hit_rate: the first request finds an empty cache; every later one hits '
        'num_shared_blocks(...) whole blocks; the rate counts tokens over ALL requests\' prompts')


# ----------------------------------------------------------------------------- real vLLM on CPU (provided)

def real_engine(num_gpu_blocks: int = 64, max_model_len: int = 2048, block_size: int = 16):
    """The real vLLM Scheduler (with its KVCacheManager and BlockPool) on CPU, no model."""
    from mini_vllm.testing.real_vllm import RealScheduler
    from mini_vllm.testing.traces import SchedConfig

    return RealScheduler(SchedConfig(num_gpu_blocks=num_gpu_blocks, block_size=block_size, max_num_seqs=16,
                                     max_num_batched_tokens=1024, max_model_len=max_model_len))


@contextmanager
def _capture_vllm_log(logger_name: str):
    """Collect the INFO lines one vLLM module logs (the driver silences vLLM below ERROR)."""
    import vllm.logger

    lines: list[str] = []

    class _Collect(logging.Handler):
        def emit(self, record):
            lines.append(record.getMessage())

    logger = logging.getLogger(logger_name)
    handler, old_level = _Collect(), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    # info_once() remembers what it printed; forget, so a repeated config logs again.
    getattr(vllm.logger, "_print_info_once", None) and vllm.logger._print_info_once.cache_clear()
    try:
        yield lines
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old_level)


def real_kv_cache_config(engine, shape: ModelShape, available_bytes: int, block_size: int = 16):
    """Ask the real get_kv_cache_configs how many blocks `available_bytes` buys for `shape`.
    Returns (num_blocks, startup log text)."""
    import torch
    from vllm.v1.core.kv_cache_utils import get_kv_cache_configs
    from vllm.v1.kv_cache_interface import FullAttentionSpec

    dtype = {2: torch.float16, 4: torch.float32, 1: torch.float8_e4m3fn}[shape.dtype_bytes]
    spec = FullAttentionSpec(block_size=block_size, num_kv_heads=shape.num_kv_heads,
                             head_size=shape.head_dim, dtype=dtype)
    layers = {f"model.layers.{i}.self_attn.attn": spec for i in range(shape.num_layers)}
    with _capture_vllm_log("vllm.v1.core.kv_cache_utils") as lines:
        (config,) = get_kv_cache_configs(engine.scheduler.vllm_config, [layers], [available_bytes])
    return config.num_blocks, "\n".join(lines)


def real_identical_prompts(num_requests: int = 8, prompt_len: int = 100, engine=None) -> dict:
    """Admit `num_requests` copies of one prompt in the same step on the real scheduler (a fresh
    one unless `engine` is given, which must hold no requests); report each block table, every
    block's ref_cnt, and the prefix-cache token counters."""
    engine = engine or real_engine()
    prompt = [(7 * i + 3) % 500 for i in range(prompt_len)]
    for i in range(num_requests):
        engine.add_request(f"req-{i}", prompt, max_tokens=2)   # 2: still running after step 1
    record = engine.step()
    pool = engine.kv_cache_manager.block_pool
    _, queries, hits = record.prefix_cache[:3]
    tables = {rid: ids for rid, ids in sorted(record.block_ids.items())}
    return {
        "tables": tables,
        "ref_cnt": {b: pool.blocks[b].ref_cnt for ids in tables.values() for b in ids},
        "queries": queries,
        "hits": hits,
    }


def arithmetic() -> None:
    """The worked numbers of the phase guide (section 2.2): no vLLM needed."""
    llama = kv_bytes_per_token(LLAMA3_8B)
    print(f"Llama-3-8B: 2 x 32 layers x 8 KV heads x 128 dims x 2 B = {llama:,} B per token "
          f"({llama // 1024} KiB)")
    print(f"  2,000-token conversation: {2000 * llama:,} B = {2000 * llama / 2**20:.0f} MiB "
          f"(= {2000 * llama / 1e6:.0f} MB)")
    print(f"  2,048-token conversation: {2048 * llama:,} B = {2048 * llama / 2**20:.0f} MiB")
    budget = 24 - 16
    print(f"  24 GB GPU - 16 GB of weights = {budget} GB for KV -> "
          f"{budget * 1e9 / (2000 * llama):.1f} conversations of 2,000 tokens")
    print(f"  one 16-token block: {bytes_per_block(LLAMA3_8B, 16):,} B = "
          f"{bytes_per_block(LLAMA3_8B, 16) // 2**20} MiB across all 32 layers")
    opt = kv_bytes_per_token(OPT_125M)
    print(f"OPT-125m: 2 x 12 x 12 x 64 x 2 B = {opt:,} B per token; "
          f"{bytes_per_block(OPT_125M, 16):,} B per block")


def main() -> None:
    import sys

    if "--arithmetic" in sys.argv:
        arithmetic()
        return
    for shape in (LLAMA3_8B, OPT_125M):
        print(f"{shape.name}: {kv_bytes_per_token(shape):,} B of KV per token, "
              f"{bytes_per_block(shape, 16):,} B per 16-token block")
    engine = real_engine()
    print("real vllm get_kv_cache_configs (max_model_len 2048, block_size 16):")
    for shape, budget in ((LLAMA3_8B, 8 * GiB), (LLAMA3_8B, 20 * GiB), (OPT_125M, 5 * GiB)):
        blocks, log = real_kv_cache_config(engine, shape, budget)
        mine = predict_num_blocks(shape, budget)
        print(f"  {shape.name} with {budget / GiB:.0f} GiB -> {blocks:,} blocks (predicted {mine:,})")
        for line in log.splitlines():
            print(f"    log: {line}")

    import torch
    from vllm.v1.core.kv_cache_utils import get_max_concurrency_for_kv_cache_config
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec

    spec = FullAttentionSpec(block_size=16, num_kv_heads=12, head_size=64, dtype=torch.float16)
    config = KVCacheConfig(num_blocks=8788, kv_cache_tensors=[],
                           kv_cache_groups=[KVCacheGroupSpec([f"l{i}" for i in range(12)], spec)])
    conc = get_max_concurrency_for_kv_cache_config(engine.scheduler.vllm_config, config)
    print(f"OPT-125m with 8,788 blocks: {8788 * 16:,} tokens, concurrency at 2,048 = {conc} "
          f"-> logged as '{conc:.2f}x'; KV budget = {8788 * bytes_per_block(OPT_125M, 16) / GiB:.2f} GiB")

    for n, length in ((8, 100), (8, 64)):
        r = real_identical_prompts(n, length)
        first = next(iter(r["tables"].values()))
        shared = first[:num_shared_blocks(length)]
        print(f"{n} identical {length}-token prompts, same step: table of req-0 = {first}")
        shared_refs = sorted({r["ref_cnt"][b] for b in shared})
        tails = sorted({r["ref_cnt"][t[-1]] for t in r["tables"].values()})
        print(f"  shared blocks {shared} at ref_cnt {', '.join(map(str, shared_refs))}; each request's "
              f"last block is private (ref_cnt {', '.join(map(str, tails))})")
        print(f"  real prefix cache: {r['hits']} hits / {r['queries']} queries = "
              f"{100 * r['hits'] / r['queries']:.1f}%  (predicted {100 * predicted_hit_rate(n, length):.1f}%)")
    print(f"ceiling for 8 requests: 7/8 = {100 * 7 / 8:.1f}%; a 1,601-token prompt reaches "
          f"{100 * predicted_hit_rate(8, 1601):.1f}%")


if __name__ == "__main__":
    main()
