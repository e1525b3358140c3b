"""``attnlab bench recall``: associative recall against recurrent state size."""

from __future__ import annotations

import typer

from .common import chart, emit_json, int_list, load_report, name_list, out, records_json, track
from .options import from_option, json_option, output_option, plot_option, precision_option
from .tables import table

__all__ = ["recall"]


def recall(
    variants: str | None = typer.Option(
        None, help="Comma-separated variants [default: dense, local, linear and every input-gated variant that decodes causally "
                   "(attnlab.studies.recall.default_variants)]."),
    pairs: str = typer.Option("8,16", help="Comma-separated numbers of key-value pairs (the sequence is 3 x pairs tokens)."),
    embed_dims: str = typer.Option("32,64", "--embed-dims", help="Comma-separated model widths E (the state grows with them)."),
    steps: int = typer.Option(1500, min=1, help="Training steps per model (the same for every variant)."),
    seconds: float = typer.Option(60.0, min=0.1,
                                  help="At most this many training seconds per model (a slower variant trains fewer steps)."),
    precision: str = precision_option("fp32"),
    as_json: bool = json_option("Print the records as JSON instead of a table."),
    output: str | None = output_option("Also write the JSON to this file (after every model)."),
    plot: str | None = plot_option("Also draw accuracy against state size to this PNG."),
    source: str | None = from_option("Measure nothing: print (and --plot) the JSON written by -o."),
) -> None:
    """Multi-query associative recall (Zoology's MQAR) against recurrent state size, every variant on the same steps.

    The defaults took 20 minutes on a 2-core CPU when they were 8 variants (x 2 pair counts x 2 widths).
    """
    from .. import efficient
    from ..studies.recall import default_variants, run

    if source:
        records = load_report(source, "bench recall", lambda d: d["records"])
    else:
        names = name_list("--variants", ",".join(default_variants()) if variants is None else variants, efficient.names(),
                          hint=f"choose from {', '.join(efficient.names())}")
        pair_list, dim_list = int_list("--pairs", pairs, minimum=1), int_list("--embed-dims", embed_dims, minimum=4)
        total = len(names) * len(pair_list) * len(dim_list)
        with track("training", total, output, records_json) as tracker:
            run(names, pair_list, dim_list, steps=steps, seconds=seconds, precision=precision,
                on_record=tracker.on_record(lambda r: f"{r.variant} pairs={r.pairs} d={r.dim}: {r.accuracy:.3f}"))
        records = [r.to_dict() for r in tracker.records]
    chart(plot, "bench.plot_recall", records)
    if emit_json({"records": records}, as_json):
        return
    out.print("multi-query associative recall: test query accuracy (chance 1/values) and state size (float32 numbers per layer)")
    t = table(None, ["variant", "pairs", "N", "width", "state", "accuracy", "steps"], no_wrap=True)
    for r in records:
        t.add_row(r["variant"], str(r["pairs"]), str(r["length"]), str(r["dim"]), f"{r['state_floats']:,}", f"{r['accuracy']:.3f}",
                  str(r["steps"]))
    out.print(t)
