"""Incremental detokenization: token ids in, text deltas out, UTF-8 safe, with stop strings.

Mirrors ``vllm/v1/engine/detokenizer.py``: ``IncrementalDetokenizer.update(new_token_ids,
stop_terminated)`` decodes the new tokens and checks the stop strings (returning the one that
matched), ``get_next_output_text(finished, delta)`` hands out text while holding back the last
``max(len(stop)) - 1`` characters, which could still become a stop string; ``check_stop_strings``
searches only the text the new tokens could have completed. Upstream decodes with the
``tokenizers`` library's ``DecodeStream`` (``FastIncrementalDetokenizer``); here every token is a
byte string (``token_bytes``), the detokenizer keeps the bytes of an unfinished character, and
emits the longest prefix made of whole UTF-8 characters, so each byte is decoded exactly once
(``num_decoded_bytes``): the O(n) path, never a re-decode of the whole output per token.

One difference, on purpose: a stream that ends inside a character (``finish()``) shows U+FFFD for
the cut bytes; upstream's ``DecodeStream`` never emits them. Left out: ``min_tokens`` (the server
passes it to the engine) and the ``spaces_between_special_tokens`` rule for added tokens.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable, Sequence

REPLACEMENT = "\ufffd"


def utf8_expected_len(lead_byte: int) -> int:
    """Bytes in the UTF-8 sequence this byte starts: 1, 2, 3 or 4 (1 for a continuation/invalid byte)."""
    if lead_byte < 0x80:
        return 1
    if 0xC2 <= lead_byte <= 0xDF:
        return 2
    if 0xE0 <= lead_byte <= 0xEF:
        return 3
    if 0xF0 <= lead_byte <= 0xF4:
        return 4
    return 1  # 0x80-0xC1, 0xF5-0xFF never start a valid sequence: decode alone (as U+FFFD)


def complete_prefix_len(buf: bytes | bytearray) -> int:
    """Length of the longest prefix of ``buf`` that ends on a character boundary.

    Only the last (at most 3) bytes can be an unfinished character, so the scan is O(1) per call.
    """
    n = len(buf)
    for back in range(1, min(4, n) + 1):  # find the last lead byte
        b = buf[n - back]
        if b & 0xC0 != 0x80:  # not a continuation byte
            need = utf8_expected_len(b)
            return n if need <= back else n - back
    return n  # only continuation bytes in the tail: nothing can complete them


def check_stop_strings(
    output_text: str, new_char_count: int, stop: Sequence[str], include_in_output: bool
) -> tuple[str, int] | None:
    """The stop string the last ``new_char_count`` characters completed, and where to cut.

    Returns ``(stop_string, truncate_to)`` (``-1`` = keep everything) or ``None``. Searching only
    from ``len(stop) - 1`` characters before the new text keeps each check O(new + len(stop)).
    """
    if not new_char_count or not stop:
        return None
    for s in stop:
        start = max(0, len(output_text) - new_char_count - len(s) + 1)
        idx = output_text.find(s, start)
        if idx == -1:
            continue
        if include_in_output:
            end = idx + len(s)
            return s, (-1 if end >= len(output_text) else end)
        return s, idx
    return None


class IncrementalDetokenizer:
    """One request's text, grown token by token.

    ``token_bytes(token_id) -> bytes`` gives each token's bytes (``b""`` for a token that shows
    nothing, such as EOS); ``stop`` are stop strings, cut from the text unless
    ``include_stop_str_in_output``.
    """

    def __init__(
        self,
        token_bytes: Callable[[int], bytes],
        stop: Sequence[str] | str | None = None,
        include_stop_str_in_output: bool = False,
    ) -> None:
        stop = [stop] if isinstance(stop, str) else list(stop or [])
        if any(not isinstance(s, str) or not s for s in stop):
            raise ValueError(f"stop strings must be non-empty strings, got {stop!r}")
        self.token_bytes = token_bytes
        self.stop = stop
        self.include_stop_str_in_output = include_stop_str_in_output
        # hold back what could still grow into a stop string (upstream's stop_buffer_length)
        self.stop_buffer_length = max(map(len, stop)) - 1 if stop and not include_stop_str_in_output else 0
        self.token_ids: list[int] = []
        self.output_text = ""
        self.stopped: str | None = None  # the stop string that finished the text
        self.num_decoded_bytes = 0  # bytes passed to the UTF-8 decoder, all tokens together
        self._pending = bytearray()  # bytes of an unfinished character
        self._last_output_text_offset = 0

    def num_output_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_pending_bytes(self) -> int:
        """Bytes of an unfinished character, waiting for the rest of it."""
        return len(self._pending)

    @property
    def num_held_chars(self) -> int:
        """Characters decoded but not yet handed out (the stop-string window)."""
        return len(self.output_text) - self._last_output_text_offset

    def decode_next(self, token_id: int) -> str:
        """Add one token's bytes; return the whole characters they complete ('' while one is open)."""
        if isinstance(token_id, bool) or not isinstance(token_id, numbers.Integral):
            raise TypeError(f"token ids must be ints, got {token_id!r}")
        self._pending += self.token_bytes(int(token_id))
        cut = complete_prefix_len(self._pending)
        if cut == 0:
            return ""
        done = bytes(self._pending[:cut])
        del self._pending[:cut]
        self.num_decoded_bytes += len(done)
        return done.decode("utf-8", errors="replace")

    def update(self, new_token_ids: Sequence[int], stop_terminated: bool = False) -> str | None:
        """Decode the new tokens, then check the stop strings; return the one that matched.

        ``stop_terminated``: the last token is a stop token (EOS or a stop id) and is not shown.
        After a stop string matched, further tokens are refused.
        """
        if self.stopped is not None:
            raise ValueError(f"the text already stopped on {self.stopped!r}; no more tokens")
        if not new_token_ids:
            return None
        new_token_ids = list(new_token_ids)
        shown = new_token_ids[:-1] if stop_terminated else new_token_ids
        offset = len(self.output_text)
        for tok in shown:
            self.output_text += self.decode_next(tok)
        self.token_ids.extend(new_token_ids)
        return self._check_stop(offset)

    def finish(self) -> str | None:
        """The stream ended: decode a cut character as U+FFFD, and check the stop strings once more."""
        if self.stopped is not None or not self._pending:
            return None
        offset = len(self.output_text)
        self.num_decoded_bytes += len(self._pending)
        self.output_text += bytes(self._pending).decode("utf-8", errors="replace")
        self._pending.clear()
        return self._check_stop(offset)

    def _check_stop(self, offset: int) -> str | None:
        hit = check_stop_strings(
            self.output_text, len(self.output_text) - offset, self.stop, self.include_stop_str_in_output
        )
        if hit is None:
            return None
        self.stopped, truncate_to = hit
        if truncate_to != -1:
            self.output_text = self.output_text[:truncate_to]
        self._pending.clear()
        return self.stopped

    def get_next_output_text(self, finished: bool, delta: bool) -> str:
        """The text so far (``delta=False``) or what is new since the last call (``delta=True``).

        Until ``finished`` the last ``stop_buffer_length`` characters are held back.
        """
        hold = 0 if finished else self.stop_buffer_length
        length = max(0, len(self.output_text) - hold)
        if not delta:
            return self.output_text[:length]
        last = self._last_output_text_offset
        if last < length:
            self._last_output_text_offset = length
            return self.output_text[last:length]
        return ""


def byte_token_bytes(eos_token_id: int | None = 256) -> Callable[[int], bytes]:
    """``token_bytes`` for mini's ``ByteTokenizer``: ids 0..255 are bytes, anything else shows nothing."""

    def token_bytes(token_id: int) -> bytes:
        return bytes((token_id,)) if 0 <= token_id < 256 and token_id != eos_token_id else b""

    return token_bytes


def _byte_level_decoder() -> dict[str, int]:
    """GPT-2's byte-to-unicode table, inverted: the character a byte-level BPE shows for each byte."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    chars, extra = [], 0
    for b in range(256):
        if b in printable:
            chars.append(chr(b))
        else:
            chars.append(chr(256 + extra))
            extra += 1
    return {c: b for b, c in enumerate(chars)}


def hf_token_bytes(tokenizer, skip_special_tokens: bool = True) -> Callable[[int], bytes]:
    """``token_bytes`` for a Hugging Face byte-level BPE tokenizer (GPT-2 / Llama-3 / Qwen style).

    Added tokens show their text; special ones only without ``skip_special_tokens``; a tokenizer whose
    vocabulary is not byte-level raises ``ValueError``.
    """
    decoder = _byte_level_decoder()
    added = {int(i): (t.content, t.special) for i, t in tokenizer.added_tokens_decoder.items()}
    table: dict[int, bytes] = {}
    for tok_id in range(len(tokenizer)):
        if tok_id in added:
            content, special = added[tok_id]
            table[tok_id] = b"" if skip_special_tokens and special else content.encode()
            continue
        piece = tokenizer.convert_ids_to_tokens(tok_id)
        try:
            table[tok_id] = bytes(decoder[c] for c in piece)
        except KeyError as e:
            raise ValueError(
                f"token {tok_id} ({piece!r}) is not byte-level BPE; cannot map it to bytes"
            ) from e
    return lambda token_id: table.get(token_id, b"")
