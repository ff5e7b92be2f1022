"""Loaded inside the tier-2 engine's processes to let LoRA run on a machine without a GPU.

``vllm.utils.torch_utils.async_tensor_h2d`` takes ``pin_memory=PIN_MEMORY`` as its default, bound at
import to True on Linux; LoRA's ``convert_mapping`` calls it without the argument, and the engine
venv's torch (a CUDA build) then fails with "Found no NVIDIA driver". Importing this module sets that
default to False in the importing process. The LoRA job names ``UnpinnedH2D`` as the engine's
``worker_extension_cls``, so vLLM itself imports this module in its worker process (the one that
runs the model), where a patch made by the job's own process would not reach.
"""

from vllm.utils import torch_utils

torch_utils.async_tensor_h2d.__defaults__ = (False,)


class UnpinnedH2D:
    """An empty worker extension: its only purpose is to get this module imported in the worker."""
