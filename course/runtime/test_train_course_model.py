"""The committed course Llama (``mini_vllm/checkpoints/course-llama``) and the script that trains it."""

from __future__ import annotations

import json

import pytest

from course.runtime import tiny_model
from course.runtime import train_course_model as tcm

HELDOUT_TOKENS = 4096  # the slice the fast test scores (~0.2 s); the README scores all of it
HELDOUT_LOSS_BOUND = 3.0  # nats/token on that slice (the unigram baseline is near 5, uniform guessing 6.24)
SIZE_BOUND = 8 * 2**20


def test_committed_files_match_their_recorded_sha256():
    recorded = tcm.read_manifest(tcm.CHECKPOINT)
    assert sorted(recorded) == sorted(tcm.HASHED), (
        f"SHA256SUMS lists {sorted(recorded)}, expected {sorted(tcm.HASHED)}: retrain or rerun write_manifest"
    )
    for name, digest in recorded.items():
        actual = tcm.sha256_of(tcm.CHECKPOINT / name)
        assert actual == digest, (
            f"{name} has sha256 {actual}, SHA256SUMS records {digest}: the committed checkpoint was changed "
            "by hand; retrain it with the command in training.json (this also rewrites SHA256SUMS)"
        )


def test_checkpoint_is_the_tiny_llama_shape_in_float16_and_small():
    from safetensors import safe_open

    config = json.loads((tcm.CHECKPOINT / "config.json").read_text())
    assert config == {**tiny_model.CONFIG, "torch_dtype": "float16"}, (
        "config.json drifted from tiny_model.CONFIG"
    )
    weights = tcm.CHECKPOINT / "model.safetensors"
    assert weights.stat().st_size <= SIZE_BOUND, (
        f"model.safetensors is {weights.stat().st_size} bytes, over 8 MiB"
    )
    with safe_open(str(weights), framework="np") as f:
        dtypes = {name: str(f.get_tensor(name).dtype) for name in f.keys()}  # noqa: SIM118 (safe_open is no dict)
    assert set(dtypes.values()) == {"float16"}, f"every tensor must be float16 (numpy can read it): {dtypes}"


def test_tokenizer_is_the_courses():
    committed = tcm.load_tokenizer().get_vocab()
    assert committed == tiny_model.train_tokenizer().get_vocab(), (
        "the checkpoint's tokenizer differs from tiny_model.train_tokenizer(): retrain the checkpoint"
    )


def test_hf_llama_loads_it_and_beats_the_unigram_baseline_on_heldout_text():
    tcm.set_torch_determinism(1)
    model, tokenizer = tcm.load_model(), tcm.load_tokenizer()
    ids = tokenizer.encode((tcm.CHECKPOINT / tcm.HELDOUT).read_text(encoding="utf-8")).ids
    loss, scored = tcm.mean_nll(model, ids, max_tokens=HELDOUT_TOKENS)
    assert scored == HELDOUT_TOKENS
    baseline = tcm.unigram_nll(
        json.loads((tcm.CHECKPOINT / "training.json").read_text())["unigram_counts"], ids[: scored + 1]
    )
    assert loss < HELDOUT_LOSS_BOUND, (
        f"held-out loss {loss:.3f} nats/token, expected below {HELDOUT_LOSS_BOUND}"
    )
    assert loss < baseline - 1.0, (
        f"held-out loss {loss:.3f} is not clearly below the unigram baseline {baseline:.3f}"
    )


def test_greedy_guard_never_repeats_a_trigram():
    tcm.set_torch_determinism(1)
    model, tokenizer = tcm.load_model(), tcm.load_tokenizer()
    text = tcm.greedy(model, tokenizer, "The scheduler", new_tokens=24)
    ids = tokenizer.encode(text).ids
    grams = [tuple(ids[i : i + 3]) for i in range(len(ids) - 2)]
    assert len(grams) == len(set(grams)), f"a 3-gram repeats in {text!r}"


def test_heldout_split_is_by_path_and_leaves_the_checkpoints_out():
    train, heldout = tcm.corpus_files()
    assert heldout and train and not set(train) & set(heldout)
    assert all(tcm.is_heldout(p) for p in heldout) and not any(tcm.is_heldout(p) for p in train)
    assert not any(p.startswith("mini_vllm/checkpoints/") for p in train + heldout)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_training_script_runs_and_is_deterministic(tmp_path):
    """Three steps, twice, from the same seed: the same weights, and a checkpoint HF can load."""
    digests = []
    for run in ("a", "b"):
        out = tmp_path / run
        record = tcm.train(out, steps=3, seed=0, threads=1)
        assert tcm.read_manifest(out) == {name: tcm.sha256_of(out / name) for name in tcm.HASHED}
        digests.append(tcm.sha256_of(out / "model.safetensors"))
    assert digests[0] == digests[1], (
        "two seeded runs wrote different weights: something in training is not seeded"
    )
    assert record["steps"] == 3 and record["train_tokens"] > 100_000
    tcm.set_torch_determinism(1)
    model = tcm.load_model(out)
    ids = tcm.load_tokenizer(out).encode("The scheduler decides which requests run.").ids
    loss, _ = tcm.mean_nll(model, ids)
    assert loss < 7.0, f"after 3 steps the loss is {loss:.3f}, worse than uniform over 512 tokens (6.24)"
