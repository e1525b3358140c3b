"""Charts of ``attnlab complexity`` and ``attnlab bench distance`` records, and cross-attention maps."""

from __future__ import annotations

from pathlib import Path

__all__ = ["plot_complexity", "plot_distance", "plot_cross_attention"]


def _save(fig, path) -> Path:
    from .bench import save_figure

    return save_figure(fig, path)


def plot_complexity(records: list[dict], path: str | Path, *, exponents: dict | None = None) -> Path:
    """Forward time against n (log-log, one line per layer type, fitted exponent in the legend)
    and the measured sequential steps against n.

    Args:
        records: dicts of :meth:`attnlab.studies.complexity.ComplexityRecord.to_dict`.
        path: the PNG to write (its folder is created).
        exponents: ``{layer: exponent}`` shown in the legend.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in records if r.get("seconds")]
    if not rows:
        raise ValueError("no timed records to plot")
    layers = list(dict.fromkeys(r["layer"] for r in records))
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.8))
    for i, name in enumerate(layers):
        pts = sorted((r["n"], r["seconds"]) for r in rows if r["layer"] == name)
        e = (exponents or {}).get(name)
        if pts:
            axes[0].plot(*zip(*pts), marker="o", color=f"C{i}",
                         label=name + (f" (exponent {e:.2f})" if e is not None else ""))
        steps = sorted((r["n"], r["sequential_steps"]) for r in records if r["layer"] == name
                       and r.get("sequential_steps"))
        if steps:
            axes[1].plot(*zip(*steps), marker="o", color=f"C{i}", label=name)
    from .bench import log_log_axes

    for ax, title in ((axes[0], "forward time (s), B=1, d=64"),
                      (axes[1], "sequential steps (longest chain of dependent ops)")):
        log_log_axes(ax, title, "sequence length n")
    fig.suptitle("CNN / RNN / self-attention: measured cost and sequential steps")
    return _save(fig, path)


def plot_distance(records: list[dict], path: str | Path) -> Path:
    """Held-out accuracy against the distance to the trigger, one line per layer type (the mean
    over seeds, the band from the worst to the best seed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if not records:
        raise ValueError("no distance records to plot")
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    markers = "osD^v<>p"
    names = list(dict.fromkeys(r["layer"] for r in records))
    for i, name in enumerate(names):
        by: dict[int, list[float]] = {}
        for r in records:
            if r["layer"] == name:
                by.setdefault(r["distance"], []).append(r["accuracy"])
        ds = sorted(by)
        # shrinking markers and dashes keep lines that coincide (all at 1.0, say) visible
        ax.plot(
            ds,
            [sum(by[d]) / len(by[d]) for d in ds],
            marker=markers[i % len(markers)],
            markersize=11 - 1.5 * (i % 5),
            linestyle=("-", "--", "-.", ":")[i % 4],
            color=f"C{i}",
            label=name,
        )
        ax.fill_between(ds, [min(by[d]) for d in ds], [max(by[d]) for d in ds], color=f"C{i}", alpha=0.15)
    ax.set_xscale("log", base=2)
    distances = sorted({r["distance"] for r in records})
    ax.set_xticks(distances, [str(d) for d in distances])
    ax.set_ylim(0, 1.05)
    ax.set_xlabel("distance from the trigger to the query")
    ax.set_ylabel("held-out accuracy at the query")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title("Does the layer still see a token far back?")
    return _save(fig, path)


def plot_cross_attention(weights, source: list[str], target: list[str], path: str | Path, *, title: str = "") -> Path:
    """A decoder's cross-attention ``(M, N)`` (target step x source word) as a heat map."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    w = weights.detach().float().cpu().numpy() if hasattr(weights, "detach") else weights
    if w.shape != (len(target), len(source)):
        raise ValueError(f"weights of shape {tuple(w.shape)} do not match {len(target)} target x "
                         f"{len(source)} source tokens")
    fig, ax = plt.subplots(figsize=(0.55 * len(source) + 2.5, 0.45 * len(target) + 2))
    ax.imshow(w, cmap="viridis", vmin=0, aspect="auto")
    ax.set_xticks(range(len(source)), source, rotation=60, ha="right")
    ax.set_yticks(range(len(target)), target)
    ax.set_xlabel("source")
    ax.set_ylabel("generated target")
    ax.set_title(title or "cross-attention (last decoder block, mean over heads)")
    return _save(fig, path)
