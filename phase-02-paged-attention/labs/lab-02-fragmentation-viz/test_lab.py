from course.runtime import lab_module

lab = lab_module(__file__)   # solution.py by default; LAB_IMPL=starter grades starter.py


def test_default_workload_numbers():
    lens = [32] * 64
    c = lab.contiguous_admit(lens, total_slots=4096, max_len=512)
    p = lab.paged_admit(lens, total_slots=4096, block_size=16)
    assert (c.admitted, c.rejected, c.wasted) == (8, 56, 3840), (
        f"contiguous should admit 4096 // 512 = 8, reject 56 and waste 8 x (512 - 32) = 3840; "
        f"got admitted={c.admitted} rejected={c.rejected} wasted={c.wasted}")
    assert (p.admitted, p.rejected, p.wasted) == (64, 0, 0), (
        f"paged needs 64 x ceil(32/16) = 128 of 256 blocks, so admits all 64 with no waste "
        f"(32 is a multiple of 16); got admitted={p.admitted} rejected={p.rejected} wasted={p.wasted}")


def test_contiguous_waste_is_reserved_minus_used():
    lens = [5, 100, 512, 1, 77]
    c = lab.contiguous_admit(lens, total_slots=2048, max_len=512)
    assert c.admitted == 4 and c.rejected == 1, (
        f"2048 slots hold four 512-slot reservations; the fifth arrival is rejected. got {c}")
    assert c.wasted == sum(512 - n for n in lens[:4]), (
        f"contiguous waste is the sum of (max_len - used) over ADMITTED requests = "
        f"{sum(512 - n for n in lens[:4])}; got {c.wasted}")
    assert c.used == sum(lens[:4]), "used counts the tokens of admitted requests only"


def test_paged_waste_is_below_block_size_per_request():
    p = lab.paged_admit([33] * 64, total_slots=4096, block_size=16)
    assert p.wasted == 64 * 15, (
        f"33 tokens need ceil(33/16) = 3 blocks = 48 slots, wasting 15 each: 64 x 15 = 960; got {p.wasted}")
    lens = lab.lognormal_workload(300, seed=7)
    for bs in (1, 4, 16, 64):
        p = lab.paged_admit(lens, total_slots=1 << 20, block_size=bs)
        assert p.admitted == len(lens)
        assert p.wasted <= (bs - 1) * p.admitted, (
            f"block_size {bs}: waste {p.wasted} exceeds (block_size - 1) per request; round UP to whole blocks")
    assert lab.paged_admit([48], 4096, 16).wasted == 0, "an exact multiple of block_size wastes nothing"


def test_rejections_are_counted_not_raised():
    c = lab.contiguous_admit([10] * 5, total_slots=100, max_len=64)
    p = lab.paged_admit([40] * 5, total_slots=100, block_size=16)
    assert (c.admitted, c.rejected) == (1, 4), f"one 64-slot run fits in 100 slots; got {c}"
    assert (p.admitted, p.rejected) == (2, 3), (
        f"100 slots = 6 whole blocks of 16; each 40-token request needs 3 -> 2 admitted, 3 rejected; got {p}")
    p = lab.paged_admit([16] * 7, total_slots=100, block_size=16)
    assert (p.admitted, p.rejected) == (6, 1), (
        f"a 100-slot pool holds 100 // 16 = 6 whole blocks: the last 4 slots are not a block, so only 6 "
        f"one-block requests fit; got {p}")


def test_paged_admits_at_least_as_many_on_seeded_workloads():
    for seed in range(5):
        lens = lab.lognormal_workload(400, seed)
        c = lab.contiguous_admit(lens, total_slots=65536, max_len=2048)
        p = lab.paged_admit(lens, total_slots=65536, block_size=16)
        assert p.admitted >= c.admitted, f"seed {seed}: paged admitted {p.admitted} < contiguous {c.admitted}"
        assert p.admitted + p.rejected == len(lens) == c.admitted + c.rejected, "every arrival is admitted or rejected"
    assert c.admitted == 32, f"65536 // 2048 = 32 contiguous reservations, got {c.admitted}"


def test_external_fragmentation_defeats_first_fit():
    holes = [(0, 512), (1024, 512), (2048, 512), (3072, 512)]   # 2048 slots free, in four holes
    assert lab.first_fit(list(holes), 1024) is None, (
        "no single hole holds 1024 contiguous slots, so first fit must fail despite 2048 free")
    h = list(holes)
    assert lab.first_fit(h, 300) == 0 and h[0] == (300, 212), (
        f"first fit carves from the FIRST hole big enough and shrinks it; holes now {h}")
    assert lab.first_fit(h, 512) == 1024 and len(h) == 3, "an exact fit consumes the whole hole"
    p = lab.paged_admit([1024], total_slots=2048, block_size=16)
    assert p.admitted == 1, "paged needs 64 free blocks anywhere: the same 2048 free slots admit it"


def test_block_size_sweep_trades_waste_for_table_size():
    rows = lab.sweep_block_size(33, [1, 4, 16, 64, 256])
    assert [r[1] for r in rows] == [0, 3, 15, 31, 223], (
        f"waste per request = ceil(33/b)*b - 33 -> [0, 3, 15, 31, 223]; got {[r[1] for r in rows]}")
    assert [r[2] for r in rows] == [33, 9, 3, 1, 1], (
        f"table entries per request = ceil(33/b) -> [33, 9, 3, 1, 1]; got {[r[2] for r in rows]}")


def test_a_refused_request_takes_nothing_from_the_pool():
    # 6 blocks of 16: 40 tokens take 3, 200 tokens (13 blocks) are refused, then 16 and 17 tokens still fit.
    p = lab.paged_admit([40, 200, 16, 17], total_slots=100, block_size=16)
    assert (p.admitted, p.rejected) == (3, 1), (
        f"the 200-token request is refused and must take nothing: the 1- and 2-block requests after it still fit "
        f"in the 3 remaining blocks; got {p}: check `need > free_blocks` BEFORE taking any blocks")
    assert (p.used, p.wasted) == (40 + 16 + 17, 8 + 0 + 15), f"only admitted requests count; got {p}"
    c = lab.contiguous_admit([10, 10, 10], total_slots=100, max_len=64)
    assert (c.admitted, c.rejected) == (1, 2), f"after one 64-slot run, 36 slots stay free and no other run fits; got {c}"


def test_first_fit_takes_the_first_hole_not_the_tightest():
    # Holes of different sizes: 250 slots fit in all three; first fit takes the FIRST (600), where
    # best fit would take the tightest (300) and leave a different pool behind.
    h = [(0, 600), (1000, 300), (2000, 260)]
    start = lab.first_fit(h, 250)
    assert start == 0 and h == [(250, 350), (1000, 300), (2000, 260)], (
        f"first_fit(holes, 250) over holes of 600, 300, 260 slots must carve from the first hole that fits "
        f"(start 0, holes [(250, 350), (1000, 300), (2000, 260)]), got start {start}, holes {h}"
    )
