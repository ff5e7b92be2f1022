"""Datasheet peaks of the GPUs the lab benchmarks know, looked up from ``torch.cuda.get_device_name()``.

One table for every ``bench.py`` that reports a fraction of peak or predicts a time from one. Each
row pairs a tuple of name tokens with a :class:`DevicePeak`. A row matches a device name when every
one of its tokens appears in the name as a whole word (case-insensitive; letters and digits are word
characters, so "-" and " " separate words), and the first matching row wins. Rows are therefore
ordered most specific first: "GH200 144G" before "GH200" before "H200 NVL" before "H200"; "H100 NVL"
and "H100 PCIe" before the SXM fallback "H100"; "A100 80GB PCIe" before "A100 80GB" (SXM) before
"A100" (40 GB); "L40S" before "L40" before "L4". Whole words keep "L4" from matching "NVIDIA L40",
"H200" from matching "GH200" and "A10" from matching "A100" or "A10G".

Figures are datasheet values. FLOP/s are dense (no sparsity) fp16/bf16 tensor-core peaks: the
datasheets quote them "with sparsity", and the dense figure is half of that.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class DevicePeak:
    """One GPU's datasheet peaks.

    ``dense_bf16_flops`` is ``None`` where no copy of the old per-bench tables carried a figure;
    benches that need FLOP/s treat such a device as not in the table.
    """

    label: str
    hbm_bytes_per_s: float
    dense_bf16_flops: float | None
    reference: str


# (name tokens, peaks). ORDER MATTERS: the first row whose tokens all occur as whole words wins.
# Merged from the six bench.py tables (phase-02 lab-06, phase-04 lab-04, phase-05 lab-05, phase-06
# lab-05, phase-07 lab-05 and lab-06). The copies agreed on every figure they shared; they differed
# only in which devices and variants they listed, and all of those are kept here.
DEVICES: tuple[tuple[tuple[str, ...], DevicePeak], ...] = (
    (("GH200", "144G"), DevicePeak(
        "GH200 (HBM3e)", 4.9e12, 989e12,
        "NVIDIA GH200 Grace Hopper Superchip datasheet, 144GB HBM3e (4.9 TB/s, 1,979 TFLOP/s fp16 sparse)")),
    (("GH200",), DevicePeak(
        "GH200 (HBM3)", 4.0e12, 989e12,
        "NVIDIA GH200 Grace Hopper Superchip datasheet, 96GB HBM3 (4 TB/s, 1,979 TFLOP/s fp16 sparse)")),
    (("H200", "NVL"), DevicePeak(
        "H200 NVL", 4.8e12, 835e12,
        "NVIDIA H200 Tensor Core GPU datasheet, H200 NVL (4.8 TB/s, 1,671 TFLOP/s fp16 sparse)")),
    (("H200",), DevicePeak(
        "H200", 4.8e12, 989e12,
        "NVIDIA H200 Tensor Core GPU datasheet (HBM3e, 4.8 TB/s)")),
    (("H100", "NVL"), DevicePeak(
        "H100 NVL", 3.9e12, 835e12,
        "NVIDIA H100 Tensor Core GPU datasheet, H100 NVL (3.9 TB/s)")),
    (("H100", "PCIe"), DevicePeak(
        "H100 PCIe", 2.0e12, 756e12,
        "NVIDIA H100 Tensor Core GPU datasheet, H100 PCIe (2 TB/s)")),
    # The SXM part reports as "NVIDIA H100 80GB HBM3", with no "SXM" in the name: it is the fallback.
    (("H100",), DevicePeak(
        "H100 SXM", 3.35e12, 989e12,
        "NVIDIA H100 Tensor Core GPU datasheet, H100 SXM (HBM3, 3.35 TB/s)")),
    (("B200",), DevicePeak(
        "B200", 8.0e12, None,
        "NVIDIA HGX B200 datasheet (HBM3e, 8 TB/s per GPU)")),
    (("A100", "80GB", "PCIe"), DevicePeak(
        "A100 80GB PCIe", 1.935e12, 312e12,
        "NVIDIA A100 datasheet, A100 80GB PCIe (1,935 GB/s)")),
    # "NVIDIA A100-SXM4-80GB": the 80 GB name without "PCIe" is the SXM part.
    (("A100", "80GB"), DevicePeak(
        "A100 80GB SXM", 2.039e12, 312e12,
        "NVIDIA A100 datasheet, A100 80GB SXM (2,039 GB/s)")),
    (("A100",), DevicePeak(
        "A100 40GB", 1.555e12, 312e12,
        "NVIDIA A100 datasheet, A100 40GB (1,555 GB/s)")),
    (("L40S",), DevicePeak(
        "L40S", 0.864e12, 362e12,
        "NVIDIA L40S datasheet (864 GB/s)")),
    (("L40",), DevicePeak(
        "L40", 0.864e12, 181e12,
        "NVIDIA L40 datasheet (864 GB/s)")),
    (("L4",), DevicePeak(
        "L4", 0.300e12, 121e12,
        "NVIDIA L4 Tensor Core GPU datasheet (300 GB/s)")),
    (("A10",), DevicePeak(
        "A10", 0.600e12, 125e12,
        "NVIDIA A10 Tensor Core GPU datasheet (600 GB/s)")),
    # T4 has no bf16 tensor cores; the FLOP/s figure is its fp16 tensor-core peak (65 TFLOP/s).
    (("T4",), DevicePeak(
        "T4", 0.320e12, 65e12,
        "NVIDIA T4 Tensor Core GPU datasheet (320 GB/s)")),
    (("RTX", "4090"), DevicePeak(
        "RTX 4090", 1.008e12, None,
        "NVIDIA GeForce RTX 4090 specifications (1,008 GB/s)")),
)


def _has_word(name: str, token: str) -> bool:
    """Whether ``token`` occurs in ``name`` with no letter or digit directly before or after it."""
    pattern = rf"(?<![A-Za-z0-9]){re.escape(token)}(?![A-Za-z0-9])"
    return re.search(pattern, name, re.IGNORECASE) is not None


def lookup(device_name: str) -> DevicePeak | None:
    """The peaks of the first row whose tokens all occur in ``device_name`` as whole words, else None."""
    for tokens, peak in DEVICES:
        if all(_has_word(device_name, t) for t in tokens):
            return peak
    return None
