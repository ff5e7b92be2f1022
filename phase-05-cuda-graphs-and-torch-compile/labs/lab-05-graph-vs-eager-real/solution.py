"""Lab 03-05 — CUDA graphs vs eager on a real GPU (reference solution).

A small decoder step (embedding, a few transformer layers that attend over a fixed KV cache,
an LM head) is run two ways on CUDA at batch 1, 8 and 64: eagerly, one kernel launch per op,
and as a ``torch.cuda.CUDAGraph`` captured once per batch size and replayed. ``bench.py`` times
both; this file holds the parts that do not need a GPU to be checked:

* ``count_launches(fn, *args)`` — how many kernels one call would launch (every aten op that is
  not a view), counted with a ``TorchDispatchMode``; the count does not depend on the batch size;
* ``GraphedStep`` — capture once for one input shape, then: copy the new input into the static
  buffer, replay, return the static output (the capture itself is a pluggable ``backend``:
  ``cuda_graph_backend`` on a GPU, ``eager_replay_backend`` on CPU for the tests);
* ``predict_rows`` — lab-02's step-time model fed with this model's kernel count and a
  roofline estimate of its GPU time: the *predicted* speedup at each batch size;
* ``compare_with_model`` — measured (eager, graph) times in, lab-02's prediction out: fit the
  launch cost from the smallest batch, then predict the eager time of every other batch.

Provided (not graded): ``DecoderConfig``, ``build_decoder``, ``make_tokens``,
``eager_replay_backend``. torch is imported lazily so ``import solution`` stays cheap.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from course.runtime import use_lab

LAB02 = use_lab("phase-05/lab-02-launch-overhead")  # lab-02's step-time model

# H100 SXM5 datasheet: 3.35 TB/s HBM3, 989 TFLOP/s dense BF16/FP16 tensor core.
H100_SXM = {"hbm_tb_s": 3.35, "peak_tflops": 989.0}


# --------------------------------------------------------------------------- provided: the model
@dataclass(frozen=True)
class DecoderConfig:
    hidden: int = 1024
    n_layers: int = 8
    n_heads: int = 8
    intermediate: int = 4096
    vocab: int = 8192
    context: int = 1024  # cached tokens every sequence attends over
    dtype: str = "float16"

    @property
    def weight_params(self) -> int:
        per_layer = 4 * self.hidden * self.hidden + 2 * self.hidden * self.intermediate
        return self.n_layers * per_layer + self.vocab * self.hidden  # LM head; embedding rows: B only

    def kv_elems(self, batch: int) -> int:
        return 2 * self.n_layers * batch * self.context * self.hidden


TINY = DecoderConfig(hidden=64, n_layers=2, n_heads=4, intermediate=128, vocab=257, context=16, dtype="float32")


def build_decoder(cfg: DecoderConfig, device: str = "cpu", seed: int = 0):
    """A decode step as an ``nn.Module``: ``model(tokens (B,), k_cache, v_cache) -> logits (B, vocab)``.

    Each layer writes the new token's K and V into the last slot of the (persistent) cache, then
    attends over all ``context`` slots: the read that grows with batch size.
    """
    import torch
    import torch.nn.functional as F

    dtype = getattr(torch, cfg.dtype)
    g = torch.Generator().manual_seed(seed)

    def w(*shape):
        return (torch.randn(*shape, generator=g) / shape[0] ** 0.5).to(device=device, dtype=dtype)

    class DecoderStep(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = torch.nn.Parameter(w(cfg.vocab, cfg.hidden), requires_grad=False)
            self.layers = [
                {"q": w(cfg.hidden, cfg.hidden), "kv": w(cfg.hidden, 2 * cfg.hidden), "o": w(cfg.hidden, cfg.hidden),
                 "up": w(cfg.hidden, cfg.intermediate), "down": w(cfg.intermediate, cfg.hidden)}
                for _ in range(cfg.n_layers)
            ]
            self.lm_head = w(cfg.hidden, cfg.vocab)

        def forward(self, tokens, k_cache, v_cache):
            b, h, d = tokens.shape[0], cfg.n_heads, cfg.hidden // cfg.n_heads
            x = self.embed[tokens]
            for i, p in enumerate(self.layers):
                y = F.rms_norm(x, (cfg.hidden,))
                q = (y @ p["q"]).view(b, h, 1, d)
                kv = y @ p["kv"]
                k_cache[i, :, :, -1] = kv[:, : cfg.hidden].view(b, h, d)  # append this token's K and V
                v_cache[i, :, :, -1] = kv[:, cfg.hidden :].view(b, h, d)  # (the last cache slot)
                scores = (q @ k_cache[i].transpose(-1, -2)) * d**-0.5  # (B, h, 1, context)
                attn = (torch.softmax(scores, dim=-1) @ v_cache[i]).view(b, cfg.hidden)
                x = x + attn @ p["o"]
                x = x + F.silu(F.rms_norm(x, (cfg.hidden,)) @ p["up"]) @ p["down"]
            return F.rms_norm(x, (cfg.hidden,)) @ self.lm_head

    return DecoderStep().eval()


def make_kv_cache(cfg: DecoderConfig, batch: int, device: str = "cpu", seed: int = 1):
    """A fixed KV cache (n_layers, B, heads, context, head_dim) for K and for V: persistent buffers."""
    import torch

    g = torch.Generator().manual_seed(seed)
    shape = (cfg.n_layers, batch, cfg.n_heads, cfg.context, cfg.hidden // cfg.n_heads)
    dtype = getattr(torch, cfg.dtype)
    return tuple(torch.randn(*shape, generator=g).to(device=device, dtype=dtype) for _ in range(2))


def make_tokens(cfg: DecoderConfig, batch: int, device: str = "cpu", seed: int = 2):
    """One new token id per sequence: the input that changes every step."""
    import torch

    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, cfg.vocab, (batch,), generator=g).to(device)


def eager_replay_backend(fn: Callable, static_input: Any, warmup: int) -> tuple[Any, Callable[[], None]]:
    """CPU stand-in for a CUDA graph: the "replay" reruns ``fn`` on the static input, into the static output."""
    out = fn(static_input)

    def replay() -> None:
        out.copy_(fn(static_input))

    return out, replay


# --------------------------------------------------------------------------- the lab
def count_launches(fn: Callable, *args: Any) -> int:
    """Kernels one call of ``fn(*args)`` would launch: every dispatched aten op that is not a view."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    free = {torch.ops.aten._unsafe_view.default, torch.ops.aten.detach.default}

    class _Count(TorchDispatchMode):
        n = 0

        @classmethod
        def _should_skip_dynamo(cls) -> bool:  # keep torch._dynamo (seconds to import) out of a counter
            return False

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if not func.is_view and func not in free:
                self.n += 1
            return func(*args, **(kwargs or {}))

    with torch.no_grad(), _Count() as counter:  # no_grad, not inference_mode: see ops as the GPU would
        fn(*args)
    return counter.n


def cuda_graph_backend(fn: Callable, static_input: Any, warmup: int) -> tuple[Any, Callable[[], None]]:
    """Warm up on a side stream, capture ``fn(static_input)`` into a CUDA graph; return (static output, replay)."""
    import torch

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warmup: lazy init, allocator, cuBLAS handles, outside the graph
        for _ in range(warmup):
            fn(static_input)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):  # upstream: vllm/compilation/cuda_graph.py:313
        out = fn(static_input)
    return out, graph.replay


class GraphedStep:
    """One captured graph of ``fn`` for one input shape: copy in, replay, return the static output."""

    def __init__(self, fn: Callable, example_input: Any, warmup: int = 3, backend: Callable | None = None) -> None:
        import torch

        self.static_input = example_input.clone()  # the buffer the graph reads, forever
        backend = backend or cuda_graph_backend
        with torch.no_grad():
            self.static_output, self._replay = backend(fn, self.static_input, warmup)

    def __call__(self, x: Any) -> Any:
        if tuple(x.shape) != tuple(self.static_input.shape):
            raise ValueError(
                f"this graph was captured for input shape {tuple(self.static_input.shape)}, got "
                f"{tuple(x.shape)}: capture one graph per batch size (and pad up to it)"
            )
        self.static_input.copy_(x)  # Constraint 2: into the captured buffer, never rebind
        self._replay()
        return self.static_output  # overwritten by the next replay


def predict_rows(
    num_kernels: int,
    cfg: DecoderConfig,
    batches: tuple[int, ...] = (1, 8, 64),
    launch_us: float = 5.0,
    kernel_floor_us: float = 2.0,
    hbm_tb_s: float = H100_SXM["hbm_tb_s"],
    peak_tflops: float = H100_SXM["peak_tflops"],
) -> list[dict[str, float]]:
    """Predicted eager/graph step times per batch: lab-02's model with a roofline GPU time.

    GPU time of a step = max(num_kernels * kernel_floor_us, bytes / bandwidth, flops / peak),
    where bytes = weights + the KV cache read at this batch (2 bytes per fp16 element) and
    flops = 2 per weight per sequence + 2 per cached K/V element (q.K and p.V). Each row is a
    dict with ``batch``, ``gpu_us``, ``eager_us``, ``graph_us`` and ``speedup``.
    """
    elem = 2 if cfg.dtype in ("float16", "bfloat16") else 4
    rows = []
    for b in batches:
        nbytes = elem * (cfg.weight_params + cfg.kv_elems(b))
        flops = 2 * b * cfg.weight_params + 2 * cfg.kv_elems(b)
        gpu_us = max(num_kernels * kernel_floor_us, nbytes / (hbm_tb_s * 1e6), flops / (peak_tflops * 1e6))
        k_us = gpu_us / num_kernels
        eager = LAB02.eager_step_us(num_kernels, launch_us, k_us)
        graph = LAB02.graph_step_us(num_kernels, launch_us, k_us)
        rows.append({"batch": b, "gpu_us": gpu_us, "eager_us": eager, "graph_us": graph, "speedup": eager / graph})
    return rows


def compare_with_model(num_kernels: int, measured: dict[int, tuple[float, float]]) -> list[dict[str, float]]:
    """Fit lab-02's model to measurements and predict every batch's eager time.

    ``measured`` maps batch -> (eager_us, graph_us). The launch cost is fitted from the smallest
    batch, assumed launch-bound (launch_us = eager_us / num_kernels); each batch's per-kernel GPU
    time is its graph time / num_kernels (a replay is almost pure GPU time). Each row is a dict
    with ``batch``, ``eager_us``, ``graph_us``, ``speedup``, ``predicted_eager_us``,
    ``predicted_speedup`` and ``launch_us``.
    """
    if not measured:
        raise ValueError("measured must hold at least one batch")
    b0 = min(measured)
    launch_us = measured[b0][0] / num_kernels
    rows = []
    for b in sorted(measured):
        eager, graph = measured[b]
        predicted = LAB02.eager_step_us(num_kernels, launch_us, graph / num_kernels)
        rows.append({"batch": b, "eager_us": eager, "graph_us": graph, "speedup": eager / graph,
                     "predicted_eager_us": predicted, "predicted_speedup": predicted / graph,
                     "launch_us": launch_us})
    return rows


def kernels_per_step(cfg: DecoderConfig) -> tuple[int, int, int]:
    """(per layer, outside the layers, total) kernels of ``cfg``'s step, counted on two tiny CPU copies."""
    counts = []
    for layers in (1, 2):
        tiny = DecoderConfig(**{**TINY.__dict__, "n_layers": layers})
        counts.append(count_launches(build_decoder(tiny), make_tokens(tiny, 1), *make_kv_cache(tiny, 1)))
    per_layer, outside = counts[1] - counts[0], 2 * counts[0] - counts[1]
    return per_layer, outside, outside + cfg.n_layers * per_layer


def main() -> None:
    cfg = DecoderConfig()
    per_layer, outside, n = kernels_per_step(cfg)
    print(f"kernels per decode step: {per_layer} per layer + {outside} outside the layers (same at every batch)")
    print(f"bench model: {cfg.n_layers} layers, hidden {cfg.hidden}, context {cfg.context} -> {n} kernels per step, "
          f"{cfg.weight_params * 2 / 1e6:.0f} MB of fp16 weights")
    for b in (1, 8, 64):
        print(f"  batch {b:>2}: KV cache read per step {cfg.kv_elems(b) * 2 / 1e6:>6.0f} MB")
    print("\npredicted on H100 SXM (3.35 TB/s, 989 TFLOP/s), launch 5 us, kernel floor 2 us")
    print(f"{'batch':>5} {'gpu_us':>7} {'eager_us':>9} {'graph_us':>9} {'speedup':>8}")
    for r in predict_rows(n, cfg):
        print(f"{r['batch']:>5} {r['gpu_us']:>7.0f} {r['eager_us']:>9.0f} {r['graph_us']:>9.0f} {r['speedup']:>7.2f}x")

if __name__ == "__main__":
    main()
