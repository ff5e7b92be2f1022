"""Train the course Llama: the tiny Llama of ``tiny_model.py``, taught this course's own Markdown.

Random weights (``tiny_model.build``) print gibberish; this model writes fragments of the course.
Same shape (hidden 256, 4 query heads, 2 KV heads, 2 layers, vocabulary 512), same tokenizer
(``tiny_model.train_tokenizer``); weights trained here with torch on a CPU in minutes, seeded:
the same command, torch version and thread count give the same bytes.

* the corpus: every course ``*.md`` (``course.discover.markdown_files``, without the checkpoint
  folder itself), sorted by path, joined by the EOS token. A file is **held out** when the sha256
  of its path falls in one sixteenth of the range, so adding or editing other files never moves
  it. The held-out text is written next to the weights (``heldout.txt``): the figures below stay
  the same while the course's pages change.
* ``train OUT_DIR [--steps N] [--threads T] [--seed S]``: AdamW on random 256-token windows;
  writes ``config.json``, the tokenizer files, ``model.safetensors`` (float16), ``training.json``
  (settings, corpus manifest, losses) and ``SHA256SUMS``.
* ``report [DIR]``: held-out perplexity against a unigram baseline, and greedy samples with a
  repetition guard (float32 forward, one thread, deterministic algorithms), for the README's
  generated block.

    .venv/bin/python -m course.runtime.train_course_model train mini_vllm/checkpoints/course-llama
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import sys
import time
from pathlib import Path

from course import ROOT
from course.runtime import tiny_model

CHECKPOINT = ROOT / "mini_vllm" / "checkpoints" / "course-llama"
SEQ_LEN = 256
BATCH = 8
STEPS = 1000
PEAK_LR = 3e-3
WARMUP = 50
SEED = 0
THREADS = 1
HELDOUT_BUCKETS = 16  # one path hash bucket in sixteen is held out
MANIFEST = "SHA256SUMS"
HELDOUT = "heldout.txt"
HASHED = ("config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
HASHED += ("model.safetensors", "training.json", HELDOUT)
PROMPTS = ("The scheduler", "The KV cache", "The block pool", "Each request")
NEW_TOKENS = 40
NO_REPEAT_NGRAM = 3


# ---- the corpus -----------------------------------------------------------------------------------


def is_heldout(relpath: str) -> bool:
    """The deterministic split: the path's sha256, not its content, picks the held-out files."""
    return int(hashlib.sha256(relpath.encode()).hexdigest()[:8], 16) % HELDOUT_BUCKETS == 0


def corpus_files(root: Path = ROOT) -> tuple[list[str], list[str]]:
    """(training paths, held-out paths), relative to ``root``, sorted; the checkpoints are left out."""
    from course.discover import markdown_files

    paths = sorted(p.relative_to(root).as_posix() for p in markdown_files(root))
    paths = [p for p in paths if not p.startswith("mini_vllm/checkpoints/")]
    return [p for p in paths if not is_heldout(p)], [p for p in paths if is_heldout(p)]


def join_documents(texts: list[str]) -> str:
    """Documents joined by the EOS token: the tokenizer turns each EOS string into its one id."""
    return tiny_model.EOS.join(texts)


def manifest(root: Path, paths: list[str]) -> dict[str, str]:
    return {p: hashlib.sha256((root / p).read_bytes()).hexdigest() for p in paths}


# ---- the model --------------------------------------------------------------------------------------


def model_config() -> dict:
    """``tiny_model.CONFIG`` with the stored dtype named honestly."""
    return {**tiny_model.CONFIG, "torch_dtype": "float16"}


def set_torch_determinism(threads: int) -> None:
    import torch

    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(True)


def new_model(seed: int):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    return LlamaForCausalLM(LlamaConfig(**model_config()))


def load_model(path: Path = CHECKPOINT):
    """The checkpoint as Hugging Face ``LlamaForCausalLM``, in float32, eval mode."""
    import torch
    from transformers import LlamaForCausalLM

    return LlamaForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()


def load_tokenizer(path: Path = CHECKPOINT):
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(Path(path) / "tokenizer.json"))


def mean_nll(model, ids: list[int], max_tokens: int | None = None) -> tuple[float, int]:
    """(mean next-token loss in nats, tokens scored) over non-overlapping ``SEQ_LEN`` windows."""
    import torch

    ids = ids[: max_tokens + 1] if max_tokens else ids
    total, count = 0.0, 0
    with torch.no_grad():
        for start in range(0, len(ids) - 1, SEQ_LEN):
            window = torch.tensor([ids[start : start + SEQ_LEN + 1]])
            if window.shape[1] < 2:
                break
            logits = model(input_ids=window[:, :-1]).logits.float()
            loss = torch.nn.functional.cross_entropy(logits[0], window[0, 1:], reduction="sum")
            total += float(loss)
            count += window.shape[1] - 1
    return total / count, count


def unigram_nll(counts: list[int], heldout_ids: list[int]) -> float:
    """The baseline: each token's training frequency (add-one smoothed), context ignored."""
    import numpy as np

    counts = np.asarray(counts, dtype=np.float64) + 1.0
    logp = np.log(counts / counts.sum())
    return float(-logp[np.asarray(heldout_ids[1:])].mean())  # the same targets mean_nll scores


def greedy(
    model, tokenizer, prompt: str, new_tokens: int = NEW_TOKENS, no_repeat: int = NO_REPEAT_NGRAM
) -> str:
    """Greedy continuation that never repeats an n-gram (``no_repeat`` tokens) and stops at EOS."""
    import torch

    ids = tokenizer.encode(prompt).ids
    eos = tokenizer.token_to_id(tiny_model.EOS)
    with torch.no_grad():
        for _ in range(new_tokens):
            logits = model(input_ids=torch.tensor([ids])).logits[0, -1].float()
            prefix = tuple(ids[len(ids) - no_repeat + 1 :])
            for i in range(len(ids) - no_repeat + 1):  # ban what would complete a seen n-gram
                if tuple(ids[i : i + no_repeat - 1]) == prefix:
                    logits[ids[i + no_repeat - 1]] = -math.inf
            nxt = int(torch.argmax(logits))
            if nxt == eos:
                break
            ids.append(nxt)
    return tokenizer.decode(ids)


# ---- training ---------------------------------------------------------------------------------------


def lr_at(step: int, steps: int, peak: float = PEAK_LR, warmup: int = WARMUP) -> float:
    """Linear warm-up, then cosine decay to a tenth of the peak."""
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, steps - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def train(out: Path, steps: int = STEPS, seed: int = SEED, threads: int = THREADS, root: Path = ROOT) -> dict:
    """Train and write the checkpoint into ``out``; returns what ``training.json`` records."""
    import torch
    from safetensors.torch import save_file

    set_torch_determinism(threads)
    out = Path(out)
    train_paths, heldout_paths = corpus_files(root)
    tokenizer = tiny_model.train_tokenizer()
    train_text = join_documents([(root / p).read_text(encoding="utf-8") for p in train_paths])
    heldout_text = join_documents([(root / p).read_text(encoding="utf-8") for p in heldout_paths])
    data = torch.tensor(tokenizer.encode(train_text).ids, dtype=torch.long)
    heldout_ids = tokenizer.encode(heldout_text).ids
    print(
        f"corpus: {len(train_paths)} files, {len(data):,} tokens; held out: {len(heldout_paths)} files, "
        f"{len(heldout_ids):,} tokens",
        file=sys.stderr,
    )

    model = new_model(seed).train()
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.ndim < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
        lr=PEAK_LR,
        betas=(0.9, 0.95),
        eps=1e-8,
    )
    gen = torch.Generator().manual_seed(seed)
    offsets = torch.arange(SEQ_LEN + 1)
    losses = []
    started = time.monotonic()
    for step in range(steps):
        for group in opt.param_groups:
            group["lr"] = lr_at(step, steps)
        starts = torch.randint(0, len(data) - SEQ_LEN - 1, (BATCH,), generator=gen)
        batch = data[starts[:, None] + offsets]
        logits = model(input_ids=batch[:, :-1]).logits
        loss = torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1)
        )
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(float(loss.detach()))
        if step % 100 == 0 or step == steps - 1:
            print(
                f"step {step:5d}  loss {losses[-1]:.3f}  lr {lr_at(step, steps):.2e}  "
                f"{time.monotonic() - started:6.0f} s",
                file=sys.stderr,
            )

    out.mkdir(parents=True, exist_ok=True)
    state = {name: t.detach().to(torch.float16).contiguous() for name, t in model.state_dict().items()}
    save_file(dict(sorted(state.items())), str(out / "model.safetensors"), metadata={"format": "pt"})
    tiny_model.write_config(out, torch_dtype="float16")
    tiny_model.write_tokenizer(out)
    (out / HELDOUT).write_text(heldout_text, encoding="utf-8")
    tail = losses[-100:]
    record = {
        "command": f"python -m course.runtime.train_course_model train {out.as_posix()} --steps {steps} "
        f"--seed {seed} --threads {threads}",
        "torch": torch.__version__,
        "seed": seed,
        "threads": threads,
        "steps": steps,
        "batch": BATCH,
        "seq_len": SEQ_LEN,
        "peak_lr": PEAK_LR,
        "warmup": WARMUP,
        "weight_decay": 0.1,
        "grad_clip": 1.0,
        "train_tokens": len(data),
        "heldout_tokens": len(heldout_ids),
        "unigram_counts": torch.bincount(data, minlength=tokenizer.get_vocab_size()).tolist(),
        "final_train_loss_mean_last_100": round(sum(tail) / len(tail), 4),
        "train_files": manifest(root, train_paths),
        "heldout_files": manifest(root, heldout_paths),
    }
    (out / "training.json").write_text(json.dumps(record, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    write_manifest(out)
    print(f"trained {steps} steps in {time.monotonic() - started:.0f} s; wrote {out}", file=sys.stderr)
    return record


def sha256_of(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def write_manifest(out: Path) -> None:
    lines = [f"{sha256_of(out / name)}  {name}\n" for name in sorted(HASHED)]
    (out / MANIFEST).write_text("".join(lines), encoding="utf-8")


def read_manifest(out: Path) -> dict[str, str]:
    """``{file name: sha256}`` from ``SHA256SUMS`` (the ``sha256sum`` format)."""
    entries = {}
    for line in (Path(out) / MANIFEST).read_text(encoding="utf-8").splitlines():
        digest, name = line.split("  ", 1)
        entries[name] = digest
    return entries


# ---- the report (the README's generated block) ----------------------------------------------------


def report(path: Path = CHECKPOINT) -> str:
    set_torch_determinism(1)
    path = Path(path)
    record = json.loads((path / "training.json").read_text(encoding="utf-8"))
    model, tokenizer = load_model(path), load_tokenizer(path)
    heldout_text = (path / HELDOUT).read_text(encoding="utf-8")
    heldout_ids = tokenizer.encode(heldout_text).ids
    model_nll, scored = mean_nll(model, heldout_ids)
    params = sum(p.numel() for p in model.parameters())
    size = (path / "model.safetensors").stat().st_size
    tokens_seen = record["steps"] * record["batch"] * record["seq_len"]
    lines = [
        f"checkpoint  {path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else path}: "
        f"{params:,} parameters, float16, {size / 2**20:.1f} MiB",
        f"trained on  {len(record['train_files'])} Markdown files, {record['train_tokens']:,} tokens; {record['steps']:,} steps "
        f"of {record['batch']} x {record['seq_len']} tokens ({tokens_seen / record['train_tokens']:.1f} epochs)",
        f"held out    {len(record['heldout_files'])} files, {scored:,} tokens, {len(heldout_text):,} characters",
        "",
        f"{'':14}{'nats/token':>12}{'perplexity':>12}{'bits/char':>11}",
    ]
    # the baseline's counts were taken from the training tokens when the model was trained
    rows = [
        ("unigram", unigram_nll(record["unigram_counts"], heldout_ids[: scored + 1])),
        ("course-llama", model_nll),
    ]
    for name, nll in rows:
        bits_per_char = nll * scored / math.log(2) / len(heldout_text)
        lines.append(f"{name:14}{nll:12.2f}{math.exp(nll):12.1f}{bits_per_char:11.2f}")
    lines += [
        "",
        f"greedy, {NEW_TOKENS} new tokens at most, never repeating a {NO_REPEAT_NGRAM}-gram (⏎ = newline):",
    ]
    for prompt in PROMPTS:
        text = greedy(model, tokenizer, prompt)
        lines.append(f"  {prompt!r:18} → {text.replace(chr(10), '⏎')}")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m course.runtime.train_course_model", description=__doc__.split("\n")[0]
    )
    sub = parser.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("train", help="train and write a checkpoint")
    t.add_argument("out", type=Path)
    t.add_argument("--steps", type=int, default=STEPS)
    t.add_argument("--seed", type=int, default=SEED)
    t.add_argument("--threads", type=int, default=THREADS)
    r = sub.add_parser("report", help="held-out perplexity and greedy samples")
    r.add_argument("path", type=Path, nargs="?", default=CHECKPOINT)
    args = parser.parse_args(argv)
    if args.cmd == "train":
        train(args.out, steps=args.steps, seed=args.seed, threads=args.threads)
    else:
        print(report(args.path))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
