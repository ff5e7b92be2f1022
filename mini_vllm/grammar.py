"""Grammar-constrained decoding: regex and JSON grammars that emit a per-step token bitmask.

Mirrors ``vllm/v1/structured_output/`` upstream:

- ``Grammar`` is ``StructuredOutputGrammar`` (``backend_types.py``): one instance per request, with
  ``accept_tokens`` / ``validate_tokens`` / ``rollback`` / ``fill_bitmask`` / ``is_terminated`` /
  ``reset``. Upstream the xgrammar backend wraps an ``xgr.GrammarMatcher``; here the matcher is a
  character machine (``RegexFSM`` or ``JsonMachine``) walked one character at a time.
- ``GrammarCompiler`` is ``StructuredOutputBackend``: ``compile_grammar(kind, spec)`` and
  ``allocate_token_bitmask(rows)``, with compiled machines cached per ``(kind, spec)`` the way the
  manager shares one compiled grammar between requests with the same schema.
- ``StructuredOutputManager`` (``__init__.py``) keeps the engine's per-request grammars:
  ``grammar_init`` compiles one when a structured-output request arrives, ``accept_tokens``
  advances it with each sampled token (``should_advance`` upstream), ``free`` drops it when the
  request finishes. ``grammar_bitmask`` fills one bitmask row per position a request samples
  at, the speculative walk included (fill, tentatively accept a draft, fill the next row, ...,
  then roll back), as upstream's does.
- The hook for speculative decoding: ``validate_draft_tokens(request_id, drafts)`` returns the
  longest prefix of a request's drafts that its grammar accepts, without advancing it (upstream's
  ``Scheduler.update_draft_token_ids`` trims drafts with ``grammar.validate_tokens``); drafts
  then go to ``grammar_bitmask(..., spec_tokens)`` for k + 1 rows, and ``accept_tokens`` takes
  the accepted prefix plus the bonus token after verification. The engine does not draft yet.
- ``apply_bitmask`` is ``apply_grammar_bitmask`` (``utils.py``) minus the row reordering: every
  disallowed logit becomes ``-inf`` before sampling.

The bitmask is vLLM's: a row of ``ceil(V / 32)`` int32 words, bit ``i % 32`` of word ``i // 32``
set when token ``i`` is allowed (an all-ones row, every word ``-1``, means unconstrained).

Left out: compiling in a thread pool (compilation is synchronous), JSON Schema, EBNF and
structural tags (only ``regex``, ``choice`` and ``json_object``), the reasoning gate, whitespace
in JSON (the JSON machine accepts the compact form only), xgrammar's compile-time split of tokens
into context-independent and context-dependent ones (masks are computed lazily per machine state
and cached instead), and ``.``/``{m,n}``/anchors/backreferences in regexes.

Regex subset: literals, ``\\``-escapes (``\\d`` ``\\w`` ``\\s`` or an escaped character), classes
``[a-z_]`` and ``[^...]``, groups ``( )``, alternation ``|``, and the postfix operators ``*``
``+`` ``?``. The pattern must match the whole output (``re.fullmatch`` semantics).

Machines read UTF-8 bytes, as xgrammar's do: a pattern's characters and classes are compiled to
byte-level paths (``utf8_sequences``), so ``café`` allows byte 195 (``0xC3``) after ``caf`` and a
negated class or a JSON string accepts any well-formed multi-byte sequence (surrogates included,
as xgrammar). A token is its bytes (``str`` entries are UTF-8 encoded, ``bytes`` entries are taken
as they are: a byte tokenizer's ids may stop mid-character); it is allowed iff feeding its bytes
one at a time keeps the machine alive. A vocabulary entry of ``None`` is a special token that no
byte sequence produces; the EOS token is allowed exactly when the machine is in an accepting state.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field

import numpy as np

from .sampling_params import StructuredOutputsParams

__all__ = [
    "Grammar",
    "GrammarCompiler",
    "JsonMachine",
    "RegexFSM",
    "StructuredOutputManager",
    "Vocab",
    "allocate_token_bitmask",
    "apply_bitmask",
    "bitmask_words",
    "byte_vocab",
    "pack_mask",
    "unpack_bitmask",
    "utf8_sequences",
]

# ---------------------------------------------------------------------------------------------
# The packed bitmask (vLLM's format)
# ---------------------------------------------------------------------------------------------


def bitmask_words(vocab_size: int) -> int:
    """Words in one bitmask row: ``ceil(vocab_size / 32)`` (257 tokens -> 9 words, not 8)."""
    if vocab_size <= 0:
        raise ValueError(f"vocab_size must be positive, got {vocab_size}")
    return math.ceil(vocab_size / 32)


def allocate_token_bitmask(num_rows: int, vocab_size: int) -> np.ndarray:
    """An int32 ``[num_rows, ceil(V / 32)]`` array of ``-1`` (every token allowed)."""
    if num_rows <= 0:
        raise ValueError(f"num_rows must be positive, got {num_rows}")
    return np.full((num_rows, bitmask_words(vocab_size)), -1, dtype=np.int32)


def pack_mask(mask: np.ndarray) -> np.ndarray:
    """Pack a ``bool[V]`` mask into ``ceil(V / 32)`` int32 words (bit i of word i // 32 = token i)."""
    mask = np.asarray(mask, dtype=bool)
    if mask.ndim != 1:
        raise ValueError(f"pack_mask expects a 1-D bool mask, got shape {mask.shape}")
    padded = np.zeros(bitmask_words(mask.size) * 32, dtype=np.uint64)
    padded[: mask.size] = mask
    weights = np.left_shift(np.uint64(1), np.arange(32, dtype=np.uint64))
    words = (padded.reshape(-1, 32) * weights).sum(axis=1)
    return words.astype(np.uint32).view(np.int32)


def unpack_bitmask(bitmask: np.ndarray, vocab_size: int) -> np.ndarray:
    """The inverse of ``pack_mask`` for one row or many: ``bool[..., V]``."""
    bitmask = np.asarray(bitmask, dtype=np.int32)
    if bitmask.shape[-1] != bitmask_words(vocab_size):
        raise ValueError(
            f"a bitmask row for vocab {vocab_size} has {bitmask_words(vocab_size)} words, "
            f"got {bitmask.shape[-1]}"
        )
    ids = np.arange(vocab_size)
    return ((bitmask[..., ids // 32] >> (ids % 32)) & 1).astype(bool)


def apply_bitmask(logits: np.ndarray, bitmask: np.ndarray) -> np.ndarray:
    """Set every logit whose bit is 0 to ``-inf``, in place; returns ``logits``.

    ``logits`` is ``[V]`` with a ``[words]`` row, or ``[rows, V]`` with ``[rows, words]``.
    """
    if not np.issubdtype(np.asarray(logits).dtype, np.floating):
        raise TypeError("apply_bitmask needs floating-point logits (it writes -inf)")
    allowed = unpack_bitmask(bitmask, logits.shape[-1])
    if allowed.shape != logits.shape:
        raise ValueError(f"bitmask covers shape {allowed.shape}, logits have shape {logits.shape}")
    logits[~allowed] = -np.inf
    return logits


# ---------------------------------------------------------------------------------------------
# Vocabulary
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Vocab:
    """Token strings by id; ``None`` marks a special token. ``eos_token_id`` must be special."""

    tokens: tuple[str | bytes | None, ...]
    eos_token_id: int

    def __post_init__(self) -> None:
        if not 0 <= self.eos_token_id < len(self.tokens):
            raise ValueError(f"eos_token_id {self.eos_token_id} outside vocab of {len(self.tokens)}")
        if self.tokens[self.eos_token_id] is not None:
            raise ValueError("the EOS entry must be None (a special token with no characters)")
        if any(t == "" or t == b"" for t in self.tokens):
            raise ValueError("a token with no characters would never advance the grammar")
        # What the machines read: each token's UTF-8 bytes.
        object.__setattr__(
            self, "token_bytes", tuple(t.encode("utf-8") if isinstance(t, str) else t for t in self.tokens)
        )

    @property
    def size(self) -> int:
        return len(self.tokens)


def byte_vocab() -> Vocab:
    """``ByteTokenizer``'s 257 ids: 0..255 are one UTF-8 byte each, 256 is EOS."""
    return Vocab(tuple(bytes([b]) for b in range(256)) + (None,), eos_token_id=256)


# ---------------------------------------------------------------------------------------------
# Byte machines. A machine is: start() -> state, step(state, byte) -> state | None (dead),
# is_accepting(state). States are hashable, so per-state masks can be cached. ``step`` also takes
# a one-character ASCII ``str`` (its byte); ``fullmatch`` takes text and walks its UTF-8 bytes.
# ---------------------------------------------------------------------------------------------

_DIGITS = frozenset("0123456789")
_MAX_CODE_POINT = 0x10FFFF
Ranges = tuple[tuple[int, int], ...]  # inclusive code-point ranges, sorted and disjoint
_DIGIT_RANGES: Ranges = ((0x30, 0x39),)
_WORD_RANGES: Ranges = ((0x30, 0x39), (0x41, 0x5A), (0x5F, 0x5F), (0x61, 0x7A))
# ``\s`` as xgrammar reads it (ECMAScript's white space and line terminators).
_SPACE_RANGES: Ranges = ((0x09, 0x0D), (0x20, 0x20), (0xA0, 0xA0), (0x1680, 0x1680), (0x2000, 0x200A),
                         (0x2028, 0x2029), (0x202F, 0x202F), (0x205F, 0x205F), (0x3000, 0x3000), (0xFEFF, 0xFEFF))


def _byte(b: int | str) -> int:
    if isinstance(b, str):
        if len(b) != 1 or ord(b) > 0x7F:
            raise ValueError(f"a machine steps one byte at a time; feed {b!r} as its UTF-8 bytes")
        return ord(b)
    return b


def _utf8_encode(cp: int) -> bytes:
    """UTF-8 of one code point, surrogates included (``str.encode`` refuses those)."""
    if cp < 0x80:
        return bytes([cp])
    if cp < 0x800:
        return bytes([0xC0 | cp >> 6, 0x80 | cp & 0x3F])
    if cp < 0x10000:
        return bytes([0xE0 | cp >> 12, 0x80 | cp >> 6 & 0x3F, 0x80 | cp & 0x3F])
    return bytes([0xF0 | cp >> 18, 0x80 | cp >> 12 & 0x3F, 0x80 | cp >> 6 & 0x3F, 0x80 | cp & 0x3F])


def utf8_sequences(lo: int, hi: int) -> list[tuple[tuple[int, int], ...]]:
    """Byte-range sequences whose byte strings are exactly the UTF-8 encodings of ``lo..hi``.

    ``[é-ǿ]`` (U+00E9..U+01FF) becomes ``[C3][A9-BF]`` and ``[C4-C7][80-BF]``: the range is split
    where the encoded length changes and wherever a continuation byte would not run over its full
    ``80-BF`` span, so each piece is one byte range per position.
    """
    out: list[tuple[tuple[int, int], ...]] = []
    stack = [(lo, hi)]
    while stack:
        lo, hi = stack.pop()
        pieces = next(([(lo, b), (b + 1, hi)] for b in (0x7F, 0x7FF, 0xFFFF) if lo <= b < hi), None)
        for i in (1, 2, 3):
            if pieces is not None or hi <= 0x7F:
                break
            m = (1 << 6 * i) - 1
            if lo & ~m != hi & ~m:
                if lo & m:
                    pieces = [(lo, lo | m), ((lo | m) + 1, hi)]
                elif hi & m != m:
                    pieces = [(lo, (hi & ~m) - 1), (hi & ~m, hi)]
        if pieces is not None:
            stack.extend(reversed(pieces))
        else:
            out.append(tuple(zip(_utf8_encode(lo), _utf8_encode(hi))))
    return out


def _merge(code_points: Sequence[tuple[int, int]]) -> Ranges:
    out: list[list[int]] = []
    for lo, hi in sorted(code_points):
        if out and lo <= out[-1][1] + 1:
            out[-1][1] = max(out[-1][1], hi)
        else:
            out.append([lo, hi])
    return tuple((lo, hi) for lo, hi in out)


@dataclass(frozen=True)
class _CharSet:
    ranges: Ranges
    negated: bool = False

    def code_point_ranges(self) -> Ranges:
        """The set as positive code-point ranges (a negated class: the complement up to U+10FFFF)."""
        if not self.negated:
            return self.ranges
        out, nxt = [], 0
        for lo, hi in self.ranges:
            if lo > nxt:
                out.append((nxt, lo - 1))
            nxt = hi + 1
        if nxt <= _MAX_CODE_POINT:
            out.append((nxt, _MAX_CODE_POINT))
        return tuple(out)


def _one(ch: str) -> _CharSet:
    return _CharSet(((ord(ch), ord(ch)),))


class RegexFSM:
    """A regex compiled to a UTF-8 byte NFA (Thompson construction) and walked as a lazily built DFA.

    Each character or class becomes byte-range paths (``utf8_sequences``). DFA state ids are ints;
    ``transitions[(state, byte)]`` fills in as bytes are seen, so the table covers exactly the
    bytes the vocabulary uses. State 0 is the start state.
    """

    def __init__(self, pattern: str) -> None:
        if not isinstance(pattern, str):
            raise TypeError(f"pattern must be a str, got {type(pattern).__name__}")
        self.pattern = pattern
        self._edges: list[list[tuple[tuple[int, int] | None, int]]] = []  # a byte range, None = epsilon
        self._pos = 0
        start, end = self._parse_alt()
        if self._pos != len(pattern):
            raise ValueError(f"unbalanced ')' at position {self._pos} in {pattern!r}")
        self._final = end
        self._sets: list[frozenset[int]] = []
        self._ids: dict[frozenset[int], int] = {}
        self.transitions: dict[tuple[int, int], int | None] = {}
        self._intern(self._closure({start}))

    # -- parsing: alt := seq ('|' seq)* ; seq := repeat* ; repeat := atom [*+?] --------------
    def _new(self) -> int:
        self._edges.append([])
        return len(self._edges) - 1

    def _peek(self) -> str | None:
        return self.pattern[self._pos] if self._pos < len(self.pattern) else None

    def _parse_alt(self) -> tuple[int, int]:
        branches = [self._parse_seq()]
        while self._peek() == "|":
            self._pos += 1
            branches.append(self._parse_seq())
        if len(branches) == 1:
            return branches[0]
        s, e = self._new(), self._new()
        for bs, be in branches:
            self._edges[s].append((None, bs))
            self._edges[be].append((None, e))
        return s, e

    def _parse_seq(self) -> tuple[int, int]:
        s = e = self._new()
        while self._peek() not in (None, "|", ")"):
            fs, fe = self._parse_repeat()
            self._edges[e].append((None, fs))
            e = fe
        return s, e

    def _parse_repeat(self) -> tuple[int, int]:
        s, e = self._parse_atom()
        op = self._peek()
        if op in ("*", "+", "?"):
            self._pos += 1
            if self._peek() in ("*", "+", "?"):
                raise ValueError(f"stacked quantifier at position {self._pos} in {self.pattern!r}")
            ns, ne = self._new(), self._new()
            self._edges[ns].append((None, s))
            self._edges[e].append((None, ne))
            if op in ("*", "?"):
                self._edges[ns].append((None, ne))  # zero times
            if op in ("*", "+"):
                self._edges[e].append((None, s))  # again
            return ns, ne
        return s, e

    def _parse_atom(self) -> tuple[int, int]:
        ch = self._peek()
        where = f"at position {self._pos} in {self.pattern!r}"
        if ch == "(":
            self._pos += 1
            s, e = self._parse_alt()
            if self._peek() != ")":
                raise ValueError(f"unclosed '(' {where}")
            self._pos += 1
            return s, e
        if ch in ("*", "+", "?"):
            raise ValueError(f"quantifier {ch!r} with nothing to repeat {where}")
        if ch in (".", "{", "}", "^", "$", "]"):
            raise ValueError(f"{ch!r} is outside the supported subset {where}; escape it as '\\{ch}'")
        if ch == "[":
            cs = self._parse_class()
        elif ch == "\\":
            cs = self._parse_escape()
        else:
            self._pos += 1
            cs = _one(ch)
        s, e = self._new(), self._new()
        for lo, hi in cs.code_point_ranges():
            for seq in utf8_sequences(lo, hi):  # one path of byte ranges per piece
                at = s
                for k, byte_range in enumerate(seq):
                    nxt = e if k == len(seq) - 1 else self._new()
                    self._edges[at].append((byte_range, nxt))
                    at = nxt
        return s, e

    def _parse_escape(self) -> _CharSet:
        self._pos += 1
        ch = self._peek()
        if ch is None:
            raise ValueError(f"dangling '\\' at the end of {self.pattern!r}")
        self._pos += 1
        return {"d": _CharSet(_DIGIT_RANGES), "w": _CharSet(_WORD_RANGES), "s": _CharSet(_SPACE_RANGES)}.get(
            ch, _one(ch)
        )

    def _parse_class(self) -> _CharSet:
        start = self._pos
        self._pos += 1
        negated = self._peek() == "^"
        if negated:
            self._pos += 1
        chars: list[tuple[int, int]] = []
        first = True
        while True:
            ch = self._peek()
            if ch is None:
                raise ValueError(f"unclosed '[' at position {start} in {self.pattern!r}")
            if ch == "]" and not first:
                self._pos += 1
                break
            first = False
            if ch == "\\":
                chars.extend(self._parse_escape().ranges)
                continue
            self._pos += 1
            nxt = self.pattern[self._pos : self._pos + 2]
            if len(nxt) == 2 and nxt[0] == "-" and nxt[1] != "]":
                lo, hi = ord(ch), ord(nxt[1])
                if lo > hi:
                    raise ValueError(f"bad range {ch}-{nxt[1]} in {self.pattern!r}")
                chars.append((lo, hi))
                self._pos += 2
            else:
                chars.append((ord(ch), ord(ch)))
        return _CharSet(_merge(chars), negated)

    # -- the lazy DFA ---------------------------------------------------------------------------
    def _closure(self, states: set[int]) -> frozenset[int]:
        stack, seen = list(states), set(states)
        while stack:
            for cs, t in self._edges[stack.pop()]:
                if cs is None and t not in seen:
                    seen.add(t)
                    stack.append(t)
        return frozenset(seen)

    def _intern(self, nfa_states: frozenset[int]) -> int:
        if nfa_states not in self._ids:
            self._ids[nfa_states] = len(self._sets)
            self._sets.append(nfa_states)
        return self._ids[nfa_states]

    @property
    def num_states(self) -> int:
        """DFA states discovered so far."""
        return len(self._sets)

    def start(self) -> int:
        return 0

    def step(self, state: int, byte: int | str) -> int | None:
        key = (state, _byte(byte))
        if key not in self.transitions:
            b = key[1]
            moved = {t for s in self._sets[state] for r, t in self._edges[s] if r is not None and r[0] <= b <= r[1]}
            self.transitions[key] = self._intern(self._closure(moved)) if moved else None
        return self.transitions[key]

    def is_accepting(self, state: int) -> bool:
        return self._final in self._sets[state]

    def fullmatch(self, text: str | bytes) -> bool:
        """True iff ``text`` (its UTF-8 bytes) is in the language (the test oracle is ``re.fullmatch``)."""
        state: int | None = self.start()
        for b in text.encode("utf-8") if isinstance(text, str) else text:
            state = self.step(state, b)
            if state is None:
                return False
        return self.is_accepting(state)


def choice_pattern(choices: Sequence[str]) -> str:
    """``["yes", "no"]`` -> ``yes|no`` with every metacharacter escaped (how CHOICE lowers)."""
    if not choices or not all(isinstance(c, str) and c for c in choices):
        raise ValueError("choice needs a non-empty list of non-empty strings")
    return "|".join("".join("\\" + c if c in "\\|()[]*+?.{}^$" else c for c in s) for s in choices)


# JSON modes. A state is (mode, stack, extra): stack is a tuple of '{' / '[' (the pushdown part).
_VALUE, _ARR_FIRST, _OBJ_FIRST, _KEY_START, _COLON, _AFTER, _DONE = range(7)
_STR, _STR_ESC, _STR_HEX = 7, 8, 9  # extra = (is_key, hex digits left)
_STR_UTF8 = 19  # inside a multi-byte character; extra = (is_key, the byte-range tails still possible)
_N_MINUS, _N_ZERO, _N_INT, _N_DOT, _N_FRAC, _N_E, _N_ESIGN, _N_EXP = range(10, 18)
_LIT = 18  # extra = the characters of true/false/null still to come
_NUM_END = {_N_ZERO, _N_INT, _N_FRAC, _N_EXP}
_HEX = frozenset("0123456789abcdefABCDEF")
_ESCAPES = frozenset('"\\/bfnrtu')

JsonState = tuple[int, tuple[str, ...], Hashable]

# Lead byte -> the byte-range tails that may follow it in a string (any code point >= U+0080).
_UTF8_TAILS: dict[int, tuple[tuple[tuple[int, int], ...], ...]] = {}
for _seq in utf8_sequences(0x80, _MAX_CODE_POINT):
    for _lead in range(_seq[0][0], _seq[0][1] + 1):
        _UTF8_TAILS[_lead] = tuple(sorted({*_UTF8_TAILS.get(_lead, ()), _seq[1:]}))


class JsonMachine:
    """A pushdown machine for compact JSON: objects, arrays, strings, numbers, true/false/null.

    The stack holds one ``{`` or ``[`` per open container, so the depth is ``len(stack)``.
    ``top_level="object"`` requires the document to be an object (upstream's ``json_object``).
    Strings reject raw control characters (below U+0020), as strict ``json.loads`` does.
    ``max_depth`` bounds the stack (a model that loves ``[`` is refused past it).
    """

    def __init__(self, top_level: str = "any", max_depth: int = 64) -> None:
        if top_level not in ("any", "object"):
            raise ValueError(f"top_level must be 'any' or 'object', got {top_level!r}")
        if max_depth < 1:
            raise ValueError(f"max_depth must be >= 1, got {max_depth}")
        self.top_level = top_level
        self.max_depth = max_depth

    def start(self) -> JsonState:
        return (_VALUE, (), None)

    def is_accepting(self, state: JsonState) -> bool:
        mode, stack, _ = state
        return mode == _DONE or (not stack and mode in _NUM_END)

    @staticmethod
    def depth(state: JsonState) -> int:
        return len(state[1])

    def _close_value(self, stack: tuple[str, ...]) -> JsonState:
        return (_DONE, (), None) if not stack else (_AFTER, stack, None)

    def _start_value(self, ch: str, stack: tuple[str, ...]) -> JsonState | None:
        if not stack and self.top_level == "object" and ch != "{":
            return None
        if ch in "{[":
            if len(stack) >= self.max_depth:
                return None
            return ((_OBJ_FIRST if ch == "{" else _ARR_FIRST), stack + (ch,), None)
        if ch == '"':
            return (_STR, stack, (False, 0))
        if ch == "-":
            return (_N_MINUS, stack, None)
        if ch == "0":
            return (_N_ZERO, stack, None)
        if ch in _DIGITS:
            return (_N_INT, stack, None)
        for word in ("true", "false", "null"):
            if ch == word[0]:
                return (_LIT, stack, word[1:])
        return None

    def step(self, state: JsonState, byte: int | str) -> JsonState | None:  # noqa: C901 - one table
        mode, stack, extra = state
        b = _byte(byte)
        if b > 0x7F or mode == _STR_UTF8:  # a multi-byte character: legal only inside a string
            return self._step_utf8(state, b)
        ch = chr(b)
        if mode == _VALUE:
            return self._start_value(ch, stack)
        if mode == _ARR_FIRST:
            return self._close_value(stack[:-1]) if ch == "]" else self._start_value(ch, stack)
        if mode == _OBJ_FIRST:
            if ch == "}":
                return self._close_value(stack[:-1])
            return (_STR, stack, (True, 0)) if ch == '"' else None
        if mode == _KEY_START:
            return (_STR, stack, (True, 0)) if ch == '"' else None
        if mode == _COLON:
            return (_VALUE, stack, None) if ch == ":" else None
        if mode == _AFTER:
            top = stack[-1]
            if ch == ",":
                return (_KEY_START, stack, None) if top == "{" else (_VALUE, stack, None)
            if ch == ("}" if top == "{" else "]"):
                return self._close_value(stack[:-1])
            return None
        if mode == _DONE:
            return None
        if mode == _STR:
            is_key = extra[0]
            if ch == '"':
                return (_COLON, stack, None) if is_key else self._close_value(stack)
            if ch == "\\":
                return (_STR_ESC, stack, extra)
            return None if ord(ch) < 0x20 else state
        if mode == _STR_ESC:
            if ch not in _ESCAPES:
                return None
            return (_STR_HEX, stack, (extra[0], 4)) if ch == "u" else (_STR, stack, (extra[0], 0))
        if mode == _STR_HEX:
            if ch not in _HEX:
                return None
            left = extra[1] - 1
            return (_STR, stack, (extra[0], 0)) if left == 0 else (_STR_HEX, stack, (extra[0], left))
        if mode == _LIT:
            if ch != extra[0]:
                return None
            return self._close_value(stack) if len(extra) == 1 else (_LIT, stack, extra[1:])
        # numbers: -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?
        if ch in _DIGITS:
            nxt = {_N_MINUS: _N_INT if ch != "0" else _N_ZERO, _N_INT: _N_INT, _N_DOT: _N_FRAC,
                   _N_FRAC: _N_FRAC, _N_E: _N_EXP, _N_ESIGN: _N_EXP, _N_EXP: _N_EXP}.get(mode)
            return None if nxt is None else (nxt, stack, None)
        if ch == "." and mode in (_N_ZERO, _N_INT):
            return (_N_DOT, stack, None)
        if ch in "eE" and mode in (_N_ZERO, _N_INT, _N_FRAC):
            return (_N_E, stack, None)
        if ch in "+-" and mode == _N_E:
            return (_N_ESIGN, stack, None)
        if mode in _NUM_END and stack:
            # a number ends where the next character is not part of it: re-dispatch that
            # character as if the value had just closed (',' '}' ']').
            return self.step((_AFTER, stack, None), ch)
        return None

    @staticmethod
    def _step_utf8(state: JsonState, b: int) -> JsonState | None:
        mode, stack, extra = state
        if mode == _STR:
            tails = _UTF8_TAILS.get(b)
            return None if tails is None else (_STR_UTF8, stack, (extra[0], tails))
        if mode != _STR_UTF8:
            return None
        tails = tuple(t[1:] for t in extra[1] if t[0][0] <= b <= t[0][1])
        if not tails:
            return None
        return (_STR, stack, (extra[0], 0)) if not tails[0] else (_STR_UTF8, stack, (extra[0], tails))

    def fullmatch(self, text: str | bytes) -> bool:
        state: JsonState | None = self.start()
        for b in text.encode("utf-8") if isinstance(text, str) else text:
            state = self.step(state, b)
            if state is None:
                return False
        return self.is_accepting(state)


Machine = RegexFSM | JsonMachine

# ---------------------------------------------------------------------------------------------
# The compiled grammar: a machine lifted over one vocabulary, with cached per-state masks.
# ---------------------------------------------------------------------------------------------


class CompiledGrammar:
    """A character machine lifted to tokens. Shared by every request with the same spec.

    ``token_mask(state)`` is cached per machine state: a regex has a few states, so after warm-up
    every step is a dictionary lookup (a miniature of xgrammar's precomputed token tables).
    """

    def __init__(self, machine: Machine, vocab: Vocab) -> None:
        self.machine = machine
        self.vocab = vocab
        self._masks: dict[Hashable, np.ndarray] = {}
        self.mask_computations = 0

    def walk(self, state: Hashable, data: bytes) -> Hashable | None:
        """Feed ``data`` one byte at a time; ``None`` as soon as the machine dies."""
        for b in data:
            state = self.machine.step(state, b)
            if state is None:
                return None
        return state

    def token_mask(self, state: Hashable) -> np.ndarray:
        """``bool[V]``: tokens whose characters all survive from ``state``; EOS iff accepting."""
        cached = self._masks.get(state)
        if cached is None:
            self.mask_computations += 1
            cached = np.zeros(self.vocab.size, dtype=bool)
            for tid, data in enumerate(self.vocab.token_bytes):
                if data is not None:
                    cached[tid] = self.walk(state, data) is not None
            cached[self.vocab.eos_token_id] = self.machine.is_accepting(state)
            cached.flags.writeable = False
            self._masks[state] = cached
        return cached


class Grammar:
    """One request's grammar state (upstream: ``StructuredOutputGrammar``).

    ``history`` is the stack of machine states, one per accepted token plus the start state, so
    ``rollback(n)`` restores the exact state n tokens ago. Unlike xgrammar's wrapper,
    ``accept_tokens`` is all-or-nothing: a rejected list leaves the state unchanged.
    """

    def __init__(self, compiled: CompiledGrammar, max_rollback_tokens: int = -1) -> None:
        self.compiled = compiled
        self.max_rollback_tokens = max_rollback_tokens  # -1: unlimited
        self.history: list[Hashable] = [compiled.machine.start()]
        self.terminated = False
        self.num_processed_tokens = 0

    @property
    def vocab_size(self) -> int:
        return self.compiled.vocab.size

    @property
    def state(self) -> Hashable:
        return self.history[-1]

    def _check_id(self, token: int) -> None:
        if isinstance(token, bool) or not isinstance(token, (int, np.integer)):
            raise TypeError(f"token ids must be ints, got {token!r}")
        if not 0 <= token < self.vocab_size:
            raise ValueError(f"token id {token} is outside the vocabulary [0, {self.vocab_size})")

    def _advance(self, state: Hashable, terminated: bool, token: int) -> tuple[Hashable, bool] | None:
        if terminated:
            return None
        if token == self.compiled.vocab.eos_token_id:
            return (state, True) if self.compiled.machine.is_accepting(state) else None
        data = self.compiled.vocab.token_bytes[token]
        if data is None:
            return None
        nxt = self.compiled.walk(state, data)
        return None if nxt is None else (nxt, False)

    def validate_tokens(self, tokens: Sequence[int]) -> list[int]:
        """The longest prefix of ``tokens`` the grammar accepts, without advancing (vets drafts)."""
        state, terminated, ok = self.state, self.terminated, []
        for tok in tokens:
            self._check_id(tok)
            step = self._advance(state, terminated, tok)
            if step is None:
                break
            state, terminated = step
            ok.append(tok)
        return ok

    def accept_tokens(self, request_id: str, tokens: Sequence[int]) -> bool:
        """Advance by every token, or by none if any is illegal. Returns whether all were legal."""
        if len(self.validate_tokens(tokens)) != len(tokens):
            return False
        for tok in tokens:
            state, self.terminated = self._advance(self.state, self.terminated, tok)
            self.history.append(state)
            self.num_processed_tokens += 1
        if self.max_rollback_tokens >= 0:  # keep only what rollback may need (+ the current state)
            del self.history[: max(0, len(self.history) - self.max_rollback_tokens - 1)]
        return True

    def rollback(self, num_tokens: int) -> None:
        """Un-accept the last ``num_tokens`` tokens (rejected speculative drafts)."""
        if num_tokens < 0:
            raise ValueError(f"cannot roll back a negative number of tokens ({num_tokens})")
        if num_tokens >= len(self.history):
            raise ValueError(
                f"cannot roll back {num_tokens} tokens: only {len(self.history) - 1} can be undone"
            )
        if num_tokens == 0:
            return
        del self.history[-num_tokens:]
        self.num_processed_tokens -= num_tokens
        self.terminated = False  # EOS is always the last token, so it is always rolled back first

    def allowed_token_mask(self) -> np.ndarray:
        """``bool[V]`` for the next token (all False once terminated)."""
        if self.terminated:
            return np.zeros(self.vocab_size, dtype=bool)
        return self.compiled.token_mask(self.state)

    def fill_bitmask(self, bitmask: np.ndarray, batch_index: int) -> None:
        """Write this request's packed allowed-token row into ``bitmask[batch_index]``."""
        bitmask[batch_index] = pack_mask(self.allowed_token_mask())

    def is_terminated(self) -> bool:
        """True once EOS was accepted in an accepting state."""
        return self.terminated

    def is_accepting(self) -> bool:
        """True when the text so far is a complete match (EOS would be legal now)."""
        return not self.terminated and self.compiled.machine.is_accepting(self.state)

    def reset(self) -> None:
        self.history = [self.compiled.machine.start()]
        self.terminated = False
        self.num_processed_tokens = 0


# ---------------------------------------------------------------------------------------------
# Backend and manager
# ---------------------------------------------------------------------------------------------

KINDS = ("regex", "choice", "json_object", "json")


@dataclass
class GrammarCompiler:
    """The backend (upstream: ``StructuredOutputBackend``): compiles specs, caches per spec."""

    vocab: Vocab
    num_speculative_tokens: int = 0
    _cache: dict[tuple[str, str], CompiledGrammar] = field(default_factory=dict)
    compilations: int = 0

    def compile_grammar(self, kind: str, spec: str | Sequence[str]) -> Grammar:
        """A fresh per-request ``Grammar``; the compiled machine is shared per ``(kind, spec)``.

        ``kind`` is ``regex`` (a pattern in the subset), ``choice`` (a list of strings),
        ``json_object`` (any JSON object) or ``json`` (any JSON value; no schema support).
        """
        if kind not in KINDS:
            raise ValueError(f"unknown grammar kind {kind!r}; expected one of {KINDS}")
        key = (kind, json.dumps(spec) if kind == "choice" else str(spec))
        if key not in self._cache:
            if kind == "regex":
                machine: Machine = RegexFSM(spec)  # type: ignore[arg-type]
            elif kind == "choice":
                machine = RegexFSM(choice_pattern(spec))  # type: ignore[arg-type]
            else:
                machine = JsonMachine("object" if kind == "json_object" else "any")
            self._cache[key] = CompiledGrammar(machine, self.vocab)
            self.compilations += 1
        return Grammar(self._cache[key], max_rollback_tokens=self.num_speculative_tokens)

    def allocate_token_bitmask(self, max_num_seqs: int) -> np.ndarray:
        """Rows for every position that can sample in one step: seqs x (1 + spec tokens)."""
        return allocate_token_bitmask(max_num_seqs * (1 + self.num_speculative_tokens), self.vocab.size)


class StructuredOutputManager:
    """The engine's grammars, one per structured-output request, and the step's bitmask.

    Upstream: ``StructuredOutputManager`` (``grammar_init``, ``grammar_bitmask``, ``should_advance``);
    the per-request grammar lives on ``request.structured_output_request`` there, in ``grammars`` here.
    """

    def __init__(self, compiler: GrammarCompiler, max_num_seqs: int) -> None:
        self.compiler = compiler
        self._bitmask = compiler.allocate_token_bitmask(max_num_seqs)
        self.grammars: dict[str, Grammar] = {}  # request id -> its grammar, while the request lives

    def compile(self, params: StructuredOutputsParams) -> Grammar:
        """A fresh grammar for a ``StructuredOutputsParams`` (``ValueError`` if its spec is bad)."""
        kind, spec = params.kind_and_spec
        return self.compiler.compile_grammar(kind, list(spec) if kind == "choice" else spec)

    def grammar_init(self, request_id: str, params: StructuredOutputsParams) -> Grammar:
        """Compile and keep the grammar of a request that asks for structured output."""
        if request_id in self.grammars:
            raise ValueError(f"request {request_id!r} already has a grammar")
        grammar = self.compile(params)
        self.grammars[request_id] = grammar
        return grammar

    def should_advance(self, request_id: str) -> bool:
        return request_id in self.grammars

    def accept_tokens(self, request_id: str, tokens: Sequence[int]) -> None:
        """Advance a request's grammar by tokens sampled under its mask; an illegal one is a bug."""
        if not self.grammars[request_id].accept_tokens(request_id, tokens):
            raise RuntimeError(f"request {request_id!r}: tokens {list(tokens)} break its grammar; was the mask applied?")

    def validate_draft_tokens(self, request_id: str, draft_token_ids: Sequence[int]) -> list[int]:
        """The hook for speculation: the longest prefix of the drafts the grammar accepts (no advance)."""
        grammar = self.grammars.get(request_id)
        return list(draft_token_ids) if grammar is None else grammar.validate_tokens(draft_token_ids)

    def free(self, request_id: str) -> None:
        self.grammars.pop(request_id, None)

    def grammar_bitmask(
        self,
        grammars: Sequence[Grammar | None],
        spec_tokens: Sequence[Sequence[int]] | None = None,
    ) -> np.ndarray:
        """One row per sampled position, in order: request r with k drafts gets k + 1 rows.

        ``None`` marks an unconstrained request (its rows stay all ones). Rows after a draft
        token the grammar rejects are left all-ones for the rejection sampler to discard; every
        tentative advance is rolled back, so the grammars are unchanged on return.
        """
        spec_tokens = spec_tokens or [[] for _ in grammars]
        if len(spec_tokens) != len(grammars):
            raise ValueError("spec_tokens needs one (possibly empty) list per request")
        rows = sum(1 + len(d) for d in spec_tokens)
        if rows > self._bitmask.shape[0]:
            raise ValueError(f"{rows} rows needed, bitmask was allocated with {self._bitmask.shape[0]}")
        self._bitmask.fill(-1)
        row = 0
        for grammar, drafts in zip(grammars, spec_tokens, strict=True):
            advanced, alive = 0, grammar is not None
            for pos in range(len(drafts) + 1):
                if alive:
                    grammar.fill_bitmask(self._bitmask, row + pos)
                    if pos < len(drafts):
                        alive = grammar.accept_tokens("", [drafts[pos]])
                        advanced += alive
            if advanced:
                grammar.rollback(advanced)
            row += len(drafts) + 1
        return self._bitmask[:rows].copy()


def constrained_argmax(logits_fn: Callable[[list[int]], np.ndarray], grammar: Grammar, max_tokens: int) -> list[int]:
    """Greedy decode under ``grammar``: mask, take the best allowed token, advance; stops at EOS."""
    out: list[int] = []
    for _ in range(max_tokens):
        logits = np.asarray(logits_fn(out), dtype=np.float64).copy()
        row = allocate_token_bitmask(1, grammar.vocab_size)
        grammar.fill_bitmask(row, 0)
        apply_bitmask(logits, row[0])
        tok = int(np.argmax(logits))
        if not np.isfinite(logits[tok]):
            raise RuntimeError("no token is allowed: the grammar has no way forward")
        grammar.accept_tokens("", [tok])
        out.append(tok)
        if grammar.is_terminated():
            break
    return out
