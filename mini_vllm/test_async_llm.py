"""mini_vllm.entrypoints.async_llm: per-request streams over the engine, and abort when a consumer leaves."""

import asyncio

import pytest

from mini_vllm import LLMEngine, SamplingParams
from mini_vllm.entrypoints.async_llm import AsyncLLM


def _free(engine):
    return engine.scheduler.kv_cache_manager.block_pool.get_num_free_blocks()


def test_streams_equal_generate_and_interleave():
    engine = LLMEngine(num_gpu_blocks=32, block_size=4)
    want = [o.token_ids for o in LLMEngine(num_gpu_blocks=32, block_size=4).generate(
        ["ab", "xyz"], SamplingParams(max_tokens=9, temperature=0, ignore_eos=True))]
    llm = AsyncLLM(engine)

    async def collect(prompt):
        got, deltas = [], 0
        async for d in llm.generate(prompt, SamplingParams(max_tokens=9, temperature=0, ignore_eos=True)):
            got += d.new_token_ids
            deltas += 1
        return got, deltas, d.finish_reason

    async def main():
        try:
            return await asyncio.gather(collect("ab"), collect("xyz"))
        finally:
            await llm.shutdown()

    (a, na, fa), (b, nb, fb) = asyncio.run(main())
    assert [a, b] == want, "streamed tokens must equal LLMEngine.generate's"
    assert na > 1 and nb > 1, "tokens must arrive step by step, not all at the end"
    assert fa == fb == "length"


def test_leaving_early_aborts_and_frees_blocks():
    engine = LLMEngine(num_gpu_blocks=1024, block_size=16)
    start = _free(engine)
    llm = AsyncLLM(engine)

    async def main():
        try:
            gen = llm.generate("hello", SamplingParams(max_tokens=16000, temperature=0, ignore_eos=True))
            async for d in gen:
                if d.num_output_tokens >= 3:
                    break
            await gen.aclose()
            await asyncio.wait_for(llm.wait_idle(), 5)
        finally:
            await llm.shutdown()

    asyncio.run(main())
    assert not engine.has_unfinished_requests(), "a consumer that leaves must abort its request"
    assert engine.num_steps < 16000, f"the request ran {engine.num_steps} steps: it was not aborted, it ran to max_tokens"
    assert _free(engine) == start, "the aborted request's blocks must return to the pool"


def test_bad_input_raises_before_anything_is_yielded():
    llm = AsyncLLM(LLMEngine(num_gpu_blocks=8, block_size=4))

    async def main():
        try:
            with pytest.raises(ValueError, match="empty"):
                async for _ in llm.generate("", SamplingParams(max_tokens=2)):
                    pass
            deltas = [d async for d in llm.generate("ok", SamplingParams(max_tokens=2, temperature=0))]
            return deltas[-1].finished
        finally:
            await llm.shutdown()

    assert asyncio.run(main()), "the engine must still serve after a refused request"
