"""Print one multi-LoRA engine step, end to end, with mini_vllm.lora and the toy model.

Admission (the max_loras walk), slot activation (LRU), the per-row slot indices, and the grouped
apply on the toy model's logits: which greedy token each request gets with and without its adapter.
Run: python phase-11-multi-lora/figures/one_step.py
"""

from __future__ import annotations

import numpy as np

from mini_vllm.lora import LoRAAdapter, LoRASlotManager, admit_waiting, lora_logits
from mini_vllm.model import ToyModel

VOCAB, RANK, MAX_LORAS = 257, 8, 2


def main() -> None:
    model = ToyModel(vocab_size=VOCAB, seed=0)
    adapters = {i: LoRAAdapter.random(VOCAB, VOCAB, RANK, seed=i, std=1.2) for i in (4, 7, 9)}
    manager = LoRASlotManager(MAX_LORAS)
    for lora_id in (4, 7):  # earlier steps left 4 and 7 resident; 7 was used last
        manager.activate_adapter(lora_id, adapters[lora_id])
    print(f"slots before the step: {manager.lora_index_to_id} (LRU first: {manager.resident()})")

    running = [("r0", 7)]
    waiting = [("r1", 9), ("r2", None), ("r3", 4), ("r4", 9)]
    claimed = {lora for _, lora in running if lora is not None}
    admitted = admit_waiting(claimed, [lora for _, lora in waiting], MAX_LORAS)
    batch = running + [waiting[i] for i in admitted]
    deferred = [rid for i, (rid, _) in enumerate(waiting) if i not in admitted]
    print(f"running {running}; waiting {waiting}; max_loras={MAX_LORAS}")
    print(f"admitted {[waiting[i][0] for i in admitted]}, deferred {deferred} (adapter 4 would be a third)")

    for _, lora in batch:
        if lora is not None:
            hit = not manager.activate_adapter(lora, adapters[lora])
            print(f"  activate {lora}: {'hit' if hit else 'load'} -> slots {manager.lora_index_to_id}")
    print(f"slot stats, including the two earlier loads: {manager.stats}")

    ids = [lora for _, lora in batch]
    index = manager.token_lora_indices(ids)
    print(f"batch {[rid for rid, _ in batch]}, adapter ids {ids} -> slot indices {index.tolist()}")

    tokens = np.array([ord(c) for c in "tool"])
    positions = np.array([3, 3, 3, 3])
    base = model.forward(tokens, positions)
    patched = lora_logits(base, tokens, index, manager.slots)
    for row, (rid, lora) in enumerate(batch):
        b, p = int(base[row].argmax()), int(patched[row].argmax())
        change = "same" if b == p else "changed"
        print(f"  {rid} adapter {str(lora):4s}: greedy token base {b:3d}, with adapter {p:3d} ({change}); "
              f"max |delta| {np.abs(patched[row] - base[row]).max():.2f}")


if __name__ == "__main__":
    main()
