"""Lab 15-01 reference: hand a live request, and the KV it has computed, from one engine to another.

``export_request`` takes a request out of a prefill engine with its counters and the KV its
``num_computed_tokens`` cover, packed in logical token order; ``import_request`` admits it into a
decode engine with that compute prepaid. ``run_to_completion`` finishes every request. The engine
(``PagedEngine``) and its model (``TinyPagedModel``, whose next token *reads* the paged KV) are
provided: a wrong handoff changes the output.
Grade with: LAB_IMPL=starter pytest phase-15-disaggregated-serving/labs/lab-01-kv-handoff -q
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

# ---- provided: a paged engine whose model reads its KV -------------------------------------------


class TinyPagedModel:
    """A seeded toy transformer: each layer's K/V depend on (token, position); the next token is the
    argmax of attention (with a recency bias, so row order matters) from the last token over every
    cached row of every layer."""

    def __init__(self, num_layers=2, num_kv_heads=2, head_size=8, vocab=97, seed=0):
        rng = np.random.default_rng(seed)
        self.L, self.H, self.D, self.vocab = num_layers, num_kv_heads, head_size, vocab
        width = num_kv_heads * head_size
        self.emb = rng.standard_normal((vocab, width)).astype(np.float32)
        self.wk, self.wv, self.wq = (
            rng.standard_normal((num_layers, width, width)).astype(np.float32) / 3 for _ in "kvq"
        )
        self.wo = rng.standard_normal((width, vocab)).astype(np.float32)

    def kv(self, layer: int, token_ids, positions) -> np.ndarray:
        """(2, n, H, D): this layer's K and V rows for tokens at positions."""
        x = self.emb[np.asarray(token_ids)] + np.sin(np.asarray(positions, dtype=np.float32))[:, None]
        k, v = np.tanh(x @ self.wk[layer]), np.tanh(x @ self.wv[layer])
        return np.stack([k, v]).reshape(2, len(x), self.H, self.D)

    def next_token(self, rows: list[np.ndarray], last_token: int) -> int:
        """``rows[l]`` is layer l's (2, n, H, D) KV of the whole sequence so far."""
        out = np.zeros(self.H * self.D, np.float32)
        for layer, kv in enumerate(rows):
            q = (self.emb[last_token] @ self.wq[layer]).reshape(self.H, self.D)
            scores = np.einsum("hd,nhd->hn", q, kv[0]) / np.sqrt(self.D)
            scores -= 0.25 * np.arange(len(kv[0]))[::-1]  # ALiBi-style recency bias: row order matters
            p = np.exp(scores - scores.max(axis=1, keepdims=True))
            out += np.einsum("hn,nhd->hd", p / p.sum(axis=1, keepdims=True), kv[1]).reshape(-1)
        return int(np.argmax(out @ self.wo))


@dataclass
class Req:
    request_id: str
    prompt: list[int]
    max_tokens: int
    output: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0
    block_ids: list[int] = field(default_factory=list)

    @property
    def tokens(self) -> list[int]:
        return self.prompt + self.output


class PagedEngine:
    """One engine: a pool of ``num_blocks`` blocks (block 0 is never handed out), KV per layer in
    mini's layout ``(2, num_blocks, block_size, H, D)``, and a step that computes every running
    request's missing KV rows and samples one token. Blocks come off the free list front first."""

    def __init__(self, model: TinyPagedModel, num_blocks: int = 32, block_size: int = 4):
        self.model, self.num_blocks, self.block_size = model, num_blocks, block_size
        self.kv_caches = [
            np.zeros((2, num_blocks, block_size, model.H, model.D), np.float32) for _ in range(model.L)
        ]
        self.free_block_ids = list(range(1, num_blocks))
        self.running: dict[str, Req] = {}
        self.finished: dict[str, list[int]] = {}

    @property
    def usage(self) -> float:
        return 1.0 - len(self.free_block_ids) / (self.num_blocks - 1)

    def add_request(self, request_id: str, prompt: list[int], max_tokens: int) -> None:
        self.running[request_id] = Req(request_id, list(prompt), max_tokens)

    def allocate(self, n: int) -> list[int]:
        if n > len(self.free_block_ids):
            raise MemoryError(f"need {n} blocks, {len(self.free_block_ids)} free")
        got, self.free_block_ids = self.free_block_ids[:n], self.free_block_ids[n:]
        return got

    def free(self, block_ids: list[int]) -> None:
        self.free_block_ids.extend(block_ids)

    def rows(self, block_ids: list[int], n: int) -> list[np.ndarray]:
        """Each layer's first ``n`` token rows of a request, in logical order."""
        return [np.concatenate([kv[:, b] for b in block_ids], axis=1)[:, :n] for kv in self.kv_caches]

    def step(self) -> None:
        for req in list(self.running.values()):
            tokens, bs = req.tokens, self.block_size
            need = -(-len(tokens) // bs) - len(req.block_ids)
            if need > 0:
                req.block_ids += self.allocate(need)
            for pos in range(req.num_computed_tokens, len(tokens)):
                b, off = req.block_ids[pos // bs], pos % bs
                for layer, kv in enumerate(self.kv_caches):
                    kv[:, b, off] = self.model.kv(layer, [tokens[pos]], [pos])[:, 0]
            req.num_computed_tokens = len(tokens)
            req.output.append(self.model.next_token(self.rows(req.block_ids, len(tokens)), tokens[-1]))
            if len(req.output) == req.max_tokens:
                self.finished[req.request_id] = req.output
                self.free(req.block_ids)
                del self.running[req.request_id]


@dataclass
class Snapshot:
    """What crosses the wire: identity, counters and KV in logical order. Never block ids."""

    request_id: str
    prompt: list[int]
    output: list[int]
    max_tokens: int
    num_computed_tokens: int
    kv: np.ndarray  # (num_layers, 2, num_computed_tokens, H, D)

    @property
    def nbytes(self) -> int:
        return self.kv.nbytes


# ---- yours ---------------------------------------------------------------------------------------


def export_request(engine: PagedEngine, request_id: str) -> Snapshot:
    """Take ``request_id`` out of ``engine``: its tokens, counters and the KV of its
    ``num_computed_tokens`` tokens (every layer, logical order); free its blocks. Unknown id: KeyError."""
    if request_id not in engine.running:
        raise KeyError(f"request {request_id!r} is not running on this engine")
    req = engine.running[request_id]
    kv = np.stack(engine.rows(req.block_ids, req.num_computed_tokens))
    snap = Snapshot(
        req.request_id, list(req.prompt), list(req.output), req.max_tokens, req.num_computed_tokens, kv
    )
    engine.free(req.block_ids)
    del engine.running[request_id]
    return snap


def import_request(engine: PagedEngine, snap: Snapshot) -> None:
    """Admit ``snap`` with its compute prepaid: claim ceil(computed / block_size) blocks, write the
    KV rows into them, set the counter. Too few free blocks: MemoryError, and the engine is unchanged."""
    if snap.request_id in engine.running:
        raise ValueError(f"request {snap.request_id!r} is already running on this engine")
    if snap.kv.shape[1:] != (2, snap.num_computed_tokens) + engine.kv_caches[0].shape[3:] or len(
        snap.kv
    ) != len(engine.kv_caches):
        raise ValueError(f"snapshot KV {snap.kv.shape} does not fit this engine's layers/heads/head size")
    bs = engine.block_size
    block_ids = engine.allocate(-(-snap.num_computed_tokens // bs))  # raises before anything changes
    for pos in range(snap.num_computed_tokens):
        for layer, kv in enumerate(engine.kv_caches):
            kv[:, block_ids[pos // bs], pos % bs] = snap.kv[layer, :, pos]
    engine.running[snap.request_id] = Req(
        snap.request_id,
        list(snap.prompt),
        snap.max_tokens,
        list(snap.output),
        snap.num_computed_tokens,
        block_ids,
    )


def run_to_completion(engine: PagedEngine, max_steps: int = 10_000) -> dict[str, list[int]]:
    """Step until nothing runs; request id -> its output tokens (finished ones included)."""
    for _ in range(max_steps):
        if not engine.running:
            return dict(engine.finished)
        engine.step()
    raise RuntimeError(f"still running after {max_steps} steps")


def main() -> None:
    model, prompt = TinyPagedModel(), [(7 * i + 3) % 97 for i in range(10)]
    single = PagedEngine(model)
    single.add_request("r", prompt, 8)
    want = run_to_completion(single)["r"]
    P, D = PagedEngine(model), PagedEngine(model)
    D.free_block_ids = D.free_block_ids[::-1]  # D hands out blocks in another order
    P.add_request("r", prompt, 8)
    P.step()  # prefill + first token: the proxy's max_tokens=1
    snap = export_request(P, "r")
    import_request(D, snap)
    print(f"after prefill on P: computed {snap.num_computed_tokens} tokens, output {snap.output}")
    print(f"P usage after export: {P.usage:.1f}; D blocks claimed: {D.running['r'].block_ids}")
    print(f"payload: {snap.kv.shape} float32 = {snap.nbytes} bytes")
    got = run_to_completion(D)["r"]
    print(f"single engine: {want}\nP -> D       : {got}\nidentical: {got == want}")


if __name__ == "__main__":
    main()
