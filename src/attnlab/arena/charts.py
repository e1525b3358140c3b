"""The arena's charts: the Long-Range-Arena chart (score against speed, bubble area = memory),
validation curves against training time, and first-layer attention maps (PNG, matplotlib)."""

from __future__ import annotations

import math
from pathlib import Path

from .presets import NO_ATTENTION
from .store import task_label

__all__ = ["label", "plot_curves", "plot_lra", "plot_maps", "slug"]


def label(entry: dict) -> str:
    """An entry's name on the leaderboard: its variant, and its setting when the variant has several."""
    return entry["variant"] + (f" ({entry['setting']})" if entry.get("setting") else "")


_PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf",
            "#393b79", "#ad494a", "#637939", "#843c39")


def _color(variant: str) -> str:
    """One colour per variant, the same in every panel (black: the no-attention baseline)."""
    from .. import efficient

    if variant == NO_ATTENTION:
        return "black"
    names = efficient.names()
    return _PALETTE[(names.index(variant) if variant in names else len(names)) % len(_PALETTE)]


def _bubbles(ax, entries: list[dict], title: str) -> None:
    pts = [e for e in entries if e.get("value") is not None and e.get("speed")]
    for e in pts:
        size = 600 * (e.get("memory") or 1.0)
        ax.scatter(e["speed"], e["value"], s=size, alpha=0.45, color=_color(e["variant"]))
        if e.get("spread") and math.isfinite(e["spread"]):  # the seeds' spread: +- one standard deviation
            ax.errorbar(e["speed"], e["value"], yerr=e["spread"], color=_color(e["variant"]), capsize=3, lw=1)
        if e.get("sweep"):  # the sweep's range: every value's mean test score, dotted
            ax.vlines(e["speed"], e["sweep"]["low"], e["sweep"]["high"], colors=_color(e["variant"]), linestyles=":", lw=1.2)
        ax.annotate(label(e), (e["speed"], e["value"]), fontsize=8, ha="center", va="center")
    ax.set_xscale("log", base=2)
    ax.axvline(1.0, color="grey", lw=0.6, ls=":")
    ax.set_xlabel("training speed relative to dense")
    ax.set_ylabel("test score")
    ax.set_title(title, fontsize=10)
    ax.grid(True, alpha=0.3)
    if pts:
        lo, hi = min(e["speed"] for e in pts), max(e["speed"] for e in pts)
        ax.set_xlim(lo / 1.6, hi * 1.6)


def plot_lra(board: dict, path: str | Path) -> Path:
    """The Long-Range-Arena chart: one panel per task and one for the average (bubble area =
    peak memory relative to dense)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [(f"{t}", es) for t, es in board["tasks"].items()] + [("average over tasks (geometric mean speed)", board["average"])]
    cols = min(3, len(panels))
    rows = math.ceil(len(panels) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5.2 * cols, 4.2 * rows), squeeze=False)
    for ax, (title, es) in zip(axes.flat, panels):
        _bubbles(ax, es, title)
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    swept = any(e.get("sweep") for es in board["tasks"].values() for e in es)
    fig.suptitle("attnlab arena: score vs speed (bubble area: peak memory relative to dense; bars: +-1 sd over seeds"
                 + ("; dotted: the range over a sweep's values" if swept else "") + ")")
    fig.subplots_adjust(hspace=0.35)
    return _save(fig, path)


def plot_curves(rows: list[dict], path: str | Path) -> Path | None:
    """Validation score against training time, one panel per task and one line per variant
    (its first seed): which variant is ahead at every budget, not only at the end. None when no
    stored run has a history (stores written before histories were kept)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tasks: dict[str, dict[str, list]] = {}
    for r in sorted(rows, key=lambda r: r["seed"]):
        hist = [h for h in r.get("history") or [] if h.get("seconds") is not None]
        if r["status"] == "done" and hist and r["variant"] not in tasks.get(task_label(r), {}):
            tasks.setdefault(task_label(r), {})[r["variant"]] = hist
    if not tasks:
        return None
    cols = min(3, len(tasks))
    nrows = math.ceil(len(tasks) / cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(5.2 * cols, 3.8 * nrows), squeeze=False)
    for ax, (task, lines) in zip(axes.flat, tasks.items()):
        for variant, hist in lines.items():
            ax.plot([h["seconds"] for h in hist], [h["val"] for h in hist], marker=".", ms=4, lw=1.2,
                    color=_color(variant), label=variant, ls="--" if variant == NO_ATTENTION else "-")
        ax.set_xlabel("training time (s, validation not counted)")
        ax.set_ylabel("validation score")
        ax.set_title(task, fontsize=10)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7, ncol=2)
    for ax in list(axes.flat)[len(tasks):]:
        ax.axis("off")
    fig.suptitle("attnlab arena: validation score against training time (dashed: no attention)")
    fig.subplots_adjust(hspace=0.35)
    return _save(fig, path)


def plot_maps(maps: dict[str, list], path: str | Path, title: str) -> Path:
    """Attention maps of the first layer: one column per variant, one row per example."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [v for v in maps if maps[v]]
    rows = max((len(maps[v]) for v in names), default=1)
    fig, axes = plt.subplots(rows, max(1, len(names)), figsize=(2.2 * max(1, len(names)), 2.3 * rows), squeeze=False)
    for j, v in enumerate(names):
        for i in range(rows):
            ax = axes[i][j]
            ax.set_xticks([])
            ax.set_yticks([])
            if i < len(maps[v]):
                ax.imshow(maps[v][i].numpy(), cmap="viridis", aspect="auto")
            if i == 0:
                ax.set_title(v, fontsize=9)
    fig.suptitle(title, fontsize=10)
    return _save(fig, path)


def slug(task: str) -> str:
    """A task's label as a file name: ``jsonl (mine.jsonl, sha256 1a2b...)`` -> ``jsonl-mine.jsonl-sha256-1a2b...``."""
    import re

    return re.sub(r"[^A-Za-z0-9._]+", "-", task).strip("-")


def _save(fig, path) -> Path:
    from ..viz.bench import save_figure

    return save_figure(fig, path, dpi=100)


