"""``attnlab compare vit-cnn``: train rival models on the same data and compare them."""

from __future__ import annotations

import typer

from .common import chart, emit_json, int_list, out, records_json, split_list, track
from .errors import device_or_fail, fail, usage_error
from .options import device_option, json_option, output_option, plot_option
from .tables import on_device, table

__all__ = ["vit_cnn"]


def vit_cnn(
    fractions: str = typer.Option("0.05,0.1,0.25,0.5,1.0", help="Comma-separated shares of the digits training split."),
    models: str = typer.Option("vit,cnn", help="Comma-separated image models (vit, pixels, cnn)."),
    seeds: str = typer.Option("0,1,2", help="Comma-separated seeds (training subset and weights)."),
    steps: int | None = typer.Option(None, min=1, help="Optimizer steps per run (default: the task's)."),
    as_json: bool = json_option("Print the records as JSON instead of a table."),
    output: str | None = output_option("Also write the JSON here (after every run)."),
    plot: str | None = plot_option("Also draw accuracy against training-set size to this PNG."),
    device: str = device_option(),
) -> None:
    """Digits: test accuracy of a ViT and a CNN (same head, same training) as the training set grows."""
    where = device_or_fail(device)
    from ..studies.vit_cnn import run

    try:
        frac = [float(f) for f in split_list(fractions)]
    except ValueError:
        usage_error(f"--fractions must be numbers in (0, 1], got {fractions!r}")
    seed_list = int_list("--seeds", seeds, minimum=0)
    names = split_list(models)
    try:
        with track("training", len(frac) * len(names) * len(seed_list), output, records_json) as tracker:
            on_step = tracker.on_step(lambda m, f, s, step, total: f"{m} fraction={f} seed={s} step {step}/{total}",
                                      advance=0)
            run(frac, names, seeds=seed_list, steps=steps, device=str(where), on_record=tracker.on_record(),
                on_step=on_step)
    except (ValueError, KeyError) as e:
        fail(e)
    recs = [r.to_dict() for r in tracker.records]
    chart(plot, "bench.plot_vit_cnn", recs)
    if emit_json({"records": recs}, as_json):
        return
    fracs = sorted({r["fraction"] for r in recs})
    columns = ["model"]
    for f in fracs:
        n = [r["train_size"] for r in recs if r["fraction"] == f]
        columns.append(f"{f:g} ({round(sum(n) / len(n))} imgs)")
    t = table(f"digits test accuracy{on_device(where)}, mean (min) over seeds", columns)
    for m in dict.fromkeys(r["model"] for r in recs):
        row = [m]
        for f in fracs:
            a = [r["accuracy"] for r in recs if r["model"] == m and r["fraction"] == f]
            row.append(f"{sum(a) / len(a):.3f} ({min(a):.3f})" if a else "-")
        t.add_row(*row)
    out.print(t)
