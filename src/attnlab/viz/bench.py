"""Charts of ``attnlab bench attention`` records."""

from __future__ import annotations

from pathlib import Path

__all__ = ["log_log_axes", "plot_attention_benchmark", "plot_precision", "plot_recall", "plot_scaling", "plot_vit_cnn"]


def save_figure(fig, path: str | Path, *, dpi: int = 110) -> Path:
    """Write a matplotlib figure to ``path`` (its folder created; tight layout), close it, return the path."""
    import matplotlib.pyplot as plt

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi, bbox_inches="tight")
    plt.close(fig)
    return path


def log_log_axes(ax, title: str, xlabel: str) -> None:
    """Log2 x, log y, grid and a small legend: the axes of every scaling chart. Axes with nothing
    drawn (memory not measured) say so instead."""
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7)
    elif not (ax.lines or ax.collections):
        ax.text(0.5, 0.5, "not measured", transform=ax.transAxes, ha="center", va="center", color="grey")


def plot_attention_benchmark(records: list[dict], path: str | Path) -> Path:
    """Draw time and peak memory against N, one column per path, one line per implementation.

    Both axes are logarithmic, so the N^2 growth of the naive implementation and the flat
    memory of the fused and chunked paths read as slopes. Rows: fwd and fwd_bwd time, then
    peak memory of fwd_bwd (of fwd if only that was measured).

    Args:
        records: dicts as produced by :meth:`attnlab.studies.attention.Record.to_dict`.
        path: where to write the PNG (its folder is created).

    Returns:
        The path written.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if not records:
        raise ValueError("no benchmark records to plot")
    paths = list(dict.fromkeys(r["path"] for r in records))
    modes = list(dict.fromkeys(r["mode"] for r in records))
    mem_mode = "fwd_bwd" if "fwd_bwd" in modes else modes[0]
    names = list(dict.fromkeys(_label(r) for r in records))
    color = {name: f"C{i}" for i, name in enumerate(names)}  # one colour per implementation everywhere
    rows = [("seconds", m, f"time, {m} (s)") for m in modes] + [("peak_bytes", mem_mode,
                                                                 f"peak memory, {mem_mode} (MiB)")]
    fig, axes = plt.subplots(len(rows), len(paths), figsize=(4 * len(paths), 3 * len(rows)), squeeze=False)
    for c, p in enumerate(paths):
        for r, (field, mode, label) in enumerate(rows):
            ax = axes[r][c]
            by_impl: dict[str, list[tuple[int, float]]] = {}
            for rec in records:
                if rec["path"] == p and rec["mode"] == mode and rec[field] is not None:
                    name = _label(rec)
                    value = rec[field] / 2**20 if field == "peak_bytes" else rec[field]
                    by_impl.setdefault(name, []).append((rec["n"], value))
            for name, pts in by_impl.items():
                pts.sort()
                ax.plot([x for x, _ in pts], [y for _, y in pts], marker="o", label=name, color=color[name])
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.grid(True, which="both", alpha=0.3)
            if r == 0:
                ax.set_title(p)
            if c == 0:
                ax.set_ylabel(label)
            if r == len(rows) - 1:
                ax.set_xlabel("N (queries = keys)")
            if by_impl:
                ax.legend(fontsize=7)
    fig.suptitle("attend vs scaled_dot_product_attention vs naive (B=1, H=4, D=64, fp32)")
    fig.tight_layout()
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def _label(rec: dict) -> str:
    return f"attend ({rec['backend']})" if rec["impl"].startswith("attend") else rec["impl"]


def plot_scaling(records: list[dict], path: str | Path, *, slopes: dict | None = None) -> Path:
    """Forward+backward time and peak memory against N, one line per variant, log-log.

    Args:
        records: dicts of :meth:`attnlab.studies.scaling.Record.to_dict` (``fwd_bwd`` ones are drawn;
            the band around a time line spans the fastest to the slowest timed step).
        path: the PNG to write.
        slopes: ``{variant: {"time_slope": s, "memory_slope": s}}`` shown in the legend.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in records if r["mode"] == "fwd_bwd"]
    if not rows:
        raise ValueError("no forward+backward records to plot")
    variants = list(dict.fromkeys(r["variant"] for r in rows))
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.8))
    for i, v in enumerate(variants):
        pts = sorted((r["n"], r["seconds"], r["peak_bytes"]) for r in rows if r["variant"] == v)
        s = (slopes or {}).get(v, {})
        for ax, idx, key, scale in ((axes[0], 1, "time_slope", 1.0), (axes[1], 2, "memory_slope", 2.0**-20)):
            xy = [(n, y * scale) for n, *rest in pts for y in [rest[idx - 1]] if y]
            if not xy:
                continue
            label = v + (f" (slope {s[key]:.2f})" if s.get(key) is not None else "")
            ax.plot(*zip(*xy), marker="o", color=f"C{i}", label=label, linestyle="--" if v == "dense" else "-")
        band = sorted((r["n"], r["seconds_min"], r["seconds_max"]) for r in rows if r["variant"] == v
                      and r.get("seconds_min"))
        if len(band) > 1:  # the spread of the timed steps: fastest to slowest
            axes[0].fill_between([b[0] for b in band], [b[1] for b in band], [b[2] for b in band], color=f"C{i}",
                                 alpha=0.15, linewidth=0)
    for ax, title in ((axes[0], "forward + backward time (s)"), (axes[1], "peak memory (MiB)")):
        log_log_axes(ax, title, "sequence length N")
    fig.suptitle("attention variants: B=1, H=4, D=64, fp32 (slopes fitted over N >= 4096)")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path


def plot_vit_cnn(records: list[dict], path: str | Path) -> Path:
    """Test accuracy against training-set size, one line per model (mean over seeds, the band
    from the worst to the best seed); x logarithmic.

    Args:
        records: dicts from :meth:`attnlab.studies.vit_cnn.CompareRecord.to_dict`.
        path: the PNG to write (its folder is created).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if not records:
        raise ValueError("no comparison records to plot")
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for model in dict.fromkeys(r["model"] for r in records):
        fracs = sorted({r["fraction"] for r in records if r["model"] == model})
        rows = [[r for r in records if r["model"] == model and r["fraction"] == f] for f in fracs]
        sizes = [sum(r["train_size"] for r in rs) / len(rs) for rs in rows]  # seeds may differ by an image
        accs = [[r["accuracy"] for r in rs] for rs in rows]
        mean = [sum(a) / len(a) for a in accs]
        ax.plot(sizes, mean, marker="o", label=model)
        ax.fill_between(sizes, [min(a) for a in accs], [max(a) for a in accs], alpha=0.2)
    ax.set_xscale("log")
    ax.set_xlabel("training images")
    ax.set_ylabel("test accuracy")
    ax.set_title("digits (8x8): CNN vs self-attention as the data grow")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    return save_figure(fig, path, dpi=120)


def plot_precision(data: dict, path: str | Path) -> Path:
    """``attnlab bench precision``: per variant, the bfloat16 step's speed-up over float32 (left)
    and the share of this machine's peak each precision reaches (right), one group per length."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    recs = [r for r in data["records"] if r["seconds"] is not None]
    lengths = sorted({r["n"] for r in recs})
    variants = list(dict.fromkeys(r["variant"] for r in recs))
    by = {(r["variant"], r["n"], r["precision"]): r for r in recs}
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 4.2))
    width = 0.8 / max(1, len(lengths))
    for i, n in enumerate(lengths):
        xs = [j + i * width for j, v in enumerate(variants) if (v, n, "bf16") in by]
        left.bar(xs, [by[(v, n, "bf16")]["speedup"] for v in variants if (v, n, "bf16") in by], width, label=f"N = {n}")
        for k, prec in enumerate(("fp32", "bf16")):
            ys = [100 * by[(v, n, prec)]["peak_fraction"] for v in variants if (v, n, prec) in by]
            right.bar([x + k * width / 2 for x in xs], ys, width / 2, label=f"{prec}, N = {n}",
                      alpha=0.9 if prec == "bf16" else 0.5)
    for ax in (left, right):
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(variants))], variants, rotation=30,
                      ha="right", fontsize=8)
        ax.grid(True, axis="y", alpha=0.3)
        ax.legend(fontsize=8)
    left.axhline(1.0, color="grey", lw=0.8, ls=":")
    left.set_ylabel("bf16 steps/s over fp32 steps/s")
    left.set_title("bfloat16 mixed precision: training-step speed-up", fontsize=10)
    right.set_ylabel("% of this machine's peak in that precision")
    right.set_title("achieved FLOP/s over the matrix-product peak", fontsize=10)
    return save_figure(fig, path)


def plot_recall(records: list[dict], path: str | Path) -> Path:
    """``attnlab bench recall``: test accuracy against recurrent state size (log), one panel per
    number of key-value pairs, one line per variant through its widths (Based's figure 2)."""
    import matplotlib.pyplot as plt

    pairs = sorted({r["pairs"] for r in records})
    fig, axes = plt.subplots(1, len(pairs), figsize=(4.2 * len(pairs), 3.6), squeeze=False, sharey=True)
    for ax, p in zip(axes[0], pairs):
        for variant in dict.fromkeys(r["variant"] for r in records):
            pts = sorted((r["state_floats"], r["accuracy"]) for r in records if r["pairs"] == p
                         and r["variant"] == variant)
            if pts:
                ax.plot(*zip(*pts), marker="o", label=variant)
        ax.set_xscale("log", base=2)
        ax.set_ylim(0, 1.02)
        length = next(r["length"] for r in records if r["pairs"] == p)
        ax.set_title(f"{p} key-value pairs (N = {length})")
        ax.set_xlabel("state size (float32 numbers per layer)")
        ax.grid(True, which="both", alpha=0.3)
    axes[0][0].set_ylabel("test query accuracy")
    axes[0][-1].legend(fontsize=7)
    return save_figure(fig, path)
