"""``attnlab complexity``: CNN / RNN / self-attention, the textbook table measured."""

from __future__ import annotations

from pathlib import Path

import typer

from .common import chart, err, int_list, name_list, out, print_json, track
from .errors import device_or_fail
from .options import device_option, json_option, layer_types_option, output_option, repeats_option, width_option
from .tables import on_device, table

__all__ = ["complexity"]

DEFAULT_SIZES = "64,128,256,512,1024,2048,4096,8192"
FIT_RANGES = "CNN 8K-256K, self-attention 4K-32K, recurrent layers 1K-8K"


def complexity(
    sizes: str | None = typer.Option(None, help=f"Comma-separated lengths n for the timing (default {DEFAULT_SIZES})."),
    layers: str = layer_types_option("cnn,rnn,lstm,self_attention,attention_rnn,lstmn"),
    path_sizes: str = typer.Option("16,64,256", "--path-sizes", help="Lengths n at which the path length is measured."),
    embed_dim: int = width_option(64, "Layer width d."),
    repeats: int = repeats_option(),
    rounds: int = typer.Option(
        3, min=1, help="Sweeps over a layer's lengths in its timing process (the median is kept)."),
    fit: bool | None = typer.Option(
        None, "--fit/--no-fit", help="Also time each layer over its fit range (default: on without --sizes)."),
    as_json: bool = json_option("Print one JSON record per (layer, n) and per layer instead of tables."),
    output: str | None = output_option("Folder for complexity.json (after every record) and complexity.png."),
    device: str = device_option(help="Where the layers are timed: auto (CUDA if present, else CPU), cpu, cuda, mps."),
) -> None:
    """CNN / RNN / self-attention, measured: time against n, sequential steps, path length.

    Beside the textbook table (cost O(k n d^2) / O(n d^2) / O(n^2 d); sequential steps O(1) /
    O(n) / O(1); path length O(n/k) / O(n) / O(1)), for each layer at width d (CNN kernel 3):
    forward time and its exponent, fitted where the leading term dominates (the range is shown); the longest chain
    of dependent operations of one forward pass; and the layers or recurrent steps between input 0 and
    output n - 1, found where d out_{n-1} / d x_0 first becomes non-zero.
    """
    where = device_or_fail(device)
    from ..studies.complexity import FIT_SIZES, LAYERS, exponents, fit_ranges, run

    size_list = int_list("--sizes", DEFAULT_SIZES if sizes is None else sizes, minimum=1)
    path_list = int_list("--path-sizes", path_sizes, minimum=2) if path_sizes.strip() else []
    names = name_list("--layers", layers, LAYERS)
    folder = Path(output) if output else None
    if folder is not None:
        folder.mkdir(parents=True, exist_ok=True)  # an unwritable -o fails now, not after minutes of timing
    if fit is None:  # the fit ranges reach 256K: a user's own short --sizes does not also run them unasked
        fit = sizes is None
        if not fit:
            err.print(f"--sizes given: the fit ranges ({FIT_RANGES}) are not timed; add --fit to time them too",
                      highlight=False, soft_wrap=True)

    def payload(done: list) -> dict:
        return {"records": [r.to_dict() for r in done], "exponents": exponents(done), "fit_ranges": fit_ranges(done)}

    fit_sizes = FIT_SIZES if fit else None
    total = (sum(len(set(size_list) | set(path_list) | set((fit_sizes or {}).get(name, ()))) for name in names)
             + len(names))
    with track("measuring", total, folder and str(folder / "complexity.json"), payload) as tracker:
        tick = tracker.on_record(lambda rec: f"{rec.layer} n={rec.n}")
        run(size_list, names, embed_dim=embed_dim, path_sizes=tuple(path_list), min_repeats=repeats,
            fit_sizes=fit_sizes, rounds=rounds, device=where, on_record=tick,
            on_timed=lambda name: tracker.update(1, f"timed {name}"))
    data = payload(tracker.records)
    chart(folder and folder / "complexity.png", "complexity.plot_complexity", data["records"],
          exponents=data["exponents"])
    if as_json:
        for r in data["records"]:
            print_json(r)
        for name, e in data["exponents"].items():
            print_json({"layer": name, "exponent": e, "fit_range": data["fit_ranges"][name]})
        return
    _tables(data, names, embed_dim, path_list, on_device(where))


def _tables(data: dict, names: list[str], embed_dim: int, path_list: list[int], where: str = "") -> None:
    """Print the forward times (measured ``where``: :func:`~attnlab.cli.tables.on_device`), then the
    textbook claims beside the measured exponent, steps and paths."""
    from ..studies.complexity import TEXTBOOK

    recs = data["records"]
    t = table(f"forward time (ms){where}, B=1, d={embed_dim}, fp32", ["n", *names], left=())
    for n in sorted({r["n"] for r in recs if r["seconds"] is not None}):
        by = {r["layer"]: r for r in recs if r["n"] == n}
        t.add_row(str(n), *[f"{by[name]['seconds'] * 1e3:.3g}" if name in by else "·" for name in names])
    out.print(t)

    left = ("layer", "book cost", "fit n", "book seq", "steps", "book path")
    columns = ["layer", "book cost", "time exp", "fit n", "book seq", "steps", "book path",
               *(f"path@{n}" for n in path_list)]
    c = table("textbook ('book') vs measured", columns, left=left)  # wraps in a narrow terminal rather than cutting
    ranges = data.get("fit_ranges", {})
    for name in names:
        mine = {r["n"]: r for r in recs if r["layer"] == name}
        lo, hi = min(mine), max(mine)
        e, span = data["exponents"].get(name), ranges.get(name)
        cost, seq, path = TEXTBOOK[name]
        steps = f"{mine[lo]['sequential_steps']} -> {mine[hi]['sequential_steps']} (n {_short(lo)}-{_short(hi)})"
        paths = [("·" if n not in mine or mine[n]["path_length"] is None else str(mine[n]["path_length"]))
                 for n in path_list]
        c.add_row(name, cost, "·" if e is None else f"{e:.2f}",
                  "·" if not span else f"{_short(span[0])}-{_short(span[1])}", seq, steps, path, *paths)
    out.print(c)
    out.print(
        "time exponent: log-log fit over the lengths n where the layer's leading term dominates (fit n); steps: "
        "longest chain of dependent operations in one forward pass, at the smallest and the largest n; path: layers "
        "(stacks) or recurrent hand-overs from input 0 to output n-1; CNN: causal, kernel 3"
    )
    missing = [name for name in names if data["exponents"].get(name) is None]
    if missing:
        out.print(f"no time exponent (·) for {', '.join(missing)}: fewer than two lengths timed in the layer's fit "
                  "range, or from n = 1024 outside it (--fit, or --sizes there, give one)")


def _short(n: int) -> str:
    """262144 -> "256K"; lengths below 1024 or not a multiple of it as they are."""
    return f"{n // 1024}K" if n >= 1024 and n % 1024 == 0 else str(n)
