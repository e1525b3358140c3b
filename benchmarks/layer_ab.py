"""One layer's forward + backward, this checkout against another, side by side: what a change to the way from a
layer to its math costs or saves (the way itself is counted by benchmarks/call_path.py).

    git worktree add /tmp/base REV
    PYTHONPATH=src python benchmarks/layer_ab.py --base /tmp/base/src -o benchmarks/results/layer-ab-DATE-cpu2.json

Each round runs one process per checkout, in alternating order (machine noise hits both alike); each process times
every variant's layer (``efficient.create(name, embed_dim=256, num_heads=4)``, float32, batch 1) at each length:
the median of ``--reps`` calls of ``layer(x).output.sum().backward()`` after two warm-up calls. Prints per variant
and length the median over rounds of each side and the ratio this / base. The figures are this machine's.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

VARIANTS = ("dense", "gated_deltanet", "mamba2", "retnet")
LENGTHS = (128, 2048)


def child(variants: list[str], lengths: list[int], reps: int) -> dict:
    """Seconds per call of each variant's layer at each length, in this process's attnlab."""
    import torch

    from attnlab import efficient

    out = {}
    for name in variants:
        torch.manual_seed(0)
        layer = efficient.create(name, embed_dim=256, num_heads=4)
        for n in lengths:
            x = torch.randn(1, n, 256)
            times = []
            for i in range(reps + 2):
                start = time.perf_counter()
                layer(x).output.sum().backward()
                if i >= 2:
                    times.append(time.perf_counter() - start)
            out[f"{name}@{n}"] = statistics.median(times)
    return out


def run_side(src: str, a: argparse.Namespace) -> dict:
    env = {**os.environ, "PYTHONPATH": src}
    cmd = [sys.executable, __file__, "--child", "--variants", ",".join(a.variants), "--lengths",
           ",".join(map(str, a.lengths)), "--reps", str(a.reps)]
    return json.loads(subprocess.run(cmd, env=env, check=True, capture_output=True, text=True).stdout)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--base", help="the src folder of the checkout to compare against")
    p.add_argument("--variants", type=lambda s: s.split(","), default=list(VARIANTS))
    p.add_argument("--lengths", type=lambda s: [int(t) for t in s.split(",")], default=list(LENGTHS))
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("-o", "--output", default=None)
    a = p.parse_args()
    if a.child:
        print(json.dumps(child(a.variants, a.lengths, a.reps)))
        return
    if not a.base:
        p.error("--base is required")
    here = str(Path(__file__).resolve().parents[1] / "src")
    sides: dict[str, list[dict]] = {"this": [], "base": []}
    for r in range(a.rounds):
        order = ("this", "base") if r % 2 == 0 else ("base", "this")
        for side in order:
            sides[side].append(run_side(here if side == "this" else a.base, a))
    rows = []
    for key in sides["this"][0]:
        this = statistics.median(s[key] for s in sides["this"])
        base = statistics.median(s[key] for s in sides["base"])
        rows.append({"layer": key, "this_s": this, "base_s": base, "ratio": this / base})
        print(f"{key:22s} this {this * 1e3:9.2f} ms   base {base * 1e3:9.2f} ms   this / base {this / base:5.3f}")
    if a.output:
        with open(a.output, "w") as f:
            json.dump({"command": " ".join(sys.argv), "this_commit": _commit(here), "base_commit": _commit(a.base),
                       "python": platform.python_version(), "cpu": _cpu(), "rounds": a.rounds, "reps": a.reps,
                       "rows": rows, "raw": sides}, f, indent=1)


def _commit(src: str) -> str | None:
    """The commit a checkout's ``src`` folder is at (with ``+`` when it has changes), or None outside git."""
    git = ["git", "-C", src]
    head = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    if head.returncode:
        return None
    dirty = subprocess.run([*git, "status", "--porcelain", "--", "."], capture_output=True, text=True).stdout.strip()
    return head.stdout.strip() + ("+" if dirty else "")


def _cpu() -> str:
    """The CPU's model name and whether it has native bfloat16 (``avx512_bf16``), from /proc/cpuinfo."""
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.machine()
    name = next((line.split(":", 1)[1].strip() for line in info.splitlines() if line.startswith("model name")), "")
    return f"{name} ({'avx512_bf16' if 'avx512_bf16' in info else 'no avx512_bf16'}, {os.cpu_count()} cores)"


if __name__ == "__main__":
    main()
