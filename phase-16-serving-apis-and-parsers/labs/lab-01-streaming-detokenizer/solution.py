"""Lab 16-01 solution: a streaming detokenizer that never emits half a character, with stop strings.

Tokens are bytes (mini's ``ByteTokenizer``: ids 0..255, EOS 256). ``feed`` adds one token and
returns the text it completes; bytes of an unfinished UTF-8 character wait in a buffer; with stop
strings, the last ``max(len(stop)) - 1`` characters wait too, because they could still become one.
Run ``python phase-16-serving-apis-and-parsers/labs/lab-01-streaming-detokenizer/solution.py``.
"""

from __future__ import annotations

from collections.abc import Sequence

NUM_BYTES = 256  # ids 0..255 are bytes; anything else (EOS = 256) shows nothing


def utf8_expected_len(lead_byte: int) -> int:
    """Bytes in the UTF-8 sequence ``lead_byte`` starts: 1-4 (1 for a byte no sequence starts with)."""
    if lead_byte < 0x80:
        return 1
    if 0xC2 <= lead_byte <= 0xDF:
        return 2
    if 0xE0 <= lead_byte <= 0xEF:
        return 3
    if 0xF0 <= lead_byte <= 0xF4:
        return 4
    return 1


def complete_prefix_len(buf: bytes | bytearray) -> int:
    """Length of the longest prefix of ``buf`` that ends on a character boundary (looks at <= 4 bytes)."""
    n = len(buf)
    for back in range(1, min(4, n) + 1):
        b = buf[n - back]
        if b & 0xC0 != 0x80:  # the last byte that is not a continuation byte
            return n if utf8_expected_len(b) <= back else n - back
    return n


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
        if self.stopped is not None:
            raise ValueError(f"the stream already stopped on {self.stopped!r}")
        if not 0 <= token_id < NUM_BYTES:
            return ""  # EOS and other non-byte ids show nothing
        self.pending.append(token_id)
        cut = complete_prefix_len(self.pending)
        if cut:
            old = len(self.text)
            self.text += bytes(self.pending[:cut]).decode("utf-8", errors="replace")
            del self.pending[:cut]
            self._check_stop(old)
        return self._release(final=self.stopped is not None)

    def flush(self) -> str:
        """The stream ended: a cut character becomes U+FFFD (never hidden); release what was held."""
        if self.stopped is None and self.pending:
            old = len(self.text)
            self.text += bytes(self.pending).decode("utf-8", errors="replace")
            self.pending.clear()
            self._check_stop(old)
        return self._release(final=True)

    def _check_stop(self, old_len: int) -> None:
        for s in self.stop:  # only where the new characters could complete it
            i = self.text.find(s, max(0, old_len - len(s) + 1))
            if i != -1:
                self.stopped, self.text = s, self.text[:i]
                self.pending.clear()
                return

    def _release(self, final: bool) -> str:
        end = len(self.text) if final else max(self.sent, len(self.text) - self.hold)
        out, self.sent = self.text[self.sent : end], max(self.sent, end)
        return out


def naive_decode(token_ids: Sequence[int]) -> list[str]:
    """The broken baseline: decode every token on its own."""
    return [bytes([t]).decode("utf-8", errors="replace") for t in token_ids if 0 <= t < NUM_BYTES]


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
