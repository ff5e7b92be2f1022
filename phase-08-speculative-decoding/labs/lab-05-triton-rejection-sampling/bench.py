"""Benchmark the lab's fused rejection kernel against vLLM's two kernels on the random path.

On a CUDA machine:   python phase-08-speculative-decoding/labs/lab-05-triton-rejection-sampling/bench.py
                     (--impl starter benchmarks your starter.py)
Anywhere, no GPU:    python phase-08-speculative-decoding/labs/lab-05-triton-rejection-sampling/bench.py --predict
                     prints the bytes each side must move and the time that takes at the datasheet bandwidth
                     (a floor, not a measurement).

Shapes: 256 requests, k = 4 or 8 drafts each, vocabularies of 32,000 (Llama 2) and 128,256 (Llama 3),
float32 probability rows. vLLM (``rejection_sample``'s random path) runs ``sample_recovered_tokens_kernel``
over every (request, position), each program reading the draft row q, the target row p and the
request's 1/E row, then ``rejection_random_sample_kernel`` walks the drafts. The lab's kernel walks the
drafts and reads the three rows only at a request's first rejection. Bytes are what each kernel must read
and write (the lab's: ``predicted_bytes``; vLLM's: 3 rows x 4 B x vocab per draft, plus the walk).
"""

from __future__ import annotations

import sys
from functools import partial

from course.runtime.bench import bench_main, device_bandwidth

PREDICT = ("H100 SXM", 3.35e12)
BATCH = 256
SHAPES = [(4, 32000), (8, 32000), (4, 128256), (8, 128256)]
WALK = 4 + 8 + 4 + 4 + 4      # per draft looked at: id, uniform, p(x), q(x), stored token


def vllm_bytes(batch: int, k: int, vocab: int, looked: float, rejected: float) -> float:
    """vLLM's two kernels: every draft position reads three float32 rows and writes its recovered id, then the walk."""
    recovered = batch * k * (3 * 4 * vocab + 4 + 4)          # rows + draft id + recovered id written
    walk = batch * 8 + looked * WALK + rejected * 4 + (batch - rejected) * 8
    return recovered + walk


def lab_bytes_expected(batch: int, k: int, vocab: int, alpha: float) -> tuple[float, float, float]:
    """Expected (bytes, drafts looked at, rejected requests) of the fused kernel at i.i.d. acceptance alpha."""
    looked_per_req = sum(alpha**i for i in range(k))         # draft i is looked at if the i before it survived
    reject = 1 - alpha**k
    nbytes = batch * (8 + looked_per_req * WALK + reject * 3 * 4 * vocab + (1 - reject) * 8)
    return nbytes, batch * looked_per_req, batch * reject


def predict(lab, args) -> None:
    name, bw = PREDICT
    print(f"predicted for {name} ({bw / 1e12:.2f} TB/s), batch {BATCH}, float32 rows; "
          f"floors are bytes / bandwidth, not measurements")
    print(f"{'alpha':>5} {'k':>2} {'vocab':>7} {'vLLM MB':>9} {'fused MB':>9} {'bytes ratio':>11} {'vLLM us':>8} {'fused us':>9}")
    for alpha in (0.3, 0.7):
        for k, vocab in SHAPES:
            mine, looked, rejected = lab_bytes_expected(BATCH, k, vocab, alpha)
            theirs = vllm_bytes(BATCH, k, vocab, looked, rejected)
            print(f"{alpha:5.1f} {k:2d} {vocab:7d} {theirs / 1e6:9.1f} {mine / 1e6:9.2f} {theirs / mine:10.1f}x "
                  f"{theirs / bw * 1e6:8.1f} {mine / bw * 1e6:9.2f}")
    print("vLLM reads three rows for every draft; the fused walk reads them once per rejected request,")
    print("so the ratio is about k / (1 - alpha^k).")


def make_inputs(k: int, vocab: int, seed: int = 0):
    import torch

    g = torch.Generator(device="cuda").manual_seed(seed)
    n = BATCH * k
    q = torch.softmax(torch.randn(n, vocab, device="cuda", generator=g) * 2, -1)
    p = torch.softmax(torch.randn(n, vocab, device="cuda", generator=g) * 2, -1)
    drafts = torch.multinomial(q, 1, generator=g).view(-1).to(torch.int32)
    u = torch.rand(n, dtype=torch.float64, device="cuda", generator=g)
    inv_e = torch.empty(BATCH, vocab, device="cuda").exponential_(generator=g).reciprocal()
    bonus = torch.arange(BATCH, device="cuda", dtype=torch.int32)
    return q, p, drafts, u, inv_e, bonus


def vllm_random_path(q, p, drafts, u, inv_e, bonus, k: int, vocab: int):
    import torch
    from vllm.v1.sample.rejection_sampler import (
        rejection_random_sample_kernel,
        sample_recovered_tokens_kernel,
    )

    cu = torch.arange(1, BATCH + 1, device="cuda", dtype=torch.int32) * k
    rec = torch.empty_like(drafts)
    sample_recovered_tokens_kernel[(BATCH, k)](rec, cu, drafts, q, p, inv_e, vocab, 8192, NO_DRAFT_PROBS=False)
    out = torch.full((BATCH, k + 1), -1, dtype=torch.int32, device="cuda")
    rejection_random_sample_kernel[(BATCH,)](out, cu, drafts, q, p, bonus, rec, u,
                                             torch.zeros(BATCH, dtype=torch.bool, device="cuda"), k, vocab, None,
                                             NO_DRAFT_PROBS=False, SYNTHETIC_MODE=False)
    return out


def measure(lab, args) -> int:
    import torch
    from triton.testing import do_bench

    bw = device_bandwidth()
    if bw is None:
        return 2
    print(f"{'k':>2} {'vocab':>7} {'accept':>6} {'vLLM us':>8} {'fused us':>9} {'speedup':>8} "
          f"{'fused GB/s':>10} {'% HBM':>6} {'vLLM GB/s':>9} {'% HBM':>6}")
    for k, vocab in SHAPES:
        q, p, drafts, u, inv_e, bonus = make_inputs(k, vocab)
        counts = [k] * BATCH
        ours = lab.rejection_sample_random(drafts, counts, q, p, bonus, u, inv_exponentials=inv_e)
        theirs = vllm_random_path(q, p, drafts, u, inv_e, bonus, k, vocab)
        if not torch.equal(ours, theirs):
            print(f"k={k} vocab={vocab}: {(ours != theirs).sum().item()} slots differ from vLLM; not timed")
            return 1
        out = ours.cpu().numpy()
        kept = (out[:, :k] == drafts.view(BATCH, k).cpu().numpy()).cumprod(1).sum()
        t_ours = do_bench(partial(lab.rejection_sample_random, drafts, counts, q, p, bonus, u, inv_exponentials=inv_e)) * 1e-3
        t_theirs = do_bench(partial(vllm_random_path, q, p, drafts, u, inv_e, bonus, k, vocab)) * 1e-3
        mine = lab.predicted_bytes(out, counts, vocab, recovered_given=False)
        rejected = int((out[:, k] == -1).sum())
        looked = int(kept) + rejected
        theirs_b = vllm_bytes(BATCH, k, vocab, looked, rejected)
        print(f"{k:2d} {vocab:7d} {kept / (BATCH * k):6.2f} {t_theirs * 1e6:8.1f} {t_ours * 1e6:9.1f} "
              f"{t_theirs / t_ours:7.2f}x {mine / t_ours / 1e9:10.1f} {mine / t_ours / bw:6.1%} "
              f"{theirs_b / t_theirs / 1e9:9.1f} {theirs_b / t_theirs / bw:6.1%}")
    print("times include the launcher (allocation, cumulative counts): at these sizes launch overhead is part of the cost")
    return 0


if __name__ == "__main__":
    sys.exit(bench_main(__file__, __doc__, measure, predict))
