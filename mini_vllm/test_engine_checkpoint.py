"""The engine on a real checkpoint: every scheduling feature leaves greedy tokens unchanged.

The tiny Llama of ``course/runtime/tiny_model.py`` (2 layers, 512-token vocabulary, random
weights) is built once per session. Its K/V really live in the paged cache, so chunked prefill,
prefix-cache hits, preemption and recompute, block sizes, batch composition and rejected drafts
all change which cache slots are written and read, and none may change a greedy token.
"""

import importlib.util

import numpy as np
import pytest

from mini_vllm import CacheConfig, LLMEngine, ModelConfig, SamplingParams, VllmConfig
from mini_vllm.sampling_params import BeamSearchParams, StructuredOutputsParams

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("torch") is None or importlib.util.find_spec("transformers") is None,
    reason="the tiny checkpoint is written by transformers (pip install -e '.[torch]')",
)

MAX_TOKENS = 24
GREEDY = SamplingParams(max_tokens=MAX_TOKENS, temperature=0, ignore_eos=True)
SHARED = list(range(3, 43))  # 40 tokens: two and a half blocks of 16 that later prompts share


def prompts() -> list[list[int]]:
    rng = np.random.default_rng(0)
    out = [SHARED + [int(t) for t in rng.integers(3, 512, size=n)] for n in (1, 9, 30)]
    out += [[int(t) for t in rng.integers(3, 512, size=n)] for n in (1, 5, 17, 70)]
    out.append([7, 8, 9, 10] * 10)  # repetitive: the n-gram drafter finds matches in the prompt
    return out


@pytest.fixture(scope="session")
def checkpoint(tmp_path_factory):
    from course.runtime import tiny_model

    return str(tiny_model.build(tmp_path_factory.mktemp("tiny-llama")))


def run(checkpoint, batch=None, **engine_args):
    """Greedy tokens of every prompt (all queued at once, or ``batch`` at a time) and the engine."""
    engine = LLMEngine(model=checkpoint, **engine_args)
    ps = prompts()
    batch = batch or len(ps)
    tokens = []
    for i in range(0, len(ps), batch):
        tokens += [o.token_ids for o in engine.generate(ps[i : i + batch], GREEDY)]
    return tokens, engine


@pytest.fixture(scope="session")
def reference(checkpoint):
    tokens, engine = run(checkpoint)
    assert engine.scheduler.kv_cache_manager.make_prefix_cache_stats().hits > 0, "shared prefixes must hit"
    return tokens


def test_the_engine_generates_hugging_faces_greedy_tokens(checkpoint, reference):
    import torch
    from transformers import LlamaForCausalLM

    hf = LlamaForCausalLM.from_pretrained(checkpoint, torch_dtype=torch.float32).eval()
    for prompt, got in list(zip(prompts(), reference))[::3]:
        with torch.no_grad():
            ids = hf.generate(
                torch.tensor([prompt]),
                max_new_tokens=MAX_TOKENS,
                do_sample=False,
                eos_token_id=None,
                pad_token_id=0,
            )
        assert got == ids[0, len(prompt) :].tolist(), f"prompt of {len(prompt)} tokens: mini differs from HF"


def test_the_engine_takes_the_checkpoints_tokenizer_eos_and_length(checkpoint):
    engine = LLMEngine(model=checkpoint)
    assert engine.max_model_len == 2048, "max_model_len is capped at max_position_embeddings"
    assert engine.tokenizer.eos_token_id == 1 and engine.tokenizer.vocab_size == 512
    runner = engine.model_executor.driver_worker.model_runner
    assert [k.shape for k in runner.kv_caches] == [(2, 257, 16, 2, 64)] * 2, (
        "one KV tensor per layer, pool-sized"
    )
    out = engine.generate(["The scheduler decides"], SamplingParams(max_tokens=4, temperature=0))[0]
    assert out.prompt_token_ids == engine.tokenizer.encode("The scheduler decides")
    assert out.text == engine.tokenizer.decode(out.token_ids)
    assert LLMEngine(model=checkpoint, num_gpu_blocks=9).max_model_len == 128, "a small pool caps it lower"
    built = VllmConfig(
        model_config=ModelConfig(model=checkpoint), cache_config=CacheConfig(num_gpu_blocks=300)
    )
    assert built.max_model_len == 2048, "a VllmConfig built by hand caps max_model_len at the model's too"


@pytest.mark.parametrize(
    "engine_args",
    [
        {"enable_prefix_caching": False},
        {"max_num_batched_tokens": 8},
        {"max_num_batched_tokens": 32},
        {"max_num_batched_tokens": 2048, "long_prefill_token_threshold": 16},
        {"block_size": 32},
        {"block_size": 32, "max_num_batched_tokens": 8, "enable_prefix_caching": False},
    ],
    ids=[
        "no-prefix-caching",
        "chunk-8",
        "chunk-32",
        "threshold-16",
        "block-32",
        "block-32-chunk-8-no-caching",
    ],
)
def test_greedy_tokens_do_not_depend_on_the_schedule(checkpoint, reference, engine_args):
    got, _ = run(checkpoint, **engine_args)
    assert got == reference, f"{engine_args} changed a greedy token"


def test_batch_of_one_equals_the_whole_batch(checkpoint, reference):
    got, _ = run(checkpoint, batch=1)
    assert got == reference, "each prompt alone must get the tokens it gets in a batch of eight"


def test_preemption_and_recompute_do_not_change_tokens(checkpoint, reference):
    engine = LLMEngine(model=checkpoint, num_gpu_blocks=12, max_model_len=176, enable_prefix_caching=False)
    ids = [engine.add_request(p, GREEDY) for p in prompts()]
    requests = [engine.scheduler.requests[rid] for rid in ids]
    while engine.has_unfinished_requests():
        engine.step()
    assert [list(r.output_token_ids) for r in requests] == reference, (
        "recomputing a preempted request's KV must give the same tokens"
    )
    assert sum(r.num_preemptions for r in requests) > 0, "11 usable blocks of 16 cannot hold eight requests"


def test_speculation_does_not_change_tokens(checkpoint, reference):
    engine = LLMEngine(
        model=checkpoint,
        speculative_config={
            "method": "ngram",
            "num_speculative_tokens": 3,
            "prompt_lookup_min": 2,
            "prompt_lookup_max": 2,
        },
    )
    ids = [engine.add_request(p, GREEDY) for p in prompts()]
    requests = [engine.scheduler.requests[rid] for rid in ids]
    drafted = accepted = 0
    while engine.has_unfinished_requests():
        engine.step()
        stats = engine.scheduler.spec_decoding_stats
        if stats is not None:
            drafted, accepted = drafted + stats.num_draft_tokens, accepted + stats.num_accepted_tokens
    assert [list(r.output_token_ids) for r in requests] == reference, (
        "rejected drafts' KV is overwritten before it is read: greedy output must not change"
    )
    assert drafted > accepted > 0, (
        f"the repetitive prompt must see drafts accepted and rejected: {accepted}/{drafted}"
    )


def test_n_children_share_the_prompt_and_match_a_single_request(checkpoint, reference):
    engine = LLMEngine(model=checkpoint)
    out = engine.generate(
        [prompts()[2]],
        SamplingParams(n=2, max_tokens=MAX_TOKENS, temperature=0.5, top_k=1, ignore_eos=True, seed=1),
    )[0]
    assert [c.token_ids for c in out.outputs] == [reference[2]] * 2, "top_k=1 children equal greedy"


def test_a_prompt_past_max_model_len_is_refused_and_nothing_is_allocated(checkpoint):
    engine = LLMEngine(model=checkpoint, max_model_len=64)
    kv = engine.scheduler.kv_cache_manager
    free = kv.block_pool.get_num_free_blocks()
    with pytest.raises(ValueError, match="max_model_len=64"):
        engine.add_request(list(range(3, 67)), GREEDY)
    with pytest.raises(ValueError, match="max_model_len=64"):
        engine.generate([[5, 6], list(range(3, 100))], GREEDY)
    assert not engine.has_unfinished_requests() and kv.block_pool.get_num_free_blocks() == free
    engine.step()
    assert not engine.model_executor.driver_worker.model_runner.requests, (
        "the runner never saw a refused request"
    )
    ok = engine.generate([list(range(3, 50))], SamplingParams(max_tokens=20, temperature=0, ignore_eos=True))[
        0
    ]
    assert len(ok.token_ids) == 64 - 47 and ok.finish_reason == "length", (
        "a prompt that fits stops at max_model_len"
    )
    with pytest.raises(ValueError, match="max_position_embeddings 2048"):
        LLMEngine(model=checkpoint, max_model_len=4096, num_gpu_blocks=300)


def test_features_that_cannot_apply_are_refused_with_a_reason(checkpoint):
    with pytest.raises(ValueError, match="cannot be sharded"):
        LLMEngine(model=checkpoint, tensor_parallel_size=2)
    with pytest.raises(ValueError, match="no LoRA layers"):
        LLMEngine(model=checkpoint, enable_lora=True)
    engine = LLMEngine(model=checkpoint)
    with pytest.raises(ValueError, match="beam search"):
        engine.beam_search(["hi"], BeamSearchParams(beam_width=2, max_tokens=2))
    with pytest.raises(ValueError, match="needs its KV context"):
        engine.model.forward(np.array([5]), np.array([0]))
    assert not engine.has_unfinished_requests(), "a refused request leaves nothing queued"
    with pytest.raises(FileNotFoundError, match="does not exist"):
        LLMEngine(model=checkpoint + "/missing")


def test_structured_outputs_run_on_the_checkpoints_bpe_vocabulary(checkpoint):
    """Grammars walk each BPE token's bytes (special tokens never match), as xgrammar's TokenizerInfo."""
    import re

    engine = LLMEngine(model=checkpoint)
    vocab = engine.tokenizer.grammar_vocab()
    assert vocab.size == 512 and vocab.tokens[1] is None, (
        "EOS (id 1) and the other special tokens have no bytes"
    )
    assert all(vocab.tokens[i] is None for i in (0, 1, 2, 3, 4, 7)), "the tiny tokenizer's special tokens"
    assert vocab.tokens[5] == b"<think>" and vocab.tokens[6] == b"</think>", "added but not special: their bytes"
    cases = {
        "(yes|no)": r"(yes|no)",
        "[a-z]+ [0-9]+": r"[a-z]+ [0-9]+",
        '\\{"city": "(Paris|東京)"\\}': r'\{"city": "(Paris|東京)"\}',
    }
    for pattern, check in cases.items():
        params = SamplingParams(
            max_tokens=24, temperature=0, structured_outputs=StructuredOutputsParams(regex=pattern)
        )
        (out,) = engine.generate(["Answer:"], params)
        assert re.fullmatch(check, out.text) and out.finish_reason == "stop", (
            f"regex {pattern!r}: got {out.text!r} ({out.finish_reason}); every token must keep the match alive "
            f"and EOS comes once it matches"
        )
    (js,) = engine.generate(
        ["{"],
        SamplingParams(
            max_tokens=40, temperature=0, structured_outputs=StructuredOutputsParams(json_object=True)
        ),
    )
    assert js.text.startswith("{") and (js.finish_reason == "length" or js.text.endswith("}")), js.text
    assert not engine.has_unfinished_requests()


@pytest.mark.slow
def test_the_mp_backend_loads_the_checkpoint_in_its_worker(checkpoint, reference):
    got, engine = run(checkpoint, distributed_executor_backend="mp")
    engine.shutdown()
    assert got == reference
