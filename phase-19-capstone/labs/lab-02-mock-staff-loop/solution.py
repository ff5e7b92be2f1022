"""Lab 19-02 reference: the mock staff loop behind ``python -m course interview``.

The question bank is every phase's ``INTERVIEW.md``; the competency rows are CAREER.md's Track B
table. Four pieces are the lab: parse a page into questions with their model answers, draw a
seeded round filtered by phase and level, turn self-scores into the competency matrix, and commit
the design round to numbers computed by three earlier labs (the KV budget of Phase 00 lab 02, the
all-reduce bill of Phase 10 lab 02, the KV transfer toll of Phase 15 lab 02). The loading, the
report and the chart are provided. ``python …/solution.py`` runs a scripted loop and prints it.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import NamedTuple

import numpy as np

from course.runtime import use_lab

KV = use_lab("phase-00/lab-02-kv-memory-calculator")
COMM = use_lab("phase-10/lab-02-tp-comm-cost")
TOLL = use_lab("phase-15/lab-02-disagg-economics")

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]

# level -> (phases, questions drawn per phase): the first three sessions of the loop
LEVELS = {
    "fundamentals": (tuple(range(0, 4)), 2),
    "systems": (tuple(range(4, 9)), 1),
    "staff": (tuple(range(9, 20)), 1),
}
SCORES = (0, 1, 2, 3)  # 3 derived cold, 2 hesitated or peeked, 1 knew of it, 0 blank
CAP = 2  # a peek, or skipping arithmetic that was available, caps an answer at 2
REVISE_AT = 1  # rows scoring this or less send you back to their phases

HEAD_RE = re.compile(r"^(?:#{2,3} |\*\*)Q(?P<n>\d+)\.\s+(?P<title>.+?)(?:\*\*)?\s*$")
OPEN = "<details><summary>Model answer</summary>"
CLOSE = "</details>"


class Question(NamedTuple):
    phase: int
    number: int  # the Qn on the page
    title: str
    answer: str  # the model answer's text, stripped


class Score(NamedTuple):
    question: Question
    score: int  # 0..3, as the learner judged it
    peek: bool = False  # opened the answer (or notes) before finishing
    skipped_math: bool = False  # available arithmetic not done


class Row(NamedTuple):
    name: str
    phases: tuple[int, ...]


# ---- yours ---------------------------------------------------------------------------------------


def parse_interview(text: str, phase: int) -> list[Question]:
    """The questions of one INTERVIEW.md, in page order. A heading is ``## Qn. …``, ``### Qn. …``
    or ``**Qn. …**`` (which may wrap over several lines); its model answer is the next
    ``<details><summary>Model answer</summary>`` block. ``ValueError`` naming the question when one
    has no model answer (or an empty one)."""
    questions: list[Question] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        m = HEAD_RE.match(lines[i])
        i += 1
        if not m:
            continue
        title = m.group("title").strip()
        if lines[i - 1].startswith("**") and not lines[i - 1].rstrip().endswith("**"):
            while i < len(lines) and lines[i].strip() and not title.endswith("**"):
                title += " " + lines[i].strip()  # a bold heading wrapped over several lines
                i += 1
            title = title.removesuffix("**").strip()
        while i < len(lines) and not lines[i].strip():
            i += 1
        if i >= len(lines) or lines[i].strip() != OPEN:
            raise ValueError(f"phase {phase:02d} Q{m.group('n')} ({title!r}) has no model answer")
        body = []
        i += 1
        while i < len(lines) and lines[i].strip() != CLOSE:
            body.append(lines[i])
            i += 1
        answer = "\n".join(body).strip()
        if i >= len(lines) or not answer:
            raise ValueError(
                f"phase {phase:02d} Q{m.group('n')} ({title!r}): model answer empty or never closed"
            )
        questions.append(Question(phase, int(m.group("n")), title, answer))
    return questions


def draw(
    bank: list[Question], seed: int, phases: list[int] | None = None, level: str | None = None
) -> list[Question]:
    """A round: for each phase in increasing order, ``k`` questions drawn without replacement with
    ``np.random.default_rng(seed)`` (``rng.choice(len(pool), size=min(k, len(pool)), replace=False)``
    over that phase's questions in page order, one call per phase), kept in drawn order.
    ``level`` (a key of ``LEVELS``) restricts the phases and sets ``k``; without it ``k`` is 1.
    ``phases`` restricts further. ``ValueError`` for an unknown level or an empty round."""
    if level is not None and level not in LEVELS:
        raise ValueError(f"unknown level {level!r}; choose from {sorted(LEVELS)}")
    allowed, k = LEVELS[level] if level else (None, 1)
    wanted = sorted({q.phase for q in bank})
    if allowed is not None:
        wanted = [p for p in wanted if p in allowed]
    if phases is not None:
        wanted = [p for p in wanted if p in set(phases)]
    rng = np.random.default_rng(seed)
    out: list[Question] = []
    for p in wanted:
        pool = [q for q in bank if q.phase == p]
        picks = rng.choice(len(pool), size=min(k, len(pool)), replace=False)
        out += [pool[int(i)] for i in picks]
    if not out:
        raise ValueError(f"no questions for phases={phases} level={level}")
    return out


def capped(s: Score) -> int:
    """One answer's score after the caps: a peek or skipped arithmetic caps it at ``CAP``."""
    if s.score not in SCORES:
        raise ValueError(f"a score is one of {SCORES}, got {s.score!r}")
    return min(s.score, CAP) if (s.peek or s.skipped_math) else s.score


def score_matrix(rows: list[Row], scores: list[Score]) -> dict[str, int | None]:
    """Each row's score: the floor of the mean of the capped scores of the answers whose phase the
    row covers (a question counts for every row that lists its phase); ``None`` when the round
    probed no phase of the row."""
    out: dict[str, int | None] = {}
    for row in rows:
        mine = [capped(s) for s in scores if s.question.phase in row.phases]
        out[row.name] = math.floor(sum(mine) / len(mine)) if mine else None
    return out


def revision_list(rows: list[Row], matrix: dict[str, int | None]) -> list[tuple[str, tuple[int, ...]]]:
    """Rows scored ``REVISE_AT`` or less, with the phases to re-enter, in table order."""
    return [
        (r.name, r.phases) for r in rows if matrix.get(r.name) is not None and matrix[r.name] <= REVISE_AT
    ]


def design_round() -> dict[str, float]:
    """Scenario (a): a 70B chat model, p99 TTFT < 1 s and ITL < 30 ms, 16 A100-80GB in 2 nodes of 8.
    Commit to TP=8 inside a node, one replica per node, and return the numbers that defend it,
    every one computed by the earlier labs' functions (see README for each formula)."""
    m = KV.LLAMA_3_70B
    shape = (m.num_layers, m.num_kv_heads, m.head_dim, m.dtype_bytes)
    hbm = int(A100_HBM * GPU_MEMORY_UTILIZATION) * TP
    weights = int(m.n_params * m.dtype_bytes)
    per_token = KV.kv_bytes_per_token(*shape)
    nvlink = COMM.tp_comm_time_per_step(DECODE_BATCH, TP, NVLINK3, hidden=HIDDEN_70B, num_layers=m.num_layers)
    across = COMM.tp_comm_time_per_step(
        DECODE_BATCH, 2 * TP, IB_HDR, hidden=HIDDEN_70B, num_layers=m.num_layers
    )
    payload = TOLL.kv_payload_bytes(PROMPT_TOKENS, per_token)
    return {
        "kv_bytes_per_token": per_token,
        "kv_bytes_per_token_per_gpu": per_token // TP,
        "contexts_per_replica": KV.max_concurrent_seqs(hbm, weights, *shape, CONTEXT_TOKENS),
        "allreduce_ms_per_step_tp8_nvlink": 1e3 * nvlink,
        "allreduce_ms_per_step_tp16_ib": 1e3 * across,
        "kv_transfer_ms_ib": 1e3 * TOLL.transfer_seconds(payload, IB_HDR_GBPS),
    }


# ---- provided: the scenario's inputs, the bank, the rows, the report -----------------------------

A100_HBM = 80 * 10**9  # bytes, A100 SXM 80 GB (datasheet)
GPU_MEMORY_UTILIZATION = 0.9  # vLLM's default share of HBM it may use
TP = 8
HIDDEN_70B = 8192
DECODE_BATCH = 64  # decode tokens in one step
CONTEXT_TOKENS = 4096  # a chat context the design budgets for
PROMPT_TOKENS = 2048  # a prompt whose KV would cross nodes if prefill and decode were split
NVLINK3 = COMM.Link("NVLink 3 (A100 SXM)", 300e9, 3e-6)  # 600 GB/s total, 300 each way
IB_HDR_GBPS = 200  # HDR InfiniBand, one port
IB_HDR = COMM.Link("InfiniBand HDR 200 Gb/s", IB_HDR_GBPS * 1e9 / 8, 5e-6)


def load_bank(root: Path = ROOT) -> list[Question]:
    """Every question of every ``phase-NN-*/INTERVIEW.md`` under ``root``."""
    bank: list[Question] = []
    for page in sorted(root.glob("phase-[0-9][0-9]-*/INTERVIEW.md")):
        bank += parse_interview(page.read_text(encoding="utf-8"), int(page.parent.name[6:8]))
    return bank


def competency_rows(career: Path = ROOT / "CAREER.md") -> list[Row]:
    """CAREER.md's Track B table: ``| Competency | Phases | … |`` rows, phases like ``04–07, 10``."""
    rows = []
    for line in career.read_text(encoding="utf-8").splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 3 or not re.fullmatch(r"\d[\d,\s–-]*", cells[1]):
            continue
        phases: list[int] = []
        for part in cells[1].split(","):
            a, _, b = part.strip().replace("–", "-").partition("-")
            phases += range(int(a), int(b or a) + 1)
        rows.append(Row(cells[0], tuple(phases)))
    return rows


def report(rows: list[Row], scores: list[Score], seed: int, chart: Path | None = None) -> str:
    """The Markdown report: the matrix, the revision list, the design commitments; draws ``chart``."""
    matrix = score_matrix(rows, scores)
    out = [
        f"# Mock staff loop (seed {seed}, {len(scores)} questions)",
        "",
        "| Competency | Phases | Score |",
        "|---|---|---|",
    ]
    for r in rows:
        s = matrix[r.name]
        out.append(f"| {r.name} | {', '.join(f'{p:02d}' for p in r.phases)} | {'—' if s is None else s} |")
    out += ["", "Revision list (rows scored 1 or less):"]
    out += [
        f"- {name}: re-enter phase {', '.join(f'{p:02d}' for p in ph)}"
        for name, ph in revision_list(rows, matrix)
    ] or ["- none"]
    d = design_round()
    out += [
        "",
        "Design round (a): 70B chat, 16 A100-80GB in 2 nodes → TP=8 per node, 2 replicas, no P/D split",
        f"- KV: {d['kv_bytes_per_token'] / 1024:.0f} KiB/token "
        f"({d['kv_bytes_per_token_per_gpu'] / 1024:.0f} KiB per GPU at TP=8); "
        f"{d['contexts_per_replica']} contexts of {CONTEXT_TOKENS} tokens per replica",
        f"- all-reduce per decode step (batch {DECODE_BATCH}): {d['allreduce_ms_per_step_tp8_nvlink']:.2f} ms at TP=8 on NVLink "
        f"vs {d['allreduce_ms_per_step_tp16_ib']:.2f} ms at TP=16 over IB (predicted)",
        f"- KV toll for a {PROMPT_TOKENS}-token prompt across nodes: "
        f"{d['kv_transfer_ms_ib']:.1f} ms at {IB_HDR_GBPS} Gb/s (predicted)",
    ]
    if chart is not None:
        draw_chart(rows, matrix, chart)
        out += ["", f"![competency matrix]({chart.name})"]
    return "\n".join(out) + "\n"


def draw_chart(rows: list[Row], matrix: dict[str, int | None], path: Path) -> None:
    """A horizontal bar per row, 0–3, unprobed rows hatched; readable at 400 px wide."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams.update({"font.size": 12})
    fig, ax = plt.subplots(figsize=(6.4, 0.5 * len(rows) + 1.2), dpi=100)
    names = [r.name for r in rows][::-1]
    vals = [matrix[n] for n in names]
    colors = ["#bbbbbb" if v is None else ("#c0392b" if v <= REVISE_AT else "#2e86c1") for v in vals]
    ax.barh(names, [0.1 if v is None else max(v, 0.06) for v in vals], color=colors)
    ax.set(xlim=(0, 3), xticks=[0, 1, 2, 3], xlabel="score (red: revise; grey: not probed)")
    fig.tight_layout()
    fig.savefig(path, metadata={"Software": None})
    plt.close(fig)


def main() -> None:
    bank, rows = load_bank(), competency_rows()
    print(
        f"bank: {len(bank)} questions from {len({q.phase for q in bank})} phases; {len(rows)} competency rows"
    )
    for level in LEVELS:
        picks = draw(bank, seed=7, level=level)
        print(f"{level:>12}: " + " ".join(f"{q.phase:02d}/Q{q.number}" for q in picks))
    picks = draw(bank, seed=7, level="fundamentals") + draw(bank, seed=7, level="systems")
    scripted = [Score(q, score=(3, 2, 1)[i % 3], peek=i % 4 == 1) for i, q in enumerate(picks)]
    print()
    print(report(rows, scripted, seed=7), end="")


if __name__ == "__main__":
    main()
