"""``attnlab bench recall``: associative recall against recurrent state size."""

from __future__ import annotations

import typer

from .common import int_list, name_list, out, records_json, track
from .errors import device_or_fail
from .measured import measured
from .options import Precision, device_option, plain, precision_option
from .tables import table

__all__ = ["recall"]


def _recall(
    *,
    variants: str | None = typer.Option(
        None, help="Comma-separated variants (default: dense, local, linear and the causal input-gated ones)."),
    pairs: str = typer.Option(
        "8,16", help="Comma-separated numbers of key-value pairs (the sequence is 3 x pairs tokens)."),
    embed_dims: str = typer.Option(
        "32,64", "--embed-dims", help="Comma-separated model widths E (the state grows with them)."),
    steps: int = typer.Option(1500, min=1, help="Training steps per model (the same for every variant)."),
    seconds: float = typer.Option(
        60.0, min=0.1, help="At most this many training seconds per model (a slower variant trains fewer steps)."),
    precision: Precision = precision_option(Precision.fp32),  # noqa: B008  (an enum is not immutable to ruff)
    device: str = device_option(),
    output: str | None = None,
) -> dict:
    """Multi-query associative recall (Zoology's MQAR) against recurrent state size, every variant on the same steps.

    The defaults train every variant at 2 pair counts and 2 widths: a long run on a CPU (the recall
    benchmark page gives its time).
    """
    where = device_or_fail(device)
    from .. import efficient
    from ..studies.recall import default_variants, run

    names = name_list("--variants", ",".join(default_variants()) if variants is None else variants, efficient.names(),
                      hint=f"choose from {', '.join(efficient.names())}")
    pair_list, dim_list = int_list("--pairs", pairs, minimum=1), int_list("--embed-dims", embed_dims, minimum=4)
    total = len(names) * len(pair_list) * len(dim_list)
    with track("training", total, output, records_json) as tracker:
        run(names, pair_list, dim_list, steps=steps, seconds=seconds, precision=plain(precision), device=where,
            on_record=tracker.on_record(lambda r: f"{r.variant} pairs={r.pairs} d={r.dim}: {r.accuracy:.3f}"))
    return records_json(tracker.records)


def _report(data: dict) -> None:
    out.print("multi-query associative recall: test query accuracy (chance 1/values) and state size "
              "(float32 numbers per layer)")
    t = table(None, ["variant", "pairs", "N", "width", "state", "accuracy", "steps"], no_wrap=True)
    for r in data["records"]:
        t.add_row(r["variant"], str(r["pairs"]), str(r["length"]), str(r["dim"]), f"{r['state_floats']:,}",
                  f"{r['accuracy']:.3f}", str(r["steps"]))
    out.print(t)


def _checked(data: dict) -> dict:
    for r in data["records"]:
        for f in ("variant", "pairs", "length", "dim", "state_floats", "accuracy", "steps"):
            if f not in r:
                raise KeyError(f)
    return data


recall = measured("bench recall", draw="bench.plot_recall", show=_report, checked=_checked,
                  drawn=lambda data: data["records"],
                  plot_help="Also draw accuracy against state size to this PNG.")(_recall)
