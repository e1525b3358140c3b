"""The gated linear-attention family's training step against N, side by side with dense attention.

    python benchmarks/gated_scaling.py -o benchmarks/results/gated-scaling-2026-11-24-cpu2.json

Forward + backward, B = 1, H = 4, D = 64 (E = 256), float32, at each N in a fresh round-robin
(:func:`attnlab.profiling.round_robin`: machine noise hits every entry alike), two measures:

* **attention step** (what ``attnlab bench scaling`` times for every variant: q, k, v of shape
  ``(B, H, N, D)`` in, the projections left out): dense is PyTorch's fused
  ``scaled_dot_product_attention``, causal and not; each gated variant is its chunkwise form
  (:mod:`attnlab.efficient.recurrence`, chunks of 64, causal as the method is) on the same q, k, v
  plus its gates (fixed random ones of the shape the variant uses);
* **layer** (projections, gates, short convolution, output norm and gate included): the causal
  dense layer (:class:`attnlab.MultiHeadAttention` with ``masks.causal()``) against each causal
  gated layer (``efficient.create(name, causal=True)``).

The process reuses freed memory as ``attnlab bench scaling``'s timing processes do (it restarts
itself with :func:`attnlab.profiling.allocator_env`'s ``"keep"``). Dense is timed up to
``--dense-up-to`` (its 32K step takes about 30 s here). Prints per N the seconds and the speed-up
over dense (causal), and the log-log slopes from 4K to the largest N.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

from attnlab import efficient, masks
from attnlab.efficient import recurrence
from attnlab.profiling import allocator_env, loglog_slope, round_robin

GATED = ("retnet", "gla", "deltanet", "gated_deltanet", "mamba2")
B, H, D = 1, 4, 64


def _step_inputs(n: int):
    g = torch.Generator().manual_seed(n)
    q, k, v = (torch.randn(B, H, n, D, generator=g).requires_grad_(True) for _ in range(3))
    gates = {"head": (-0.1 * torch.rand(B, H, n, generator=g)).requires_grad_(True),
             "channel": (-0.05 * torch.rand(B, H, n, D, generator=g)).requires_grad_(True),
             "beta": torch.rand(B, H, n, generator=g).requires_grad_(True)}
    return q, k, v, gates


def attention_steps(n: int, dense: bool) -> dict:
    q, k, v, gates = _step_inputs(n)
    kn = F.normalize(k.detach(), dim=-1).requires_grad_(True)  # the delta rule's keys are unit vectors

    def run(fn):
        def call():
            for t in (q, k, v, kn, *gates.values()):
                t.grad = None
            fn().sum().backward()
        return call

    calls = {}
    if dense:
        calls["dense"] = run(lambda: F.scaled_dot_product_attention(q, k, v))
        calls["dense causal"] = run(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True))
    scaled = lambda: q * D ** -0.5  # noqa: E731
    calls["retnet"] = run(lambda: recurrence.chunk_gated(scaled(), k, v, gates["head"])[0])
    calls["gla"] = run(lambda: recurrence.chunk_gated(scaled(), k, v, gates["channel"])[0])
    calls["deltanet"] = run(lambda: recurrence.chunk_delta(scaled(), kn, v, gates["beta"])[0])
    calls["gated_deltanet"] = run(lambda: recurrence.chunk_delta(scaled(), kn, v, gates["beta"], gates["head"])[0])
    calls["mamba2"] = run(lambda: recurrence.chunk_gated(q, k * gates["beta"][..., None], v, gates["head"])[0])
    return calls


def layer_steps(n: int, dense: bool) -> dict:
    x = torch.randn(B, n, H * D, generator=torch.Generator().manual_seed(n)).requires_grad_(True)
    torch.manual_seed(0)
    layers = {name: efficient.create(name, embed_dim=H * D, num_heads=H, causal=True) for name in GATED}
    causal = masks.causal()

    def run(fn):
        def call():
            x.grad = None
            fn().sum().backward()
        return call

    calls = {}
    if dense:
        layer = efficient.create("dense", embed_dim=H * D, num_heads=H)
        calls["dense causal"] = run(lambda: layer(x, mask=causal).output)
    for name, m in layers.items():
        calls[name] = run(lambda m=m: m(x).output)
    return calls


def slope(points: list[tuple[int, float]]) -> float | None:
    """The log-log slope over N >= 4096."""
    return loglog_slope([(n, t) for n, t in points if n >= 4096])


def main() -> None:
    if "ATTNLAB_ALLOCATOR" not in os.environ:  # restart once with freed memory reused, as `attnlab bench scaling` times
        os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, **allocator_env("keep"), "ATTNLAB_ALLOCATOR": "keep"})
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="4096,8192,16384,32768")
    ap.add_argument("--dense-up-to", type=int, default=16384)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("-o", "--output", default=None)
    args = ap.parse_args()
    records = []
    for n in (int(s) for s in args.sizes.split(",")):
        for measure, make in (("attention step", attention_steps), ("layer", layer_steps)):
            times = round_robin(make(n, n <= args.dense_up_to), args.repeats, target_seconds=20.0)
            for name, t in times.items():
                records.append({"measure": measure, "variant": name, "n": n, "seconds": statistics.median(t[1:]), "repeats": len(t) - 1})
            print(f"N={n} {measure}: " + ", ".join(f"{k} {statistics.median(t[1:]):.3f} s" for k, t in times.items()), flush=True)
            if args.output:
                Path(args.output).write_text(json.dumps({"records": records}, indent=1))
    print()
    for measure in ("attention step", "layer"):
        print(f"{measure}: seconds per forward + backward (speed-up over dense causal at the same N)")
        for name in dict.fromkeys(r["variant"] for r in records if r["measure"] == measure):
            rows = [r for r in records if r["measure"] == measure and r["variant"] == name]
            cells = []
            for r in rows:
                ref = next((d["seconds"] for d in records
                            if d["measure"] == measure and d["variant"] == "dense causal" and d["n"] == r["n"]), None)
                cells.append(f"{r['n']}: {r['seconds']:.3f}" + (f" ({ref / r['seconds']:.1f}x)" if ref else ""))
            s = slope([(r["n"], r["seconds"]) for r in rows])
            print(f"  {name:15s} " + "  ".join(cells) + ("" if s is None else f"  slope {s:.2f}"))
    if args.output:
        Path(args.output).write_text(json.dumps({"records": records, "slopes": {
            f"{m}/{v}": slope([(r["n"], r["seconds"]) for r in records if r["measure"] == m and r["variant"] == v])
            for m, v in dict.fromkeys((r["measure"], r["variant"]) for r in records)}}, indent=1))


if __name__ == "__main__":
    main()
