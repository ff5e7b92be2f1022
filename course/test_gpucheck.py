"""The rented-GPU route: the gpu extra never asks for the CPU course's torch; results files are checked."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest

from course import ROOT, gpucheck

SAMPLE = Path(__file__).with_name("samples") / "gpu-results.sample.json"


def test_the_gpu_extra_leaves_torch_to_vllm():
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    gpu = extras["gpu"]
    assert "vllm==0.22.1" in gpu
    named = " ".join(gpu).lower()
    assert "torch" not in named and "triton" not in named, "vllm 0.22.1 pins its own torch; the gpu extra must not"
    assert not any("vllm-mastery[" in d for d in gpu), "the gpu extra must not pull the torch/triton/dev extras"
    assert any(d.startswith("torch==2.13.0") for d in extras["torch"]), "the CPU route keeps its torch pin"


def test_the_sample_reads_back_with_its_label_and_skips_failed_runs():
    shown = gpucheck.measured_outputs(ROOT, folder=SAMPLE.parent, allow_sample=True)
    assert list(shown) == ["python bench.py"], "a run with rc != 0 is never shown as measured"
    header, line = shown["python bench.py"]
    assert header.startswith("SAMPLE, not a measurement: measured on Sample GPU")
    assert "course/samples/gpu-results.sample.json" in header and line.startswith("SAMPLE")
    with pytest.raises(gpucheck.ResultsError, match="not a measurement"):
        gpucheck.measured_outputs(ROOT, folder=SAMPLE.parent)


def test_a_malformed_results_file_is_an_error(tmp_path: Path):
    data = json.loads(SAMPLE.read_text())
    del data["driver"]
    (tmp_path / "x.json").write_text(json.dumps(data))
    with pytest.raises(gpucheck.ResultsError, match="missing driver"):
        gpucheck.load_results(tmp_path, allow_sample=True)


def test_device_names_become_stable_file_names():
    assert gpucheck.device_slug("NVIDIA H100 80GB HBM3") == "nvidia-h100-80gb-hbm3"
    assert gpucheck.device_slug("Tesla T4") == "tesla-t4"


def test_gpu_check_covers_every_bench_and_run_script():
    commands = gpucheck.gpu_commands(ROOT)
    on_disk = sorted(ROOT.glob("phase-*/labs/lab-*/bench.py")) + sorted(ROOT.glob("phase-*/labs/lab-*/run.py"))
    assert len(commands) == len(on_disk) > 0
    assert all(c.startswith("python phase-") for c in commands)


def test_no_results_file_under_results_gpu_is_a_sample():
    gpucheck.load_results(ROOT / gpucheck.RESULTS_DIR)  # raises on a sample or a malformed file


def test_the_install_check_reads_torch_from_vllms_own_pin():
    reqs = ["numpy", 'torch==2.11.0', 'torchaudio==2.11.0', 'matplotlib; extra == "bench"']
    assert gpucheck.pinned_torch(reqs) == "2.11.0"
    assert gpucheck.pinned_torch(["torchvision==0.26.0"]) is None
