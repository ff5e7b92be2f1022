"""Drive vLLM 0.22.1's ``ExampleConnector`` with the real ``Scheduler``, both roles, on a CPU.

The scheduler-role connector is built inside the real ``Scheduler`` (``kv_transfer_config``); the
worker-role one comes from ``KVConnectorFactory``. No model runs: the caller hands in each layer's
paged KV as a numpy array, and the worker side saves or loads it as the model runner would (one
``save_kv_layer`` per layer, one ``start_load_kv`` with a forward context holding every layer).
Used by ``mini_vllm/test_upstream_kv_connector.py`` and Phase 15 lab 03.
"""

from __future__ import annotations

import types
from dataclasses import dataclass

import numpy as np

# isort: off
from course.runtime import real_vllm as rv

import torch
from vllm.config import KVTransferConfig
from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
from vllm.distributed.kv_transfer.kv_connector.v1.example_connector import ExampleConnector
# isort: on

LAYERS = [f"layer.{i}" for i in range(rv.NUM_LAYERS)]
NUM_KV_HEADS, HEAD_SIZE = rv.NUM_KV_HEADS, rv.HEAD_SIZE


@dataclass
class Step:
    """One ``schedule()`` of a real engine with a connector: what ran and what moved."""

    num_scheduled_tokens: dict[str, int]
    num_computed_tokens: dict[str, int]  # at admission: local + external hits
    block_ids: dict[str, list[int]]
    transfers: list[tuple[bool, list[int], list[int]]]  # (is_store, key tokens, slots) per ReqMeta


class RealEngineSide:
    """A real ``Scheduler`` with an ``ExampleConnector`` (scheduler role) plus its worker role."""

    def __init__(
        self,
        store: str,
        role: str,
        *,
        block_size: int = 16,
        num_gpu_blocks: int = 64,
        connector_cls: type | None = None,
    ) -> None:
        extra = {"shared_storage_path": store}
        kv_config = KVTransferConfig(
            kv_connector="ExampleConnector", kv_role=role, kv_connector_extra_config=extra
        )
        self.vllm_config = rv.make_vllm_config(
            block_size=block_size, num_gpu_blocks=num_gpu_blocks, kv_transfer_config=kv_config
        )
        self.scheduler = rv.make_scheduler(self.vllm_config)
        if connector_cls is None:
            self.worker = KVConnectorFactory.create_connector(
                config=self.vllm_config,
                role=KVConnectorRole.WORKER,
                kv_cache_config=self.scheduler.kv_cache_config,
            )
        else:
            self.worker = connector_cls(
                self.vllm_config, KVConnectorRole.WORKER, self.scheduler.kv_cache_config
            )
        self.block_hasher = rv.make_block_hasher(self.vllm_config)
        self.out = None

    def add(self, rid: str, prompt: list[int], max_tokens: int) -> None:
        self.scheduler.add_request(
            rv.make_request(rid, prompt, max_tokens=max_tokens, block_hasher=self.block_hasher)
        )

    def schedule(self) -> Step:
        out = self.out = self.scheduler.schedule()
        meta = out.kv_connector_metadata
        return Step(
            num_scheduled_tokens=dict(out.num_scheduled_tokens),
            num_computed_tokens={r.req_id: r.num_computed_tokens for r in out.scheduled_new_reqs},
            block_ids={r.req_id: list(r.block_ids[0]) for r in out.scheduled_new_reqs},
            transfers=[(m.is_store, m.token_ids.tolist(), m.slot_mapping.tolist()) for m in meta.requests],
        )

    def save(self, kv: dict[str, np.ndarray]) -> None:
        """The worker side's saves for this step: ``save_kv_layer`` per layer, then ``wait_for_save``."""
        self.worker.bind_connector_metadata(self.out.kv_connector_metadata)
        for name in LAYERS:
            self.worker.save_kv_layer(name, torch.from_numpy(kv[name]), attn_metadata=types.SimpleNamespace())
        self.worker.wait_for_save()
        self.worker.clear_connector_metadata()

    def load(self, kv: dict[str, np.ndarray]) -> None:
        """The worker side's loads for this step into ``kv`` (numpy arrays, written in place)."""
        self.worker.bind_connector_metadata(self.out.kv_connector_metadata)
        layers = {name: types.SimpleNamespace(kv_cache=torch.from_numpy(kv[name])) for name in LAYERS}
        attn = {name: types.SimpleNamespace() for name in LAYERS}
        self.worker.start_load_kv(types.SimpleNamespace(no_compile_layers=layers, attn_metadata=attn))
        self.worker.clear_connector_metadata()


__all__ = ["ExampleConnector", "LAYERS", "RealEngineSide", "Step"]
