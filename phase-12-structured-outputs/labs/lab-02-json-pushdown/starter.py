"""Lab 12-02 starter: a pushdown machine for a JSON subset, used as a character-level mask.

The subset: a document is an integer or an object; an object maps quoted keys to integers or
nested objects. Keys are one or more of ``a-z``, ``0-9`` and ``_``; integers are ``0`` or
``[1-9][0-9]*`` (no leading zeros, no sign); no whitespace, strings, arrays, floats or literals.

``JsonMachine`` keeps a *mode* and a *depth*. Only one construct nests (the object), so a
counter of open objects is the whole stack. ``allowed()`` is the set of characters that may come
next, ``feed(ch)`` advances or raises ``ValueError`` without changing anything, ``accepting()``
says whether the text so far is a complete document (EOS would be legal now).
``constrained_generate`` masks a model's logits with ``allowed()`` one character at a time.

Run it: ``python phase-12-structured-outputs/labs/lab-02-json-pushdown/solution.py``
Grade with: LAB_IMPL=starter pytest phase-12-structured-outputs/labs/lab-02-json-pushdown -q
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple

import numpy as np

DIGITS = frozenset("0123456789")
KEY_CHARS = frozenset("abcdefghijklmnopqrstuvwxyz0123456789_")
ALPHABET = "".join(sorted(set('{}":,') | DIGITS | KEY_CHARS))
VOCAB: list[str | None] = [*ALPHABET, None]  # one token per character, then EOS
EOS = len(VOCAB) - 1
MODES = ("value", "int", "int_zero", "obj_first", "key", "key_body", "colon", "comma_or_close", "obj_key", "done")

Model = Callable[[list[int]], np.ndarray]  # output so far -> logits over VOCAB


class Generation(NamedTuple):
    text: str
    finish_reason: str  # "stop" (EOS chosen) or "length" (max_tokens reached first)
    max_depth: int  # deepest nesting reached


class JsonMachine:
    """The JSON-subset pushdown machine: ``mode`` (one of ``MODES``) and ``depth`` (open objects)."""

    def __init__(self) -> None:
        self.mode = "value"
        self.depth = 0

    def allowed(self) -> frozenset[str]:
        """Characters legal next. Only the two integer modes read ``depth``: a top-level integer
        can only grow (or end at EOS), one inside an object may also be ended by ``,`` or ``}``."""
        raise NotImplementedError(
            "JsonMachine.allowed: return the characters legal in self.mode (see MODES and the README's table); "
            "only 'int' and 'int_zero' look at self.depth (',' and '}' only when depth > 0)"
        )

    def accepting(self) -> bool:
        """A complete document: a closed top-level object, or a top-level integer."""
        raise NotImplementedError(
            "JsonMachine.accepting: True in mode 'done', or at depth 0 in mode 'int' / 'int_zero'"
        )

    def feed(self, ch: str) -> None:
        """Advance by one character, or raise ``ValueError`` (naming the mode) and change nothing."""
        raise NotImplementedError(
            "JsonMachine.feed: raise ValueError if ch is not in self.allowed(); '{' pushes (depth + 1), "
            "'}' pops (then 'done' at depth 0, else 'comma_or_close'); ',' or '}' in an int mode ends the "
            "int (mode 'comma_or_close') and is fed again"
        )
        # mode "int" with a digit stays "int"


def accepts(text: str) -> bool:
    """True iff ``text`` is a complete document of the subset (the machine as a validator)."""
    m = JsonMachine()
    try:
        for ch in text:
            m.feed(ch)
    except ValueError:
        return False
    return m.accepting()


def constrained_generate(model: Model, max_tokens: int) -> Generation:
    """Greedy decoding over ``VOCAB`` (one character per token): mask every character not in
    ``allowed()`` and EOS unless ``accepting()``, take the argmax (lowest id on ties), feed it;
    stop at EOS or after ``max_tokens`` tokens (EOS counts). Raises ``ValueError`` if
    ``max_tokens < 1`` or the logits' shape is not ``(len(VOCAB),)``."""
    raise NotImplementedError(
        "constrained_generate: validate max_tokens; per step mask VOCAB with m.allowed() (EOS iff m.accepting()), "
        "logits[~mask] = -inf, argmax, stop on EOS, else m.feed(char); track the deepest depth"
    )


def ranked_model(ranking: Sequence[str | None], script: str = "") -> Model:
    """A fake model with fixed preferences: at step ``i < len(script)`` it wants ``script[i]`` above
    everything; otherwise ``ranking[0]`` is best, then ``ranking[1]``, ...; characters it never
    ranks score below every ranked one; ``None`` means EOS."""
    base = np.full(len(VOCAB), -1000.0)
    for rank, text in enumerate(ranking):
        base[VOCAB.index(text)] = -float(rank)

    def model(out: list[int]) -> np.ndarray:
        logits = base.copy()
        if len(out) < len(script):
            logits[VOCAB.index(script[len(out)])] = 1000.0
        return logits

    return model


def main() -> None:
    m = JsonMachine()
    print('feeding {"a":{"b":12},"c":0}')
    for ch in '{"a":{"b":12},"c":0}':
        m.feed(ch)
        print(f"  {ch!r:>5} -> mode {m.mode:<15} depth {m.depth}  next {''.join(sorted(m.allowed()))[:14] or '(EOS only)'}")
    print(f"  accepting: {m.accepting()}")
    print()
    for text in ['{"a":1}', "0123", '{"a":1,}', "{}}", '{"a":}', '{"a":{"b":{}}}']:
        print(f"  accepts({text!r:<18}) = {accepts(text)}")
    print()
    hater = ranked_model([None, "}"], script='{"a":{"b":1')
    g = constrained_generate(hater, 40)
    script = '{"a":{"b":1'
    print(f"brace hater (says {script}, then wants EOS; '}}' ranked last): {g.text!r} {g.finish_reason}, "
          f"depth {g.max_depth}")
    lover = ranked_model(["{", '"', "a", ":", "}", None])
    g = constrained_generate(lover, 40)
    print(f"brace lover, max_tokens=40: {g.text!r} {g.finish_reason}, depth {g.max_depth}")
    rng = np.random.default_rng(0)
    stop = length = 0
    for _ in range(50):
        ranking = [*rng.permutation(list(ALPHABET)), None]
        g = constrained_generate(ranked_model(ranking), 30)
        stop += g.finish_reason == "stop"
        length += g.finish_reason == "length"
    print(f"50 random rankings, max_tokens=30: {stop} stopped (all parse), {length} truncated (live prefixes)")


if __name__ == "__main__":
    main()
