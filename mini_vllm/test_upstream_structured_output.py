"""The real vLLM 0.22.1 Scheduler + StructuredOutputManager + xgrammar on CPU, random logits as the model.

A tiny byte-level BPE tokenizer (trained offline here, about 300 tokens) and the course's stub
model config make a ``VllmConfig``; requests carry ``StructuredOutputsParams`` (a JSON schema, a
regex, a choice); each step the real scheduler schedules, ``get_grammar_bitmask`` fills the rows,
the runner-side ``apply_grammar_bitmask`` masks seeded random logits, argmax "samples", and
``update_from_output`` advances the grammars. Grammars compile synchronously, as with the
external_launcher executor: with the default thread pool the step at which a request becomes
schedulable depends on timing, and the same seed can give different texts.

What it shows: every request that stops satisfies its constraint, the JSON requests that hit
``max_tokens`` are the truncation hole (``finish_reason`` length, not parseable), and for the
regex request ``mini_vllm.grammar`` computes the same allowed-token set as the real bitmask row
at every step.
"""

import json
import os
import re
import tempfile

import numpy as np
import pytest

from mini_vllm.grammar import GrammarCompiler, Vocab, unpack_bitmask

pytestmark = [
    pytest.mark.upstream,
    # vLLM passes max_rollback_tokens; xgrammar 0.2.8 ignores it (history is unlimited) and warns
    pytest.mark.filterwarnings("ignore:max_rollback_tokens is deprecated:DeprecationWarning"),
]

SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
          "required": ["name", "age"]}
REGEX = "(yes|no) [0-9][0-9]"
CHOICES = ["red", "green", "blue"]
MAX_TOKENS = 60


def _tokenizer_dir(model_config_path: str) -> str:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    d = tempfile.mkdtemp(prefix="mini_vllm_bpe_")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=360, special_tokens=["<s>", "</s>"], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(['{"name": "Ada", "age": 36}', "yes no maybe red green blue",
                             "hello world 0123456789"], trainer)
    tok.save(os.path.join(d, "tokenizer.json"))
    with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>"}, f)
    with open(os.path.join(model_config_path, "config.json")) as f:
        cfg = json.load(f)
    cfg.update(vocab_size=tok.get_vocab_size(), bos_token_id=0, eos_token_id=1)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f)
    return d


@pytest.fixture(scope="module")
def run():
    os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
    os.environ.setdefault("TRITON_INTERPRET", "1")
    real = pytest.importorskip("mini_vllm.testing.real_vllm")  # registers the stub model, quiets logs
    pytest.importorskip("xgrammar")
    pytest.importorskip("lmformatenforcer")  # SamplingParams._validate_structured_outputs imports it
    import torch
    from vllm.config import (
        CacheConfig,
        DeviceConfig,
        ModelConfig,
        SchedulerConfig,
        StructuredOutputsConfig,
        VllmConfig,
    )
    from vllm.sampling_params import SamplingParams, StructuredOutputsParams
    from vllm.utils.hashing import get_hash_fn_by_name
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.outputs import ModelRunnerOutput
    from vllm.v1.request import Request
    from vllm.v1.structured_output import StructuredOutputManager
    from vllm.v1.structured_output.utils import apply_grammar_bitmask

    d = _tokenizer_dir(real.model_dir())
    mc = ModelConfig(model=d, tokenizer=d, dtype="float32", max_model_len=256, seed=0)
    vc = VllmConfig(
        model_config=mc,
        scheduler_config=SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=256, max_model_len=256,
                                         is_encoder_decoder=False, async_scheduling=False),
        cache_config=CacheConfig(block_size=16),
        device_config=DeviceConfig(device="cpu"),
        structured_outputs_config=StructuredOutputsConfig(backend="xgrammar"),
    )
    vc.cache_config.num_gpu_blocks = 64
    spec = FullAttentionSpec(block_size=16, num_kv_heads=2, head_size=16, dtype=torch.float32)
    kv = KVCacheConfig(num_blocks=64, kv_cache_tensors=[],
                       kv_cache_groups=[KVCacheGroupSpec(layer_names=["layer.0", "layer.1"], kv_cache_spec=spec)])
    manager = StructuredOutputManager(vc)
    manager._use_async_grammar_compilation = False  # deterministic: compile inside grammar_init
    sched = Scheduler(vllm_config=vc, kv_cache_config=kv, structured_output_manager=manager, block_size=16,
                      log_stats=False)
    tok = manager.tokenizer
    hash_fn = get_hash_fn_by_name(vc.cache_config.prefix_caching_hash_algo)
    init_none_hash(hash_fn)
    hasher = get_request_block_hasher(16, hash_fn)

    kinds = {f"json{i}": StructuredOutputsParams(json=SCHEMA) for i in range(4)}
    kinds["regex"] = StructuredOutputsParams(regex=REGEX)
    kinds["choice"] = StructuredOutputsParams(choice=CHOICES)
    for rid, so in kinds.items():
        sp = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, structured_outputs=so)
        sp._validate_structured_outputs(vc.structured_outputs_config, tok)  # the front end's job
        sp.update_from_generation_config({}, tok.eos_token_id)
        req = Request(request_id=rid, prompt_token_ids=tok.encode("hello"), sampling_params=sp,
                      pooling_params=None, block_hasher=hasher)
        manager.grammar_init(req)  # EngineCore.preprocess_add_request does this
        sched.add_request(req)

    class Batch:  # what apply_grammar_bitmask reads from the runner's InputBatch
        def __init__(self, req_ids):
            self.req_ids = req_ids

    gen = torch.Generator().manual_seed(0)
    V = mc.get_vocab_size()
    tokens: dict[str, list[int]] = {rid: [] for rid in kinds}
    finish: dict[str, str] = {}
    regex_rows = []  # (tokens so far, real bitmask row) for the regex request
    for _step in range(200):
        if not sched.has_unfinished_requests():
            break
        out = sched.schedule()
        grammar_out = sched.get_grammar_bitmask(out)
        ids = list(out.num_scheduled_tokens)
        if grammar_out is not None and "regex" in grammar_out.structured_output_request_ids:
            row = grammar_out.grammar_bitmask[grammar_out.structured_output_request_ids.index("regex")]
            regex_rows.append((list(tokens["regex"]), row.copy()))
        logits = torch.randn(len(ids), V, generator=gen)
        if grammar_out is not None:
            apply_grammar_bitmask(out, grammar_out, Batch(ids), logits)
        picks = logits.argmax(-1).tolist()
        sampled = [[] if sched.requests[r].is_prefill_chunk else [t] for r, t in zip(ids, picks, strict=True)]
        outputs = sched.update_from_output(out, ModelRunnerOutput(
            req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)}, sampled_token_ids=sampled))
        for eco in outputs.values():
            for o in eco.outputs:
                tokens[o.request_id].extend(o.new_token_ids)
                if o.finish_reason is not None:
                    finish[o.request_id] = str(o.finish_reason)
    else:
        pytest.fail("the real scheduler did not finish 6 requests in 200 steps")
    texts = {rid: tok.decode(t, skip_special_tokens=True) for rid, t in tokens.items()}
    return {"tok": tok, "V": V, "texts": texts, "tokens": tokens, "finish": finish, "regex_rows": regex_rows}


def test_regex_and_choice_outputs_satisfy_their_constraint(run):
    assert run["finish"]["regex"] == "stop" and re.fullmatch(REGEX, run["texts"]["regex"]), run["texts"]["regex"]
    assert run["finish"]["choice"] == "stop" and run["texts"]["choice"] in CHOICES, run["texts"]["choice"]


def test_stopped_json_parses_and_truncated_json_is_the_length_hole(run):
    stopped = [rid for rid in run["texts"] if rid.startswith("json") and run["finish"][rid] == "stop"]
    truncated = [rid for rid in run["texts"] if rid.startswith("json") and run["finish"][rid] == "length"]
    assert stopped and truncated, f"seed 0 gives both endings with max_tokens={MAX_TOKENS}: {run['finish']}"
    for rid in stopped:
        doc = json.loads(run["texts"][rid])  # strict: no raw control characters inside strings
        assert isinstance(doc["name"], str) and isinstance(doc["age"], int), doc
    for rid in truncated:
        assert len(run["tokens"][rid]) == MAX_TOKENS
        with pytest.raises(json.JSONDecodeError):
            json.loads(run["texts"][rid])


def test_mini_grammar_matches_the_real_bitmask_row_every_step(run):
    tok, V = run["tok"], run["V"]
    special = set(tok.all_special_ids)
    vocab = Vocab(tuple(None if i in special else tok.decode([i]) for i in range(V)), tok.eos_token_id)
    mine = GrammarCompiler(vocab).compile_grammar("regex", REGEX)
    assert len(run["regex_rows"]) >= 3, "the regex request samples at least 3 times (multi-character tokens)"
    for so_far, row in run["regex_rows"]:
        mine.reset()
        assert mine.accept_tokens("regex", so_far)
        want = unpack_bitmask(row, V)
        got = mine.allowed_token_mask()
        diff = np.flatnonzero(want != got)
        assert diff.size == 0, f"after {tok.decode(so_far)!r}: tokens {[tok.decode([i]) for i in diff]} differ"
