"""Checkpoint → model: read safetensors into numpy, build the class ``config.json`` names, load it.

Mirrors vllm/model_executor/model_loader/weight_utils.py:893 — safetensors_weights_iterator
(every ``*.safetensors`` file of the directory, tensor by tensor) and
vllm/model_executor/model_loader/default_loader.py:382 — DefaultModelLoader.load_weights
(build the model from the registry, feed it the weights through its own ``load_weights``, then
refuse a model whose parameters were not all filled, naming them). The model's ``load_weights`` does the HF →
vLLM renaming (``stacked_params_mapping``, see ``llama.py``) and refuses extra or mis-shaped
tensors by name.

The safetensors format is read here by hand, as it is simple: 8 bytes of header length
(little-endian), a JSON header ``{name: {dtype, shape, data_offsets}}``, then the raw bytes.
bfloat16 and float16 tensors come out float32 (bfloat16 is the top half of a float32).

Left out: ``.bin`` / ``.pt`` / GGUF checkpoints, the hub download, sharded-index files (every
``*.safetensors`` in the directory is read, sorted), quantized weights, memory mapping onto a
device, ``process_weights_after_loading``.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from .interfaces import is_pooling_model
from .registry import ModelRegistry

_DTYPES = {
    "F64": np.float64,
    "F32": np.float32,
    "F16": np.float16,
    "BF16": np.uint16,  # widened to float32 below
    "I64": np.int64,
    "I32": np.int32,
    "I16": np.int16,
    "I8": np.int8,
    "U8": np.uint8,
    "BOOL": np.bool_,
}


def bf16_to_float32(bits: np.ndarray) -> np.ndarray:
    """bfloat16 bit patterns (uint16) → float32: the 16 bits are the float32's top half."""
    return (bits.astype(np.uint32) << 16).view(np.float32)


def read_safetensors(path: str | Path) -> Iterator[tuple[str, np.ndarray]]:
    """``(name, array)`` for every tensor of one file, in the header's order; floats become float32."""
    path = Path(path)
    data = path.read_bytes()
    if len(data) < 8:
        raise ValueError(f"{path}: too short to be a safetensors file")
    (header_len,) = struct.unpack("<Q", data[:8])
    try:
        header = json.loads(data[8 : 8 + header_len])
    except ValueError as exc:
        raise ValueError(f"{path}: the safetensors header is not JSON ({exc})") from None
    base = 8 + header_len
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dtype = _DTYPES.get(info["dtype"])
        if dtype is None:
            raise ValueError(
                f"{path}: tensor {name!r} has dtype {info['dtype']}, which mini_vllm does not read"
            )
        start, end = info["data_offsets"]
        array = np.frombuffer(
            data, dtype=dtype, count=(end - start) // np.dtype(dtype).itemsize, offset=base + start
        )
        array = array.reshape(info["shape"])
        if info["dtype"] == "BF16":
            array = bf16_to_float32(array)
        elif info["dtype"] == "F16":
            array = array.astype(np.float32)
        yield name, array.copy()


def safetensors_weights_iterator(model_dir: str | Path) -> Iterator[tuple[str, np.ndarray]]:
    """Every tensor of every ``*.safetensors`` file in ``model_dir`` (files sorted by name)."""
    for file in sorted(Path(model_dir).glob("*.safetensors")):
        yield from read_safetensors(file)


def load_weights_into(model: Any, weights, where: str = "the checkpoint") -> None:
    """``DefaultModelLoader.load_weights``: feed the weights, then name every parameter left empty."""
    loaded = model.load_weights(weights)
    expected = {name for name, _ in model.named_parameters()} if hasattr(model, "named_parameters") else set()
    if expected - loaded:
        if hasattr(model, "missing_checkpoint_tensors"):
            missing = model.missing_checkpoint_tensors(loaded)
        else:
            missing = sorted(expected - loaded)
        raise ValueError(f"{where} lacks tensors the model needs: {', '.join(missing)}")


def get_model(model_config: Any) -> Any:
    """The model ``model_config`` describes, its weights loaded from ``model_config.model``.

    The class comes from ``ModelRegistry`` by the checkpoint's ``architectures``; a model with
    parameters needs ``*.safetensors`` next to ``config.json``. A pooling model is built with
    ``model_config.pooler_config``'s pooling type (refused for a generative model).
    """
    model_cls, arch = ModelRegistry.resolve_model_cls(model_config.architectures)
    pooler_config = getattr(model_config, "pooler_config", None)
    if is_pooling_model(model_cls):
        pooling_type = pooler_config.seq_pooling_type if pooler_config is not None else None
        model = model_cls(model_config.hf_config, pooling_type=pooling_type)
    elif pooler_config is not None:
        raise ValueError(f"pooler_config is for pooling models; {arch} generates text")
    else:
        model = model_cls(model_config.hf_config)
    params = list(model.named_parameters()) if hasattr(model, "named_parameters") else []
    model_dir = Path(model_config.model) if model_config.model is not None else None
    files = sorted(model_dir.glob("*.safetensors")) if model_dir is not None and model_dir.is_dir() else []
    if params and not files:
        raise ValueError(
            f"{model_dir}: no *.safetensors weights for {type(model).__name__}'s {len(params)} parameters"
        )
    if files:
        load_weights_into(model, safetensors_weights_iterator(model_dir), where=str(model_dir))
    return model
