"""Are the long tasks learnt? No attention, dense from scratch, dense with self-pretraining, on the
same wall-clock budget per task.

    python benchmarks/learnability.py --seconds 180 -o benchmarks/results/learnability-2026-11-24-cpu2.json

For ``text``, ``retrieval``, ``pathfinder`` and LRA-length ``listops`` at the ``lra`` preset's
settings (:data:`attnlab.arena.PRESETS`), three runs of ``--seconds`` training each (every run
time-budgeted: the same seconds of optimizer steps, learning rate annealed over them, no early
stop), all at ``--precision`` (default ``auto``):

* ``none``: the task's model without attention (``TrainConfig.baseline``);
* ``dense``: the dense transformer from random weights;
* ``dense + self-pretraining``: the same, its first ``--share`` of the seconds spent restoring
  masked tokens of the training inputs (:mod:`attnlab.objectives.denoising`), the rest
  fine-tuning on the labels (Amos, Berant & Gupta 2024).

Chance is 1 / classes; the majority share is the most frequent class of the test split.
Prints the table and writes the JSON (after every run: an interrupted study keeps what it measured).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import tempfile
import time
from collections import Counter
from pathlib import Path

from attnlab import tasks
from attnlab.arena.presets import PRESETS
from attnlab.training import TrainConfig, train

TASKS = ("text", "retrieval", "pathfinder", "listops")
COLUMNS = ("none", "dense", "dense + self-pretraining")


def configs(name: str, seconds: float, precision: str, share: float) -> dict[str, TrainConfig]:
    setting = PRESETS["lra"].tasks[name]
    train_opts = {**setting.train, "seconds": float(seconds), "precision": precision, "patience": None}
    dense = TrainConfig.for_task(name, task_options=dict(setting.task_options), **train_opts)
    dense = dataclasses.replace(dense, patience=None)
    return {
        "none": dense.baseline(),
        "dense": dense,
        "dense + self-pretraining": dataclasses.replace(dense, pretrain_steps=10**6, pretrain_share=share),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=180.0)
    ap.add_argument("--precision", default="auto")
    ap.add_argument("--share", type=float, default=0.5, help="the share of the budget self-pretraining takes")
    ap.add_argument("--tasks", default=",".join(TASKS))
    ap.add_argument("-o", "--output", default=None)
    args = ap.parse_args()
    records = []
    work = Path(tempfile.mkdtemp(prefix="learnability-"))
    for name in args.tasks.split(","):
        cfgs = configs(name, args.seconds, args.precision, args.share)
        task = tasks.create(name, **cfgs["dense"].task_options)
        labels = task.split("test").labels.flatten().tolist()
        majority = Counter(labels).most_common(1)[0][1] / len(labels)
        for column, cfg in cfgs.items():
            t0 = time.perf_counter()
            res = train(cfg, work / f"{name}-{column.replace(' ', '')}", task=task)
            rec = {"task": name, "column": column, "model": cfg.model, "value": res.value, "steps": res.steps, "precision": res.precision,
                   "pretrain": res.pretrain, "chance": 1 / task.num_labels, "majority": majority, "wall_seconds": time.perf_counter() - t0,
                   "train_seconds": res.step_seconds + (res.pretrain or {}).get("seconds", 0.0), "test_size": res.test_size,
                   "config": dataclasses.asdict(cfg)}
            records.append(rec)
            pre = (f", pretraining {res.pretrain['steps']} steps (restored-token accuracy {res.pretrain['val_accuracy']:.3f})"
                   if res.pretrain else "")
            print(f"{name:10s} {column:26s} {res.value:.3f} after {res.steps} steps{pre}", flush=True)
            if args.output:
                Path(args.output).write_text(json.dumps({"seconds": args.seconds, "precision": args.precision, "share": args.share,
                                                         "records": records}, indent=1))
    print()
    print(f"| task (chance / majority) | {' | '.join(COLUMNS)} |")
    print("|---|" + "---|" * len(COLUMNS))
    for name in dict.fromkeys(r["task"] for r in records):
        row = {r["column"]: r for r in records if r["task"] == name}
        first = next(iter(row.values()))
        cells = [f"{row[c]['value']:.3f} ({row[c]['steps']} steps)" if c in row else "-" for c in COLUMNS]
        print(f"| {name} ({first['chance']:.3f} / {first['majority']:.3f}) | {' | '.join(cells)} |")


if __name__ == "__main__":
    main()
