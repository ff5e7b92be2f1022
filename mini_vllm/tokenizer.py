"""Byte-level tokenizer: one UTF-8 byte is one token, plus an end-of-sequence token.

Mirrors the role of the Hugging Face tokenizer that vLLM loads next to a model (see
``vllm/tokenizers/`` upstream) and leaves out everything that makes real tokenizers hard:
no merges, no special-token table, no chat template. Token ids ``0..255`` are the bytes
themselves and ``256`` is EOS, so a prompt of ``n`` ASCII characters is exactly ``n`` tokens —
the property every worked number in the course relies on.
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence

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
