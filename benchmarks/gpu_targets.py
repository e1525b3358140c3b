"""The GPU issue's speed targets, side by side in one process, forward + backward (or forward only):

* the masks (local, longformer, bigbird) through ``attnlab.attend`` against FlexAttention called
  directly (compiled) on the same block mask, in the same dtype, and against SDPA on dense
  attention (bf16 causal, fp32);
* the gated family's functional forms (``chunk_gated``, ``chunk_delta``) through attnlab, served by
  fla where its check passes, against fla's op called directly, and attnlab's own forms with fla
  switched off (the fallback).

B = 1, 16 heads of 64 (4 of 16 on a CPU), one length (``--n``, default 16384; 1024 on a CPU);
median of ``--repeats`` timed calls after two warm-ups, each between synchronisations.

    PYTHONPATH=src python benchmarks/gpu_targets.py [--n 16384] [--repeats 5] [-o OUT.json]
"""

import argparse
import importlib
import itertools
import json
import statistics
import sys
import time

import torch
import torch.nn.functional as F

from attnlab import attend, efficient
from attnlab.core import flex
from attnlab.devices import describe, resolve, synchronize
from attnlab.efficient import fla_ops, recurrence

MASKED = ("local", "longformer", "bigbird")


def timed(call, device, repeats: int) -> float | str:
    """Median seconds of ``call()`` (warmed up twice), or the first line of what it raised."""
    try:
        for _ in range(2):
            call()
        times = []
        for _ in range(repeats):
            synchronize(device)
            t = time.perf_counter()
            call()
            synchronize(device)
            times.append(time.perf_counter() - t)
        return statistics.median(times)
    except Exception as e:  # a kernel refused, out of memory: the row says so
        return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"


def fwd_bwd(fn, *inputs, backward: bool = True):
    def call():
        out = fn(*inputs)
        out = out[0] if isinstance(out, tuple) else out
        if backward:
            out.float().sum().backward()
    return call


def leaves(shapes, device, dtype, gen, low=None):
    out = []
    for s in shapes:
        t = torch.randn(*s, generator=gen).to(device, dtype)
        out.append((t if low is None else -F.softplus(t.float()).to(dtype) * low).requires_grad_())
    return out


def mask_rows(n, heads, dim, device, repeats, gen):
    from torch.nn.attention.flex_attention import flex_attention

    rows = []
    direct = torch.compile(flex_attention, dynamic=False)
    for dtype in (torch.float32, torch.bfloat16):
        # fp32 leaves; bf16 as the layers run it: attnlab's forms under autocast, fla's op on bf16 copies
        q, k, v = leaves([(1, heads, n, dim)] * 3, device, torch.float32, gen)
        sdpa = timed(fwd_bwd(lambda a, b, c: F.scaled_dot_product_attention(a, b, c, is_causal=True), q, k, v), device, repeats)
        rows.append({"what": "sdpa causal", "dtype": str(dtype), "seconds": sdpa})
        for name in MASKED:
            mask = efficient.create(name, embed_dim=heads * dim, num_heads=heads).step.pattern_mask()
            bmap = flex.flex_map(mask, 1, heads, n, n, device)
            blocks = flex.block_mask(bmap)
            ours = timed(fwd_bwd(lambda a, b, c, m=mask: attend(a, b, c, mask=m).output, q, k, v), device, repeats)
            theirs = timed(fwd_bwd(lambda a, b, c, bm=blocks: direct(a, b, c, block_mask=bm), q, k, v), device, repeats)
            rows.append({"what": name, "dtype": str(dtype), "attnlab": ours, "flex direct": theirs, "sdpa causal": sdpa,
                         "x flex": ours / theirs if isinstance(ours, float) and isinstance(theirs, float) else None})
            print(rows[-1], file=sys.stderr)
    return rows


def gated_rows(n, heads, dim, device, repeats, gen):
    rows = []
    cases = {"chunk_gated (retnet, mamba2)": ("chunk_simple_gla", False), "chunk_delta (gated_deltanet)": ("chunk_gated_delta_rule", True)}
    for (label, (op, delta)), dtype, backward in itertools.product(cases.items(), (torch.float32, torch.bfloat16), (False, True)):
        # fp32 leaves; bf16 as the layers run it: attnlab's forms under autocast, fla's op on bf16 copies
        q, k, v = leaves([(1, heads, n, dim)] * 3, device, torch.float32, gen)
        q = (q.detach() * dim**-0.5).requires_grad_()
        k = (F.normalize(k.detach(), dim=-1)).requires_grad_()
        (g,) = leaves([(1, heads, n)], device, torch.float32, gen, low=0.1)
        beta = torch.rand(1, heads, n, generator=gen).to(device).requires_grad_()
        args = (q, k, v, beta, g) if delta else (q, k, v, g)
        plain = recurrence.chunk_delta if delta else recurrence.chunk_gated

        def form(*a, plain=plain, dtype=dtype):
            with torch.autocast(device.type, dtype=dtype, enabled=dtype != torch.float32):
                return plain(*a)
        row = {"what": label, "dtype": str(dtype), "backward": backward,
               "attnlab": timed(fwd_bwd(form, *args, backward=backward), device, repeats)}
        served = fla_ops.SERVED_ON
        fla_ops.SERVED_ON = ()  # attnlab's own form: the fallback
        row["attnlab own form"] = timed(fwd_bwd(form, *args, backward=backward), device, repeats)
        fla_ops.SERVED_ON = served
        try:
            fn = fla_ops.fla_op(op)
            t = [x.transpose(1, 2).to(dtype) for x in (q, k, v)]
            extra = (g.transpose(1, 2), beta.transpose(1, 2).to(dtype)) if delta else (g.transpose(1, 2),)
            row["fla direct"] = timed(fwd_bwd(lambda *a, fn=fn: fn(*a, scale=1.0), *t, *extra, backward=backward), device, repeats)
        except Exception as e:  # fla or Triton missing here
            row["fla direct"] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        if all(isinstance(row[k], float) for k in ("attnlab", "fla direct")):
            row["x fla"] = row["attnlab"] / row["fla direct"]
        rows.append(row)
        print(row, file=sys.stderr)
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="auto")
    p.add_argument("--n", type=int, default=None)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("-o", "--output", default=None)
    p.add_argument("--only", choices=("masks", "gated"), default=None, help="one section")
    a = p.parse_args()
    device = resolve(a.device)
    gpu = device.type == "cuda"
    n = a.n or (16384 if gpu else 1024)
    heads, dim = (16, 64) if gpu else (4, 16)
    gen = torch.Generator().manual_seed(0)
    versions = {m: getattr(importlib.import_module(m), "__version__", "?") for m in ("torch",)}
    for m in ("triton", "fla"):
        try:
            versions[m] = importlib.import_module(m).__version__
        except Exception:
            versions[m] = None
    out = {"device": str(device), "device_name": describe(device), "versions": versions, "n": n, "heads": heads, "head_dim": dim}

    def write() -> str:  # after each section, so that a run stopped midway keeps what it measured
        text = json.dumps(out, indent=1)
        if a.output:
            with open(a.output, "w") as f:
                f.write(text)
        return text

    if a.only != "gated":
        out["masks"] = mask_rows(n, heads, dim, device, a.repeats, gen)
        write()
    if a.only != "masks":
        out["gated"] = gated_rows(n, heads, dim, device, a.repeats, gen)
    print(write())


if __name__ == "__main__":
    main()
