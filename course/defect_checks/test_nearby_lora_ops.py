"""Nearby checks for ``vllm/lora/ops/torch_ops/lora_ops.py``: the CPU LoRA ops on rows that *have* an
adapter (slot 0 .. n-1), against a per-row loop; weights are never written; shapes and offsets hold.

They pass on the pinned file (``make test`` runs them there) and ``python -m course defect grade``
runs them again on a patched copy. Index -1 (no adapter) is deliberately left out: that is the defect.
"""

import importlib

import pytest
import torch

pytestmark = pytest.mark.upstream  # (an unknown marker where the grader runs it: harmless)


@pytest.fixture(scope="module")
def ops():
    return importlib.import_module("vllm.lora.ops.torch_ops.lora_ops")


SLOTS, IN, OUT = 3, 8, 6


def make(seed, rows):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, IN, generator=g)
    a = torch.randn(SLOTS, OUT, IN, generator=g)  # (slots, out, in), as the ops index them
    base = torch.randn(rows, OUT, generator=g)
    return x, a, base


def per_row(x, w, idx):
    return torch.stack([w[i] @ x[r] for r, i in enumerate(idx.tolist())])


@pytest.mark.parametrize("idx", [[0, 1, 2, 2], [2, 2, 2], [1]])
@pytest.mark.parametrize("add", [True, False])
def test_bgmv_expand_every_slot(idx, add, ops):
    idx = torch.tensor(idx)
    x, w, base = make(len(idx), len(idx))
    before = w.clone()
    out = base.clone()
    ops.bgmv_expand(x, w, out, idx, add_inputs=add)
    want = per_row(x, w, idx) + (base if add else 0)
    torch.testing.assert_close(out, want)
    assert torch.equal(w, before), "the op must not write the LoRA weights"


def test_bgmv_shrink_scales_every_slot(ops):
    idx = torch.tensor([2, 0, 1, 2])
    x, w, _ = make(1, 4)
    out = torch.zeros(4, OUT + 2)
    ops.bgmv_shrink(x, w, out, idx, scaling=0.5)
    torch.testing.assert_close(out[:, :OUT], 0.5 * per_row(x, w, idx))
    assert not out[:, OUT:].any(), "columns past the rank stay as they were"


def test_bgmv_expand_slice_writes_only_its_columns(ops):
    idx = torch.tensor([0, 2, 1])
    x, w, _ = make(2, 3)
    out = torch.ones(3, OUT + 4)
    ops.bgmv_expand_slice(x, w, out, idx, slice_offset=2, slice_size=OUT, add_inputs=True)
    torch.testing.assert_close(out[:, 2 : 2 + OUT], 1 + per_row(x, w, idx))
    assert torch.equal(out[:, :2], torch.ones(3, 2)) and torch.equal(out[:, 2 + OUT :], torch.ones(3, 2))


def test_sgmv_ops_explode_sequences_into_rows(ops):
    seq = torch.tensor([2, 1, 3])
    lora = torch.tensor([1, 0, 2])
    rows = torch.repeat_interleave(lora, seq)
    x, w, base = make(3, 6)
    out = base.clone()
    start = torch.tensor([0, 2, 3])
    ops.sgmv_expand(x, w, out, start, seq, lora, 3, 3, 6, add_inputs=True)
    torch.testing.assert_close(out, base + per_row(x, w, rows))
    shrunk = torch.zeros(6, OUT)
    ops.sgmv_shrink(x, w, shrunk, start, seq, lora, 3, 3, 6, 2.0)
    torch.testing.assert_close(shrunk, 2.0 * per_row(x, w, rows))


def test_four_dimensional_weights_and_a_broadcast_row(ops):
    x, w, base = make(4, 1)
    out = base.expand(3, OUT).clone()
    ops.bgmv_expand(x, w.unsqueeze(1), out, torch.tensor([1]), add_inputs=True)
    # one LoRA row against three output rows: the row is broadcast to all of them
    torch.testing.assert_close(out, base.expand(3, OUT) + (w[1] @ x[0]))
