"""Draw block_table.svg: two requests' block tables pointing into one pool (phase 02 guide, §2.4).

The inputs are the guide's example: a pool of 10 blocks of 16 token slots, request A (40 tokens)
holding blocks [4, 1, 7], request B (20 tokens) holding [2, 9]. Everything else (how full each
block is, which block is the only partly empty one, where token 35 of A lives) is computed here.
Run: python phase-02-paged-attention/figures/block_table.py (or `make outputs`).
"""

from __future__ import annotations

from pathlib import Path

from course.svgfig import BLUE, FAINT, INK, ORANGE, Svg

BLOCK_SIZE = 16
POOL = 10
REQUESTS = {"A": (40, [4, 1, 7]), "B": (20, [2, 9])}
COLOURS = {"A": BLUE, "B": ORANGE}
PROBE = ("A", 35)  # the token whose slot the figure traces


def used_in(num_tokens: int, logical: int) -> int:
    """Token slots of logical block ``logical`` that a ``num_tokens``-token request fills."""
    return max(0, min(BLOCK_SIZE, num_tokens - logical * BLOCK_SIZE))


def slot(table: list[int], t: int) -> int:
    return table[t // BLOCK_SIZE] * BLOCK_SIZE + t % BLOCK_SIZE


def draw(path: Path) -> None:
    svg = Svg(760, 340, "Block tables map logical blocks to physical blocks",
              "Request A's three logical blocks point to physical blocks 4, 1 and 7; request B's two point "
              "to 2 and 9. Only the last block of each request is partly filled.")
    bw, bh, gap = 62, 44, 10
    pool_x, pool_y = 20, 232
    starts = {"A": 20, "B": 420}
    for name, (num_tokens, table) in REQUESTS.items():
        x0 = starts[name]
        svg.text(x0, 22, f"request {name}: {num_tokens} tokens, block table {table}", 13, bold=True)
        for i, phys in enumerate(table):
            x, y = x0 + i * (bw + 44), 44
            used = used_in(num_tokens, i)
            svg.rect(x, y, bw, bh, FAINT)
            svg.rect(x, y + bh - 8, bw * used / BLOCK_SIZE, 8, COLOURS[name], COLOURS[name])
            svg.text(x + bw / 2, y + 17, f"logical {i}", 11, "middle")
            svg.text(x + bw / 2, y + 31, f"{used}/{BLOCK_SIZE} used", 10, "middle")
            px = pool_x + phys * (bw + gap) + bw / 2
            svg.line(x + bw / 2, y + bh, px, pool_y - 2, COLOURS[name], 1.5, arrow=True)
    svg.text(pool_x, pool_y + bh + 20, "the pool: one global set of physical blocks; a table may point anywhere in it", 12)
    owner = {phys: (name, i) for name, (n, table) in REQUESTS.items() for i, phys in enumerate(table)}
    for b in range(POOL):
        x = pool_x + b * (bw + gap)
        svg.rect(x, pool_y, bw, bh, FAINT)
        svg.text(x + bw / 2, pool_y + 18, f"b{b}", 12, "middle", bold=True)
        if b in owner:
            name, i = owner[b]
            used = used_in(REQUESTS[name][0], i)
            svg.rect(x, pool_y + bh - 8, bw * used / BLOCK_SIZE, 8, COLOURS[name], COLOURS[name])
            svg.text(x + bw / 2, pool_y + 32, f"{name}{i}", 10, "middle")
        else:
            svg.text(x + bw / 2, pool_y + 32, "free", 10, "middle", fill="#777777")
    name, t = PROBE
    table = REQUESTS[name][1]
    s = slot(table, t)
    px = pool_x + table[t // BLOCK_SIZE] * (bw + gap) + bw * (t % BLOCK_SIZE + 0.5) / BLOCK_SIZE
    svg.line(px, pool_y + bh + 2, px, pool_y + bh - 10, INK, 2)
    svg.text(20, 324, f"token {t} of {name}: block_table[{t} // {BLOCK_SIZE}] = {table[t // BLOCK_SIZE]}, "
             f"row {t} % {BLOCK_SIZE} = {t % BLOCK_SIZE}  ->  slot {table[t // BLOCK_SIZE]} x {BLOCK_SIZE} + "
             f"{t % BLOCK_SIZE} = {s}", 12, mono=True, fill=INK)
    svg.write(path)


def main() -> None:
    for name, (num_tokens, table) in REQUESTS.items():
        print(f"request {name} ({num_tokens} tokens): block table {table}")
        for i, phys in enumerate(table):
            used = used_in(num_tokens, i)
            last = min(num_tokens, (i + 1) * BLOCK_SIZE) - 1
            note = "full" if used == BLOCK_SIZE else f"{used} of {BLOCK_SIZE} used  <- the only partly empty block"
            print(f"  logical {i} (tokens {i * BLOCK_SIZE:>2}-{last:<2}) -> b{phys}   {note}")
    free = sorted(set(range(POOL)) - {b for _, table in REQUESTS.values() for b in table})
    print(f"free blocks: {free}")
    name, t = PROBE
    print(f"token {t} of {name} lives in slot {slot(REQUESTS[name][1], t)}")
    draw(Path(__file__).with_name("block_table.svg"))
    print("wrote block_table.svg")


if __name__ == "__main__":
    main()
