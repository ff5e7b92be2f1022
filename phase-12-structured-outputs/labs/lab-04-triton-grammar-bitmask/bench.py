"""Benchmark the lab's grammar-bitmask kernel against vLLM's ``_apply_grammar_bitmask_kernel``.

On a CUDA machine:   python phase-12-structured-outputs/labs/lab-04-triton-grammar-bitmask/bench.py
                     (--impl starter benchmarks your starter.py)
Anywhere, no GPU:    python phase-12-structured-outputs/labs/lab-04-triton-grammar-bitmask/bench.py --predict
                     prints the bytes each shape moves and the time those take at the datasheet
                     bandwidth (a floor, not a measurement).

Shapes: Qwen2.5's padded vocabulary (151,936) and Llama 3's (128,256), float32 logits, with
half of the rows constrained (the others have no grammar), at a decode batch of 8, 64 and 256
rows and at 256 x 5 rows (speculative decoding with 4 drafts: one bitmask row per position).
Each constrained row allows 1 % of the vocabulary, as a JSON grammar typically does (a grammar
state admits few tokens), so nearly every logit of a constrained row is written.

Bytes per launch = constrained rows x (4 x ceil(V/32) bitmask bytes read + 4 x V x banned fraction
logits bytes written). The kernel never reads the logits, and unconstrained rows cost nothing.
"""

from __future__ import annotations

import sys
from functools import partial

from course.runtime.bench import bench_main, device_bandwidth
from course.runtime.devices import lookup

PREDICT = lookup("NVIDIA H100 80GB HBM3")    # the datasheet row of an H100 SXM (the name it reports)
VOCABS = [151936, 128256]
ROWS = [8, 64, 256, 1280]
ALLOWED = 0.01


def nbytes(rows: int, vocab: int) -> float:
    constrained = rows // 2
    return constrained * (4 * -(-vocab // 32) + 4 * vocab * (1 - ALLOWED))


def predict(lab, args) -> None:
    name, bw = PREDICT.label, PREDICT.hbm_bytes_per_s
    print(f"predicted for {name}: {bw / 1e12:.2f} TB/s HBM; float32 logits, half the rows constrained,")
    print(f"{ALLOWED:.0%} of the vocabulary allowed per constrained row")
    print(f"{'vocab':>7} {'rows':>5} {'MB moved':>9} {'floor us':>9}")
    for vocab in VOCABS:
        for rows in ROWS:
            b = nbytes(rows, vocab)
            print(f"{vocab:>7} {rows:>5} {b / 1e6:9.2f} {b / bw * 1e6:9.2f}")
    print("floor = bytes / bandwidth, bytes = rows/2 x (4 ceil(V/32) + 4 V x 0.99).")
    print("At 8 rows the launch overhead (a few us) dominates; from 64 rows on the kernel should approach the floor.")


def make_problem(rows: int, vocab: int):
    import torch

    g = torch.Generator(device="cuda").manual_seed(0)
    logits = torch.randn(rows, vocab, device="cuda", generator=g)
    allowed = torch.rand(rows // 2, vocab, device="cuda", generator=g) < ALLOWED
    words = -(-vocab // 32)
    padded = torch.zeros(rows // 2, words * 32, dtype=torch.int64, device="cuda")
    padded[:, :vocab] = allowed.long()
    shifts = torch.arange(32, device="cuda", dtype=torch.int64)
    packed = (padded.view(rows // 2, words, 32) << shifts).sum(-1)
    bitmask = torch.where(packed >= 2**31, packed - 2**32, packed).to(torch.int32)
    indices = torch.arange(0, rows, 2, dtype=torch.int32, device="cuda")
    return logits, bitmask, indices


def vllm_apply(logits, bitmask, indices):
    from vllm.triton_utils import triton
    from vllm.v1.worker.gpu.structured_outputs import _apply_grammar_bitmask_kernel

    grid = (bitmask.shape[0], triton.cdiv(logits.shape[1], 8192))
    _apply_grammar_bitmask_kernel[grid](logits, logits.stride(0), indices, bitmask, bitmask.stride(0),
                                        logits.shape[1], BLOCK_SIZE=8192)


def measure(lab, args) -> int:
    import torch
    from triton.testing import do_bench

    bw = device_bandwidth()
    if bw is None:
        return 2
    print(f"{'vocab':>7} {'rows':>5} {'vLLM us':>8} {'lab us':>8} {'ratio':>6} {'GB/s':>7} {'% HBM':>6} {'floor us':>9}")
    for vocab in VOCABS:
        for rows in ROWS:
            logits, bitmask, indices = make_problem(rows, vocab)
            want, got = logits.clone(), logits.clone()
            vllm_apply(want, bitmask, indices)
            lab.apply_token_bitmask(got, bitmask, indices)
            if not torch.equal(want, got):
                print(f"{vocab:>7} {rows:>5}: the lab's result differs from vLLM's; not timed")
                return 1
            t_vllm = do_bench(partial(vllm_apply, logits.clone(), bitmask, indices)) * 1e-3
            t_lab = do_bench(partial(lab.apply_token_bitmask, logits.clone(), bitmask, indices)) * 1e-3
            b = nbytes(rows, vocab)
            print(f"{vocab:>7} {rows:>5} {t_vllm * 1e6:8.1f} {t_lab * 1e6:8.1f} {t_vllm / t_lab:5.2f}x "
                  f"{b / t_lab / 1e9:7.0f} {100 * b / t_lab / bw:5.1f}% {b / bw * 1e6:9.2f}")
    print("ratio > 1: the lab's kernel is faster than vLLM's. Re-applying the mask to the same logits is "
          "idempotent, so do_bench's repeats measure the same work.")
    return 0


if __name__ == "__main__":
    sys.exit(bench_main(__file__, __doc__, measure, predict))
