import math
import re
from pathlib import Path

import numpy as np
import pytest

from course.runtime import lab_module, use_lab

lab = lab_module(__file__)  # solution.py by default; LAB_IMPL=starter grades starter.py

ROOT = Path(__file__).resolve().parents[3]
PAGE = """# Phase 99 interview

## Q1. First?

<details><summary>Model answer</summary>

One.
</details>

### Q2. Second?

<details><summary>Model answer</summary>
Two, with a `path.py:1 — x`.

Second paragraph.
</details>

**Q3. A bold question that wraps
over two lines?**

<details><summary>Model answer</summary>

Three.
</details>

## Rapid-fire

- *Q4. not a question heading*: no.
"""


def Q(phase, n=1):
    return lab.Question(phase, n, f"q{phase}.{n}", "a")


def test_parse_interview_formats():
    got = lab.parse_interview(PAGE, 99)
    assert [(q.phase, q.number) for q in got] == [(99, 1), (99, 2), (99, 3)], (
        f"three questions in page order, got {got}"
    )
    assert got[0].title == "First?" and got[0].answer == "One.", f"title and stripped answer, got {got[0]}"
    assert got[1].answer == "Two, with a `path.py:1 — x`.\n\nSecond paragraph.", (
        f"the whole answer, got {got[1].answer!r}"
    )
    assert got[2].title == "A bold question that wraps over two lines?", (
        f"a wrapped bold heading, got {got[2].title!r}"
    )


@pytest.mark.parametrize(
    "broken",
    [
        PAGE.replace("<details><summary>Model answer</summary>\n\nOne.\n</details>\n", ""),
        PAGE.replace("\nOne.\n", "\n\n"),
        PAGE.replace("Three.\n</details>", "Three."),
    ],
    ids=["no-answer", "empty-answer", "never-closed"],
)
def test_parse_interview_is_loud(broken):
    with pytest.raises(ValueError, match=r"Q[13]"):
        lab.parse_interview(broken, 99)


def test_every_interview_page_parses():
    pages = sorted(ROOT.glob("phase-[0-9][0-9]-*/INTERVIEW.md"))
    assert len(pages) >= 17, f"expected every phase's INTERVIEW.md, found {len(pages)}"
    for page in pages:
        text = page.read_text(encoding="utf-8")
        got = lab.parse_interview(text, int(page.parent.name[6:8]))
        want = text.count("<summary>Model answer</summary>")
        assert len(got) == want, f"{page.parent.name}: {want} model answers but {len(got)} questions parsed"
        assert [q.number for q in got] == list(range(1, want + 1)), (
            f"{page.parent.name}: Q numbers {[q.number for q in got]}"
        )
        assert all(q.title and q.answer for q in got), (
            f"{page.parent.name}: a question without title or answer"
        )


BANK = [Q(p, n) for p in (0, 1, 2, 3, 4, 9, 12) for n in range(1, 6)] + [Q(5, 1)]


def test_draw_is_deterministic_and_spelled_out():
    one = lab.draw(BANK, seed=3)
    assert one == lab.draw(BANK, seed=3), "the same seed must draw the same round"
    assert [q.phase for q in one] == [0, 1, 2, 3, 4, 5, 9, 12], (
        f"one per phase, phases increasing, got {[q.phase for q in one]}"
    )
    rng, want = np.random.default_rng(3), []
    for p in (0, 1, 2, 3, 4, 5, 9, 12):
        pool = [q for q in BANK if q.phase == p]
        want += [pool[int(i)] for i in rng.choice(len(pool), size=1, replace=False)]
    assert one == want, "draw with one default_rng(seed), one rng.choice per phase, in phase order"
    rounds = {tuple(lab.draw(BANK, seed=s)) for s in range(8)}
    assert len(rounds) > 1, "different seeds must be able to draw different rounds"


def test_draw_filters_by_level_and_phase():
    fund = lab.draw(BANK, seed=1, level="fundamentals")
    assert [q.phase for q in fund] == [0, 0, 1, 1, 2, 2, 3, 3], (
        f"two per phase 00-03, got {[q.phase for q in fund]}"
    )
    assert all(a != b for a, b in zip(fund[::2], fund[1::2])), (
        "no question twice in a phase (without replacement)"
    )
    systems = lab.draw(BANK, seed=1, level="systems")
    assert [q.phase for q in systems] == [4, 5], (
        f"phases 04-08 that exist, one each; got {[q.phase for q in systems]}"
    )
    assert [q.phase for q in lab.draw(BANK, seed=1, phases=[12, 2])] == [2, 12], (
        "the phase filter, in phase order"
    )
    assert [q.phase for q in lab.draw(BANK, seed=1, level="staff", phases=[2, 9])] == [9], (
        "level and phases intersect"
    )
    with pytest.raises(ValueError, match="level"):
        lab.draw(BANK, seed=1, level="guru")
    with pytest.raises(ValueError):
        lab.draw(BANK, seed=1, level="systems", phases=[0])


def test_capped_scores():
    q = Q(2)
    assert [lab.capped(lab.Score(q, s)) for s in (0, 1, 2, 3)] == [0, 1, 2, 3], "no flag, no cap"
    assert lab.capped(lab.Score(q, 3, peek=True)) == 2, "a peek caps a 3 at 2"
    assert lab.capped(lab.Score(q, 3, skipped_math=True)) == 2, "skipped arithmetic caps a 3 at 2"
    assert lab.capped(lab.Score(q, 1, peek=True)) == 1, "a cap never raises a score"
    for bad in (4, -1, 2.5):
        with pytest.raises(ValueError):
            lab.capped(lab.Score(q, bad))


def test_score_matrix_and_revision_list():
    rows = [lab.Row("A", (0, 1)), lab.Row("B", (2,)), lab.Row("C", (1, 3)), lab.Row("D", (7,))]
    scores = [
        lab.Score(Q(0), 3),
        lab.Score(Q(1), 2),  # counts for A and C
        lab.Score(Q(2), 3, peek=True),
        lab.Score(Q(3), 0),
    ]
    m = lab.score_matrix(rows, scores)
    assert m == {"A": 2, "B": 2, "C": 1, "D": None}, (
        f"floor of the capped mean per row, None if unprobed; got {m}"
    )
    assert lab.revision_list(rows, m) == [("C", (1, 3))], (
        f"rows at 1 or less, not unprobed ones: {lab.revision_list(rows, m)}"
    )
    assert lab.revision_list(rows, {"A": 0, "B": 1, "C": 2, "D": None}) == [("A", (0, 1)), ("B", (2,))], (
        "0 and 1 both revise"
    )


def test_every_phase_lands_in_a_competency_row():
    rows = lab.competency_rows(ROOT / "CAREER.md")
    covered = {p for r in rows for p in r.phases}
    assert covered >= set(range(0, 20)), (
        f"CAREER.md rows must cover phases 00-19; missing {sorted(set(range(20)) - covered)}"
    )
    m = lab.score_matrix(rows, [lab.Score(Q(p), 3) for p in range(20)])
    assert all(v == 3 for v in m.values()), f"a perfect round scores 3 on every row, got {m}"


def test_design_round_uses_the_earlier_labs():
    KV = use_lab("phase-00/lab-02-kv-memory-calculator")
    COMM = use_lab("phase-10/lab-02-tp-comm-cost")
    TOLL = use_lab("phase-15/lab-02-disagg-economics")
    d = lab.design_round()
    m = KV.LLAMA_3_70B
    shape = (m.num_layers, m.num_kv_heads, m.head_dim, m.dtype_bytes)
    per_tok = KV.kv_bytes_per_token(*shape)
    assert d["kv_bytes_per_token"] == per_tok == 327_680, f"70B KV per token, got {d['kv_bytes_per_token']}"
    assert d["kv_bytes_per_token_per_gpu"] == per_tok // 8, "TP=8 splits the 8 KV heads, one per GPU"
    hbm = int(80e9 * 0.9) * 8
    want = KV.max_concurrent_seqs(hbm, int(70e9 * 2), *shape, lab.CONTEXT_TOKENS)
    assert d["contexts_per_replica"] == want == math.floor((hbm - 140e9) / (per_tok * 4096)), (
        f"contexts per replica: (8 GPUs x 0.9 x 80 GB - 140 GB of weights) // KV per context; got {d['contexts_per_replica']}"
    )
    tp8 = 1e3 * COMM.tp_comm_time_per_step(64, 8, lab.NVLINK3, hidden=8192, num_layers=80)
    tp16 = 1e3 * COMM.tp_comm_time_per_step(64, 16, lab.IB_HDR, hidden=8192, num_layers=80)
    assert d["allreduce_ms_per_step_tp8_nvlink"] == pytest.approx(tp8), "TP=8 inside a node, NVLink 3"
    assert d["allreduce_ms_per_step_tp16_ib"] == pytest.approx(tp16), (
        "TP=16 spans both nodes: 16 ranks over IB"
    )
    toll = 1e3 * TOLL.transfer_seconds(TOLL.kv_payload_bytes(2048, per_tok), 200)
    assert d["kv_transfer_ms_ib"] == pytest.approx(toll), "a 2048-token prompt's KV over 200 Gb/s"
    assert d["allreduce_ms_per_step_tp8_nvlink"] < 30 < d["allreduce_ms_per_step_tp16_ib"], (
        "the commitment: TP=8 leaves room in a 30 ms ITL; TP=16 over IB would spend it all on all-reduces"
    )


def test_report_and_chart(tmp_path):
    rows = [lab.Row("A", (0,)), lab.Row("B", (2,))]
    text = lab.report(rows, [lab.Score(Q(0), 3), lab.Score(Q(2), 1)], seed=5, chart=tmp_path / "m.png")
    assert "| A | 00 | 3 |" in text and "| B | 02 | 1 |" in text, f"the matrix rows, got\n{text}"
    assert re.search(r"- B: re-enter phase 02", text), "B scored 1: it is on the revision list"
    assert "TP=8" in text and "KiB/token" in text, "the design round's commitments are in the report"
    png = (tmp_path / "m.png").read_bytes()
    width = int.from_bytes(png[16:20], "big")
    assert png[:4] == b"\x89PNG" and width >= 400, f"a PNG chart at least 400 px wide, got width {width}"
