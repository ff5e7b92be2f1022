"""MUTANT — greedy only when the temperature is exactly 0: a temperature of 1e-6 (below SAMPLING_EPS) divides the logits by it and draws from a generator.

Lab 00-03 — from logits to one token (reference solution).

The model hands the engine one row of logits (one score per vocabulary entry). The sampler
turns that row into one token id, in this order — the same order vLLM and mini_vllm use:

    temperature  ->  top-k  ->  top-p  ->  softmax  ->  one seeded draw

and a temperature of (almost) zero short-circuits everything to a plain argmax.

Functions you write: ``softmax``, ``apply_top_k``, ``apply_top_p``, ``sampling_probs``
(the pipeline up to the final distribution) and ``sample`` (greedy or one draw). The result
must agree token for token with ``mini_vllm.Sampler``.
"""

from __future__ import annotations

import numpy as np

# Below this temperature sampling is greedy (vLLM: _SAMPLING_EPS in vllm/v1/sample/sampler.py).
SAMPLING_EPS = 1e-5


# --------------------------------------------------------------------------- the lab
def softmax(logits: np.ndarray) -> np.ndarray:
    """Probabilities from scores: exp, then normalise. Subtract the max first so exp never overflows.

    ``-inf`` entries become probability 0.
    """
    shifted = logits - np.max(logits)
    e = np.exp(shifted)
    return e / e.sum()


def apply_top_k(logits: np.ndarray, k: int) -> np.ndarray:
    """Keep the ``k`` largest logits and set every other entry to ``-inf`` (returns a new array).

    Disabled (input returned unchanged) when ``k <= 0`` or ``k >= vocab``. Values tied with the
    k-th largest survive too. ``np.partition`` finds the k-th largest in O(vocab), no full sort.
    """
    if k <= 0 or k >= logits.shape[-1]:
        return logits
    kth = np.partition(logits, -k)[-k]
    return np.where(logits >= kth, logits, -np.inf)


def apply_top_p(logits: np.ndarray, p: float) -> np.ndarray:
    """Keep the smallest set of most-likely tokens whose probabilities add up to at least ``p``.

    The token whose probability makes the running sum cross ``p`` is kept (so at least one
    token always survives); the rest become ``-inf``. ``p >= 1`` disables it.
    """
    if p >= 1.0:
        return logits
    probs = softmax(logits)
    order = np.argsort(-probs, kind="stable")  # most likely first; ties keep index order
    cum = np.cumsum(probs[order])
    num_keep = min(int(np.searchsorted(cum, p)) + 1, len(cum))  # first index with cum >= p, inclusive
    out = np.full_like(logits, -np.inf)
    keep = order[:num_keep]
    out[keep] = logits[keep]
    return out


def sampling_probs(logits: np.ndarray, temperature: float, top_k: int = 0, top_p: float = 1.0) -> np.ndarray:
    """The distribution the draw is made from: temperature -> top-k -> top-p -> softmax.

    For a greedy temperature (below ``SAMPLING_EPS``) it is one-hot on the argmax
    (lowest index on ties).
    """
    logits = np.asarray(logits, dtype=np.float64)
    if temperature == 0.0:
        one_hot = np.zeros_like(logits)
        one_hot[int(np.argmax(logits))] = 1.0
        return one_hot
    logits = logits / temperature
    logits = apply_top_k(logits, top_k)
    logits = apply_top_p(logits, top_p)
    return softmax(logits)


def sample(
    logits: np.ndarray, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0, seed: int | None = None
) -> int:
    """Pick one token id from a 1-D row of logits.

    Greedy (``temperature < SAMPLING_EPS``): ``argmax``, no random numbers at all, every other
    knob ignored. Otherwise one draw ``rng.choice(vocab, p=probs)`` with
    ``rng = np.random.default_rng(seed)``.
    """
    logits = np.asarray(logits, dtype=np.float64)
    if temperature == 0.0:
        return int(np.argmax(logits))
    probs = sampling_probs(logits, temperature, top_k, top_p)
    rng = np.random.default_rng(seed)
    return int(rng.choice(len(probs), p=probs))


# --------------------------------------------------------------------------- what you should see
def main() -> None:
    np.set_printoptions(precision=3, suppress=True, floatmode="maxprec")
    words = [" Paris", " Lyon", " the", " a", " France", " banana"]
    # logits = log of the guide's probabilities (any constant shift gives the same softmax)
    logits = np.log([0.87, 0.06, 0.03, 0.01, 0.029997, 0.000003])
    print("The capital of France is ...")
    print(f"  tokens : {words}")
    print(f"  logits : {logits}")
    for t in (0.5, 1.0, 2.0):
        print(f"  T={t:<3}  probs {sampling_probs(logits, t)}")
    print(f"  top_k=2      {sampling_probs(logits, 1.0, top_k=2)}")
    print(f"  top_p=0.95   {sampling_probs(logits, 1.0, top_p=0.95)}")
    print()
    print("1,000 seeded draws each (seed = 0..999): how often each token is picked")
    for label, kw in (("greedy (T=0)", {"temperature": 0.0}),
                      ("T=1.0", {"temperature": 1.0}),
                      ("T=2.0", {"temperature": 2.0}),
                      ("T=1.0, top_p=0.95", {"temperature": 1.0, "top_p": 0.95})):
        counts = np.bincount([sample(logits, seed=s, **kw) for s in range(1000)], minlength=len(words))
        print(f"  {label:<18} {counts}")
    print()
    import mini_vllm

    mine = [sample(logits, 1.5, 4, 0.9, seed=s) for s in range(12)]
    theirs = [mini_vllm.Sampler().sample(logits, mini_vllm.SamplingParams(temperature=1.5, top_k=4, top_p=0.9, seed=s))
              for s in range(12)]
    print("temperature=1.5, top_k=4, top_p=0.9, seeds 0..11")
    print(f"  this lab : {mine}")
    print(f"  mini_vllm: {theirs}")
    print(f"  agree    : {mine == theirs}")

if __name__ == "__main__":
    main()
