"""The default arena preset's wall time serially against a two-node Ray cluster on this machine,
one after the other (two one-thread runs at once against one two-thread run):

    python benchmarks/arena_executors.py -o benchmarks/results/arena-executors-2026-11-25-cpu2.txt

Runs ``attnlab arena --out DIR/serial`` (one run at a time, every torch thread), then starts
``ray start --head --num-cpus 1`` and ``ray start --address ... --num-cpus 1`` (a private temp
dir, token authentication off, stopped by pid at the end) and runs ``attnlab arena --executor ray
--address ... --out DIR/ray``. Prints both wall times, their ratio, whether the run ids are the
same, and each run's score and steps side by side (time-budgeted runs: the same seconds, not the
same steps, so their scores differ with the threads each run had).
"""

import argparse
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BIN = Path(sys.executable).parent


def _arena(out: Path, *extra: str, env=None) -> float:
    start = time.perf_counter()
    subprocess.run([str(BIN / "attnlab"), "arena", "--out", str(out), *extra], check=True, env=env,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def _rows(out: Path) -> dict:
    con = sqlite3.connect(out / "results.sqlite")
    return {r[0]: r[1:] for r in con.execute("select run_id, task, variant, seed, value, steps from runs")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-o", "--output", help="also write the report to this file")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="arena-exec-"))
    serial = _arena(work / "serial")
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    temp = Path(tempfile.mkdtemp(prefix="rq"))  # short: Ray's socket paths must stay under 107 bytes
    nodes = []
    try:
        for args_ in (["--head", "--port", str(port), "--temp-dir", str(temp / "t"), "--include-dashboard", "false"],
                      ["--address", f"127.0.0.1:{port}"]):
            nodes.append(subprocess.Popen([str(BIN / "ray"), "start", *args_, "--num-cpus", "1", "--disable-usage-stats", "--block"],
                                          env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            time.sleep(8)
        ray = _arena(work / "ray", "--executor", "ray", "--address", f"127.0.0.1:{port}", env=env)
    finally:
        for proc in reversed(nodes):
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=60)
    a, b = _rows(work / "serial"), _rows(work / "ray")
    lines = [f"default preset (attnlab arena), wall time including start-up: serial {serial:.0f} s, "
             f"two-node Ray cluster on this machine {ray:.0f} s (ray / serial {ray / serial:.2f})",
             f"run ids: {len(a)} serial, {len(b)} ray, {'the same' if set(a) == set(b) else 'DIFFERENT'}",
             f"{'task':8s} {'variant':10s} seed  serial score (steps)   ray score (steps)"]
    for rid in sorted(a, key=lambda r: a[r][:3]):
        t, v, seed, value, steps = a[rid]
        other = b.get(rid)
        theirs = f"{other[3]:.3f} ({other[4]:5d})" if other else "-"
        lines.append(f"{t:8s} {v:10s} {seed:4d}  {value:.3f} ({steps:5d})          {theirs}")
    text = "\n".join(lines)
    print(text)
    if args.output:
        Path(args.output).write_text(text + "\n")


if __name__ == "__main__":
    main()
