"""``attnlab bench attention | scaling | graph | audio | peak | precision``: time and peak memory, side by
side."""

from __future__ import annotations

import typer

from ..profiling import ALLOCATORS
from .common import chart, emit_json, err, int_list, load_report, name_list, out, progress, track
from .errors import device_or_fail, fail, usage_error
from .options import (
    blocks_option,
    choices,
    device_option,
    from_option,
    heads_option,
    json_option,
    memory_option,
    output_option,
    plain,
    plot_option,
    repeats_option,
    width_option,
)
from .tables import on_device, table

__all__ = ["Allocator", "attention", "audio", "graph", "peak", "precision", "scaling"]

Allocator = choices("Allocator", ALLOCATORS, "``bench scaling --allocator``: the timing processes' allocator "
                                               "(:func:`attnlab.profiling.allocator_env`).")


def attention(
    sizes: str = typer.Option("1024,4096,8192", help="Comma-separated sequence lengths N (= M)."),
    configs: str = typer.Option(
        "scaled_dot+softmax,cosine+softmax,scaled_dot+relu,additive+softmax",
        help="Comma-separated score+normaliser paths."
    ),
    modes: str = typer.Option("fwd,fwd_bwd", help="fwd and/or fwd_bwd."),
    repeats: int = repeats_option("Timed repetitions at least (more while they take under 2 s)."),
    as_json: bool = json_option("Print the records as a JSON list instead of a table."),
    output: str | None = output_option("Also write the JSON records to this file."),
    plot: str | None = plot_option("Also draw time and memory against N to this PNG file."),
    device: str = device_option(),
) -> None:
    """attend vs scaled_dot_product_attention vs a naive materialised implementation (B=1, H=4, D=64, fp32)."""
    where = device_or_fail(device)
    from ..studies.attention import CONFIGS, ratios, run

    size_list = int_list("--sizes", sizes, minimum=1, what="positive integers")
    cfg_list = name_list("--configs", configs, CONFIGS, hint=f"expected some of {list(CONFIGS)}", required=False)
    mode_list = name_list("--modes", modes, ("fwd", "fwd_bwd"), hint="expected fwd and/or fwd_bwd", required=False)
    total = sum(len(CONFIGS[c]["impls"]) for c in cfg_list) * len(size_list) * len(mode_list)
    with track("benchmarking attention", total, output, lambda done: [r.to_dict() for r in done]) as tracker:
        tick = tracker.on_record(lambda rec: f"{rec.path} {rec.impl} N={rec.n} {rec.mode}")
        records = run(size_list, cfg_list, mode_list, min_repeats=repeats, device=where, on_record=tick)
    data = [r.to_dict() for r in records]
    chart(plot, "bench.plot_attention_benchmark", data)
    if emit_json(data, as_json):
        return
    rel = {(r["path"], r["n"], r["mode"], r["impl"], r["vs"]): r for r in ratios(records)}
    out.print(
        f"attention benchmark{on_device(where)}: B=1, H=4, D=64, fp32. ms = median time; MiB = peak tensor memory "
        "above the inputs; t/x and m/x = time and memory relative to x"
    )
    for path in cfg_list:
        has_sdpa = "sdpa" in CONFIGS[path]["impls"]
        cols = ["impl", "N", "mode", "ms", "MiB", "t/sdpa", "t/naive", "m/naive"]
        t = table(path, cols if has_sdpa else [c for c in cols if c != "t/sdpa"], left=("impl", "mode"),
                  no_wrap=True)
        t.title_justify = "left"
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


def scaling(
    sizes: str = typer.Option("1024,2048,4096,8192,16384,32768", help="Comma-separated sequence lengths N."),
    variants: str | None = typer.Option(
        None, help="Comma-separated variants (default: every variant with settings for long sequences)."),
    repeats: int = repeats_option(),
    memory: bool = memory_option("Measure peak memory (a child process per cell)."),
    flex: bool = typer.Option(True, "--flex/--no-flex", help="At N=16384: local vs compiled FlexAttention, forward."),
    peers: bool = typer.Option(
        False, "--peers", help="Also time lucidrains' implementations at 16384 (pip install -e '.\\[bench]')."),
    rounds: int = typer.Option(3, min=1, help="Sweeps over every N, of which the median and the spread are reported."),
    allocator: Allocator = typer.Option(Allocator.keep, help="keep: reuse freed memory; system: glibc's defaults."),
    as_json: bool = json_option("Print the records, slopes and ratios as JSON instead of tables."),
    output: str | None = output_option("Also write the JSON to this file (after every record)."),
    plot: str | None = plot_option("Also draw time and memory against N to this PNG (scaling.png)."),
    report: str | None = from_option("Measure nothing: print (and --plot) the JSON written by -o."),
    device: str = device_option(),
) -> None:
    """Forward+backward time and peak memory of every attention variant against N (B=1, H=4, D=64, fp32)."""
    where = device_or_fail(device)
    if peers and where.type != "cpu":
        usage_error(f"--peers: lucidrains' implementations are compared on the CPU only, not on {where}; "
                    "drop --peers or use --device cpu")
    from ..studies.scaling import SETTINGS, relative, run, slopes

    if report:
        data, recs = load_report(report, "bench scaling", lambda d: (d, d["records"]))
        chart(plot, "bench.plot_scaling", recs, slopes=data.get("slopes"))
        _scaling_tables(data, sorted({r["n"] for r in recs}),
                        list(dict.fromkeys(r["variant"] for r in recs if r["mode"] == "fwd_bwd")))
        return

    size_list = int_list("--sizes", sizes, minimum=1)
    names = name_list("--variants", ",".join(SETTINGS) if variants is None else variants, list(SETTINGS))
    allocator = plain(allocator)
    peer_done: list = []

    def payload(done: list) -> dict:
        return {
            "records": [r.to_dict() for r in done],
            "slopes": slopes(done),
            "relative": relative(done),
            "peers": [p.to_dict() for p in peer_done],
        }

    total = rounds * len(size_list) + (len(size_list) * len(names) if memory else 0) + (5 if peers else 0)
    with track("measuring", total, output, payload) as tracker:
        tick = tracker.on_record(lambda rec: f"{rec.variant} N={rec.n}",
                                 advance=lambda rec: 1 if rec.mode == "fwd_bwd" and memory else 0)
        timed = lambda n, r: tracker.update(1, f"timed N={n} (round {r + 1}/{rounds})")  # noqa: E731
        run(size_list, names, min_repeats=repeats, memory=memory, flex=flex, allocator=allocator, rounds=rounds,
            device=where, on_record=tick, on_timed=timed)
        if peers:
            from ..studies.peers import run_peers

            run_peers(16384, min_repeats=repeats,
                      on_record=tracker.on_record(lambda rec: f"peer {rec.method}", into=peer_done))
    data = payload(tracker.records)
    chart(plot, "bench.plot_scaling", data["records"], slopes=data["slopes"])
    if emit_json(data, as_json):
        return
    _scaling_tables(data, size_list, names)


def _scaling_tables(data: dict, size_list: list[int], names: list[str]) -> None:
    """Print the scaling records: one row per (variant, N), then slopes, FlexAttention and peers."""
    rel = {(r["variant"], r["n"]): r for r in data["relative"]}
    allocators = sorted({r.get("allocator", "in-process") for r in data["records"] if r["mode"] == "fwd_bwd"})
    t = table(
        "forward + backward, B=1, H=4, D=64, fp32 (speed-up and memory relative to dense SDPA; seconds: median of the "
        "rounds, min-max: fastest and slowest round; faults: minor page faults per step; "
        f"allocator {', '.join(allocators)})",
        ["variant", "N", "seconds", "min-max", "faults", "peak MiB", "speed-up", "memory"],
        no_wrap=True,
    )
    for v in names:
        for n in size_list:
            r = next((r for r in data["records"] if r["variant"] == v and r["n"] == n and r["mode"] == "fwd_bwd"),
                     None)
            if r is None or r["seconds"] is None:
                continue
            x = rel.get((v, n), {})
            t.add_row(
                v,
                str(n),
                f"{r['seconds']:.3f}",
                "" if r.get("seconds_min") is None else f"{r['seconds_min']:.3f}-{r['seconds_max']:.3f}",
                "" if r.get("faults") is None else f"{r['faults']:.0f}",
                "" if r["peak_bytes"] is None else f"{r['peak_bytes'] / 2**20:.0f}",
                "" if x.get("speedup") is None else f"{x['speedup']:.2f}x",
                "" if x.get("memory_ratio") is None else f"{x['memory_ratio']:.2f}",
            )
    out.print(t)
    st = table("log-log slopes against N (over N >= 4096 when measured)", ["variant", "time slope", "memory slope"])
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


def graph(
    nodes: int = typer.Option(100_000, min=1, help="Nodes of the random graph."),
    edges: int = typer.Option(1_000_000, min=1, help="Directed edges, drawn uniformly."),
    in_dim: int = typer.Option(256, min=1, help="Node feature width."),
    num_heads: int = heads_option(4, "Attention heads (the output is --num-heads x --head-dim wide)."),
    head_dim: int = typer.Option(64, min=1, help="Width per head."),
    repeats: int = repeats_option(),
    memory: bool = memory_option(),
    pyg: bool = typer.Option(
        True, "--pyg/--no-pyg",
        help="Compare with PyTorch Geometric's TransformerConv (pip install torch_geometric)."),
    as_json: bool = json_option("Print the records as JSON."),
    output: str | None = output_option("Also write the JSON to this file."),
    device: str = device_option(),
) -> None:
    """Forward+backward time and peak memory of attnlab's sparse graph attention vs TransformerConv (same weights)."""
    where = device_or_fail(device)
    from ..studies.graph import run

    with progress() as bar:
        task = bar.add_task(f"graph of {nodes:,} nodes, {edges:,} edges", total=None)
        try:
            recs, diff = run(nodes, edges, in_dim=in_dim, num_heads=num_heads, head_dim=head_dim, min_repeats=repeats,
                             memory=memory, pyg=pyg, device=where)
        except RuntimeError as e:
            fail(e)
        bar.update(task, completed=1, total=1)
    base = recs[0]
    data = {
        "setting": {"nodes": nodes, "edges": edges, "in_dim": in_dim, "heads": num_heads, "head_dim": head_dim},
        "records": [r.to_dict() for r in recs],
        "max_abs_output_difference": diff,
        "speedup_over_pyg": (recs[1].seconds / base.seconds) if len(recs) > 1 else None,
    }
    if emit_json(data, as_json, output):
        return
    t = table(
        f"forward + backward{on_device(where)}, {nodes:,} nodes, {edges:,} edges, {in_dim} -> {num_heads} x {head_dim}",
        ["layer", "seconds", "peak MiB", "time / attnlab", "memory / attnlab"],
    )
    for r in recs:
        mib = f"{r.peak_bytes / 2**20:.0f}" if r.peak_bytes else "-"
        mem = f"{r.peak_bytes / base.peak_bytes:.2f}" if r.peak_bytes and base.peak_bytes else "-"
        t.add_row(r.layer, f"{r.seconds:.3f}", mib, f"{r.seconds / base.seconds:.2f}", mem)
    out.print(t)
    if diff is not None:
        out.print(f"largest output difference between the two layers: {diff:.2e}")


def audio(
    seconds: float = typer.Option(60.0, min=0.1, help="Length of the input audio (100 frames per second)."),
    window: int = typer.Option(16, min=0, help="Truncated attention: +-window frames."),
    embed_dim: int = width_option(144),
    num_heads: int = heads_option(4),
    num_layers: int = blocks_option(2),
    repeats: int = repeats_option(),
    memory: bool = memory_option(),
    as_json: bool = json_option("Print the records as JSON."),
    output: str | None = output_option("Also write the JSON to this file."),
    device: str = device_option(),
) -> None:
    """Full vs truncated attention on long audio: forward+backward time and peak memory (Conformer, Transformer)."""
    where = device_or_fail(device)
    from ..studies.audio import run

    with progress() as bar:
        bar.add_task(f"{seconds:g} s of audio", total=None)
        recs = run(seconds, window=window, embed_dim=embed_dim, num_heads=num_heads, num_layers=num_layers,
                   min_repeats=repeats, memory=memory, device=where)
    # the setting's keys stay those of the files already written (dim, heads, layers)
    data = {"setting": {"seconds": seconds, "window": window, "dim": embed_dim, "heads": num_heads,
                        "layers": num_layers},
            "records": [r.to_dict() for r in recs]}
    if emit_json(data, as_json, output):
        return
    t = table(
        f"forward + backward{on_device(where)} on {seconds:g} s of audio ({recs[0].frames} frames), dim {embed_dim}, "
        f"{num_layers} blocks",
        ["model", "attention", "seconds", "peak MiB", "time / dense", "memory / dense"],
        left=("model", "attention"),
    )
    for r in recs:
        dense = next(d for d in recs if d.model == r.model and d.attention == "dense")
        mib = f"{r.peak_bytes / 2**20:.0f}" if r.peak_bytes else "-"
        mem = f"{r.peak_bytes / dense.peak_bytes:.3f}" if r.peak_bytes and dense.peak_bytes else "-"
        t.add_row(r.model, r.attention, f"{r.seconds:.3f}", mib, f"{r.seconds / dense.seconds:.3f}", mem)
    out.print(t)


def peak(as_json: bool = json_option(
             "Print {fp32, bf16} in FLOP/s (and how each was measured) as one JSON object."),
         device: str = device_option()) -> None:
    """This machine's peak: FLOP/s of a matrix product in float32 and in bfloat16 (what utilisation is a share of),
    on --device.

    Each product grows until one takes a tenth of a second, so the measurement takes a few seconds whatever the CPU
    (or GPU); it says whether the device multiplies bfloat16 natively, and how much slower bfloat16 is where it is
    emulated."""
    where = device_or_fail(device)
    got = _measure_peaks(where)
    if as_json:
        from .common import print_json

        print_json({"fp32": got["fp32"].flops, "bf16": got["bf16"].flops, "native_bf16": _native_bf16(where),
                    "measured": {k: {"size": p.size, "seconds": p.seconds, "repeats": p.repeats,
                                     "total_seconds": p.total_seconds}
                                 for k, p in got.items()}, **_named(where)})
        return
    for p in got.values():
        out.print(p.describe() + on_device(where), highlight=False)
    out.print(_bf16_note(got, where), highlight=False)


def _named(device) -> dict:
    """What a results file adds off the CPU: ``{"device": "cuda (NVIDIA H100 80GB HBM3)"}`` (on the CPU nothing, as
    before)."""
    return {"device": on_device(device).removeprefix(" on ")} if device.type != "cpu" else {}


def _native_bf16(device) -> bool:
    from ..training.precision import fast_bf16

    return fast_bf16(device)


def _measure_peaks(device) -> dict:
    """``{"fp32": Peak, "bf16": Peak}`` on ``device`` (:func:`attnlab.profiling.measure_peak`), under a progress
    line."""
    from ..profiling import PEAK_TARGET, measure_peak

    got = {}
    with progress() as bar:
        for key, dtype in (("fp32", "float32"), ("bf16", "bfloat16")):
            task = bar.add_task(f"timing {dtype} matrix products (growing until one takes {PEAK_TARGET:g} s)",
                                total=None)
            got[key] = measure_peak(dtype, str(device))
            bar.remove_task(task)
    return got


def _bf16_note(got: dict, device) -> str:
    """Whether the device multiplies bfloat16 natively, and bfloat16's rate against float32's."""
    ratio = got["bf16"].flops / got["fp32"].flops
    slower = f", {1 / ratio:.0f} times slower" if ratio < 0.5 else ""
    if device.type != "cpu":
        native = _native_bf16(device)
        return (f"{'native' if native else 'no native'} bfloat16{on_device(device)}: bf16 runs at {ratio:.3g}x "
                f"fp32's rate{'' if native else slower} (--precision auto uses {'bf16' if native else 'fp32'})")
    if _native_bf16(device):
        return f"native bfloat16 on this CPU: bf16 {ratio:.2f}x fp32's rate (--precision auto uses bf16)"
    return (f"no native bfloat16 found on this CPU (its flags name neither AVX-512 BF16 nor AMX): bf16 runs at "
            f"{ratio:.3g}x fp32's rate{slower} (--precision auto uses fp32)")


def precision(
    variants: str | None = typer.Option(
        None, help="Comma-separated attention variants [default: every registered one]."),
    sizes: str = typer.Option("1024,4096", help="Comma-separated sequence lengths N."),
    tokens: int = typer.Option(
        8192, min=1, help="Tokens per batch (8 sequences of 1K, as the arena's text task; 2 of 4K)."),
    embed_dim: int = width_option(64),
    num_heads: int = heads_option(4),
    num_layers: int = blocks_option(1),
    naive_max: int = typer.Option(
        1024, "--naive-max", min=1, help="dense_naive only up to this N (it holds every N x N weight)."),
    repeats: int = repeats_option(),
    as_json: bool = json_option("Print the records as JSON."),
    output: str | None = output_option("Also write the JSON to this file."),
    plot: str | None = plot_option("Draw the bf16 speed-up and the share of peak per variant to this PNG."),
    device: str = device_option(),
) -> None:
    """Float32 against bfloat16 mixed precision: training steps/s of every variant on the arena's long-task model, and
    the share of peak."""
    where = device_or_fail(device)
    from .. import efficient
    from ..studies.precision import run

    names = name_list("--variants", ",".join(efficient.VARIANTS.in_order()) if variants is None else variants,
                      efficient.names())
    lengths = int_list("--sizes", sizes, minimum=16)
    measured = _measure_peaks(where)
    peak_rates = {k: p.flops for k, p in measured.items()}
    err.print(f"peaks: {'; '.join(p.describe() for p in measured.values())}. {_bf16_note(measured, where)}",
              highlight=False)

    def payload(done: list) -> dict:
        # keys of the files already written
        setting = {"tokens": tokens, "dim": embed_dim, "heads": num_heads, "layers": num_layers}
        return {"setting": setting, "peaks": peak_rates, **_named(where),
                "records": [r.to_dict() for r in done]}

    with track("timing training steps", 2 * len(names) * len(lengths), output, payload) as tracker:
        run(names, lengths, tokens=tokens, embed_dim=embed_dim, num_heads=num_heads, num_layers=num_layers,
            min_repeats=repeats, device=where,
            skip=lambda v, n: ("holds every N x N weight: left out above --naive-max"
                               if v == "dense_naive" and n > naive_max else None),
            on_record=tracker.on_record(lambda r: f"{r.variant} N={r.n} {r.precision}"))
    data = payload(tracker.records)
    chart(plot, "bench.plot_precision", data)
    if emit_json(data, as_json, output):
        return
    t = table(f"training step{on_device(where)}, fp32 vs bf16 (width {embed_dim}, {num_heads} heads, "
              f"{num_layers} blocks, {tokens} tokens a batch); "
              f"peak fp32 {peak_rates['fp32'] / 1e9:.0f}, bf16 {peak_rates['bf16'] / 1e9:.0f} GFLOP/s",
              ["variant", "N", "fp32 steps/s", "bf16 steps/s", "bf16 speed-up", "GFLOP/step", "fp32 of peak",
               "bf16 of peak"])
    by = {(r.variant, r.n, r.precision): r for r in tracker.records}
    for n in lengths:
        for v in names:
            a, b = by[(v, n, "fp32")], by[(v, n, "bf16")]
            if a.seconds is None:
                t.add_row(v, str(n), "-", "-", "-", "-", "-", a.note or "-")
                continue
            t.add_row(v, str(n), f"{a.steps_per_second:.2f}", f"{b.steps_per_second:.2f}", f"{b.speedup:.2f}x",
                      f"{a.flops_per_step / 1e9:.1f}", f"{100 * a.peak_fraction:.0f}%", f"{100 * b.peak_fraction:.0f}%")
    out.print(t)
