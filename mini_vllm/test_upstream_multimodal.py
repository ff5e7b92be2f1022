"""Differential: mini_vllm.multimodal against vLLM 0.22.1's multimodal pieces on CPU.

* The doorstep table: the real ``Scheduler`` with ``mm_features`` and an ``EncoderCacheManager``
  (encoder budget set by hand: the stub model is text-only) against mini_vllm's ``Scheduler``
  (``mm_traces.run_mini``), step for step, on the three-request trace (prefix caching on and off)
  and on seeded random traces (shared images, several images per request, tight budgets and
  caches, and prompts repeated under other images, so prefix hits depend on the image keys).
* The real ``EncoderCacheManager`` and mini's on the same operation sequence.
* The real ``MultiModalHasher`` (content identity) and ``_merge_multimodal_embeddings`` (the splice
  and its count-mismatch message) against mini's.
"""

import importlib
import os
import random

import numpy as np
import pytest

from mini_vllm.multimodal import (
    EncoderCacheManager,
    MultiModalFeature,
    PlaceholderRange,
    merge_multimodal_embeddings,
)
from mini_vllm.testing.mm_traces import MMArrival, run_mini, three_requests

pytestmark = pytest.mark.upstream

os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")


@pytest.fixture(scope="module")
def real():
    importlib.import_module("mini_vllm.testing.real_vllm")  # registers the stub model, quiets logs
    return importlib.import_module("mini_vllm.testing.mm_traces")


def feat(name, offset, length):
    return MultiModalFeature(name, PlaceholderRange(offset, length))


def test_three_requests_match_the_real_scheduler(real):
    want = real.run_real(three_requests(), 256, 100, 400, enable_prefix_caching=True)
    assert [s.scheduled for s in want] == [
        {"A": (130, (0,)), "B": (10, ()), "C": (94, ())},
        {"B": (90, (0,))},
    ]
    assert run_mini(three_requests(), 256, 100, 400, enable_prefix_caching=True) == want


def test_c_gets_110_without_the_prefix_cache(real):
    """94 = 110 - 16: C's first block is A's first block (text only, before any image)."""
    want = real.run_real(three_requests(), 256, 100, 400, enable_prefix_caching=False)
    assert want[0].scheduled["C"] == (110, ())
    assert run_mini(three_requests(), 256, 100, 400, enable_prefix_caching=False) == want


def random_trace(rng):
    arrivals, base = [], 1000
    for k in range(rng.randint(1, 4)):
        n, feats, pos = rng.randint(20, 160), [], rng.randint(0, 20)
        if arrivals and rng.random() < 0.35:  # an earlier prompt again, under its own images
            prompt = arrivals[rng.randrange(len(arrivals))].prompt_token_ids
            n = len(prompt)
        else:
            prompt = tuple(range(base, base + n))
            base += n
        while pos < n - 5 and len(feats) < 3:
            length = rng.choice([8, 16, 30, 48])
            if pos + length > n:
                break
            feats.append(feat(f"img{rng.randint(0, 3)}_{length}", pos, length))
            pos += length + rng.randint(0, 30)
        arrivals.append(MMArrival(f"r{k}", prompt, tuple(feats)))
    return arrivals


def test_random_traces_match_the_real_scheduler(real):
    rng = random.Random(13)
    doorsteps = evictions = hits = 0
    for case in range(30):
        trace = random_trace(rng)
        tb, eb, cs = rng.choice([16, 32, 64, 100]), rng.choice([48, 60, 100]), rng.choice([96, 120, 200])
        caching = case % 2 == 1
        want = real.run_real(trace, tb, eb, cs, enable_prefix_caching=caching)
        got = run_mini(trace, tb, eb, cs, enable_prefix_caching=caching)
        assert got == want, f"case {case} (token budget {tb}, encoder budget {eb}, cache {cs}, prefix caching {caching}): {trace}"
        evictions += sum(len(s.freed) for s in want)
        doorsteps += sum(1 for s in want for rid, (n, _) in s.scheduled.items() if n < tb and not _)
        hits += sum(sum(n for n, _ in (s.scheduled.get(a.request_id, (0, ())) for s in want)) < len(a.prompt_token_ids)
                    for a in trace)
    assert doorsteps > 0 and evictions > 0 and hits > 0, "the random traces must exercise doorsteps, evictions and prefix hits"


def test_encoder_cache_manager_bookkeeping_matches(real):
    from types import SimpleNamespace

    from vllm.v1.core.encoder_cache_manager import EncoderCacheManager as Real

    def req(rid, h, n):
        return SimpleNamespace(
            request_id=rid,
            mm_features=[SimpleNamespace(identifier=h)],
            get_num_encoder_embeds=lambda i: n,
        )

    rng = random.Random(7)
    r, m = Real(cache_size=10), EncoderCacheManager(10)
    sizes = {f"h{i}": 2 + i for i in range(5)}
    for _ in range(300):
        rid, h = f"q{rng.randint(0, 3)}", rng.choice(list(sizes))
        rq = req(rid, h, sizes[h])
        op = rng.choice(["hit", "alloc", "free_input", "free"])
        if op == "hit":
            assert r.check_and_update_cache(rq, 0) == m.check_and_update_cache(rid, h)
        elif op == "alloc" and h not in r.cached:
            ok = r.can_allocate(rq, 0, 100, 0)
            assert ok == m.can_allocate(sizes[h], 100, 0)
            if ok:
                r.allocate(rq, 0)
                m.allocate(rid, h, sizes[h])
        elif op == "free_input":
            r.free_encoder_input(rq, 0)
            m.free_encoder_input(rid, h)
        elif op == "free":
            for hh in list(r.cached):  # mini frees in cache order
                r.free_encoder_input(req(rid, hh, sizes[hh]), 0)
            m.free(rid)
        assert (r.cached, list(r.freeable.items()), r.num_free_slots, r.num_freeable_slots) == (
            m.cached,
            list(m.freeable.items()),
            m.num_free_slots,
            m.num_freeable_slots,
        )
        assert r.get_freed_mm_hashes() == m.get_freed_mm_hashes()


def test_real_hasher_is_content_identity(real):
    from PIL import Image
    from vllm.multimodal.hasher import MultiModalHasher

    img = Image.fromarray(np.arange(48, dtype=np.uint8).reshape(4, 4, 3))
    same = MultiModalHasher.hash_kwargs(image=img) == MultiModalHasher.hash_kwargs(image=img.copy())
    pixels = np.array(img)
    pixels[0, 0, 0] ^= 1
    changed = MultiModalHasher.hash_kwargs(image=Image.fromarray(pixels))
    assert same and changed != MultiModalHasher.hash_kwargs(image=img), "equal pixels, equal hash; one bit, new hash"


def test_real_merge_matches_and_fails_the_same_way(real):
    import torch
    from vllm.model_executor.models.utils import _merge_multimodal_embeddings

    mask = np.zeros(8, dtype=bool)
    mask[[1, 2, 5, 6]] = True
    parts = [np.full((2, 4), 1.0, np.float32), np.full((2, 4), 2.0, np.float32)]
    want = _merge_multimodal_embeddings(torch.zeros(8, 4), [torch.from_numpy(p) for p in parts], torch.from_numpy(mask))
    got = merge_multimodal_embeddings(np.zeros((8, 4), np.float32), mask, parts)
    assert np.array_equal(want.numpy(), got)
    with pytest.raises(ValueError) as real_err:
        _merge_multimodal_embeddings(torch.zeros(8, 4), [torch.ones(3, 4)], torch.from_numpy(mask))
    with pytest.raises(ValueError) as mini_err:
        merge_multimodal_embeddings(np.zeros((8, 4), np.float32), mask, [np.ones((3, 4))])
    assert str(real_err.value) == str(mini_err.value) == "Attempted to assign 3 = 3 multimodal tokens to 4 placeholders"
