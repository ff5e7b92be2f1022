"""Nearby checks for ``vllm/utils/torch_utils.py``: behaviour any fix of the module must keep.

They pass on the pinned file (``make test`` runs them there) and ``python -m course defect grade``
runs them again on a patched copy. They never rely on pinned memory, which a CPU-only host lacks.
"""

import importlib
import inspect
import platform

import numpy as np
import pytest
import torch

pytestmark = pytest.mark.upstream  # (an unknown marker where the grader runs it: harmless)


@pytest.fixture(scope="module")
def tu():
    return importlib.import_module("vllm.utils.torch_utils")


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.float32])
def test_async_tensor_h2d_unpinned_keeps_values_dtype_and_device(dtype, tu):
    data = [3, 1, 4, 1, 5]
    t = tu.async_tensor_h2d(data, dtype, "cpu", pin_memory=False)
    assert t.dtype == dtype and t.device.type == "cpu"
    assert t.tolist() == data
    meta = tu.async_tensor_h2d(data, dtype, torch.device("meta"), False)  # the fourth argument, positionally
    assert meta.device.type == "meta" and meta.shape == (5,) and meta.dtype == dtype


@pytest.mark.skipif("microsoft" in " ".join(platform.uname()).lower(), reason="WSL never pins")
def test_async_tensor_h2d_default_pins_where_the_platform_can(tu, monkeypatch):
    """A fix must not switch pinning off for everyone: where the platform can pin, the default pins.
    (This host cannot pin, so the check records what was asked and builds the tensor unpinned.)"""
    from vllm.utils import platform_utils

    monkeypatch.setattr(platform_utils, "is_pin_memory_available", lambda: True)
    asked, real = [], torch.tensor

    def spy(*args, **kwargs):
        asked.append(kwargs.get("pin_memory"))
        return real(*args, **{**kwargs, "pin_memory": False})

    monkeypatch.setattr(torch, "tensor", spy)
    t = tu.async_tensor_h2d([1, 2], torch.int64, "cpu")
    assert asked == [True], f"the default asked for pin_memory={asked}; a platform that can pin must get True"
    assert t.tolist() == [1, 2]


def test_async_tensor_h2d_keeps_its_parameters(tu):
    params = list(inspect.signature(tu.async_tensor_h2d).parameters)
    assert params == ["data", "dtype", "device", "pin_memory"], params


def test_make_tensor_with_pad_pads_to_the_longest_row_or_max_len(tu):
    t = tu.make_tensor_with_pad([[1, 2], [3], []], pad=-1, dtype=torch.int64)
    assert t.tolist() == [[1, 2], [3, -1], [-1, -1]]
    t = tu.make_tensor_with_pad([[1, 2], [3]], pad=0, dtype=torch.int32, max_len=4)
    assert t.tolist() == [[1, 2, 0, 0], [3, 0, 0, 0]] and t.dtype == torch.int32
    a = tu.make_ndarray_with_pad([[7], [8, 9]], pad=0, dtype=np.int64)
    assert a.tolist() == [[7, 0], [8, 9]]


def test_dtype_helpers(tu):
    assert tu.get_dtype_size(torch.float16) == 2 and tu.get_dtype_size(torch.int64) == 8
    assert tu.is_lossless_cast(torch.float16, torch.float32)
    assert not tu.is_lossless_cast(torch.float32, torch.float16)
    assert tu.common_broadcastable_dtype([torch.float16, torch.float32]) == torch.float32
