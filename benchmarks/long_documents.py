"""User-data defaults on long documents: which package of the standard library a 2,600-character
piece of its source comes from, trained as a user would with ``attnlab train jsonl``.

    python benchmarks/long_documents.py --seconds 120 -o benchmarks/results/long-documents-2026-11-24-cpu2.json

The data set is real text a user might bring: non-overlapping 2,600-character pieces of the
Python files of five standard-library packages (``asyncio``, ``email``, ``multiprocessing``,
``tkinter``, ``xml``; at most 100 pieces each, 5 balanced classes), one ``{"text", "label"}``
line per piece; ``attnlab train jsonl`` tokenizes it (byte-level BPE since 2026-11-26; the first
results: WordPiece, 2,000 words, about 700 tokens a piece) and splits it 80 / 10 / 10. Every configuration trains the same ``--seconds`` of
optimizer steps (time-budgeted, no early stop) at ``--precision`` (default ``auto``): the
short-data defaults (``SHORT``: :data:`attnlab.tasks.jsonl.SHORT_DEFAULTS` on TrainConfig's own
batch, warm-up and learning rate, what ``jsonl`` used for every file before) with the changes
named, and the long-document defaults this measurement chose
(:data:`attnlab.tasks.jsonl.LONG_DEFAULTS`, what ``attnlab train jsonl`` now uses on this file),
for the transformer and for its no-attention baseline (``window_mlp``, what ``attnlab train
jsonl`` shows beside the model).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sysconfig
import tempfile
import time
from pathlib import Path

PACKAGES = ("asyncio", "email", "multiprocessing", "tkinter", "xml")
PIECE = 2600
PER_CLASS = 100


def write_dataset(path: Path) -> int:
    """Write the jsonl file; returns its number of pieces."""
    root = Path(sysconfig.get_paths()["stdlib"])
    rows = 0
    with path.open("w") as f:
        for pkg in PACKAGES:
            kept = 0
            for file in sorted((root / pkg).rglob("*.py")):
                if "test" in file.relative_to(root / pkg).parts[:-1] or kept >= PER_CLASS:
                    continue
                text = file.read_text(encoding="utf-8", errors="replace")
                for i in range(0, len(text) - PIECE + 1, PIECE):
                    if kept >= PER_CLASS:
                        break
                    f.write(json.dumps({"text": text[i : i + PIECE], "label": pkg}) + "\n")
                    kept += 1
                    rows += 1
    return rows


SHORT = {"positional": "rope", "batch_size": 32, "warmup": 100, "lr": 0.001}

CONFIGS = {
    "short-data defaults": SHORT,
    "positional none": {**SHORT, "positional": "none"},
    "positional sinusoidal": {**SHORT, "positional": "sinusoidal"},
    "1 layer": {**SHORT, "num_layers": 1},
    "lr 0.002": {**SHORT, "lr": 0.002},
    "self-pretraining (half the budget)": {**SHORT, "pretrain_steps": 10**6},
    "batch 8": {**SHORT, "batch_size": 8},
    "batch 8 + warm-up 20": {**SHORT, "batch_size": 8, "warmup": 20},
    "batch 8 + warm-up 20 + 1 layer": {**SHORT, "batch_size": 8, "warmup": 20, "num_layers": 1},
    "batch 8 + warm-up 20 + lr 0.002": {**SHORT, "batch_size": 8, "warmup": 20, "lr": 0.002},
    "batch 8 + warm-up 20 + local attention": {**SHORT, "batch_size": 8, "warmup": 20, "attention": "local"},
    "window_mlp (no attention: +-2 tokens)": {**SHORT, "model": "window_mlp"},
    "long-document defaults": {},
    "window_mlp at the long-document defaults": {"model": "window_mlp"},
}
"""Training options on top of the task's own defaults for this (long) file, LONG_DEFAULTS."""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-o", "--output", help="JSON file of the results")
    ap.add_argument("--seconds", type=float, default=120.0)
    ap.add_argument("--precision", default="auto")
    ap.add_argument("--configs", default=None, help="comma-separated names of CONFIGS (default: all)")
    ap.add_argument("--append", action="store_true", help="add to the results already in --output")
    args = ap.parse_args()
    from attnlab.training import TrainConfig, train

    names = args.configs.split(",") if args.configs else list(CONFIGS)
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "packages.jsonl"
        n = write_dataset(data)
        print(f"{n} pieces of {PIECE} characters from {', '.join(PACKAGES)}", flush=True)
        out = Path(args.output) if args.output else None
        results = json.loads(out.read_text())["results"] if args.append and out and out.exists() else []
        for name in names:
            overrides = CONFIGS[name]
            cfg = TrainConfig.for_task("jsonl", task_options={"path": str(data)}, seconds=args.seconds, steps=10**6,
                                       precision=args.precision, **overrides)
            cfg = dataclasses.replace(cfg, patience=None)  # for_task ignores None overrides
            t = time.perf_counter()
            res = train(cfg, Path(tmp) / f"run{len(results)}-{name}")
            row = {"config": name, "overrides": overrides, "accuracy": res.value, "steps": res.steps, "test_size": res.test_size,
                   "wall_seconds": round(time.perf_counter() - t, 1), "positional": cfg.positional,
                   "dim": cfg.embed_dim, "layers": cfg.num_layers, "lr": cfg.lr, "batch_size": cfg.batch_size, "warmup": cfg.warmup,
                   "precision": res.precision, "stopped_by": res.stopped_by}
            results.append(row)
            print(f"{name:40s} {res.value:.4f}  ({res.steps} steps, {row['wall_seconds']} s)", flush=True)
            if out:
                out.write_text(json.dumps({"pieces": n, "seconds": args.seconds, "results": results}, indent=1))


if __name__ == "__main__":
    main()
