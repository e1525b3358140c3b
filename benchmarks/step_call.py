"""The cost of calling an attention step: one decoded token per call of a layer with its cache,
the code of two source trees side by side (the layer holding its step against the code before).

    git worktree add /tmp/before e70159d
    python benchmarks/step_call.py --before /tmp/before/src --after src -o benchmarks/results/step-call-DATE-CPU.json

For each tree, in a fresh child process (round-robin, ``--rounds`` times, so that a slow spell of
the machine falls on both), each variant at each width: ``efficient.create(name, embed_dim=E,
num_heads=4, causal where it has the option)``, ``new_cache()``, then ``--tokens`` calls of one
token under ``torch.no_grad()``, one torch thread; a record keeps the best of its calls' mean
over ``--repeats``. Prints microseconds per call and the ratio after / before (the machine's
time: what is compared is the ratio, measured in one run).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

CHILD = """
import json, sys, time, torch
from attnlab import efficient
torch.set_num_threads(1)
widths, names, tokens, repeats = json.loads(sys.argv[1])
out = {}
for e in widths:
    for name in names:
        causal = {"causal": True} if efficient.capabilities(name).causal not in ("mask", None) else {}
        torch.manual_seed(0)
        layer = efficient.create(name, embed_dim=e, num_heads=4, **causal).eval()
        x = torch.randn(1, 1, e)
        best = float("inf")
        with torch.no_grad():
            for _ in range(repeats):
                cache = layer.new_cache()
                t = time.perf_counter()
                for _ in range(tokens):
                    layer(x, cache=cache)
                best = min(best, (time.perf_counter() - t) / tokens)
        out[f"{name} E={e}"] = best * 1e6
print(json.dumps(out))
"""


def measure(src: str, widths: list[int], names: list[str], tokens: int, repeats: int) -> dict[str, float]:
    """Microseconds per decoded token of every (variant, width), in a child process on ``src``."""
    env = {**os.environ, "PYTHONPATH": str(Path(src).resolve()), "OMP_NUM_THREADS": "1"}
    run = subprocess.run([sys.executable, "-c", CHILD, json.dumps([widths, names, tokens, repeats])], env=env, capture_output=True,
                         text=True, check=True)
    return json.loads(run.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--before", required=True, help="the source folder of the code before (its src/)")
    p.add_argument("--after", required=True, help="the source folder of the code after")
    p.add_argument("--variants", default="dense,local,linear,gla,fox")
    p.add_argument("--widths", default="64,512")
    p.add_argument("--tokens", type=int, default=300)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("-o", "--output")
    args = p.parse_args()
    widths, names = [int(w) for w in args.widths.split(",")], args.variants.split(",")
    runs: dict[str, list[dict]] = {"before": [], "after": []}
    for _ in range(args.rounds):
        for which in ("before", "after"):
            runs[which].append(measure(getattr(args, which), widths, names, args.tokens, args.repeats))
    rows = []
    for key in runs["before"][0]:
        b, a = (statistics.median(r[key] for r in runs[w]) for w in ("before", "after"))
        rows.append({"case": key, "before_us": round(b, 1), "after_us": round(a, 1), "ratio": round(a / b, 3)})
        print(f"{key:>16}  before {b:8.1f} us  after {a:8.1f} us  after/before {a / b:.3f}")
    if args.output:
        Path(args.output).write_text(json.dumps({"command": " ".join(sys.argv), "rounds": args.rounds, "tokens": args.tokens,
                                                 "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
