"""The ``attnlab`` command: thin wrappers that parse arguments and call library functions."""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Optional

import typer
from rich import box
from rich.console import Console
from rich.table import Table

app = typer.Typer(
    name="attnlab",
    help="Self-attention over any vector set: explain it step by step, benchmark it.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
bench_app = typer.Typer(help="Measure speed and memory, side by side in one run.", no_args_is_help=True)
app.add_typer(bench_app, name="bench")

# a log file or pipe gets wide tables; a terminal gets its own width
out = Console(width=None if sys.stdout.isatty() else 120)
err = Console(stderr=True)


def _fail(message: str) -> None:
    err.print(f"[bold red]error:[/] {message}")
    raise typer.Exit(2)


def _version(value: bool) -> None:
    if value:
        from . import __version__

        out.print(f"attnlab {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version and exit."),
) -> None:
    """attnlab: self-attention over any vector set."""


def _fmt(x) -> str:
    return "·" if x is None else f"{x:.3f}"


def _matrix(title: str, rows: list, row_labels: list[str], col_labels: list[str]) -> Table:
    t = Table(title=title, title_justify="left", show_edge=False, pad_edge=False)
    t.add_column("", style="bold")
    for c in col_labels:
        t.add_column(c, justify="right")
    for label, row in zip(row_labels, rows):
        t.add_row(label, *(_fmt(x) for x in row))
    return t


@app.command()
def explain(
    sentence: str = typer.Argument("I saw a saw", help="The sentence; tokens are split on whitespace."),
    score: str = typer.Option("scaled_dot", help="Score function: dot, scaled_dot, additive, cosine, bilinear."),
    normalize: str = typer.Option("softmax", help="Normaliser: softmax, relu, sigmoid."),
    no_self: bool = typer.Option(False, "--no-self", help="Forbid each token to attend to itself."),
    heads: int = typer.Option(1, help="Number of heads (must divide --dim)."),
    dim: int = typer.Option(4, help="Embedding width d."),
    seed: int = typer.Option(0, help="Seed of the embeddings and projection matrices."),
    as_json: bool = typer.Option(False, "--json", help="Print every step as JSON instead of tables."),
) -> None:
    """Compute self-attention on a sentence and print every step: I, Q, K, V, A, A', O."""
    from .explain import explain as run_explain

    try:
        ex = run_explain(sentence, score=score, normalize=normalize, no_self=no_self, heads=heads, dim=dim, seed=seed)
    except ValueError as e:
        _fail(str(e))
    if as_json:
        print(json.dumps(ex.to_dict()))
        return
    labels = [f"{i}:{t}" for i, t in enumerate(ex.tokens)]
    dims = [f"d{c}" for c in range(dim)]
    out.print(
        f"[bold]Self-attention on {ex.tokens}[/] — score [cyan]{score}[/], normaliser [cyan]{normalize}[/], "
        f"{heads} head(s){', no attention to self' if no_self else ''}; float64 reference steps.\n"
        "Rows are tokens. Identical tokens get identical embeddings: without positions they get identical outputs.\n"
    )
    out.print(_matrix("I — input vectors a^i", ex.inputs, labels, dims))
    hd = [f"d{c}" for c in range(dim // heads)]
    for h in range(heads):
        tag = f" (head {h + 1})" if heads > 1 else ""
        out.print()
        out.print(_matrix(f"Q = W^q I{tag}", ex.q[h], labels, hd))
        out.print(_matrix(f"K = W^k I{tag}", ex.k[h], labels, hd))
        out.print(_matrix(f"V = W^v I{tag}", ex.v[h], labels, hd))
        out.print(_matrix(f"A — scores alpha_ij = {score}(q^i, k^j){tag}; · = masked", ex.scores[h], labels, labels))
        out.print(_matrix(f"A' — {normalize} of each row{tag}", ex.weights[h], labels, labels))
        out.print(_matrix(f"O = A' V{tag}", ex.head_outputs[h], labels, hd))
    if heads > 1:
        out.print()
        out.print(_matrix("output = concat(O^1..O^h) W^o", ex.output, labels, dims))


@bench_app.command("attention")
def bench_attention(
    sizes: str = typer.Option("1024,4096,8192", help="Comma-separated sequence lengths N (= M)."),
    configs: str = typer.Option(
        "scaled_dot+softmax,cosine+softmax,scaled_dot+relu,additive+softmax", help="Comma-separated score+normaliser paths."
    ),
    modes: str = typer.Option("fwd,fwd_bwd", help="fwd and/or fwd_bwd."),
    repeats: int = typer.Option(3, min=1, help="Timed repetitions at least (more while they take under 2 s)."),
    as_json: bool = typer.Option(False, "--json", help="Print the records as a JSON list instead of a table."),
    output: Optional[str] = typer.Option(None, "-o", "--output", help="Also write the JSON records to this file."),
    plot: Optional[str] = typer.Option(None, "--plot", help="Also draw time and memory against N to this PNG file."),
) -> None:
    """attend vs scaled_dot_product_attention vs a naive materialised implementation (B=1, H=4, D=64, fp32)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from .bench.attention import CONFIGS, ratios, run

    try:
        size_list = [int(s) for s in sizes.split(",") if s.strip()]
    except ValueError:
        _fail(f"--sizes must be comma-separated integers, got {sizes!r}")
    if not size_list or min(size_list) < 1:
        _fail(f"--sizes must be positive integers, got {sizes!r}")
    cfg_list = [c.strip() for c in configs.split(",") if c.strip()]
    mode_list = [m.strip() for m in modes.split(",") if m.strip()]
    bad = [c for c in cfg_list if c not in CONFIGS]
    if bad:
        _fail(f"unknown --configs {bad}; expected some of {list(CONFIGS)}")
    bad = [m for m in mode_list if m not in ("fwd", "fwd_bwd")]
    if bad:
        _fail(f"unknown --modes {bad}; expected fwd and/or fwd_bwd")
    total = sum(len(CONFIGS[c]["impls"]) for c in cfg_list) * len(size_list) * len(mode_list)
    with Progress(
        TextColumn("[progress.description]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=err,
        transient=True,
    ) as progress:
        task = progress.add_task("benchmarking attention", total=total)

        done: list = []

        def tick(rec):
            progress.update(task, advance=1, description=f"{rec.path} N={rec.n} {rec.mode}")
            done.append(rec.to_dict())
            if output:  # rewritten after every record, atomically: an interrupted run keeps what it measured
                _write_json(output, done)

        records = run(size_list, cfg_list, mode_list, min_repeats=repeats, on_record=tick)
    data = [r.to_dict() for r in records]
    if plot:
        from .viz.bench import plot_attention_benchmark

        err.print(f"chart written to {plot_attention_benchmark(data, plot)}")
    if as_json:
        print(json.dumps(data))
        return
    rel = {(r["path"], r["n"], r["mode"], r["impl"], r["vs"]): r for r in ratios(records)}
    out.print(
        "attention benchmark: B=1, H=4, D=64, fp32. ms = median time; MiB = peak tensor memory above the inputs; "
        "t/x and m/x = time and memory relative to x"
    )
    for path in cfg_list:
        has_sdpa = "sdpa" in CONFIGS[path]["impls"]
        t = Table(title=path, title_justify="left", box=box.SIMPLE_HEAD)
        cols = ["impl", "N", "mode", "ms", "MiB", "t/sdpa", "t/naive", "m/naive"]
        for col in cols if has_sdpa else [c for c in cols if c != "t/sdpa"]:
            t.add_column(col, justify="left" if col in ("impl", "mode") else "right", no_wrap=True)
        for r in (r for r in records if r.path == path):
            impl = f"attend({r.backend})" if r.impl.startswith("attend") else r.impl
            if r.seconds is None:
                t.add_row(impl, str(r.n), r.mode, "skipped", *[""] * (4 if has_sdpa else 3))
                continue
            vs_sdpa = rel.get((r.path, r.n, r.mode, r.impl, "sdpa"))
            vs_naive = rel.get((r.path, r.n, r.mode, r.impl, "naive"))
            t.add_row(
                impl,
                str(r.n),
                r.mode,
                f"{r.seconds * 1e3:.1f}",
                "" if r.peak_bytes is None else f"{r.peak_bytes / 2**20:.1f}",
                *([f"{vs_sdpa['time_ratio']:.2f}" if vs_sdpa else ""] if has_sdpa else []),
                f"{vs_naive['time_ratio']:.2f}" if vs_naive else "",
                f"{vs_naive['memory_ratio']:.3f}" if vs_naive and vs_naive["memory_ratio"] is not None else "",
            )
        out.print(t)
    for note in sorted({(r.impl, r.note) for r in records if r.note}):
        out.print(f"{note[0]}: {note[1]}")


def _write_json(path: str, data) -> None:
    """Write JSON atomically: a temporary file beside the target, then a rename."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", dir=target.parent, suffix=".tmp", delete=False) as f:
        json.dump(data, f, indent=1)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(f.name, 0o666 & ~umask)  # a temporary file is private; the result is an ordinary file
    os.replace(f.name, target)


def main() -> None:
    """Entry point of the ``attnlab`` console script."""
    app()


if __name__ == "__main__":  # pragma: no cover
    main()
    sys.exit(0)
