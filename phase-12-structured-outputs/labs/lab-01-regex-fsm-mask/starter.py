"""Lab 12-01 starter: compile a small regex to an FSM, lift it to tokens, mask, generate.

The pattern subset is a sequence of atoms, each a literal, an escaped character (``\\.``) or a
class (``[0-9a-f]``), optionally followed by ``+``. State ``i`` means "atoms ``0..i-1`` matched";
``+`` adds a self-loop on the state after its atom. ``allowed_tokens`` lifts the character
machine to a tokenizer's vocabulary, and ``constrained_generate`` is the per-step loop: mask,
pick, advance, with EOS legal only in an accepting state. ``ranked_model`` (provided) is a fake
model that always prefers the same tokens in the same order.

Run it: ``python phase-12-structured-outputs/labs/lab-01-regex-fsm-mask/solution.py``
(``--figure`` also draws reliability.png for the guide).
Grade with: LAB_IMPL=starter pytest phase-12-structured-outputs/labs/lab-01-regex-fsm-mask -q
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import numpy as np

HERE = Path(__file__).resolve().parent

Vocab = Sequence[str | None]  # token id -> its text; None for a special token (EOS)
Model = Callable[[list[int]], np.ndarray]  # output so far -> logits over the vocabulary


class Atom(NamedTuple):
    chars: frozenset[str]  # the characters this atom matches
    plus: bool  # True when followed by '+': one or more


@dataclass
class FSM:
    """A deterministic machine: ``transitions[state][char] -> next state``; start state 0."""

    transitions: dict[int, dict[str, int]]
    accepting: set[int]
    num_states: int


class Generation(NamedTuple):
    token_ids: list[int]  # EOS included when the output stopped
    text: str  # the characters emitted (EOS adds none)
    finish_reason: str  # "stop" (EOS chosen) or "length" (max_tokens reached first)
    mask_computations: int  # allowed_tokens calls: one per distinct state visited


def parse_atoms(pattern: str) -> list[Atom]:
    """Split ``pattern`` into atoms: literal, ``\\x`` (escaped literal) or ``[...]`` (with ranges
    ``a-z``), each optionally followed by ``+``.

    Raises ``ValueError`` for an empty pattern, an unclosed ``[``, an empty class, a reversed
    range, a ``+`` with nothing before it (or a second ``+``), a dangling ``\\``, and any other
    regex metacharacter (``* ? | ( ) . { } ^ $ ]``), which this subset does not support.
    """
    raise NotImplementedError(
        "parse_atoms: walk the pattern; for each literal, \\x escape or [...] class (expand a-z ranges) "
        "make Atom(chars, plus) where plus is a following '+'; raise ValueError for everything the docstring "
        "lists"
    )


def compile_pattern(pattern: str) -> FSM:
    """Build the FSM: atom ``i`` moves state ``i`` to ``i + 1``; ``+`` loops on state ``i + 1``.

    The last state is the only accepting one. Raises ``ValueError`` when a ``+`` atom shares a
    character with the atom after it (``[0-9]+0``): from that state one character would lead to
    two states, and this construction only builds deterministic machines.
    """
    raise NotImplementedError(
        "compile_pattern: state i = atoms 0..i-1 matched; atom i adds transitions[i][ch] = i + 1 for each "
        "of its chars, and a '+' adds transitions[i + 1][ch] = i + 1; accepting = {len(atoms)}; refuse a "
        "'+' atom that shares a char with the next atom"
    )


def advance(fsm: FSM, state: int, text: str) -> int | None:
    """Feed ``text`` from ``state`` one character at a time; the final state, or ``None`` as soon
    as a character has no transition (the token dies; ``state`` itself is untouched)."""
    raise NotImplementedError(
        "advance: for each character look up fsm.transitions[state].get(ch); return None the moment one "
        "is missing, else the final state"
    )


def allowed_tokens(fsm: FSM, state: int, vocab: Vocab, eos_token_id: int) -> np.ndarray:
    """``bool[len(vocab)]``: token ``t`` is allowed iff all its characters survive from ``state``;
    EOS iff ``state`` is accepting; any other special token (``None``) never."""
    raise NotImplementedError(
        "allowed_tokens: mask[t] = advance(fsm, state, vocab[t]) is not None for every token with text; "
        "EOS only if state is accepting; None entries never"
    )


def constrained_generate(
    pattern: str, vocab: Vocab, eos_token_id: int, model: Model, max_tokens: int
) -> Generation:
    """Greedy decoding under ``pattern``: each step mask the model's logits (disallowed -> -inf),
    take the argmax (lowest id on ties), advance the FSM; stop at EOS or after ``max_tokens``
    tokens (EOS counts as a token). The allowed mask is computed once per distinct state.

    Raises ``ValueError`` if ``max_tokens < 1``, if ``vocab[eos_token_id]`` is not ``None``, or if
    the logits' shape is not ``(len(vocab),)``.
    """
    raise NotImplementedError(
        "constrained_generate: validate the arguments, compile the pattern, then per step: allowed mask "
        "(cached per state), logits[~mask] = -inf, argmax, stop on EOS, else advance; Generation(..., 'length', "
        "...) when max_tokens runs out"
    )


def ranked_model(ranking: Sequence[str | None], vocab: Vocab) -> Model:
    """A fake model with fixed preferences: ``ranking[0]`` scores highest, then ``ranking[1]``, ...;
    tokens not in ``ranking`` score below all of them (``None`` in ``ranking`` means EOS)."""
    logits = np.full(len(vocab), -1000.0)
    for rank, text in enumerate(ranking):
        logits[list(vocab).index(text)] = -float(rank)
    return lambda out: logits


# --- the demo ------------------------------------------------------------------------------

DEMO_VOCAB: list[str | None] = [*"0123456789abcdefxq@.", "0x", "zz", "1x", "ff", "0z", None]
DEMO_EOS = len(DEMO_VOCAB) - 1


def _shown(mask: np.ndarray) -> str:
    return " ".join("EOS" if DEMO_VOCAB[i] is None else repr(DEMO_VOCAB[i]) for i in np.flatnonzero(mask))


def plot_reliability(path: Path) -> None:
    """P(a response of n tokens has no error) = p^n, for three per-token reliabilities."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = np.arange(1, 5001)
    fig, ax = plt.subplots(figsize=(6.4, 3.2), dpi=100)
    for p in (0.99, 0.999, 0.9999):
        ax.plot(n, p**n, label=f"unconstrained, {p} per token")
    ax.axhline(1.0, color="k", linestyle="--", label="masked: valid by construction")
    ax.axvline(1000, color="grey", linewidth=0.8)
    ax.annotate(f"n = 1000: {0.999**1000:.2f}", (1000, 0.999**1000), xytext=(1500, 0.45),
                arrowprops={"arrowstyle": "->"})
    ax.set_xlabel("response length (tokens)")
    ax.set_ylabel("P(whole response valid)")
    ax.set_ylim(0, 1.05)
    ax.legend(fontsize=8, loc="lower left")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, metadata={"Software": None})
    plt.close(fig)


def reliability_table() -> None:
    """P(a response of n tokens is all valid) = p^n, unconstrained, for the guide's table."""
    print("P(whole response valid) = p^n without a mask; 1 with one")
    print(f"  {'n tokens':>8} | {'p=0.99':>8} {'p=0.999':>8} {'p=0.9999':>8}")
    for n in (10, 100, 1000, 5000):
        print(f"  {n:>8} | " + " ".join(f"{p**n:>8.3f}" for p in (0.99, 0.999, 0.9999)))


def main(argv: list[str]) -> None:
    if "--figure" in argv:
        reliability_table()
        plot_reliability(HERE / "reliability.png")
        print("wrote reliability.png")
        return
    pattern = "0x[0-9a-f]+"
    fsm = compile_pattern(pattern)
    print(f"pattern {pattern!r}: {len(parse_atoms(pattern))} atoms, {fsm.num_states} states, accepting {sorted(fsm.accepting)}")
    for s in range(fsm.num_states):
        edges = "".join(sorted(fsm.transitions[s]))
        print(f"  state {s}: {len(fsm.transitions[s]):>2} chars -> {sorted(set(fsm.transitions[s].values()))}  ({edges or '-'})")
    print(f"allowed from state 0: {_shown(allowed_tokens(fsm, 0, DEMO_VOCAB, DEMO_EOS))}")
    print(f"allowed from state 2: {len(_shown(allowed_tokens(fsm, 2, DEMO_VOCAB, DEMO_EOS)).split())} tokens, EOS "
          f"{'yes' if allowed_tokens(fsm, 2, DEMO_VOCAB, DEMO_EOS)[DEMO_EOS] else 'no'}; from state 3: EOS "
          f"{'yes' if allowed_tokens(fsm, 3, DEMO_VOCAB, DEMO_EOS)[DEMO_EOS] else 'no'}")
    print()
    hater = ranked_model(["q", "@", "zz", None, "1x", "ff", "0x"], DEMO_VOCAB)
    g = constrained_generate(pattern, DEMO_VOCAB, DEMO_EOS, hater, 10)
    print(f"model ranking q, @, zz, EOS, 1x, ff, 0x: {g.text!r} finish={g.finish_reason} "
          f"tokens={len(g.token_ids)} masks computed={g.mask_computations}")
    digits = ranked_model(["7", None, "."], DEMO_VOCAB)
    for n in (5, 50):
        g = constrained_generate("[0-9]+\\.[0-9]", DEMO_VOCAB, DEMO_EOS, digits, n)
        print(f"digit lover on '[0-9]+\\.[0-9]', max_tokens={n}: {g.text!r} finish={g.finish_reason}")
    print()
    rng = np.random.default_rng(0)
    fuzz_pattern, ok = "[0-9a-f][0-9a-f]\\.[xq]", 0
    texts = [t for t in DEMO_VOCAB if t is not None]
    for _ in range(50):
        ranking = [*rng.permutation(texts), None]
        g = constrained_generate(fuzz_pattern, DEMO_VOCAB, DEMO_EOS, ranked_model(ranking, DEMO_VOCAB), 8)
        ok += advance(fsm := compile_pattern(fuzz_pattern), 0, g.text) in fsm.accepting and g.finish_reason == "stop"
    print(f"50 random rankings on '{fuzz_pattern}': {ok}/50 full matches")
    print(f"unconstrained, 0.999 per token, 1000 tokens: P(valid) = {0.999**1000:.3f}, "
          f"P(at least one error) = {1 - 0.999**1000:.3f}, expected errors = {1000 * 0.001:.1f}")


if __name__ == "__main__":
    main(sys.argv[1:])
