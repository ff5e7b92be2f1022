"""A tiny Llama and its tokenizer, made offline and deterministically (no hub, no download).

Two uses:

* tier 1 (every test run): ``write_tokenizer`` + ``write_config`` give the real vLLM a model
  directory to parse and a tokenizer to load; no weights.
* tier 2 (``make engine``): ``build`` adds random weights, so the whole vLLM engine (and Hugging
  Face ``generate``) can run it on a CPU. ``python -m course.runtime.tiny_model build/tiny-llama``.

The shape: a ``LlamaForCausalLM`` with hidden size 256 and 4 query heads (head_dim 64: the CPU
attention backend rejects head_dim 16), 2 KV heads, 2 layers, a 512-token vocabulary. The
tokenizer is a byte-level BPE trained here on a fixed corpus, with the added tokens the later
phases' parsers look for (``<tool_call>``, ``<think>``, ``<|python_tag|>``). ``<think>`` and
``</think>`` are added but *not special*, as in real reasoning checkpoints (Qwen3's and
DeepSeek-R1's tokenizers): decoding with ``skip_special_tokens`` keeps them, so a reasoning parser
finds ``</think>`` in a non-streamed text as well as by its id in a stream. Weights come from
``numpy.random.default_rng(seed)``, not torch's initialisers, so the same seed gives the same
numbers under any torch version. Random weights make the text gibberish; what the course checks
is that two engines agree on it.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

VOCAB_SIZE = 512
BOS, EOS, PAD = "<|begin_of_text|>", "<|end_of_text|>", "<|pad|>"
SPECIAL_TOKENS = [BOS, EOS, PAD, "<tool_call>", "</tool_call>", "<think>", "</think>", "<|python_tag|>"]
NOT_SPECIAL = ("<think>", "</think>")  # added tokens (one id each) that decoding keeps
SEED = 0

CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "vocab_size": VOCAB_SIZE,
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "max_position_embeddings": 2048,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "hidden_act": "silu",
    "tie_word_embeddings": False,
    "torch_dtype": "float32",
    "bos_token_id": 0,
    "eos_token_id": 1,
    "pad_token_id": 2,
}

# A chat template in the plainest form: enough for the OpenAI server's chat endpoint.
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)

# The training text: written for this course, about the engine the model will run in. BPE learns
# its merges from it; the order and repetition are fixed, so the merges are too.
_CORPUS = """\
The scheduler decides which requests run in the next step and how many tokens each may compute.
A block holds the keys and values of sixteen tokens; the block pool hands out free blocks.
Prefix caching lets a request reuse blocks that an earlier request with the same prefix filled.
When memory runs out the scheduler preempts the newest running request and frees its blocks.
Chunked prefill splits a long prompt over several steps so decodes keep flowing.
The engine core loops: schedule, execute the model, sample, update the requests.
A token is an integer; the tokenizer turns text into tokens and tokens back into text.
Greedy decoding picks the most likely next token; sampling draws from the distribution.
Paged attention reads keys and values through a block table instead of one contiguous buffer.
Continuous batching admits new requests as soon as others finish, every single step.
The prompt is processed once; after that each decode step adds exactly one token per request.
Throughput counts tokens per second; latency counts the seconds a single user waits.
Quantization stores weights in fewer bits, trading a little accuracy for memory and speed.
A CUDA graph replays a recorded sequence of kernels without the launch overhead.
Speculative decoding drafts several tokens and lets the target model verify them at once.
Tensor parallelism splits each weight matrix across devices and sums the partial results.
<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>
<think>The user wants the sum of two and two, which is four.</think>The answer is 4.
<|python_tag|>{"name": "search", "parameters": {"query": "vLLM paged attention"}}
Numbers: 0 1 2 3 4 5 6 7 8 9 10 16 32 64 128 256 512 1024 2048 4096.
Hello world! How are you today? What is the capital of France? It is Paris.
"""


def corpus() -> list[str]:
    lines = _CORPUS.splitlines()
    return lines * 4


def train_tokenizer():
    """The byte-level BPE (a ``tokenizers.Tokenizer``), specials first: ids 0..7."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus(), trainer)
    if tok.get_vocab_size() != VOCAB_SIZE:
        raise RuntimeError(f"the BPE came out with {tok.get_vocab_size()} tokens, not {VOCAB_SIZE}: grow the corpus")
    data = json.loads(tok.to_str())
    for added in data["added_tokens"]:
        if added["content"] in NOT_SPECIAL:
            added["special"] = False
    return Tokenizer.from_str(json.dumps(data))


def write_tokenizer(path: str | Path) -> Path:
    """``tokenizer.json`` + ``tokenizer_config.json`` + ``special_tokens_map.json`` into ``path``."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    train_tokenizer().save(str(path / "tokenizer.json"))
    specials = {"bos_token": BOS, "eos_token": EOS, "pad_token": PAD}
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": CONFIG["max_position_embeddings"],
        "chat_template": CHAT_TEMPLATE,
        "additional_special_tokens": [t for t in SPECIAL_TOKENS[3:] if t not in NOT_SPECIAL],
        **specials,
    }
    (path / "tokenizer_config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    (path / "special_tokens_map.json").write_text(json.dumps(specials, indent=2, sort_keys=True) + "\n")
    return path


def write_config(path: str | Path, **overrides) -> Path:
    """``config.json`` only (what tier 1's vLLM parses); ``overrides`` replace keys of CONFIG."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps({**CONFIG, **overrides}, indent=2, sort_keys=True) + "\n")
    return path


def build(path: str | Path, seed: int = SEED, script: dict[int, int] | None = None) -> Path:
    """The whole model: config, random float32 weights (safetensors) and the tokenizer.

    ``script`` (token id -> next token id) makes a *scripted* model for tests that need exact
    output tokens (a reasoning split, a stop token): every layer's attention output and MLP
    output projections are zero, so the last hidden state is the current token's normed
    embedding, and ``lm_head`` points each scripted token at its successor with a margin no float
    rounding can flip. Greedy decoding then walks the script from a prompt's last token.
    """
    import numpy as np
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    path = Path(path)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(LlamaConfig(**CONFIG)).eval()
    rng = np.random.default_rng(seed)
    with torch.no_grad():
        for name, param in sorted(model.named_parameters()):
            if name.endswith("norm.weight"):
                values = 1.0 + 0.1 * rng.standard_normal(param.shape)
            else:  # std 0.1: confident enough that float rounding never flips a greedy choice
                values = 0.1 * rng.standard_normal(param.shape)
            param.copy_(torch.from_numpy(values.astype(np.float32)))
        if script:
            for layer in model.model.layers:
                layer.self_attn.o_proj.weight.zero_()
                layer.mlp.down_proj.weight.zero_()
            emb, norm = model.model.embed_tokens.weight, model.model.norm
            head = torch.zeros_like(model.lm_head.weight)
            for token, nxt in script.items():
                h = norm(emb[token][None])[0]  # what lm_head sees after token
                head[nxt] += 10.0 * h / h.dot(h)  # logit 10 for nxt; others stay near 0
            model.lm_head.weight.copy_(head)
    model.generation_config.do_sample = False
    model.save_pretrained(path, safe_serialization=True)
    write_config(path)  # our own config.json: sorted keys, no library version in it
    write_tokenizer(path)
    return path


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m course.runtime.tiny_model OUT_DIR", file=sys.stderr)
        return 2
    out = build(argv[0])
    print(f"tiny Llama written to {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
