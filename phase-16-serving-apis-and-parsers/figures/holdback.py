"""Draw holdback.svg: what each stacked hold-back buffer of mini's server holds, token by token.

One byte-token stream goes through ``mini_vllm.entrypoints``: the ``IncrementalDetokenizer`` (bytes
of an unfinished character; characters that could still become the stop string) and the
``StreamingToolParser`` (a possible ``<tool_call>`` prefix, then the whole call until it closes).
Each panel is one buffer; a bar is what that buffer holds after the token below it.
Run: python phase-16-serving-apis-and-parsers/figures/holdback.py
"""

from __future__ import annotations

from pathlib import Path

from course.svgfig import BLUE, GREEN, GREY, INK, ORANGE, Svg
from mini_vllm.entrypoints.detokenizer import IncrementalDetokenizer, byte_token_bytes
from mini_vllm.entrypoints.tool_parsers import StreamingToolParser

TEXT = 'Sure 𝄞 <tool_call>{"name": "f", "arguments": {"q": "東京"}}</tool_call> ok!!'
STOP = ["!!"]


def trace() -> list[dict]:
    detok, tools = IncrementalDetokenizer(byte_token_bytes(), stop=STOP), StreamingToolParser()
    rows = []
    for i, t in enumerate(TEXT.encode()):
        hit = detok.update([t])
        text = detok.get_next_output_text(hit is not None, delta=True)
        events = tools.feed(text)
        if hit is not None:
            events += tools.finish()
        rows.append({"i": i, "bytes": detok.num_pending_bytes, "stop": detok.num_held_chars, "parser": len(tools.buffer),
                     "events": events, "stopped": hit})
        if hit is not None:
            break
    return rows


def draw(rows: list[dict], path: Path) -> None:
    panels = [("bytes of an unfinished character", "bytes", BLUE, 4),
              ("characters that could be the stop string", "stop", ORANGE, 4),
              ("characters held by the tool parser", "parser", GREEN, 60)]
    width, left, ph, gap, top = 640, 60, 110, 58, 46
    bar = (width - left - 20) / len(rows)
    svg = Svg(width, top + len(panels) * (ph + gap) + 20, "Three hold-back buffers, token by token",
              "For each byte token of a stream with a 4-byte character, a tool call and a stop string: the bytes the "
              "detokenizer holds (at most 3), the characters held for the stop string (at most 1), and the "
              "characters the tool parser holds (a tag prefix, then the whole call until its closing tag).")
    svg.text(left, 26, f"{len(rows)} byte tokens: 'Sure 𝄞 <tool_call>…</tool_call> ok!!', stop=['!!']", 16)
    for p, (title, key, colour, ymax) in enumerate(panels):
        y0 = top + p * (ph + gap) + 24
        svg.text(left, y0 - 8, title, 17)
        svg.rect(left, y0, width - left - 20, ph, "none", GREY)
        for r in rows:
            h = ph * min(r[key], ymax) / ymax
            if h:
                svg.rect(left + r["i"] * bar, y0 + ph - h, max(bar - 1, 1), h, colour, colour, 0.5)
        svg.text(left - 8, y0 + 14, str(ymax), 14, "end")
        svg.text(left - 8, y0 + ph, "0", 14, "end")
    y = top + len(panels) * (ph + gap) - 8
    svg.text(left, y, "token index →", 15)
    for r in rows:
        if any(k == "tool_call" for k, _ in r["events"]):
            svg.line(left + (r["i"] + 0.5) * bar, top + 24, left + (r["i"] + 0.5) * bar, y - 16, INK, 1.5)
            svg.text(left + r["i"] * bar - 4, y - 20, "call emitted", 14, "end")
    svg.write(path)


def main() -> None:
    rows = trace()
    print(f"stream: {len(TEXT.encode())} bytes; stop {STOP}; stopped after token {rows[-1]['i']} on {rows[-1]['stopped']!r}")
    for key, what in [("bytes", "detokenizer, unfinished character (bytes)"), ("stop", "detokenizer, stop window (chars)"),
                      ("parser", "tool parser (chars)")]:
        print(f"  most held by the {what}: {max(r[key] for r in rows)}")
    for r in rows:
        for kind, value in r["events"]:
            print(f"  token {r['i']:2}: {kind:9} {value!r}")
    draw(rows, Path(__file__).with_name("holdback.svg"))
    print("wrote holdback.svg")


if __name__ == "__main__":
    main()
