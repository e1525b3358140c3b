"""Compare two arena stores run by run: (task, variant, seed) -> status, steps and test score.

    python benchmarks/compare_arena.py BEFORE/results.sqlite AFTER/results.sqlite

Prints one line per run and the count of identical ones (identical = same status, same steps,
the same score to the last bit). Used to show that a refactor left the arena's results unchanged;
run ids may differ between versions (they hash the whole training config), so runs are matched
by task, variant and seed.
"""

import sqlite3
import sys


def rows(path: str) -> dict:
    """The runs of a store by (task, variant, seed)."""
    con = sqlite3.connect(path)
    con.row_factory = sqlite3.Row
    return {(r["task"], r["variant"], r["seed"]): r for r in con.execute("select * from runs")}


def main(before: str, after: str) -> int:
    """Print the comparison; the exit status is the number of runs that differ (0: identical)."""
    a, b = rows(before), rows(after)
    keys = sorted(set(a) | set(b))
    differ = 0
    for k in keys:
        ra, rb = a.get(k), b.get(k)
        if ra is None or rb is None:
            print(f"{k}: only {'after' if ra is None else 'before'}")
            differ += 1
            continue
        same = (ra["status"], ra["steps"], ra["value"]) == (rb["status"], rb["steps"], rb["value"])
        differ += not same
        print(f"{k[0]:9s} {k[1]:11s} seed {k[2]}  before {ra['status']} {ra['value']!r} ({ra['steps']} steps)"
              f"  after {rb['status']} {rb['value']!r} ({rb['steps']} steps)  {'identical' if same else 'DIFFERENT'}")
    print(f"{len(keys) - differ} identical, {differ} different, of {len(keys)} runs")
    return differ


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    sys.exit(min(main(sys.argv[1], sys.argv[2]), 1))
