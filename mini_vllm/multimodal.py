"""Images in a text engine: placeholders, a toy encoder, the encoder cache, the doorstep rule.

Mirrors ``vllm/multimodal/`` (``PlaceholderRange`` in ``inputs.py``, ``MultiModalHasher`` in
``hasher.py``, the splice ``_merge_multimodal_embeddings`` of ``model_executor/models/utils.py``),
``vllm/v1/core/encoder_cache_manager.py`` (``EncoderCacheManager``: cached / freeable / freed,
eviction at allocation) and the scheduler's encoder rules as pure functions:
``try_schedule_encoder_inputs`` (``Scheduler._try_schedule_encoder_inputs``: trim a request's
tokens to stop before an image that cannot be encoded this step; 0 tokens means skip it) and
``free_consumed_encoder_inputs`` (``Scheduler._free_encoder_inputs``: release an image once its
placeholders are all in the KV cache). Phase 13's guide walks one step through them.

Left out: real pixels and processors (an image is ``bytes``; its token count is a formula), the
projector, encoder-decoder models, EAGLE's shifted window, remote encoder caches
(``ECConnector``), the processor cache, and mixing ``mm_hash`` into block hashes.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

BYTES_PER_IMAGE_TOKEN = 64  # toy "dynamic resolution": bigger images cost more tokens


@dataclass(frozen=True)
class PlaceholderRange:
    """Positions ``[offset, offset + length)`` of the prompt that an encoder output fills.

    ``is_embed`` (optional, one bool per position) marks which of them take an embedding; the
    others are structural tokens (Pixtral's row breaks) that keep their text embedding."""

    offset: int
    length: int
    is_embed: tuple[bool, ...] | None = None

    def __post_init__(self) -> None:
        if self.offset < 0 or self.length <= 0:
            raise ValueError(f"PlaceholderRange needs offset >= 0 and length > 0, got {self.offset}, {self.length}")
        if self.is_embed is not None and len(self.is_embed) != self.length:
            raise ValueError(f"is_embed has {len(self.is_embed)} entries for a range of length {self.length}")

    @property
    def end(self) -> int:
        return self.offset + self.length

    def get_num_embeds(self) -> int:
        """Embeddings the encoder must produce: ``length``, or the True count of ``is_embed``."""
        return self.length if self.is_embed is None else sum(self.is_embed)

    def num_embeds_in(self, start_rel: int, end_rel: int) -> int:
        """Embeddings inside the range's own positions ``[start_rel, end_rel)``."""
        if self.is_embed is None:
            return max(0, end_rel - start_rel)
        return sum(self.is_embed[max(0, start_rel) : max(0, end_rel)])


@dataclass(frozen=True)
class MultiModalFeature:
    """One image of a request: its content hash and where its placeholders sit (upstream's
    ``MultiModalFeatureSpec.identifier`` / ``.mm_position``)."""

    identifier: str
    mm_position: PlaceholderRange


def mm_hash(image: bytes) -> str:
    """Content identity of an image: a SHA-256 hex digest of its bytes (upstream hashes the
    serialized pixels with blake3 by default). Equal bytes, equal hash, whoever sends them."""
    if not isinstance(image, bytes | bytearray):
        raise TypeError(f"an image is bytes, got {type(image).__name__}")
    return hashlib.sha256(bytes(image)).hexdigest()


def num_image_tokens(image: bytes) -> int:
    """Placeholder tokens one image expands to: ``len(image) // 64 + 1``."""
    return len(image) // BYTES_PER_IMAGE_TOKEN + 1


def expand_markers(
    prompt_ids: Sequence[int], images: Sequence[bytes], image_token_id: int
) -> tuple[list[int], list[PlaceholderRange]]:
    """Replace each ``image_token_id`` marker by ``num_image_tokens(image)`` copies of itself.

    Markers and images pair up in order; the returned ranges are ordered, disjoint and point
    into the expanded ids. Raises ``ValueError`` when there are more markers than images or
    the other way round (a bad request, caught before any shape can go wrong)."""
    num_markers = sum(1 for t in prompt_ids if t == image_token_id)
    if num_markers != len(images):
        raise ValueError(f"prompt has {num_markers} image markers but {len(images)} images were given")
    ids: list[int] = []
    ranges: list[PlaceholderRange] = []
    images_left = iter(images)
    for t in prompt_ids:
        if t != image_token_id:
            ids.append(t)
            continue
        n = num_image_tokens(next(images_left))
        ranges.append(PlaceholderRange(offset=len(ids), length=n))
        ids.extend([image_token_id] * n)
    return ids, ranges


class ToyVisionEncoder:
    """A deterministic stand-in for ViT + projector: ``encode(image)`` returns a
    ``(num_image_tokens(image), hidden_size)`` float32 array drawn from an RNG seeded by the
    image's hash. ``calls`` counts invocations, so a test can prove an encode was skipped."""

    def __init__(self, hidden_size: int = 8) -> None:
        if hidden_size <= 0:
            raise ValueError(f"hidden_size must be positive, got {hidden_size}")
        self.hidden_size = hidden_size
        self.calls = 0

    def encode(self, image: bytes) -> np.ndarray:
        self.calls += 1
        rng = np.random.default_rng(int(mm_hash(image)[:16], 16))
        return rng.standard_normal((num_image_tokens(image), self.hidden_size)).astype(np.float32)


class EncoderCacheManager:
    """Accounting for encoder outputs, in embeddings (not blocks), keyed by ``mm_hash``.

    ``cached[h]`` is the set of request ids referencing entry ``h`` (named references instead
    of a count); an entry whose set empties moves to ``freeable`` (oldest first) and keeps its
    space until ``can_allocate`` needs it, which evicts oldest-first and records the hash in
    ``freed`` for the workers (``get_freed_mm_hashes`` drains it). ``num_free_slots`` is space
    free now; ``num_freeable_slots`` is space free after evicting every unreferenced entry."""

    def __init__(self, cache_size: int) -> None:
        if cache_size < 0:
            raise ValueError(f"cache_size must be >= 0, got {cache_size}")
        self.cache_size = cache_size
        self.num_free_slots = cache_size
        self.num_freeable_slots = cache_size
        self.cached: dict[str, set[str]] = {}
        self.freeable: OrderedDict[str, int] = OrderedDict()
        self.freed: list[str] = []
        self.num_embeds: dict[str, int] = {}  # size of every cached entry (upstream asks the request)

    def check_and_update_cache(self, request_id: str, mm_hash: str) -> bool:
        """Hit: add ``request_id`` as a referent (an unreferenced entry leaves ``freeable``)."""
        if mm_hash not in self.cached:
            return False
        if not self.cached[mm_hash]:
            self.num_freeable_slots -= self.freeable.pop(mm_hash)
        self.cached[mm_hash].add(request_id)
        return True

    def can_allocate(self, num_embeds: int, encoder_compute_budget: int, num_embeds_to_schedule: int = 0) -> bool:
        """Room to compute and store ``num_embeds`` more (beyond ``num_embeds_to_schedule``
        already promised this step)? Evicts unreferenced entries, oldest first, when needed."""
        if num_embeds > encoder_compute_budget:
            return False
        need = num_embeds + num_embeds_to_schedule
        if need <= self.num_free_slots:
            return True
        if need > self.num_freeable_slots:
            return False
        while need > self.num_free_slots:
            h, size = self.freeable.popitem(last=False)
            del self.cached[h]
            del self.num_embeds[h]
            self.freed.append(h)
            self.num_free_slots += size
        return True

    def allocate(self, request_id: str, mm_hash: str, num_embeds: int) -> None:
        """Reserve space for an encoder output about to be computed (after ``can_allocate``)."""
        if mm_hash in self.cached:
            raise ValueError(f"{mm_hash[:12]} is already cached: call check_and_update_cache, not allocate")
        if num_embeds > self.num_free_slots:
            raise ValueError(f"no room for {num_embeds} embeddings ({self.num_free_slots} free): call can_allocate first")
        self.cached[mm_hash] = {request_id}
        self.num_embeds[mm_hash] = num_embeds
        self.num_free_slots -= num_embeds
        self.num_freeable_slots -= num_embeds

    def free_encoder_input(self, request_id: str, mm_hash: str) -> None:
        """Drop one reference; the last one makes the entry freeable (its data stays)."""
        refs = self.cached.get(mm_hash)
        if not refs or request_id not in refs:
            return  # like upstream: freeing what you do not hold is a no-op
        refs.discard(request_id)
        if not refs:
            self.freeable[mm_hash] = self.num_embeds[mm_hash]
            self.num_freeable_slots += self.num_embeds[mm_hash]

    def free(self, request_id: str) -> None:
        """Drop every reference ``request_id`` holds (finish, abort, preemption)."""
        for h in [h for h, refs in self.cached.items() if request_id in refs]:
            self.free_encoder_input(request_id, h)

    def get_freed_mm_hashes(self) -> list[str]:
        """Hashes evicted since the last call; the list is handed over and cleared."""
        freed, self.freed = self.freed, []
        return freed


class EncoderSchedule(NamedTuple):
    encoder_inputs: list[int]  # indices into the request's features to encode this step
    num_new_tokens: int  # the chunk, possibly cut back to a doorstep
    encoder_compute_budget: int  # what is left for later requests this step


def try_schedule_encoder_inputs(
    request_id: str,
    num_computed_tokens: int,
    num_new_tokens: int,
    features: Sequence[MultiModalFeature],
    encoder_compute_budget: int,
    cache: EncoderCacheManager,
    disable_chunked_mm_input: bool = False,
) -> EncoderSchedule:
    """Which images to encode for the chunk ``[computed, computed + new)``, and where it stops.

    Features are visited in prompt order, stopping at the first one that starts at or past the
    chunk's end. One already inside the KV cache is skipped; one already scheduled this step
    (the same image twice) or in the encoder cache (a hit, which records the reference) costs
    nothing. Otherwise it must fit the compute budget and the cache (``can_allocate``): if it
    does, the whole image is encoded now and its embeddings leave the budget; if not, the chunk
    ends at the image's first position (the doorstep; 0 tokens when the chunk already starts
    past it) and no later image is looked at. With ``disable_chunked_mm_input`` a chunk that
    would end inside an image it started before is also cut back to the doorstep."""
    if num_new_tokens == 0 or not features:
        return EncoderSchedule([], num_new_tokens, encoder_compute_budget)
    to_encode: list[int] = []
    scheduled: set[str] = set()
    num_embeds_to_schedule = 0
    for i, f in enumerate(features):
        pos = f.mm_position
        if pos.offset >= num_computed_tokens + num_new_tokens:
            break  # the chunk ends before this image
        if pos.end <= num_computed_tokens:
            continue  # already in the KV cache
        if f.identifier in scheduled or cache.check_and_update_cache(request_id, f.identifier):
            continue  # paid for already
        if (
            disable_chunked_mm_input
            and num_computed_tokens < pos.offset
            and num_computed_tokens + num_new_tokens < pos.end
        ):
            num_new_tokens = max(0, pos.offset - num_computed_tokens)
            break
        if not cache.can_allocate(pos.get_num_embeds(), encoder_compute_budget, num_embeds_to_schedule):
            num_new_tokens = max(0, pos.offset - num_computed_tokens)  # the doorstep
            break
        start_rel = max(0, num_computed_tokens - pos.offset)
        end_rel = min(pos.length, num_computed_tokens + num_new_tokens - pos.offset)
        if pos.num_embeds_in(start_rel, end_rel) == 0:
            continue  # the chunk touches only structural tokens of this image
        num_embeds_to_schedule += pos.get_num_embeds()
        encoder_compute_budget -= pos.get_num_embeds()
        scheduled.add(f.identifier)
        to_encode.append(i)
    return EncoderSchedule(to_encode, num_new_tokens, encoder_compute_budget)


def free_consumed_encoder_inputs(
    request_id: str, features: Sequence[MultiModalFeature], num_computed_tokens: int, cache: EncoderCacheManager
) -> None:
    """After a step: release the request's reference to every image now wholly in the KV cache."""
    for f in features:
        if f.mm_position.end <= num_computed_tokens:
            cache.free_encoder_input(request_id, f.identifier)


def merge_multimodal_embeddings(
    inputs_embeds: np.ndarray, is_multimodal: np.ndarray, mm_embeds: Sequence[np.ndarray]
) -> np.ndarray:
    """Overwrite the rows of ``inputs_embeds`` where ``is_multimodal`` is True, in order, with the
    concatenated ``mm_embeds`` (cast to the input dtype), in place. Raises ``ValueError``
    ("Attempted to assign X multimodal tokens to Y placeholders") when the counts differ."""
    if len(mm_embeds) == 0:
        return inputs_embeds
    flat = np.concatenate([np.asarray(e) for e in mm_embeds], axis=0)
    expected = int(np.count_nonzero(is_multimodal))
    if len(flat) != expected:
        expr = " + ".join(str(len(e)) for e in mm_embeds)
        raise ValueError(f"Attempted to assign {expr} = {len(flat)} multimodal tokens to {expected} placeholders")
    inputs_embeds[np.asarray(is_multimodal, dtype=bool)] = flat.astype(inputs_embeds.dtype)
    return inputs_embeds


def embed_with_images(
    token_ids: Sequence[int],
    embedding: np.ndarray,
    placeholders: Sequence[PlaceholderRange],
    encoder_outputs: Sequence[np.ndarray],
) -> np.ndarray:
    """The toy forward's first layer: text embeddings for every position, then the encoder
    outputs spliced over the placeholder positions (``is_embed`` honoured)."""
    ids = np.asarray(token_ids, dtype=np.int64)
    inputs_embeds = embedding[ids].astype(np.float32)
    mask = np.zeros(len(ids), dtype=bool)
    for r in placeholders:
        if r.end > len(ids):
            raise ValueError(f"placeholder [{r.offset}, {r.end}) runs past the {len(ids)}-token prompt")
        span = np.ones(r.length, dtype=bool) if r.is_embed is None else np.asarray(r.is_embed, dtype=bool)
        mask[r.offset : r.end] |= span
    return merge_multimodal_embeddings(inputs_embeds, mask, encoder_outputs)
