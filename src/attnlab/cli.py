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
    help="Self-attention over any vector set: explain it step by step, benchmark it, train it, and compare the variants (attnlab arena).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
bench_app = typer.Typer(help="Measure speed, memory and accuracy, side by side in one run.", no_args_is_help=True)
app.add_typer(bench_app, name="bench")
compare_app = typer.Typer(help="Train rival models on the same data and compare them.", no_args_is_help=True)
app.add_typer(compare_app, name="compare")
plot_app = typer.Typer(help="Draw attnlab's parts to PNG files.", no_args_is_help=True)
app.add_typer(plot_app, name="plot")

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


def _progress():
    """A progress bar on stderr (description, bar, done/total, elapsed, remaining), gone when done."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    return Progress(
        TextColumn("[progress.description]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=err,
        transient=True,
    )


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
    from .studies.attention import CONFIGS, ratios, run

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
    with _progress() as progress:
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


def _int_list(option: str, text: str, minimum: int = 0) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        _fail(f"{option} must be comma-separated integers, got {text!r}")
    if not values or min(values) < minimum:
        _fail(f"{option} must be integers >= {minimum}, got {text!r}")
    return values


@plot_app.command("positional")
def plot_positional_cmd(
    name: str = typer.Argument(..., help="The encoding: sinusoidal, learned, rnn, floater, relative, alibi, rope."),
    length: int = typer.Option(128, min=1, help="Number of positions drawn."),
    dim: int = typer.Option(64, min=1, help="Width E of the vectors (for rope: the head width D)."),
    heads: int = typer.Option(8, min=1, help="Heads of a bias encoding."),
    seed: int = typer.Option(0, help="Seed of a trainable encoding's initialisation."),
    output: Optional[str] = typer.Option(None, "-o", "--output", help="The PNG file (default positional-NAME.png)."),
) -> None:
    """Draw a positional encoding: vectors (one column per position), per-head biases, or RoPE's angles."""
    import torch

    from . import positional as P
    from .viz.positional import plot_positional

    if name not in P.list():
        _fail(f"unknown positional encoding {name!r}; choose one of {', '.join(P.list())}")
    if name == "none":
        _fail("the 'none' encoding adds no positional information: there is nothing to draw")
    torch.manual_seed(seed)
    try:
        pe = P.create(name, dim=dim, num_heads=heads, max_len=length)
    except ValueError as e:
        _fail(str(e))
    trained = any(True for _ in pe.parameters())
    title = None
    if trained:
        title = f"{name} at initialisation (seed {seed}): " + {
            "input": "positional vectors e^i, one column per position",
            "bias": "bias b_h(i, j) per head",
        }.get(pe.kind, "")
    path = plot_positional(pe, length, output or f"positional-{name}.png", title=title)
    err.print(f"written to {path}")


@bench_app.command("positional")
def bench_positional(
    encodings: str = typer.Option(
        "none,sinusoidal,learned,rnn,floater,relative,alibi,rope", help="Comma-separated positional encodings."
    ),
    train_length: int = typer.Option(64, min=2, help="Sequence length during training (and learned's max_len)."),
    test_lengths: str = typer.Option("64,128,256", help="Comma-separated test lengths."),
    steps: int = typer.Option(1500, min=1, help="Training steps per run."),
    seeds: str = typer.Option("0,1,2", help="Comma-separated seeds: one training run per encoding and seed."),
    as_json: bool = typer.Option(False, "--json", help="Print the runs and the summary as JSON instead of a table."),
    output: Optional[str] = typer.Option(None, "-o", "--output", help="Also write the JSON to this file (after every run)."),
    plot: Optional[str] = typer.Option(None, "--plot", help="Also draw accuracy against test length to this PNG."),
) -> None:
    """Length extrapolation: train on the delayed-copy task at one length, test at longer ones."""
    from .studies.positional import DEFAULT_ENCODINGS, Settings, run, summarize

    from . import positional as P

    names = [e.strip() for e in encodings.split(",") if e.strip()]
    bad = [e for e in names if e not in P.list()]
    if bad or not names:
        _fail(f"unknown --encodings {bad}; choose from {', '.join(P.list())}")
    lengths = _int_list("--test-lengths", test_lengths, minimum=1)
    seed_list = _int_list("--seeds", seeds)
    settings = Settings(train_length=train_length, test_lengths=tuple(lengths), steps=steps, seeds=tuple(seed_list))
    if min(lengths + [train_length]) <= settings.delay:
        _fail(f"every length must exceed the copy delay {settings.delay}")
    chosen = {n: DEFAULT_ENCODINGS.get(n, {}) for n in names}
    done: list = []

    def payload() -> dict:
        return {"settings": _settings_dict(settings), "runs": [r.to_dict() for r in done], "summary": _jsonable(summarize(done))}

    with _progress() as progress:
        task = progress.add_task("training", total=len(names) * len(seed_list) * steps)

        def on_step(name, seed, step, loss):
            progress.update(task, advance=1, description=f"{name} seed {seed} loss {loss:.3f}")

        def on_result(res):
            done.append(res)
            if output:  # rewritten after every run, atomically: an interrupted run keeps what it measured
                _write_json(output, payload())

        run(chosen, settings, on_result=on_result, on_step=on_step)
    summary = summarize(done)
    if plot:
        from .viz.positional import plot_extrapolation

        err.print(f"chart written to {plot_extrapolation(_jsonable(summary), plot, train_length=train_length)}")
    if as_json:
        print(json.dumps(payload()))
        return
    out.print(
        f"length extrapolation, delayed copy (y_i = x_(i-{settings.delay}), vocab {settings.vocab}, chance "
        f"{1 / settings.vocab:.3f}); causal encoder E={settings.embed_dim} H={settings.num_heads} "
        f"layers={settings.num_layers}; trained at length {train_length} for {steps} steps; token accuracy, "
        f"mean \\[min-max] over seeds {','.join(map(str, seed_list))}"
    )
    t = Table(box=box.SIMPLE_HEAD)
    t.add_column("encoding", no_wrap=True)
    for n in lengths:
        t.add_column(f"acc @ {n}", justify="right", no_wrap=True)
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


@bench_app.command("scaling")
def bench_scaling(
    sizes: str = typer.Option("1024,2048,4096,8192,16384,32768", help="Comma-separated sequence lengths N."),
    variants: str = typer.Option(
        "dense,local,longformer,bigbird,linformer,performer,linear,reformer,nystrom", help="Comma-separated variants."
    ),
    repeats: int = typer.Option(3, min=1, help="Timed repetitions at least."),
    memory: bool = typer.Option(True, "--memory/--no-memory", help="Measure peak memory (a child process per cell)."),
    flex: bool = typer.Option(True, "--flex/--no-flex", help="At N=16384: local vs compiled FlexAttention, forward."),
    peers: bool = typer.Option(False, "--peers", help="Also time lucidrains' implementations at 16384 (pip install -e '.[bench]')."),
    as_json: bool = typer.Option(False, "--json", help="Print the records, slopes and ratios as JSON instead of tables."),
    output: Optional[str] = typer.Option(None, "-o", "--output", help="Also write the JSON to this file (after every record)."),
    plot: Optional[str] = typer.Option(None, "--plot", help="Also draw time and memory against N to this PNG (scaling.png)."),
    report: Optional[str] = typer.Option(None, "--from", help="Measure nothing: print (and --plot) the JSON written by -o."),
) -> None:
    """Forward+backward time and peak memory of every attention variant against N (B=1, H=4, D=64, fp32)."""
    from .studies.scaling import SETTINGS, relative, run, slopes

    if report:
        try:
            data = json.loads(Path(report).read_text())
            recs = data["records"]
        except (OSError, ValueError, KeyError, TypeError) as e:
            _fail(f"--from {report}: not a records file written by 'attnlab bench scaling -o' ({e})")
        if plot:
            from .viz.bench import plot_scaling

            err.print(f"chart written to {plot_scaling(recs, plot, slopes=data.get('slopes'))}")
        _scaling_tables(data, sorted({r["n"] for r in recs}), list(dict.fromkeys(r["variant"] for r in recs if r["mode"] == "fwd_bwd")))
        return

    size_list = _int_list("--sizes", sizes, minimum=1)
    names = [v.strip() for v in variants.split(",") if v.strip()]
    bad = [v for v in names if v not in SETTINGS]
    if bad or not names:
        _fail(f"unknown --variants {bad}; expected some of {', '.join(SETTINGS)}")
    done: list = []
    peer_done: list = []

    def payload() -> dict:
        return {
            "records": [r.to_dict() for r in done],
            "slopes": slopes(done),
            "relative": relative(done),
            "peers": [p.to_dict() for p in peer_done],
        }

    with _progress() as progress:
        task = progress.add_task("measuring", total=len(size_list) * len(names) + (5 if peers else 0))

        def tick(rec):
            progress.update(task, advance=1 if rec.mode == "fwd_bwd" else 0, description=f"{rec.variant} N={rec.n}")
            done.append(rec)
            if output:
                _write_json(output, payload())

        run(size_list, names, min_repeats=repeats, memory=memory, flex=flex, on_record=tick)
        if peers:
            from .studies.peers import run_peers

            def ptick(rec):
                progress.update(task, advance=1, description=f"peer {rec.method}")
                peer_done.append(rec)
                if output:
                    _write_json(output, payload())

            run_peers(16384, min_repeats=repeats, on_record=ptick)
    data = payload()
    if plot:
        from .viz.bench import plot_scaling

        err.print(f"chart written to {plot_scaling(data['records'], plot, slopes=data['slopes'])}")
    if as_json:
        print(json.dumps(data))
        return
    _scaling_tables(data, size_list, names)


def _scaling_tables(data: dict, size_list: list[int], names: list[str]) -> None:
    """Print the scaling records: one row per (variant, N), then slopes, FlexAttention and peers."""
    rel = {(r["variant"], r["n"]): r for r in data["relative"]}
    t = Table(title="forward + backward, B=1, H=4, D=64, fp32 (speed-up and memory relative to dense SDPA)", box=box.SIMPLE_HEAD)
    for col in ("variant", "N", "seconds", "peak MiB", "speed-up", "memory"):
        t.add_column(col, justify="left" if col == "variant" else "right", no_wrap=True)
    for v in names:
        for n in size_list:
            r = next((r for r in data["records"] if r["variant"] == v and r["n"] == n and r["mode"] == "fwd_bwd"), None)
            if r is None or r["seconds"] is None:
                continue
            x = rel.get((v, n), {})
            t.add_row(
                v,
                str(n),
                f"{r['seconds']:.3f}",
                "" if r["peak_bytes"] is None else f"{r['peak_bytes'] / 2**20:.0f}",
                "" if x.get("speedup") is None else f"{x['speedup']:.2f}x",
                "" if x.get("memory_ratio") is None else f"{x['memory_ratio']:.2f}",
            )
    out.print(t)
    st = Table(title="log-log slopes against N (over N >= 4096 when measured)", box=box.SIMPLE_HEAD)
    for col in ("variant", "time slope", "memory slope"):
        st.add_column(col, justify="left" if col == "variant" else "right")
    fmt = lambda x: "" if x is None else f"{x:.2f}"  # noqa: E731
    for v in names:
        sl = data["slopes"].get(v, {})
        st.add_row(v, fmt(sl.get("time_slope")), fmt(sl.get("memory_slope")))
    out.print(st)
    fwd = [r for r in data["records"] if r["mode"] == "fwd"]
    if fwd:
        out.print("forward only, N=16384: " + ", ".join(f"{r['variant']} {r['seconds']:.3f} s" for r in fwd))
    for p in data.get("peers", []):
        if p["ours_seconds"] is None:
            out.print(f"{p['method']}: {p['note']}")
        else:
            out.print(
                f"{p['method']} N={p['n']}: ours {p['ours_seconds']:.3f} s, {p['peer']} {p['peer_seconds']:.3f} s "
                f"(ours / theirs = {p['ours_seconds'] / p['peer_seconds']:.2f})"
            )


@bench_app.command("approximation")
def bench_approximation(
    n: int = typer.Option(1024, min=2, help="Sequence length N."),
    variants: str = typer.Option(
        "local,longformer,bigbird,linformer,performer,linear,reformer,nystrom", help="Comma-separated variants."
    ),
    temperature: float = typer.Option(1.0, min=0.0, help="Scale of q.k (1: diffuse attention; larger: peaked)."),
    seeds: int = typer.Option(3, min=1, help="Draws averaged per budget."),
    as_json: bool = typer.Option(False, "--json", help="Print the records as JSON instead of a table."),
) -> None:
    """Relative Frobenius error of each variant against exact softmax attention, across its budget."""
    from .studies.approximation import BUDGETS, run_approximation

    names = [v.strip() for v in variants.split(",") if v.strip()]
    bad = [v for v in names if v not in BUDGETS]
    if bad or not names:
        _fail(f"unknown --variants {bad}; expected some of {', '.join(BUDGETS)}")
    done: list = []
    with _progress() as progress:
        task = progress.add_task("measuring", total=sum(len(BUDGETS[v][1]) for v in names))

        def tick(rec):
            progress.update(task, advance=1, description=f"{rec.variant} {rec.budget}")
            done.append(rec)

        run_approximation(n, names, temperature=temperature, seeds=seeds, on_record=tick)
    if as_json:
        print(json.dumps([r.to_dict() for r in done]))
        return
    t = Table(
        title=f"relative Frobenius error vs exact softmax attention, N={n}, H=4, D=64, temperature {temperature}, "
        f"mean of {seeds} draws",
        box=box.SIMPLE_HEAD,
    )
    for col in ("variant", "budget", "values: error"):
        t.add_column(col)
    for v in names:
        rows = [r for r in done if r.variant == v]
        t.add_row(v, BUDGETS[v][0], "   ".join(f"{r.budget}: {r.error:.3f}" for r in rows))
    out.print(t)


@app.command()
def complexity(
    sizes: str = typer.Option("64,128,256,512,1024,2048,4096,8192", help="Comma-separated lengths n for the timing."),
    layers: str = typer.Option("cnn,rnn,lstm,self_attention,attention_rnn,lstmn", help="Comma-separated layer types."),
    path_sizes: str = typer.Option("16,64,256", "--path-sizes", help="Lengths n at which the path length is measured."),
    dim: int = typer.Option(64, min=1, help="Layer width d."),
    repeats: int = typer.Option(3, min=1, help="Timed repetitions at least."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON record per (layer, n) and per layer instead of tables."),
    output: Optional[str] = typer.Option(None, "-o", "--output", help="Folder for complexity.json (after every record) and complexity.png."),
) -> None:
    """CNN / RNN / self-attention, measured: time against n, sequential steps, path length.

    Beside the textbook table (cost O(k n d^2) / O(n d^2) / O(n^2 d); sequential steps O(1) /
    O(n) / O(1); path length O(n/k) / O(n) / O(1)), for each layer at width d (CNN kernel 3):
    forward time and its fitted exponent over n >= 1024; the longest chain of dependent
    operations of one forward pass; and the layers or recurrent steps between input 0 and
    output n - 1, found where d out_{n-1} / d x_0 first becomes non-zero.
    """
    from .studies.complexity import LAYERS, TEXTBOOK, exponents, run

    size_list = _int_list("--sizes", sizes, minimum=1)
    path_list = _int_list("--path-sizes", path_sizes, minimum=2) if path_sizes.strip() else []
    names = [v.strip() for v in layers.split(",") if v.strip()]
    bad = [v for v in names if v not in LAYERS]
    if bad or not names:
        _fail(f"unknown --layers {bad}; expected some of {', '.join(LAYERS)}")
    done: list = []
    folder = Path(output) if output else None

    def payload() -> dict:
        recs = [r.to_dict() for r in done]
        return {"records": recs, "exponents": exponents(done)}

    total = len(set(size_list) | set(path_list)) * len(names)
    with _progress() as progress:
        task = progress.add_task("measuring", total=total)

        def tick(rec):
            progress.update(task, advance=1, description=f"{rec.layer} n={rec.n}")
            done.append(rec)
            if folder:
                _write_json(str(folder / "complexity.json"), payload())

        run(size_list, names, dim=dim, path_sizes=tuple(path_list), min_repeats=repeats, on_record=tick)
    data = payload()
    if folder:
        from .viz.complexity import plot_complexity

        err.print(f"chart written to {plot_complexity(data['records'], folder / 'complexity.png', exponents=data['exponents'])}")
    if as_json:
        for r in data["records"]:
            print(json.dumps(r))
        for name, e in data["exponents"].items():
            print(json.dumps({"layer": name, "exponent": e}))
        return
    recs = data["records"]
    t = Table(title=f"forward time (ms), B=1, d={dim}, fp32", box=box.SIMPLE_HEAD)
    t.add_column("n", justify="right")
    for name in names:
        t.add_column(name, justify="right")
    for n in sorted({r["n"] for r in recs if r["seconds"] is not None}):
        by = {r["layer"]: r for r in recs if r["n"] == n}
        t.add_row(str(n), *[f"{by[name]['seconds'] * 1e3:.3g}" if name in by else "·" for name in names])
    out.print(t)

    lo, hi = min(r["n"] for r in recs), max(r["n"] for r in recs)
    c = Table(title="textbook ('book') vs measured", box=box.SIMPLE_HEAD)
    for col in ("layer", "book cost", "time exp", "book seq", f"steps {lo}->{hi}", "book path"):
        c.add_column(col, justify="left" if col.startswith("book") or col == "layer" else "right", no_wrap=True)
    for n in path_list:
        c.add_column(f"path@{n}", justify="right", no_wrap=True)
    for name in names:
        mine = {r["n"]: r for r in recs if r["layer"] == name}
        e = data["exponents"].get(name)
        cost, seq, path = TEXTBOOK[name]
        steps = f"{mine[lo]['sequential_steps']} -> {mine[hi]['sequential_steps']}"
        paths = [("·" if mine[n]["path_length"] is None else str(mine[n]["path_length"])) for n in path_list]
        c.add_row(name, cost, "·" if e is None else f"{e:.2f}", seq, steps, path, *paths)
    out.print(c)
    out.print(
        "time exponent: log-log fit over n >= 1024; steps: longest chain of dependent operations in one forward pass; "
        "path: layers (stacks) or recurrent hand-overs from input 0 to output n-1; CNN: causal, kernel 3"
    )


@bench_app.command("distance")
def bench_distance(
    distances: str = typer.Option("5,10,20,40,80", help="Comma-separated distances from the trigger to the query."),
    layers: str = typer.Option("rnn,lstm,attention_rnn,lstmn,self_attention", help="Comma-separated layer types."),
    steps: int = typer.Option(400, min=1, help="Adam steps per (layer, distance, seed)."),
    seeds: str = typer.Option("0,1,2", help="Comma-separated seeds (weights and data); the table shows mean and min."),
    as_json: bool = typer.Option(False, "--json", help="Print the records as JSON instead of a table."),
    output: Optional[str] = typer.Option(None, "-o", "--output", help="Also write the JSON here (after every record)."),
    plot: Optional[str] = typer.Option(None, "--plot", help="Also draw accuracy against distance to this PNG."),
    report: Optional[str] = typer.Option(None, "--from", help="Train nothing: print (and --plot) the JSON written by -o."),
) -> None:
    """Train each layer type to label a query by a trigger token far back; accuracy per distance.

    The sequence-labelling task of :mod:`attnlab.studies.distance`: a trigger of 4 kinds, noise,
    then a query labelled with the trigger's kind (chance 25%). Every run trains on fresh
    generated batches (B=32, d=32) and is scored on 512 held-out sequences.
    """
    from .studies.distance import run
    from .recurrent import list_layers

    if report:
        try:
            recs = json.loads(Path(report).read_text())["records"]
            steps = recs[0]["steps"]
        except (OSError, ValueError, KeyError, TypeError, IndexError) as e:
            _fail(f"--from {report}: not a records file written by 'attnlab bench distance -o' ({e})")
        _distance_report(recs, plot, as_json, steps)
        return
    dist = _int_list("--distances", distances, minimum=1)
    seed_list = _int_list("--seeds", seeds, minimum=0)
    names = [v.strip() for v in layers.split(",") if v.strip()]
    bad = [v for v in names if v not in list_layers()]
    if bad or not names:
        _fail(f"unknown --layers {bad}; expected some of {', '.join(list_layers())}")
    done: list = []
    with _progress() as progress:
        task = progress.add_task("training", total=len(dist) * len(names) * steps * len(seed_list))

        def on_step(name, d, s, loss):
            progress.update(task, advance=1, description=f"{name} distance={d} loss={loss:.3f}")

        def tick(rec):
            done.append(rec)
            if output:
                _write_json(output, {"records": [r.to_dict() for r in done]})

        run(dist, names, steps=steps, seeds=seed_list, on_record=tick, on_step=on_step)
    _distance_report([r.to_dict() for r in done], plot, as_json, steps)


def _distance_report(recs: list[dict], plot: Optional[str], as_json: bool, steps: int) -> None:
    """Plot, print as JSON, or tabulate ``bench distance`` records."""
    if plot:
        from .viz.complexity import plot_distance

        err.print(f"chart written to {plot_distance(recs, plot)}")
    if as_json:
        print(json.dumps({"records": recs}))
        return
    dist = sorted({r["distance"] for r in recs})
    names = list(dict.fromkeys(r["layer"] for r in recs))
    seed_list = sorted({r["seed"] for r in recs})
    t = Table(
        title=f"held-out accuracy at the query, mean (min) over seeds {seed_list}; {steps} steps each; chance 0.25",
        box=box.SIMPLE_HEAD,
    )
    t.add_column("layer", no_wrap=True)
    for d in dist:
        t.add_column(f"distance {d}", justify="right", no_wrap=True)
    t.add_column("train s", justify="right")
    for name in names:
        cells = []
        for d in dist:
            accs = [r["accuracy"] for r in recs if r["layer"] == name and r["distance"] == d]
            cells.append(f"{sum(accs) / len(accs):.3f} ({min(accs):.2f})" if accs else "·")
        t.add_row(name, *cells, f"{sum(r['seconds'] for r in recs if r['layer'] == name):.0f}")
    out.print(t)


@bench_app.command("graph")
def bench_graph(
    nodes: int = typer.Option(100_000, min=1, help="Nodes of the random graph."),
    edges: int = typer.Option(1_000_000, min=1, help="Directed edges, drawn uniformly."),
    in_dim: int = typer.Option(256, min=1, help="Node feature width."),
    heads: int = typer.Option(4, min=1, help="Attention heads."),
    head_dim: int = typer.Option(64, min=1, help="Width per head."),
    repeats: int = typer.Option(3, min=1, help="Timed repetitions at least."),
    memory: bool = typer.Option(True, "--memory/--no-memory", help="Measure peak memory (profiler)."),
    pyg: bool = typer.Option(True, "--pyg/--no-pyg", help="Compare with PyTorch Geometric's TransformerConv (pip install torch_geometric)."),
    as_json: bool = typer.Option(False, "--json", help="Print the records as JSON."),
    output: Optional[str] = typer.Option(None, "-o", "--output", help="Also write the JSON to this file."),
) -> None:
    """Forward+backward time and peak memory of attnlab's sparse graph attention vs TransformerConv (same weights)."""
    from .studies.graph import run

    with _progress() as progress:
        task = progress.add_task(f"graph of {nodes:,} nodes, {edges:,} edges", total=None)
        try:
            recs, diff = run(nodes, edges, in_dim=in_dim, heads=heads, head_dim=head_dim, min_repeats=repeats, memory=memory, pyg=pyg)
        except RuntimeError as e:
            _fail(str(e))
        progress.update(task, completed=1, total=1)
    base = recs[0]
    data = {
        "setting": {"nodes": nodes, "edges": edges, "in_dim": in_dim, "heads": heads, "head_dim": head_dim},
        "records": [r.to_dict() for r in recs],
        "max_abs_output_difference": diff,
        "speedup_over_pyg": (recs[1].seconds / base.seconds) if len(recs) > 1 else None,
    }
    if output:
        _write_json(output, data)
    if as_json:
        out.print_json(data=data)
        return
    t = Table(title=f"forward + backward, {nodes:,} nodes, {edges:,} edges, {in_dim} -> {heads} x {head_dim}", box=box.SIMPLE_HEAD)
    for col in ("layer", "seconds", "peak MiB", "time / attnlab", "memory / attnlab"):
        t.add_column(col, justify="left" if col == "layer" else "right")
    for r in recs:
        mib = f"{r.peak_bytes / 2**20:.0f}" if r.peak_bytes else "-"
        mem = f"{r.peak_bytes / base.peak_bytes:.2f}" if r.peak_bytes and base.peak_bytes else "-"
        t.add_row(r.layer, f"{r.seconds:.3f}", mib, f"{r.seconds / base.seconds:.2f}", mem)
    out.print(t)
    if diff is not None:
        out.print(f"largest output difference between the two layers: {diff:.2e}")


@bench_app.command("audio")
def bench_audio(
    seconds: float = typer.Option(60.0, min=0.1, help="Length of the input audio (100 frames per second)."),
    window: int = typer.Option(16, min=0, help="Truncated attention: +-window frames."),
    dim: int = typer.Option(144, min=1, help="Model width."),
    heads: int = typer.Option(4, min=1, help="Attention heads."),
    layers: int = typer.Option(2, min=1, help="Blocks."),
    repeats: int = typer.Option(3, min=1, help="Timed repetitions at least."),
    memory: bool = typer.Option(True, "--memory/--no-memory", help="Measure peak memory (profiler)."),
    as_json: bool = typer.Option(False, "--json", help="Print the records as JSON."),
    output: Optional[str] = typer.Option(None, "-o", "--output", help="Also write the JSON to this file."),
) -> None:
    """Full vs truncated attention on long audio: forward+backward time and peak memory (Conformer, Transformer)."""
    from .studies.audio import run

    with _progress() as progress:
        progress.add_task(f"{seconds:g} s of audio", total=None)
        recs = run(seconds, window=window, dim=dim, heads=heads, layers=layers, min_repeats=repeats, memory=memory)
    data = {"setting": {"seconds": seconds, "window": window, "dim": dim, "heads": heads, "layers": layers}, "records": [r.to_dict() for r in recs]}
    if output:
        _write_json(output, data)
    if as_json:
        out.print_json(data=data)
        return
    t = Table(title=f"forward + backward on {seconds:g} s of audio ({recs[0].frames} frames), dim {dim}, {layers} blocks", box=box.SIMPLE_HEAD)
    for col in ("model", "attention", "seconds", "peak MiB", "time / dense", "memory / dense"):
        t.add_column(col, justify="left" if col in ("model", "attention") else "right")
    for r in recs:
        dense = next(d for d in recs if d.model == r.model and d.attention == "dense")
        mib = f"{r.peak_bytes / 2**20:.0f}" if r.peak_bytes else "-"
        mem = f"{r.peak_bytes / dense.peak_bytes:.3f}" if r.peak_bytes and dense.peak_bytes else "-"
        t.add_row(r.model, r.attention, f"{r.seconds:.3f}", mib, f"{r.seconds / dense.seconds:.3f}", mem)
    out.print(t)


@app.command()
def arena(
    tasks: Optional[str] = typer.Option(None, help="Comma-separated tasks (default: the preset's)."),
    variants: Optional[str] = typer.Option(None, help="Comma-separated attention variants (default: the preset's)."),
    preset: str = typer.Option("quick", help="quick (about 6 minutes on 2 cores), standard (about an hour and a half) or lra (hours)."),
    seeds: str = typer.Option("0", help="Comma-separated seeds."),
    budget_seconds: Optional[float] = typer.Option(None, "--budget-seconds", min=1.0, help="Cap on each run's training time."),
    out_dir: str = typer.Option("arena", "--out", help="Folder of the store, the runs and the report."),
    data: Optional[str] = typer.Option(None, "--data", help="Also run on the user's jsonl file (task 'jsonl')."),
    workers: int = typer.Option(1, min=1, help="Runs at a time, each in its own process."),
    retry_failed: bool = typer.Option(False, "--retry-failed", help="Run the stored failures again."),
) -> None:
    """Train and compare attention variants across tasks: resumable grid, SQLite store, leaderboard, report.html."""
    import time as _time

    from rich.console import Group
    from rich.live import Live

    from .arena import build_report, plan, run_grid

    if data and not Path(data).is_file():
        _fail(f"--data {data}: no such file (a jsonl file, see 'attnlab train jsonl')")
    try:
        specs = plan(preset, tasks=tasks.split(",") if tasks else None, variants=variants.split(",") if variants else None,
                     seeds=_int_list("--seeds", seeds, minimum=0), data=data)
    except (ValueError, KeyError) as e:
        _fail(str(e))
    state = {s.run_id: "queued" for s in specs}
    values: dict = {}
    current = {"text": ""}
    t0 = _time.perf_counter()
    task_names = list(dict.fromkeys(s.task for s in specs))
    variant_names = list(dict.fromkeys(s.variant for s in specs))

    def grid():
        t = Table(title=f"arena ({sum(v in ('done', 'failed', 'stored') for v in state.values())}/{len(state)} runs, "
                        f"{_time.perf_counter() - t0:.0f} s)", box=box.SIMPLE_HEAD)
        t.add_column("task")
        for v in variant_names:
            t.add_column(v, justify="right")
        for task in task_names:
            cells = []
            for v in variant_names:
                ids = [s.run_id for s in specs if s.task == task and s.variant == v]
                st = [state[i] for i in ids]
                if "running" in st:
                    cells.append("[yellow]running[/]")
                elif all(x in ("done", "stored") for x in st) and any(i in values for i in ids):
                    vals = [values[i] for i in ids if i in values]
                    cells.append(f"{sum(vals) / len(vals):.3f}")
                elif all(x in ("done", "stored") for x in st):
                    cells.append("stored")
                elif "failed" in st:
                    cells.append("[red]failed[/]")
                else:
                    cells.append("[dim]queued[/]")
            t.add_row(task, *cells)
        return Group(t, current["text"])

    with Live(grid(), console=err, refresh_per_second=4, transient=False) as live:
        clock: dict = {}

        def on_event(kind, spec, **info):
            if kind == "skip":
                state[spec.run_id] = "stored"
            elif kind == "start":
                state[spec.run_id] = "running"
                clock[spec.run_id] = _time.perf_counter()
            elif kind == "eval":
                clock[("val", spec.run_id)] = info["value"]
            elif kind == "step":
                el = _time.perf_counter() - clock.get(spec.run_id, t0)
                eta = el / max(info["step"], 1) * (info["total"] - info["step"])
                val = clock.get(("val", spec.run_id))
                shown = "" if val is None else f", validation {val:.3f}"
                current["text"] = (f"{spec.task} / {spec.variant} / seed {spec.seed}: step {info['step']}/{info['total']} "
                                   f"loss {info['loss']:.4f}{shown}, ETA {eta:.0f} s")
            elif kind == "end":
                row = info["row"]
                state[spec.run_id] = row["status"]
                if row["status"] == "done":
                    values[spec.run_id] = row["value"]
                current["text"] = ""
            live.update(grid())

        run_grid(specs, out_dir, budget_seconds=budget_seconds, workers=workers, retry_failed=retry_failed, on_event=on_event)
    page, board = build_report(out_dir)
    _print_leaderboard(board)
    out.print(f"report: {page}  (wall time {_time.perf_counter() - t0:.0f} s)")


@app.command()
def report(out_dir: str = typer.Argument(..., help="The --out folder of 'attnlab arena'.")) -> None:
    """Rebuild report.html, the charts and the leaderboard from an arena's results store."""
    from .arena import build_report

    try:
        page, board = build_report(out_dir)
    except ValueError as e:
        _fail(str(e))
    _print_leaderboard(board)
    out.print(f"report: {page}")


def _print_leaderboard(board: dict) -> None:
    """The arena's leaderboard: per task, then the average."""
    for task, entries in board["tasks"].items():
        metric = next((e["metric"] for e in entries if e["metric"]), "score")
        t = Table(title=f"{task} ({metric})", box=box.SIMPLE_HEAD)
        for col in ("variant", metric, "speed vs dense", "memory vs dense", "steps/s", "params"):
            t.add_column(col, justify="left" if col == "variant" else "right")
        for e in entries:
            if e["value"] is None:
                t.add_row(e["variant"], "[red]failed[/]", "", "", "", (e["error"] or "")[:60].replace("[", "\\["))
                continue
            t.add_row(e["variant"], f"{e['value']:.3f}", _fmt_x(e["speed"]), _fmt_x(e["memory"]), f"{e['steps_per_second']:.1f}", f"{e['params']:,}")
        out.print(t)
    if board["average"]:
        t = Table(title="average over tasks", box=box.SIMPLE_HEAD)
        for col in ("variant", "mean score", "tasks", "speed vs dense", "memory vs dense"):
            t.add_column(col, justify="left" if col == "variant" else "right")
        for e in board["average"]:
            t.add_row(e["variant"], f"{e['value']:.3f}", str(e["tasks"]), _fmt_x(e["speed"]), _fmt_x(e["memory"]))
        out.print(t)


def _fmt_x(x) -> str:
    return "-" if x is None else f"{x:.2f}x"


@compare_app.command("vit-cnn")
def compare_vit_cnn(
    fractions: str = typer.Option("0.05,0.1,0.25,0.5,1.0", help="Comma-separated shares of the digits training split."),
    models: str = typer.Option("vit,cnn", help="Comma-separated image models (vit, pixels, cnn)."),
    seeds: str = typer.Option("0,1,2", help="Comma-separated seeds (training subset and weights)."),
    steps: Optional[int] = typer.Option(None, min=1, help="Optimizer steps per run (default: the task's)."),
    as_json: bool = typer.Option(False, "--json", help="Print the records as JSON instead of a table."),
    output: Optional[str] = typer.Option(None, "-o", "--output", help="Also write the JSON here (after every run)."),
    plot: Optional[str] = typer.Option(None, "--plot", help="Also draw accuracy against training-set size to this PNG."),
) -> None:
    """Digits: test accuracy of a ViT and a CNN (same head, same training) as the training set grows."""
    from .studies.vit_cnn import run

    try:
        frac = [float(f) for f in fractions.split(",") if f.strip()]
    except ValueError:
        _fail(f"--fractions must be numbers in (0, 1], got {fractions!r}")
    seed_list = _int_list("--seeds", seeds, minimum=0)
    names = [m.strip() for m in models.split(",") if m.strip()]
    done: list = []
    try:
        with _progress() as progress:
            bar = progress.add_task("training", total=len(frac) * len(names) * len(seed_list))

            def on_step(m, f, s, step, total):
                progress.update(bar, description=f"{m} fraction={f} seed={s} step {step}/{total}")

            def tick(rec):
                done.append(rec)
                progress.update(bar, advance=1)
                if output:
                    _write_json(output, {"records": [r.to_dict() for r in done]})

            run(frac, names, seeds=seed_list, steps=steps, on_record=tick, on_step=on_step)
    except (ValueError, KeyError) as e:
        _fail(str(e))
    recs = [r.to_dict() for r in done]
    if plot:
        from .viz.bench import plot_vit_cnn

        err.print(f"chart written to {plot_vit_cnn(recs, plot)}")
    if as_json:
        out.print_json(data={"records": recs})
        return
    fracs = sorted({r["fraction"] for r in recs})
    t = Table(title="digits test accuracy, mean (min) over seeds", box=box.SIMPLE_HEAD)
    t.add_column("model")
    for f in fracs:
        n = [r["train_size"] for r in recs if r["fraction"] == f]
        t.add_column(f"{f:g} ({round(sum(n) / len(n))} imgs)", justify="right")
    for m in dict.fromkeys(r["model"] for r in recs):
        row = [m]
        for f in fracs:
            a = [r["accuracy"] for r in recs if r["model"] == m and r["fraction"] == f]
            row.append(f"{sum(a) / len(a):.3f} ({min(a):.3f})" if a else "-")
        t.add_row(*row)
    out.print(t)


def _option_pairs(pairs: list[str], what: str) -> dict:
    """``key=value`` strings -> a dict; values parsed as JSON where they are (numbers, true, lists)."""
    out = {}
    for item in pairs:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            _fail(f"{what} takes key=value, got {item!r}")
        try:
            out[key] = json.loads(raw)
        except ValueError:
            out[key] = raw
    return out


@app.command()
def train(
    task: str = typer.Argument(..., help="Task name (pos, recall, listops, ...)."),
    model: Optional[str] = typer.Option(None, help="Backbone: transformer, mlp, window_mlp, graph_transformer, ... (default: the task's, else transformer)."),
    attention: Optional[str] = typer.Option(None, help="Attention variant by name (transformer only; default dense)."),
    positional: Optional[str] = typer.Option(None, help="Positional encoding by name (transformer only; default: the task's)."),
    causal: Optional[bool] = typer.Option(None, "--causal/--bidirectional", help="Causal attention (default: the task's)."),
    steps: Optional[int] = typer.Option(None, min=1, help="Optimizer steps (default: the task's)."),
    epochs: Optional[int] = typer.Option(None, min=1, help="Passes over the training split instead of --steps."),
    seed: int = typer.Option(0, help="Seed of the weights, dropout and example order."),
    out_dir: str = typer.Option("runs/latest", "--out", help="Output folder (its checkpoint/ is written atomically)."),
    resume: bool = typer.Option(False, "--resume", help="Continue the run in --out from its checkpoint."),
    size: Optional[int] = typer.Option(None, min=1, help="Task size knob: training examples."),
    task_option: list[str] = typer.Option([], "--task-option", help="key=value task option (repeatable)."),
    model_option: list[str] = typer.Option([], "--model-option", help="key=value backbone option (repeatable)."),
    dim: Optional[int] = typer.Option(None, min=1, help="Model width."),
    layers: Optional[int] = typer.Option(None, min=1, help="Blocks."),
    heads: Optional[int] = typer.Option(None, min=1, help="Attention heads."),
    batch_size: Optional[int] = typer.Option(None, "--batch-size", min=1),
    lr: Optional[float] = typer.Option(None, min=0.0),
    eval_every: Optional[int] = typer.Option(None, "--eval-every", min=1, help="Steps between validations and checkpoints."),
    patience: Optional[int] = typer.Option(None, min=1, help="Stop after this many validations without improvement."),
    as_json: bool = typer.Option(False, "--json", help="End by printing one JSON object (task, model, attention, metric, value, seconds, checkpoint)."),
) -> None:
    """Train a model on a task with validation, early stopping and atomic checkpoints; --resume continues a run."""
    from .audio import MissingToolError
    from . import tasks as task_registry
    from .training import CheckpointError, TrainConfig, train as run_train

    if task not in task_registry.names():
        _fail(f"unknown task {task!r}; choose one of {', '.join(task_registry.names())}")
    topts = _option_pairs(task_option, "--task-option")
    if size is not None:
        topts["size"] = size
    overrides = dict(
        model=model, attention=attention, positional=positional, causal=causal, steps=steps, epochs=epochs, seed=seed, dim=dim, layers=layers,
        heads=heads, batch_size=batch_size, lr=lr, eval_every=eval_every, patience=patience,
    )
    if topts:
        overrides["task_options"] = topts
    if model_option:
        overrides["model_options"] = _option_pairs(model_option, "--model-option")
    if steps is not None and epochs is not None:
        _fail("give --steps or --epochs, not both")
    if epochs is not None:
        overrides["steps"] = None
    try:
        cfg = TrainConfig.for_task(task, **overrides)
        if epochs is not None:
            cfg.steps = None
        if int(os.environ.get("RANK", "0")) > 0:  # torchrun: the other processes train silently
            run_train(cfg, out_dir, resume=resume)
            return
        with _progress() as progress:
            model = cfg.model
            bar = progress.add_task(f"{task} {model}", total=None)
            clock = {"t": None, "s": 0, "val": None}

            def on_step(step, total, loss):
                import time as _time

                now = _time.perf_counter()
                if clock["t"] is None:
                    clock["t"], clock["s"] = now, step
                rate = (step - clock["s"]) / max(now - clock["t"], 1e-9)
                val = "" if clock["val"] is None else f" val={clock['val']:.4f}"
                progress.update(bar, completed=step, total=total, description=f"{task} {model} loss={loss:.4f}{val} {rate:.1f} steps/s")

            def on_eval(step, val):
                clock["val"] = val

            result = run_train(cfg, out_dir, resume=resume, on_step=on_step, on_eval=on_eval)
    except (CheckpointError, ValueError, TypeError, MissingToolError) as e:
        _fail(str(e))
    if as_json:
        print(json.dumps(result.summary()))
        return
    out.print(f"{result.task} / {result.model} / {result.attention}: test {result.metric} = {result.value:.4f} "
              f"after {result.steps} steps, {result.seconds:.0f} s; checkpoint {result.checkpoint}")


@app.command("eval")
def eval_cmd(
    checkpoint: str = typer.Argument(..., help="A checkpoint folder, or the --out folder of 'attnlab train'."),
    split: str = typer.Option("test", help="train, val or test."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object (task, model, attention, metric, value, seconds, checkpoint)."),
    plot: Optional[str] = typer.Option(None, "--plot", help="seq2seq: draw the cross-attention of one decoded example to this PNG."),
    index: int = typer.Option(0, min=0, help="The example of the split that --plot draws."),
) -> None:
    """Score a checkpoint's best weights on a split of its task (and draw a cross-attention map)."""
    from .training import CheckpointError, cross_attention_example, evaluate

    try:
        result = evaluate(checkpoint, split)
        if plot:
            from .viz.complexity import plot_cross_attention

            w, src, tgt = cross_attention_example(checkpoint, index, split)
            err.print(f"cross-attention written to {plot_cross_attention(w, src, tgt, plot, title=f'{split} example {index}')}")
    except (CheckpointError, ValueError) as e:
        _fail(str(e))
    if as_json:
        print(json.dumps(result.summary()))
        return
    out.print(f"{result.task} / {result.model} / {result.attention}: {split} {result.metric} = {result.value:.4f} ({result.checkpoint})")


@app.command()
def predict(
    checkpoint: str = typer.Argument(..., help="A checkpoint trained on a jsonl file (attnlab train jsonl --task-option path=...)."),
    input_file: str = typer.Argument(..., metavar="INPUT", help="jsonl with the input field: tokens, text or source."),
    beam: Optional[int] = typer.Option(None, min=1, help="seq2seq: beam search of this width instead of greedy decoding."),
) -> None:
    """Predict with a checkpoint trained on user data; prints one JSON object per input line."""
    from .tasks.jsonl import read_records
    from .training import CheckpointError, load_checkpoint, predict as run_predict

    try:
        art = load_checkpoint(checkpoint).meta.get("task_artifacts") or {}
        if "kind" not in art:
            raise CheckpointError(f"{checkpoint} was not trained on user data (attnlab train jsonl): nothing to predict from")
        _, records = read_records(input_file, art["kind"], inputs_only=True)
        for row in run_predict(checkpoint, records, beam_size=beam):
            print(json.dumps(row))
    except (CheckpointError, ValueError) as e:
        _fail(str(e))


def _settings_dict(settings) -> dict:
    from dataclasses import asdict

    d = asdict(settings)
    return {k: list(v) if isinstance(v, tuple) else v for k, v in d.items()}


def _jsonable(summary: list[dict]) -> list[dict]:
    """Summary rows with string keys (JSON object keys), as they come back from a file."""
    conv = ("accuracy", "accuracy_min", "accuracy_max", "errors")
    return [{k: ({str(n): x for n, x in v.items()} if k in conv else v) for k, v in row.items()} for row in summary]


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
