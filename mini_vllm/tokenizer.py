"""Byte-level tokenizer: one UTF-8 byte is one token, plus an end-of-sequence token.

Mirrors the role of the Hugging Face tokenizer that vLLM loads next to a model (see
``vllm/tokenizers/`` upstream) and leaves out everything that makes real tokenizers hard:
no merges, no special-token table, no chat template. Token ids ``0..255`` are the bytes
themselves and ``256`` is EOS, so a prompt of ``n`` ASCII characters is exactly ``n`` tokens —
the property every worked number in the course relies on. ``HFTokenizer`` reads a checkpoint's
``tokenizer.json`` (the ``tokenizers`` library) for ``LLMEngine(model=...)``.
"""

from __future__ import annotations

import json
import numbers
from collections.abc import Sequence
from pathlib import Path
from typing import Any

Prompt = str | Sequence[int]  # what the engine accepts as one prompt: text, or token ids


class ByteTokenizer:
    """Encode text to byte ids and back. ``vocab_size`` is 257 and ``eos_token_id`` is 256."""

    vocab_size: int = 257
    eos_token_id: int = 256

    def encode(self, text: str) -> list[int]:
        """Return the UTF-8 bytes of ``text`` as token ids (no EOS appended)."""
        if not isinstance(text, str):
            raise TypeError(f"ByteTokenizer.encode expects a str, got {type(text).__name__}")
        return list(text.encode("utf-8"))

    def decode(self, token_ids: Sequence[int]) -> str:
        """Return the text for ``token_ids``; EOS is skipped, invalid UTF-8 becomes U+FFFD."""
        if isinstance(token_ids, (str, bytes)):
            raise TypeError("ByteTokenizer.decode expects a sequence of int token ids, not text")
        data = bytearray()
        for tok in token_ids:
            if isinstance(tok, bool) or not isinstance(tok, numbers.Integral):
                raise TypeError(f"token ids must be ints, got {tok!r} ({type(tok).__name__})")
            if not 0 <= tok < self.vocab_size:
                raise ValueError(f"token id {tok} is outside the vocabulary [0, {self.vocab_size})")
            if tok != self.eos_token_id:
                data.append(int(tok))
        return data.decode("utf-8", errors="replace")


class HFTokenizer:
    """A checkpoint's ``tokenizer.json`` through the ``tokenizers`` library (imported on first use).

    ``encode`` adds no special tokens; ``decode`` skips them. ``vocab_size`` and ``eos_token_id``
    are the model's (``ModelConfig``), as upstream takes EOS from the model's config. For the
    server: ``len()``, ``convert_ids_to_tokens``, ``added_tokens_decoder`` (the byte table of the
    streaming detokenizer) and ``apply_chat_template`` (the ``chat_template`` of the checkpoint's
    ``tokenizer_config.json``, rendered with Jinja as ``transformers`` renders it).
    """

    def __init__(self, model_dir: str | Path, vocab_size: int, eos_token_id: int | None) -> None:
        from tokenizers import Tokenizer

        path = Path(model_dir) / "tokenizer.json"
        if not path.is_file():
            raise FileNotFoundError(
                f"{str(model_dir)!r} has no tokenizer.json (mini_vllm reads only that file)"
            )
        self._tok = Tokenizer.from_file(str(path))
        self.vocab_size, self.eos_token_id = vocab_size, eos_token_id
        config = Path(model_dir) / "tokenizer_config.json"
        self._config = json.loads(config.read_text(encoding="utf-8")) if config.is_file() else {}

    def __len__(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)

    def convert_ids_to_tokens(self, token_id: int) -> str | None:
        return self._tok.id_to_token(int(token_id))

    @property
    def added_tokens_decoder(self) -> dict[int, Any]:
        """Added tokens by id (each with ``.content`` and ``.special``), as ``transformers`` shows them."""
        return dict(self._tok.get_added_tokens_decoder())

    def grammar_vocab(self) -> Any:
        """The grammar's view of the vocabulary (``mini_vllm.grammar.Vocab``): each id's bytes, ``None``
        for special tokens (EOS among them) and for ids past the tokenizer's (a padded embedding);
        xgrammar's ``TokenizerInfo`` upstream. Byte-level BPE only (``ValueError`` otherwise)."""
        from .entrypoints.detokenizer import hf_token_bytes
        from .grammar import Vocab

        special = {i for i, t in self.added_tokens_decoder.items() if t.special}
        to_bytes, known = hf_token_bytes(self), len(self)
        tokens = tuple(
            None if i in special or i >= known or not to_bytes(i) else to_bytes(i)
            for i in range(self.vocab_size)
        )
        if self.eos_token_id is None:
            raise ValueError(
                "structured outputs need an EOS token (the grammar allows it once the output matches)"
            )
        return Vocab(tokens, eos_token_id=self.eos_token_id)

    def apply_chat_template(
        self,
        messages: list[dict],
        tools: list[dict] | None = None,
        add_generation_prompt: bool = True,
        tokenize: bool = False,
    ) -> str | list[int]:
        """Render the checkpoint's chat template; ``ValueError`` when it has none."""
        template = self._config.get("chat_template")
        if not isinstance(template, str):
            raise ValueError(
                "this checkpoint's tokenizer_config.json has no chat_template; use /v1/completions"
            )
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        env = ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
        )
        env.filters["tojson"] = lambda x, indent=None: json.dumps(x, ensure_ascii=False, indent=indent)
        specials = {k: v for k, v in self._config.items() if k.endswith("_token") and isinstance(v, str)}
        text = env.from_string(template).render(
            messages=messages, tools=tools, add_generation_prompt=add_generation_prompt, **specials
        )
        return self.encode(text) if tokenize else text

    def encode(self, text: str) -> list[int]:
        if not isinstance(text, str):
            raise TypeError(f"encode expects a str, got {type(text).__name__}")
        return list(self._tok.encode(text, add_special_tokens=False).ids)

    def decode(self, token_ids: Sequence[int]) -> str:
        return self._tok.decode([int(t) for t in token_ids], skip_special_tokens=True)
