"""Lab 13-02 starter: an image cannot be half-encoded, so a prefill chunk may stop at its doorstep.

``plan_chunk`` is V1's encoder rule for one request in one step: which images the chunk
``[num_computed, num_computed + num_new)`` needs encoded, and how far the chunk may go when the
encoder budget cannot pay for one of them. ``doorstep_table`` (provided) runs it step by step for
several requests, the way the scheduler calls it.
Write ``plan_chunk``. Grade with: LAB_IMPL=starter pytest phase-13-multimodal-models/labs/lab-02-encoder-scheduling -q
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from mini_vllm.multimodal import PlaceholderRange
from mini_vllm.testing.mm_traces import MMArrival, simulate, three_requests


def plan_chunk(
    num_computed: int,
    num_new: int,
    placeholders: Sequence[PlaceholderRange],
    cached: set[int],
    encoder_budget: int,
) -> tuple[int, list[int]]:
    """Tokens to schedule and indices of images to encode for one request this step.

    Visit the images in prompt order; stop at the first that starts at or after the chunk's end
    (``num_computed + num_new``). Skip an image already wholly computed (its end is at or before
    ``num_computed``) or in ``cached`` (its encoder output is stored: free). Otherwise the image
    must be encoded *whole*, even if the chunk covers a single one of its positions: if its
    ``length`` fits what is left of ``encoder_budget``, schedule it and subtract the length; if
    not, cut the chunk so it ends right before the image (``max(0, offset - num_computed)``
    tokens) and look at no later image. Raises ``ValueError`` for negative numbers or
    placeholders that are out of order or overlap."""
    raise NotImplementedError(
        'plan_chunk: validate, return (0, []) for num_new == 0, then walk the placeholders in order: break at'
        ' one starting at or past num_computed + num_new; skip one already computed or in cached; if its '
        'length exceeds the budget left, return (max(0, offset - num_computed), what you scheduled so far); '
        'else subtract its length and schedule its index'
    )


PlanChunk = Callable[[int, int, Sequence[PlaceholderRange], set[int], int], tuple[int, list[int]]]


def doorstep_table(
    arrivals: Sequence[MMArrival], token_budget: int, encoder_budget: int, plan: PlanChunk | None = None
) -> list[dict[str, tuple[int, tuple[int, ...]]]]:
    """Provided. Schedule ``arrivals`` (all waiting at step 0, ``max_tokens=1``) step by step
    with ``plan`` (default: this file's ``plan_chunk``) as the encoder rule; one dict per step,
    request id -> (tokens scheduled, images encoded). An image is "cached" once any request has
    encoded it (the encoder cache is big enough that nothing is evicted)."""
    plan = plan or plan_chunk

    def rule(request_id, num_computed, num_new, features, budget, cache):
        cached = {i for i, f in enumerate(features) if f.identifier in cache.cached}
        n, to_encode = plan(num_computed, num_new, [f.mm_position for f in features], cached, budget)
        spent = sum(features[i].mm_position.length for i in to_encode)
        return to_encode, n, budget - spent

    cache_size = sum(f.mm_position.length for a in arrivals for f in a.features)
    steps = simulate(arrivals, token_budget, encoder_budget, cache_size, rule=rule, max_steps=100)
    return [s.scheduled for s in steps]


def main() -> None:
    two = [PlaceholderRange(40, 100), PlaceholderRange(160, 100)]  # text 40 | A 100 | text 20 | B 100 | text 40
    print("one request, 300 tokens: text [0,40) | image 0 [40,140) | text | image 1 [160,260) | text")
    print("  computed  new  budget  cached  ->  tokens  encode")
    for computed, new, budget, cached in [
        (0, 30, 0, set()), (0, 80, 100, set()), (0, 80, 99, set()), (0, 300, 150, set()),
        (0, 300, 200, set()), (80, 100, 0, {0}), (0, 40, 0, set()), (40, 64, 0, set()),
    ]:
        n, enc = plan_chunk(computed, new, two, cached, budget)
        print(f"  {computed:8d} {new:4d} {budget:7d}  {str(sorted(cached)):6s}  ->  {n:6d}  {enc}")
    print()
    print("three requests, token budget 256, encoder budget 100 per step (tokens, images encoded):")
    for step, table in enumerate(doorstep_table(three_requests(), 256, 100)):
        cells = "  ".join(f"{rid} {n:3d} {list(enc)}" for rid, (n, enc) in table.items())
        print(f"  step {step}: {cells}")


if __name__ == "__main__":
    main()
