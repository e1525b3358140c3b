"""Is the default arena's verdict the machine's? Its default run (``attnlab arena``, the ``quick``
preset, step budgets) twice, compared run by run:

    python benchmarks/arena_repro.py --a "attnlab arena" --b "attnlab --threads 1 arena" \\
        -o benchmarks/results/arena-repro-2026-11-26-cpu2.json

Each command runs in a fresh ``--out`` folder under ``--work`` (``A`` and ``B``), timed. Then the
two stores are compared: the same run ids, and for each run the same test score and validation
history (exact equality of the floats, not a tolerance). The result holds both leaderboards
(per task and level), the wall times and this machine's CPU, so a run on another machine (or with
``ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2``, the AVX2 kernel paths) can be set beside it.
Give ``--b ""`` to run one command only (its leaderboard and time).

    --against DIR --label avx2_paths    A's store compared run by run with another --out folder
                                        (e.g. ``ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 make demo``'s arena/)
    --naive 1024,4096,16384             dense_naive's training step measured (not projected) at these lengths,
                                        one thread, to check the cost table's b N + c N^2 projection

The result file of 2026-11-26 was written by the first form; its ``avx2_paths`` and
``naive_16k_measured`` records by these two options' code, run then as one-off lines.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path


def _run(command: str, out: Path) -> float:
    argv = shlex.split(command)
    if argv[0] == "attnlab":
        argv = [sys.executable, "-m", "attnlab", *argv[1:]]
    t = time.perf_counter()
    subprocess.run([*argv, "--out", str(out)], check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - t


def _board(out: Path) -> dict:
    from attnlab.arena import build_report

    _, board = build_report(out)
    table = {}
    for task, entries in board["tasks"].items():
        for e in entries:
            table[f"{task} / {e['variant']}"] = {"value": e["value"], "spread": e["spread"],
                                                  "levels": {json.dumps(p["level"]): p["value"] for p in e.get("levels") or []}}
    return {"leaderboard": table, "cost": board.get("cost")}


def _compare(a: dict, b: dict) -> dict:
    """Run by run: the same ids, the same test scores and validation histories (float equality)."""
    same = [i for i in a if i in b and a[i]["value"] == b[i]["value"]
            and [h["val"] for h in a[i]["history"]] == [h["val"] for h in b[i]["history"]]]
    return {"runs_a": len(a), "runs_b": len(b), "same_ids": sorted(a) == sorted(b), "identical_runs": len(same),
            "differing": [{"task": a[i]["task"], "variant": a[i]["variant"], "level": a[i].get("level"), "seed": a[i]["seed"],
                           "a": a[i]["value"], "b": b[i]["value"] if i in b else None} for i in sorted(set(a) - set(same))]}


def _naive(lengths: list[int]) -> dict:
    """dense_naive's training step on lookup's model at each length, one thread (the cost table projects it beyond 4K)."""
    import torch

    from attnlab.arena.cost import measure_one

    torch.set_num_threads(1)
    return {str(n): measure_one("lookup", "dense_naive", n, task_options={"size": 512}) for n in lengths}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--a", default="attnlab arena")
    ap.add_argument("--b", default="attnlab --threads 1 arena")
    ap.add_argument("--work", default="/tmp/arena-repro")
    ap.add_argument("--against", help="an existing --out folder to compare A's store with, run by run")
    ap.add_argument("--label", default="against", help="the record's name for --against")
    ap.add_argument("--naive", default="", help="lengths at which to measure dense_naive's step, comma-separated")
    ap.add_argument("-o", "--output", required=True)
    args = ap.parse_args()
    from attnlab.arena import Store
    from attnlab.arena.cost import cpu_name

    work = Path(args.work)
    result: dict = {"cpu": cpu_name(), "env": {k: os.environ[k] for k in ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA") if k in os.environ},
                    "commands": {}}
    stores = {}
    for name, command in (("A", args.a), ("B", args.b)):
        if not command:
            continue
        out = work / name
        if out.exists():
            raise SystemExit(f"{out} exists: give another --work")
        print(f"{name}: {command} --out {out}", flush=True)
        seconds = _run(command, out)
        stores[name] = {r["run_id"]: r for r in Store(out / "results.sqlite").rows()}
        result["commands"][name] = {"command": f"{command} --out {out}", "wall_seconds": round(seconds, 1), **_board(out)}
    if len(stores) == 2:
        result["comparison"] = _compare(stores["A"], stores["B"])
        print(json.dumps(result["comparison"]), flush=True)
    if args.against and "A" in stores:
        result[args.label] = _compare(stores["A"], {r["run_id"]: r for r in Store(Path(args.against) / "results.sqlite").rows()})
    if args.naive:
        result["naive_measured"] = _naive([int(n) for n in args.naive.split(",")])
    Path(args.output).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
