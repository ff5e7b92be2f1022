"""Lab 02.02 — contiguous reservation vs paged allocation, on the same workload (your version).

Implement first_fit, contiguous_admit, paged_admit and sweep_block_size; the workload generator,
report() and the picture are provided.
Grade with:  LAB_IMPL=starter pytest phase-02-paged-attention/labs/lab-02-fragmentation-viz -q

Two tiny capacity models of a KV pool measured in token slots:
  contiguous: every request reserves max_len slots in ONE run (first fit), used or not;
  paged:      every request takes ceil(used / block_size) blocks from anywhere in the pool.
No request ever finishes here (no frees), which flatters the contiguous baseline: frees would add
external fragmentation on top of the internal waste measured below.

Run the reference: python phase-02-paged-attention/labs/lab-02-fragmentation-viz/solution.py
(prints the numbers and writes fragmentation.png next to this file)
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent


@dataclass
class AdmitResult:
    admitted: int   # requests that got memory
    rejected: int   # requests turned away (capacity failure is an outcome, not a crash)
    wasted: int     # slots held by admitted requests but never written
    used: int       # slots actually holding tokens


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def first_fit(holes: list[tuple[int, int]], size: int) -> int | None:
    """Carve `size` contiguous slots out of the first hole (start, length) big enough.
    Mutates `holes` (shrinks or drops that hole) and returns the start, or None if no hole fits."""
    raise NotImplementedError(
        'first_fit: scan the holes in order and use the FIRST one that is long enough; the '
        'request takes that hole\'s beginning, so what is left of the hole starts later (and an '
        'exact fit leaves nothing)')


def contiguous_admit(used_lens: list[int], total_slots: int, max_len: int) -> AdmitResult:
    """Admit requests in order; each reserves a contiguous run of max_len slots (first fit)."""
    raise NotImplementedError(
        'contiguous_admit: the pool starts as one big hole; every arrival asks first_fit for a '
        'whole max_len run whatever it will use; a refusal is counted, not raised, and only '
        'admitted requests waste anything')


def paged_admit(used_lens: list[int], total_slots: int, block_size: int) -> AdmitResult:
    """Admit requests in order; each takes ceil(used / block_size) blocks from anywhere."""
    raise NotImplementedError(
        'paged_admit: think in whole blocks (a partial block at the end of the pool is not a '
        'block); a request needs enough blocks to cover ALL its tokens (round up), and its waste '
        'is only the unused end of its last block')


def sweep_block_size(used_len: int, block_sizes: list[int]) -> list[tuple[int, int, int]]:
    """(block_size, wasted slots per request, block-table entries per request) for each size."""
    raise NotImplementedError(
        'sweep_block_size: one row per block size: the blocks a used_len-token request needs '
        'is also its number of block-table entries; the waste follows from it')


def lognormal_workload(n: int, seed: int, median: int = 300, sigma: float = 0.8,
                       max_len: int = 2048) -> list[int]:
    """Seeded request lengths with a long tail, clipped to [1, max_len] (provided)."""
    rng = np.random.default_rng(seed)
    lens = rng.lognormal(mean=np.log(median), sigma=sigma, size=n)
    return [int(x) for x in np.clip(np.rint(lens), 1, max_len)]


# ----------------------------------------------------------------------------- report + picture

def _pool_map(used_lens, total_slots, max_len, block_size, paged):
    """0 = free, 1 = holds a token, 2 = held but wasted; one entry per slot (for the picture)."""
    state = np.zeros(total_slots, dtype=np.int8)
    cursor = 0
    for n in used_lens:
        take = cdiv(n, block_size) * block_size if paged else max_len
        if cursor + take > total_slots:
            break
        state[cursor:cursor + n] = 1
        state[cursor + n:cursor + take] = 2
        cursor += take
    return state


def report(total_slots: int = 4096, max_len: int = 512, used_len: int = 32, block_size: int = 16,
           arrivals: int = 64) -> dict:
    lens = [used_len] * arrivals
    c = contiguous_admit(lens, total_slots, max_len)
    p = paged_admit(lens, total_slots, block_size)
    print(f"workload A: {arrivals} arrivals x {used_len} tokens, pool {total_slots} slots, "
          f"max_len {max_len}, block_size {block_size}")
    print(f"contiguous: admitted={c.admitted} rejected={c.rejected} wasted={c.wasted}")
    print(f"paged: admitted={p.admitted} rejected={p.rejected} wasted={p.wasted}")
    reserved = c.admitted * max_len
    print(f"contiguous waste: {c.wasted} of {reserved} reserved slots = {100 * c.wasted / reserved:.2f}%")
    paged_slots = cdiv(used_len, block_size) * block_size * p.admitted
    print(f"paged footprint: {paged_slots} slots = {100 * paged_slots / total_slots:.1f}% of the pool")
    print(f"admission ratio on this workload: {p.admitted}/{c.admitted} = {p.admitted / c.admitted:.1f}x "
          f"(arrival-limited: every request got in)")
    cap_c = contiguous_admit([used_len] * 10_000, total_slots, max_len).admitted
    paged_cap = paged_admit([used_len] * 10_000, total_slots, block_size).admitted
    print(f"capacity with endless arrivals: contiguous {cap_c}, paged {paged_cap} -> "
          f"{paged_cap / cap_c:.1f}x = max_len / (ceil(used/block)*block) = "
          f"{max_len}/{cdiv(used_len, block_size) * block_size}")
    p33 = paged_admit([33] * arrivals, total_slots, block_size)
    cap33 = paged_admit([33] * 10_000, total_slots, block_size).admitted
    print(f"used_len=33: paged wasted={p33.wasted} (= {arrivals} x {block_size * 3 - 33}); "
          f"capacity {cap33} -> {cap33 / cap_c:.1f}x")

    print("block-size sweep at used_len=33: block | waste/request | table entries/request")
    sweep = sweep_block_size(33, [1, 4, 16, 64, 256])
    for bs, waste, entries in sweep:
        print(f"  {bs:>5} | {waste:>13} | {entries:>5}")

    total_b, max_b = 65536, 2048
    print(f"workload B (seeded log-normal lengths, median 300): pool {total_b} slots, max_len {max_b}, "
          f"block_size 16, 400 arrivals")
    rows = []
    for seed in (0, 1, 2):
        lens_b = lognormal_workload(400, seed)
        cb = contiguous_admit(lens_b, total_b, max_b)
        pb = paged_admit(lens_b, total_b, 16)
        rows.append((seed, cb, pb))
        print(f"  seed {seed}: contiguous admitted={cb.admitted} waste={100 * cb.wasted / (cb.admitted * max_b):.1f}%"
              f" | paged admitted={pb.admitted} waste={100 * pb.wasted / (pb.used + pb.wasted):.1f}%"
              f" | ratio {pb.admitted / cb.admitted:.1f}x")
    return {"lens": lens, "sweep": sweep, "rows": rows, "total_slots": total_slots,
            "max_len": max_len, "block_size": block_size}


def plot(data: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.colors import ListedColormap

    cmap = ListedColormap(["#e8e8e8", "#2b6cb0", "#e53e3e"])
    fig, axes = plt.subplots(3, 1, figsize=(8, 6.4), dpi=80,
                             gridspec_kw={"height_ratios": [1.1, 1.3, 1.3]})
    maps = np.stack([
        _pool_map(data["lens"], data["total_slots"], data["max_len"], data["block_size"], paged=False),
        _pool_map(data["lens"], data["total_slots"], data["max_len"], data["block_size"], paged=True),
    ])
    ax = axes[0]
    ax.imshow(maps, aspect="auto", cmap=cmap, vmin=0, vmax=2, interpolation="nearest")
    ax.set_yticks([0, 1], ["contiguous", "paged"])
    ax.set_xlabel("slot in a 4096-slot KV pool  (blue: token, red: reserved but unused, grey: free)")
    ax.set_title("Workload A: 64 requests x 32 tokens, max_len 512, block_size 16")

    ax = axes[1]
    bs = [r[0] for r in data["sweep"]]
    ax.plot(bs, [r[1] for r in data["sweep"]], "o-", color="#e53e3e", label="wasted slots / request")
    ax.plot(bs, [r[2] for r in data["sweep"]], "s-", color="#2b6cb0", label="block-table entries / request")
    ax.set_xscale("log", base=2)
    ax.set_xticks(bs, [str(b) for b in bs])
    ax.set_yscale("symlog", linthresh=1)
    ax.set_ylim(0, 400)
    ax.set_xlabel("block_size (used_len = 33)")
    ax.set_ylabel("per request (log)")
    ax.set_title("Block size trade-off: tail waste vs block-table length", fontsize=10)
    ax.legend(fontsize=8)

    ax = axes[2]
    seeds = [r[0] for r in data["rows"]]
    x = np.arange(len(seeds))
    ax.bar(x - 0.2, [r[1].admitted for r in data["rows"]], 0.4, color="#e53e3e", label="contiguous")
    ax.bar(x + 0.2, [r[2].admitted for r in data["rows"]], 0.4, color="#2b6cb0", label="paged")
    ax.set_xticks(x, [f"seed {s}" for s in seeds])
    ax.set_ylabel("admitted")
    ax.set_title("Workload B: log-normal lengths, 64k-slot pool, max_len 2048", fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, metadata={"Software": None})
    plt.close(fig)


def main() -> None:
    data = report()
    plot(data, HERE / "fragmentation.png")
    print("wrote fragmentation.png")


if __name__ == "__main__":
    main()
