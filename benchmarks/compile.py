"""Does ``torch.compile`` help the training step here? Eager against compiled, side by side.

    python benchmarks/compile.py -o benchmarks/results/compile-2026-11-24-cpu2.json

For a few task configurations (the arena's long ``text`` task, ``pos`` tagging, ``digits``), the
model's training step (forward and loss under the run's precision, backward, AdamW) is timed
eager and with the forward through :func:`torch.compile` (as ``TrainConfig.compile`` does): the
compile time (the first steps), then the median of the steps after it, the two interleaved.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from attnlab import objectives, tasks
from attnlab.models.build import build_model
from attnlab.objectives import collate
from attnlab.training import TrainConfig
from attnlab.training.config import model_config
from attnlab.training.precision import autocast

CASES = {
    "text 1024 bytes, dense, 1 block": ("text", {"length": 1024}, {"num_layers": 1}),
    "text 1024 bytes, linear, 1 block": ("text", {"length": 1024}, {"num_layers": 1, "attention": "linear"}),
    "pos tagging, dense": ("pos", {}, {}),
    "digits, vit": ("digits", {}, {}),
}


def steps(name: str, options: dict, overrides: dict, precision: str, compiled: bool):
    cfg = TrainConfig.for_task(name, task_options=options, precision=precision, **overrides)
    task = tasks.create(name, **options)
    obj = objectives.get(task)
    torch.manual_seed(0)
    model = build_model(model_config(cfg, task))
    run = torch.compile(model) if compiled else model
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    inputs, labels = collate(task, task.split("train"), torch.arange(cfg.batch_size), obj)

    def step():
        with autocast(precision):
            loss = obj.loss(run, inputs, labels)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    return step


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--precision", default="fp32")
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("-o", "--output")
    args = ap.parse_args()
    records = []
    for label, (name, options, overrides) in CASES.items():
        fns = {mode: steps(name, options, overrides, args.precision, mode == "compiled") for mode in ("eager", "compiled")}
        first = {}
        for mode, fn in fns.items():  # warm-up: the compiled one compiles here
            t = time.perf_counter()
            for _ in range(3):
                fn()
            first[mode] = time.perf_counter() - t
        times = {mode: [] for mode in fns}
        for _ in range(args.repeats):
            for mode, fn in fns.items():
                t = time.perf_counter()
                fn()
                times[mode].append(time.perf_counter() - t)
        med = {m: statistics.median(ts) for m, ts in times.items()}
        rec = {"case": label, "precision": args.precision, "eager_seconds": med["eager"], "compiled_seconds": med["compiled"],
               "speedup": med["eager"] / med["compiled"], "compile_seconds": first["compiled"] - first["eager"]}
        records.append(rec)
        print(f"{label:36s} eager {1 / med['eager']:6.1f} steps/s, compiled {1 / med['compiled']:6.1f} steps/s "
              f"({rec['speedup']:.2f}x), compiling took {rec['compile_seconds']:.0f} s", flush=True)
    if args.output:
        Path(args.output).write_text(json.dumps({"records": records}, indent=1))


if __name__ == "__main__":
    main()
