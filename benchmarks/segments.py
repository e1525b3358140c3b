"""The chunkwise forms' segments (:mod:`attnlab.efficient.segments`): peak memory and time of the
gated family's training step before and after, from ``attnlab bench scaling`` result files.

    # the code before the segments (83e8790), in a worktree, and the code now; dense once
    git worktree add /tmp/before 83e8790
    V=retnet,gla,deltanet,gated_deltanet,mamba2,kda S=4096,8192,16384,32768
    PYTHONPATH=/tmp/before/src attnlab bench scaling --variants $V --sizes $S --rounds 2 --no-flex -o before.json
    attnlab bench scaling --variants $V --sizes $S --rounds 2 --no-flex -o after.json
    attnlab bench scaling --variants dense --sizes $S --rounds 1 --repeats 1 --no-flex -o dense.json
    python benchmarks/segments.py before.json after.json --dense dense.json -o benchmarks/results/segments-DATE-CPU.json

Prints per variant and N the peak memory before and after (MiB, and as a multiple of the fused
dense's at the same N) and the median seconds of a forward + backward (B = 1, H = 4, D = 64) with
the change in percent. Peak memory is exact (a child process per cell); the seconds are the
machine's, so the two runs must be taken one after the other on a quiet machine.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def _records(path: str) -> dict[tuple[str, int], dict]:
    return {(r["variant"], r["n"]): r for r in json.loads(Path(path).read_text())["records"]}


def compare(before: dict, after: dict, dense: dict) -> list[dict]:
    """One row per (variant, N) measured in both runs, with the fused dense's peak at that N."""
    rows = []
    for (variant, n), new in sorted(after.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        old, base = before.get((variant, n)), dense.get(("dense", n))
        if old is None or base is None or variant == "dense":
            continue
        rows.append({"variant": variant, "n": n, "dense_mib": base["peak_bytes"] / 2**20,
                     "before_mib": old["peak_bytes"] / 2**20, "after_mib": new["peak_bytes"] / 2**20,
                     "before_x_dense": old["peak_bytes"] / base["peak_bytes"],
                     "after_x_dense": new["peak_bytes"] / base["peak_bytes"],
                     "before_s": old["seconds"], "after_s": new["seconds"],
                     "time_change": new["seconds"] / old["seconds"] - 1})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("before")
    parser.add_argument("after")
    parser.add_argument("--dense", required=True, help="a bench scaling file with dense at the same N")
    parser.add_argument("-o", "--output")
    args = parser.parse_args()
    rows = compare(_records(args.before), _records(args.after), _records(args.dense))
    print(f"{'variant':15} {'N':>6}  {'MiB before':>10} {'after':>6}  {'x dense before':>14} {'after':>6}  "
          f"{'s before':>8} {'after':>6} {'change':>7}")
    for r in rows:
        print(f"{r['variant']:15} {r['n']:6d}  {r['before_mib']:10.0f} {r['after_mib']:6.0f}  "
              f"{r['before_x_dense']:14.1f} {r['after_x_dense']:6.1f}  {r['before_s']:8.3f} {r['after_s']:6.3f} "
              f"{100 * r['time_change']:+6.0f}%")
    if args.output:
        Path(args.output).write_text(json.dumps({"records": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
