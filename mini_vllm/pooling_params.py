"""``PoolingParams``: what a pooling request asks for, as ``SamplingParams`` is for generation.

Mirrors vllm/pooling_params.py:37 — PoolingParams with the two fields mini uses: ``task``
(``"embed"``: one vector per prompt; ``"token_embed"``: one vector per prompt token; the names of
vllm/tasks.py:8 — PoolingTask) and ``use_activation`` (for the embed tasks: L2-normalise the
output; ``None`` means the default, ``True``, as vllm/pooling_params.py:161 —
PoolingParams._set_default_parameters sets it). Earlier vLLM versions called this switch
``normalize``; at the pin it is ``use_activation``. ``task`` left ``None`` is filled in by the
engine from the model's supported tasks (vllm/v1/engine/input_processor.py:81 —
InputProcessor._validate_params), so ``verify`` takes the task the request resolved to.

Left out: ``dimensions`` (Matryoshka truncation), the classify tasks, step pooling, plugins,
late interaction. ``skip_reading_prefix_cache`` is not a field: the ``Request`` sets it for
``token_embed``, upstream's default (vllm/pooling_params.py:124).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

POOLING_TASKS = ("embed", "token_embed")


@dataclass
class PoolingParams:
    use_activation: bool | None = None
    task: str | None = None

    def __post_init__(self) -> None:
        if self.use_activation is not None and not isinstance(self.use_activation, bool):
            raise TypeError(f"use_activation must be a bool or None, got {self.use_activation!r}")
        if self.task is not None and self.task not in POOLING_TASKS:
            raise ValueError(f"unknown pooling task {self.task!r}; mini_vllm knows {list(POOLING_TASKS)}")

    def clone(self) -> PoolingParams:
        return replace(self)

    def verify(self, task: str) -> PoolingParams:
        """A copy with ``task`` set and the defaults filled in (``use_activation=True``)."""
        if self.task is not None and self.task != task:
            raise ValueError(f"these PoolingParams are for task {self.task!r}, not {task!r}")
        if task not in POOLING_TASKS:
            raise ValueError(f"unknown pooling task {task!r}; mini_vllm knows {list(POOLING_TASKS)}")
        use_activation = True if self.use_activation is None else self.use_activation
        return PoolingParams(use_activation=use_activation, task=task)
