"""The tuned leaderboard against the single-learning-rate one, side by side, from one arena store
run with a sweep:

    attnlab arena --preset standard --tasks recall,lookup --variants dense,linear,performer,retnet,none \\
        --seeds 0 --budget-seconds 15 --out sweep
    python benchmarks/arena_sweep.py sweep > benchmarks/results/arena-sweep-2026-11-25-cpu2.txt

The single-learning-rate board is the store's runs at each task's own learning rate (the runs
the same command without ``--sweep`` plans: they have the same run ids); the tuned board picks
each cell's rate on validation (:func:`attnlab.arena.sweep.choose`). Per task: each variant's
test score and rank on both boards, the chosen rate, and whether the rank moved.
"""

import sys
from pathlib import Path

from attnlab import tasks as task_registry
from attnlab.arena.report import leaderboard
from attnlab.arena.store import Store


def main(folder: str) -> None:
    """Print both boards of ``folder``'s store side by side, task by task."""
    rows = Store(Path(folder) / "results.sqlite").rows()
    single = [{**r, "sweep": {}} for r in rows if r["config"]["lr"] == task_registry.train_defaults(r["task"]).get("lr", 1e-3)]
    tuned, one = leaderboard(rows)["tasks"], leaderboard(single)["tasks"]
    moved = 0
    for task, entries in tuned.items():
        rank_one = {e["variant"]: (i + 1, e) for i, e in enumerate(one.get(task, []))}
        lr = task_registry.train_defaults(task).get("lr", 1e-3)
        print(f"\n{task}: test score at the task's own learning rate ({lr:g}) against the rate chosen on validation")
        print(f"  {'variant':10s} {'own lr':>7s} {'rank':>4s}   {'tuned':>7s} {'rank':>4s}  {'chosen lr':>9s}  {'sweep test range':>16s}")
        for i, e in enumerate(entries):
            r1, e1 = rank_one.get(e["variant"], (None, None))
            chosen = (e.get("sweep") or {}).get("chosen", {}).get("lr")
            low, high = ((e["sweep"]["low"], e["sweep"]["high"]) if e.get("sweep") else (None, None))
            fmt = lambda x: "-" if x is None else f"{x:.3f}"  # noqa: E731
            mark = "" if r1 == i + 1 else "  rank moved"
            moved += r1 != i + 1
            print(f"  {e['variant']:10s} {fmt(e1['value'] if e1 else None):>7s} {r1 or '-':>4}   {fmt(e['value']):>7s} {i + 1:>4}  "
                  f"{'-' if chosen is None else format(chosen, 'g'):>9s}  {fmt(low):>7s}-{fmt(high):<8s}{mark}")
    print(f"\n{moved} variant ranks moved with tuning")


if __name__ == "__main__":
    main(sys.argv[1])
