"""``attnlab bench masks``: a mask as a dense tensor, as a function computed block-sparse, on
PyTorch's causal kernel and on compiled FlexAttention, against N (:mod:`attnlab.studies.masks`)."""

from __future__ import annotations

import typer

from .common import int_list, name_list, out, track
from .errors import device_or_fail, usage_error
from .measured import measured
from .options import device_option, repeats_option
from .tables import table

__all__ = ["bench_masks"]


def _bench_masks(
    *,
    sizes: str = typer.Option("4096,8192,16384,32768,65536,131072", help="Comma-separated sequence lengths N."),
    patterns: str = typer.Option(
        "causal,window,documents,prefix_lm,dilated,global+window,bigbird", help="Comma-separated patterns."),
    methods: str = typer.Option("dense mask,block-sparse,pytorch causal,flex", help="Comma-separated methods."),
    repeats: int = repeats_option("Timed steps at least (more while they fit 4 s; one for a step over 20 s)."),
    dense_up_to: int = typer.Option(
        16384, min=1, help="The dense mask only up to this N (its N x N mask and every pair)."),
    flex_up_to: int = typer.Option(16384, min=1, help="Compiled FlexAttention only up to this N."),
    quadratic_up_to: int = typer.Option(
        32768, min=1, help="Causal and prefix-LM (N^2 allowed pairs) only up to this N."),
    layer_step: int | None = typer.Option(None, min=0, help="One training step of one layer under the window at this N "
                                           "(default: the largest of --sizes; 0: none)."),
    device: str = device_option(),
    output: str | None = None,
) -> dict:
    """Masks that scale: dense mask vs block-sparse vs PyTorch's causal kernel vs compiled FlexAttention (B=1, H=4,
    D=64, fp32)."""
    where = device_or_fail(device)
    from ..studies.masks import METHODS, PATTERNS, flex_ratios, run, slopes

    size_list = int_list("--sizes", sizes, minimum=1)
    names = name_list("--patterns", patterns, PATTERNS)
    kinds = name_list("--methods", methods, METHODS)
    if not size_list:
        usage_error("--sizes: give at least one length")
    if layer_step is None:  # follows --sizes: a short sweep is not followed by a step at 131,072
        layer_step = max(size_list)

    def payload(done: list) -> dict:
        return {"records": [r.to_dict() for r in done], "slopes": slopes(done), "flex": flex_ratios(done)}

    total = (sum(len(kinds) for p in names for n in size_list if not (PATTERNS[p][1] and n > quadratic_up_to))
             + (1 if layer_step else 0))
    with track("measuring masks", total, output, payload) as tracker:
        run(size_list, names, kinds, min_repeats=repeats, dense_up_to=dense_up_to, flex_up_to=flex_up_to,
            quadratic_up_to=quadratic_up_to, layer_step=layer_step or None, device=where,
            on_record=tracker.on_record(lambda r: f"{r.pattern} N={r.n} {r.method}"))
    return payload(tracker.records)


def _checked(data: dict) -> dict:
    for r in data["records"]:
        for f in ("pattern", "n", "method", "mode", "seconds", "rss_bytes", "map_bytes", "dense_bytes"):
            if f not in r:
                raise KeyError(f)
    data["slopes"], data["flex"] = data.get("slopes", {}), data.get("flex", [])
    return data


def _slope_line(slopes: dict) -> None:
    """The block-sparse slopes, or why a pattern has none: fewer than two block-sparse times with N in the fitted
    range."""
    got = {p: s for p, s in slopes.items() if s is not None}
    none = [p for p, s in slopes.items() if s is None]
    if got:
        out.print("block-sparse forward+backward time, log-log slope against N over 4K-32K: "
                  + ", ".join(f"{p} {s:.2f}" for p, s in got.items())
                  + (f"; none for {', '.join(none)} (fewer than two block-sparse times in 4K-32K)" if none else ""))
    elif none:
        out.print("no block-sparse slope against N: it is fitted over N in 4K-32K, and fewer than two block-sparse "
                  "times fall there (--sizes with two or more of 4096-32768 give one)")


def _mib(x) -> str:
    return "-" if x is None else f"{x / 2**20:,.0f}"


def _memory(r: dict | None):
    """A record's memory: its peak resident bytes (the CPU), else its device allocator's peak (CUDA)."""
    return None if not r else r["rss_bytes"] if r["rss_bytes"] is not None else r.get("peak_bytes")


def _report(data: dict) -> None:
    recs = data["records"]
    t = table("forward + backward, B=1, H=4, D=64, fp32; each cell its own plain process; s: median step; MiB: peak "
              "resident above the process before its first step (on CUDA: the allocator's peak above the inputs); "
              "dense/sparse: time ratio; map, mask: KiB of the block map and of a dense mask",
              ["pattern", "N", "dense s", "MiB", "sparse s", "MiB", "dense/sparse", "torch causal s", "map", "mask",
               "tiles"],
              left=("pattern",), no_wrap=True)
    for p in dict.fromkeys(r["pattern"] for r in recs if r["mode"] == "fwd_bwd"):
        for n in sorted({r["n"] for r in recs if r["pattern"] == p and r["mode"] == "fwd_bwd"}):
            cell = {r["method"]: r for r in recs if r["pattern"] == p and r["n"] == n and r["mode"] == "fwd_bwd"}
            dense, ours, causal = cell.get("dense mask"), cell.get("block-sparse"), cell.get("pytorch causal")
            geo = next(iter(cell.values()))
            t.add_row(p, f"{n:,}", f"{dense['seconds']:.3f}" if dense else "-", _mib(_memory(dense)),
                      f"{ours['seconds']:.3f}" if ours else "-", _mib(_memory(ours)),
                      f"{dense['seconds'] / ours['seconds']:.1f}" if dense and ours else "-",
                      f"{causal['seconds']:.3f}" if causal else "-",
                      f"{geo['map_bytes'] / 1024:,.1f}", f"{geo['dense_bytes'] / 1024:,.0f}", f"{geo['density']:.3f}")
    out.print(t)
    _slope_line(data["slopes"])
    for f in data["flex"]:
        out.print(f"forward only, {f['pattern']} N={f['n']:,}: block-sparse {f['ours']:.3f} s, compiled FlexAttention "
                  f"{f['flex']:.3f} s (block-sparse / FlexAttention = {f['ratio']:.2f})")
    for r in recs:
        if r["mode"] == "layer_step":
            held = ("resident above the process's start" if r["rss_bytes"] is not None
                    else "of the device allocator above the inputs")
            out.print(f"one training step of a MultiHeadAttention (E=256, 4 heads) under a window of 256 at "
                      f"N={r['n']:,}: {r['seconds']:.1f} s, {_mib(_memory(r))} MiB {held}")


bench_masks = measured("bench masks", draw="masks.plot_masks", show=_report, checked=_checked,
                       what="the records, slopes and FlexAttention ratios",
                       plot_help="Also draw time and memory against N per pattern to this PNG.")(_bench_masks)
