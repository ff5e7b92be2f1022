"""course.runtime.devices.lookup maps real torch.cuda.get_device_name() strings to the right datasheet row."""

from __future__ import annotations

import pytest

from course.runtime.devices import DEVICES, DevicePeak, lookup

CASES = [
    ("NVIDIA H100 80GB HBM3", "H100 SXM"),
    ("NVIDIA H100 PCIe", "H100 PCIe"),
    ("NVIDIA H100 NVL", "H100 NVL"),
    ("NVIDIA H200", "H200"),
    ("NVIDIA H200 NVL", "H200 NVL"),
    ("NVIDIA GH200 480GB", "GH200 (HBM3)"),
    ("NVIDIA GH200 144G HBM3e", "GH200 (HBM3e)"),
    ("NVIDIA A100-SXM4-80GB", "A100 80GB SXM"),
    ("NVIDIA A100 80GB PCIe", "A100 80GB PCIe"),
    ("NVIDIA A100-SXM4-40GB", "A100 40GB"),
    ("NVIDIA A100-PCIE-40GB", "A100 40GB"),
    ("NVIDIA L40S", "L40S"),
    ("NVIDIA L40", "L40"),
    ("NVIDIA L4", "L4"),
    ("NVIDIA A10", "A10"),
    ("Tesla T4", "T4"),
    ("NVIDIA GeForce RTX 4090", "RTX 4090"),
    ("NVIDIA B200", "B200"),
]


@pytest.mark.parametrize(("name", "label"), CASES)
def test_real_device_names_map_to_their_row(name: str, label: str) -> None:
    peak = lookup(name)
    assert peak is not None and peak.label == label


@pytest.mark.parametrize("name", ["NVIDIA GeForce GTX 1080", "NVIDIA A10G", "AMD Instinct MI300X", ""])
def test_unknown_names_give_none(name: str) -> None:
    assert lookup(name) is None


def test_figures_used_by_the_benches() -> None:
    h100 = lookup("NVIDIA H100 80GB HBM3")
    assert h100 == DevicePeak("H100 SXM", 3.35e12, 989e12, h100.reference)
    assert lookup("NVIDIA L40").hbm_bytes_per_s == 864e9
    assert lookup("NVIDIA L4").hbm_bytes_per_s == 300e9


def test_every_row_is_reachable_and_cited() -> None:
    """No row is shadowed by an earlier, more general one, and each names its datasheet."""
    for tokens, peak in DEVICES:
        assert lookup("NVIDIA " + " ".join(tokens)) is peak, tokens
        assert "datasheet" in peak.reference or "specifications" in peak.reference


@pytest.mark.parametrize(("name", "label"), [("NVIDIA H200", "H200"), ("NVIDIA GeForce GTX 1080", None)])
def test_device_bandwidth_prints_the_row_it_uses_or_says_how_to_add_one(monkeypatch, capsys, name, label) -> None:
    import torch

    from course.runtime.bench import device_bandwidth

    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: name)
    bw = device_bandwidth()
    out = capsys.readouterr().out
    if label is None:
        assert bw is None and "add it to course/runtime/devices.py" in out, out
    else:
        assert bw == lookup(name).hbm_bytes_per_s and out.startswith(f"device: {name}; "), out
