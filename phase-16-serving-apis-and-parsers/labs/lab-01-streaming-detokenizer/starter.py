"""Lab 16-01 starter: a streaming detokenizer that never emits half a character, with stop strings.

Tokens are bytes (mini's ``ByteTokenizer``: ids 0..255, EOS 256). ``feed`` adds one token and
returns the text it completes; bytes of an unfinished UTF-8 character wait in a buffer; with stop
strings, the last ``max(len(stop)) - 1`` characters wait too, because they could still become one.
Your job: ``utf8_expected_len``, ``complete_prefix_len``, ``feed``, ``flush``, ``_check_stop``, and the
broken baseline ``naive_decode`` (so you see what the rest prevents).
Grade with: LAB_IMPL=starter pytest phase-16-serving-apis-and-parsers/labs/lab-01-streaming-detokenizer -q
"""

from __future__ import annotations

from collections.abc import Sequence

NUM_BYTES = 256  # ids 0..255 are bytes; anything else (EOS = 256) shows nothing


def utf8_expected_len(lead_byte: int) -> int:
    """Bytes in the UTF-8 sequence ``lead_byte`` starts: 1-4 (1 for a byte no sequence starts with)."""
    raise NotImplementedError(
        "read the lead byte's top bits: 0xxxxxxx -> 1, 110xxxxx (0xC2-0xDF) -> 2, 1110xxxx ->"
        ' 3, 11110xxx (0xF0-0xF4) -> 4, anything else -> 1'
    )


def complete_prefix_len(buf: bytes | bytearray) -> int:
    """Length of the longest prefix of ``buf`` that ends on a character boundary (looks at <= 4 bytes)."""
    raise NotImplementedError(
        'walk back over at most 4 bytes to the last non-continuation byte (b & 0xC0 != 0x80);'
        ' keep it and what follows if its sequence is not complete yet'
    )


class StreamingDetokenizer:
    """Feed byte tokens one at a time; get back only whole characters, stop strings cut out."""

    def __init__(self, stop: Sequence[str] = ()) -> None:
        if isinstance(stop, str) or any(not isinstance(s, str) or not s for s in stop):
            raise ValueError(f"stop must be a list of non-empty strings, got {stop!r}")
        self.stop = list(stop)
        self.hold = max(map(len, self.stop)) - 1 if self.stop else 0
        self.pending = bytearray()  # bytes of an unfinished character
        self.text = ""  # every whole character so far (cut at a stop string)
        self.sent = 0  # characters of ``text`` already returned
        self.stopped: str | None = None

    def feed(self, token_id: int) -> str:
        """Add one token; return the text that is now safe to show ('' while a character is open)."""
        raise NotImplementedError(
            'ignore ids >= 256; append the byte; decode the complete prefix into self.text; check'
            ' stop strings from the old length; return self._release(final=stopped)'
        )

    def flush(self) -> str:
        """The stream ended: a cut character becomes U+FFFD (never hidden); release what was held."""
        raise NotImplementedError(
            "decode any pending bytes with errors='replace' (the cut shows as U+FFFD), check stop"
            ' strings, then release everything'
        )

    def _check_stop(self, old_len: int) -> None:
        raise NotImplementedError(
            'search each stop string from len(s) - 1 characters before the new text; on a hit cut'
            ' self.text there, set self.stopped, clear pending'
        )

    def _release(self, final: bool) -> str:
        end = len(self.text) if final else max(self.sent, len(self.text) - self.hold)
        out, self.sent = self.text[self.sent : end], max(self.sent, end)
        return out


def naive_decode(token_ids: Sequence[int]) -> list[str]:
    """The broken baseline: decode every token on its own."""
    raise NotImplementedError(
        "the control, written on purpose: bytes([t]).decode('utf-8', errors='replace') for "
        'each byte id'
    )


def main() -> None:
    clef = list("𝄞".encode())
    print(f"𝄞 is {len(clef)} byte tokens: {[hex(b) for b in clef]}")
    print(f"  naive per-token decode: {naive_decode(clef)}")
    d = StreamingDetokenizer()
    print(f"  streaming detokenizer:  {[d.feed(t) for t in clef]}")
    text = "naïve café — 你好 𝄞𝄢"
    ids = list(text.encode())
    d = StreamingDetokenizer()
    deltas = [d.feed(t) for t in ids]
    held = sum(1 for x in deltas if x == "")
    print(f"\n{text!r}: {len(text)} characters, {len(ids)} byte tokens, {held} tokens returned ''")
    print(f"  concatenation equals the text: {''.join(deltas) == text}; replacement chars: {''.join(deltas).count(chr(0xFFFD))}")
    d = StreamingDetokenizer()
    cut = [d.feed(t) for t in list("ok𝄞".encode())[:4]] + [d.flush()]
    print(f"\nstream cut after 2 of 𝄞's 4 bytes: {cut}")
    d = StreamingDetokenizer(stop=["STOP"])
    out = [d.feed(t) for t in list("go, then STOP here".encode())[: len("go, then STOP")]]
    print(f"\nstop=['STOP'] on 'go, then STOP here': deltas {out}")
    print(f"  stopped on {d.stopped!r}; shown text {''.join(out)!r} (3 characters held back until they could not be a stop)")


if __name__ == "__main__":
    main()
