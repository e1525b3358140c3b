"""``attnlab bench positional | approximation | distance``: what each variant gets right, side by side."""

from __future__ import annotations

import typer

from .common import (
    chart,
    emit_json,
    int_list,
    jsonable,
    load_report,
    name_list,
    out,
    records_json,
    settings_dict,
    track,
)
from .errors import device_or_fail, usage_error
from .options import device_option, from_option, json_option, layer_types_option, output_option, plot_option
from .tables import on_device, table

__all__ = ["approximation", "distance", "positional"]


def positional(
    encodings: str = typer.Option(
        "none,sinusoidal,learned,rnn,floater,relative,alibi,rope", help="Comma-separated positional encodings."
    ),
    train_length: int = typer.Option(64, min=2, help="Sequence length during training (and learned's max_len)."),
    test_lengths: str = typer.Option("64,128,256", help="Comma-separated test lengths."),
    steps: int = typer.Option(1500, min=1, help="Training steps per run."),
    seeds: str = typer.Option("0,1,2", help="Comma-separated seeds: one training run per encoding and seed."),
    as_json: bool = json_option("Print the runs and the summary as JSON instead of a table."),
    output: str | None = output_option("Also write the JSON to this file (after every run)."),
    plot: str | None = plot_option("Also draw accuracy against test length to this PNG."),
    device: str = device_option(),
) -> None:
    """Length extrapolation: train on the delayed-copy task at one length, test at longer ones."""
    where = device_or_fail(device)
    from .. import positional as P
    from ..studies.positional import DEFAULT_ENCODINGS, Settings, run, summarize

    names = name_list("--encodings", encodings, P.names(), hint=f"choose from {', '.join(P.names())}")
    lengths = int_list("--test-lengths", test_lengths, minimum=1)
    seed_list = int_list("--seeds", seeds)
    settings = Settings(train_length=train_length, test_lengths=tuple(lengths), steps=steps, seeds=tuple(seed_list))
    if min(lengths + [train_length]) <= settings.delay:
        usage_error(f"every length must exceed the copy delay {settings.delay}")
    chosen = {n: DEFAULT_ENCODINGS.get(n, {}) for n in names}

    def payload(done: list) -> dict:
        return {"settings": settings_dict(settings), "runs": [r.to_dict() for r in done],
                "summary": jsonable(summarize(done))}

    with track("training", len(names) * len(seed_list) * steps, output, payload) as tracker:
        on_step = tracker.on_step(lambda name, seed, step, loss: f"{name} seed {seed} loss {loss:.3f}")
        run(chosen, settings, on_result=tracker.on_record(advance=0), on_step=on_step, device=where)
    summary = summarize(tracker.records)
    chart(plot, "positional.plot_extrapolation", jsonable(summary), train_length=train_length)
    if emit_json(payload(tracker.records), as_json):
        return
    out.print(
        f"length extrapolation{on_device(where)}, delayed copy (y_i = x_(i-{settings.delay}), vocab {settings.vocab}, "
        f"chance {1 / settings.vocab:.3f}); causal encoder E={settings.embed_dim} H={settings.num_heads} "
        f"layers={settings.num_layers}; trained at length {train_length} for {steps} steps; token accuracy, "
        f"mean \\[min-max] over seeds {','.join(map(str, seed_list))}"
    )
    t = table(None, ["encoding", *(f"acc @ {n}" for n in lengths)], no_wrap=True)
    t.add_column("train loss", justify="right")
    t.add_column("train s/run", justify="right")
    for row in summary:
        cells = []
        for n in lengths:
            a = row["accuracy"][n]
            if a is None:
                cells.append("error")
            else:
                cells.append(f"{a:.3f} [{row['accuracy_min'][n]:.2f}-{row['accuracy_max'][n]:.2f}]")
        opts = ",".join(f"{k}={v}" for k, v in row["options"].items())
        label = row["encoding"] + (f" ({opts})" if opts else "")
        t.add_row(label, *cells, f"{row['train_loss']:.3f}", f"{row['train_seconds']:.1f}")
    out.print(t)
    for row in summary:
        for n, e in row["errors"].items():
            out.print(f"{row['encoding']} @ {n}: {e}")


def approximation(
    n: int = typer.Option(1024, min=2, help="Sequence length N."),
    variants: str = typer.Option(
        "local,longformer,bigbird,linformer,performer,linear,reformer,nystrom", help="Comma-separated variants."
    ),
    temperature: float = typer.Option(1.0, min=0.0, help="Scale of q.k (1: diffuse attention; larger: peaked)."),
    seeds: int = typer.Option(3, min=1, help="Draws averaged per budget."),
    as_json: bool = json_option("Print the records as JSON instead of a table."),
    device: str = device_option(),
) -> None:
    """Relative Frobenius error of each variant against exact softmax attention, across its budget."""
    where = device_or_fail(device)
    from ..studies.approximation import BUDGETS, run_approximation

    names = name_list("--variants", variants, BUDGETS)
    with track("measuring", sum(len(BUDGETS[v][1]) for v in names)) as tracker:
        tick = tracker.on_record(lambda rec: f"{rec.variant} {rec.budget}")
        run_approximation(n, names, temperature=temperature, seeds=seeds, device=where, on_record=tick)
    done = tracker.records
    if emit_json([r.to_dict() for r in done], as_json):
        return
    title = (f"relative Frobenius error vs exact softmax attention{on_device(where)}, N={n}, H=4, D=64, "
             f"temperature {temperature}, mean of {seeds} draws")
    columns = ["variant", "budget", "values: error"]
    t = table(title, columns, left=columns)
    for v in names:
        rows = [r for r in done if r.variant == v]
        t.add_row(v, BUDGETS[v][0], "   ".join(f"{r.budget}: {r.error:.3f}" for r in rows))
    out.print(t)


def distance(
    distances: str = typer.Option("5,10,20,40,80", help="Comma-separated distances from the trigger to the query."),
    layers: str = layer_types_option("rnn,lstm,attention_rnn,lstmn,self_attention"),
    steps: int = typer.Option(400, min=1, help="Adam steps per (layer, distance, seed)."),
    seeds: str = typer.Option("0,1,2", help="Comma-separated seeds (weights and data); the table shows mean and min."),
    as_json: bool = json_option("Print the records as JSON instead of a table."),
    output: str | None = output_option("Also write the JSON here (after every record)."),
    plot: str | None = plot_option("Also draw accuracy against distance to this PNG."),
    report: str | None = from_option("Train nothing: print (and --plot) the JSON written by -o."),
    device: str = device_option(),
) -> None:
    """Train each layer type to label a query by a trigger token far back; accuracy per distance.

    The sequence-labelling task of :mod:`attnlab.studies.distance`: a trigger of 4 kinds, noise,
    then a query labelled with the trigger's kind (chance 25%). Every run trains on fresh
    generated batches (B=32, d=32) and is scored on 512 held-out sequences.
    """
    where = device_or_fail(device)
    from .. import recurrent
    from ..studies.distance import run

    if report:
        recs, steps = load_report(report, "bench distance", lambda d: (d["records"], d["records"][0]["steps"]))
        _distance_report(recs, plot, as_json, steps)
        return
    dist = int_list("--distances", distances, minimum=1)
    seed_list = int_list("--seeds", seeds, minimum=0)
    names = name_list("--layers", layers, recurrent.names())
    with track("training", len(dist) * len(names) * steps * len(seed_list), output, records_json) as tracker:
        on_step = tracker.on_step(lambda name, d, s, loss: f"{name} distance={d} loss={loss:.3f}")
        run(dist, names, steps=steps, seeds=seed_list, device=where, on_record=tracker.on_record(advance=0),
            on_step=on_step)
    _distance_report([r.to_dict() for r in tracker.records], plot, as_json, steps)


def _distance_report(recs: list[dict], plot: str | None, as_json: bool, steps: int) -> None:
    """Plot, print as JSON, or tabulate ``bench distance`` records."""
    chart(plot, "complexity.plot_distance", recs)
    if emit_json({"records": recs}, as_json):
        return
    dist = sorted({r["distance"] for r in recs})
    names = list(dict.fromkeys(r["layer"] for r in recs))
    seed_list = sorted({r["seed"] for r in recs})
    t = table(
        f"held-out accuracy at the query, mean (min) over seeds {seed_list}; {steps} steps each; chance 0.25",
        ["layer", *(f"distance {d}" for d in dist)],
        no_wrap=True,
    )
    t.add_column("train s", justify="right")
    for name in names:
        cells = []
        for d in dist:
            accs = [r["accuracy"] for r in recs if r["layer"] == name and r["distance"] == d]
            cells.append(f"{sum(accs) / len(accs):.3f} ({min(accs):.2f})" if accs else "·")
        t.add_row(name, *cells, f"{sum(r['seconds'] for r in recs if r['layer'] == name):.0f}")
    out.print(t)
