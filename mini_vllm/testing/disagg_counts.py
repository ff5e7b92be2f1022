"""Count what a prefill/decode split saves: tokens through each engine's forward, per prompt.

Builds the tiny Llama (``course/runtime/tiny_model.py``), then for each prompt length runs one
engine alone and the ``DisaggProxy`` pair (``kv_producer`` + ``kv_consumer`` sharing a temporary
store), one request at a time, greedy, ``MAX_TOKENS`` tokens, block size 16. Prints the tokens the
producer stored, the consumer loaded, and the forward tokens of each side. Needs torch and
transformers (to write the checkpoint); the engines themselves are numpy.
``python -m mini_vllm.testing.disagg_counts``.
"""

from __future__ import annotations

import tempfile

import numpy as np

from ..config import KVTransferConfig
from ..engine import LLMEngine
from ..entrypoints.disagg_proxy import DisaggProxy
from ..sampling_params import SamplingParams

BS, NB, MAX_TOKENS = 16, 64, 6
LENGTHS = (5, 16, 17, 40, 100)


def count_forward_tokens(engine: LLMEngine) -> list[int]:
    """Wrap the model's forward: the returned list's one entry grows by the tokens each forward sees."""
    model = engine.model_executor.driver_worker.model_runner.model
    counter, forward = [0], model.forward

    def counting(input_ids, *args, **kwargs):
        counter[0] += len(input_ids)
        return forward(input_ids, *args, **kwargs)

    model.forward = counting
    return counter


def main() -> None:
    from course.runtime import tiny_model

    work = tempfile.mkdtemp(prefix="disagg_counts_")
    checkpoint = str(tiny_model.build(f"{work}/tiny-llama"))
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0, ignore_eos=True)
    rng = np.random.default_rng(15)

    def engine(role: str | None) -> LLMEngine:
        cfg = (
            None
            if role is None
            else KVTransferConfig("ExampleConnector", role, {"shared_storage_path": work})
        )
        return LLMEngine(model=checkpoint, block_size=BS, num_gpu_blocks=NB, kv_transfer_config=cfg)

    print(f"block size {BS}, {MAX_TOKENS} greedy tokens per prompt; forward tokens per engine")
    print(" prompt  P stored  D loaded  P forward  D forward  one engine  same tokens")
    for n in LENGTHS:
        prompt = [int(t) for t in rng.integers(3, 512, size=n)]
        alone, producer, consumer = engine(None), engine("kv_producer"), engine("kv_consumer")
        counts = [count_forward_tokens(e) for e in (alone, producer, consumer)]
        want = alone.generate([prompt], params)[0].token_ids
        got = DisaggProxy(producer, consumer).generate([prompt], params)[0].token_ids
        runner = producer.model_executor.driver_worker.model_runner
        per_token = sum(kv[:, 0, 0].nbytes for kv in runner.kv_caches)  # K and V of one token, every layer
        stored = runner.kv_connector.bytes_saved
        loaded = consumer.scheduler.num_external_computed_tokens
        print(
            f"{n:7d}  {stored // per_token:8d}  {loaded:8d}  {counts[1][0]:9d}  {counts[2][0]:9d}  "
            f"{counts[0][0]:10d}  {got == want}"
        )


if __name__ == "__main__":
    main()
