"""The arena's charts: the Long-Range-Arena chart (score against speed, bubble area = memory),
validation curves against training time, and first-layer attention maps (PNG, matplotlib)."""

from __future__ import annotations

import math
import textwrap
from pathlib import Path

from .presets import NO_ATTENTION
from .store import task_label

__all__ = ["label", "plot_cost", "plot_curves", "plot_levels", "plot_lra", "plot_maps", "slug"]


def label(entry: dict) -> str:
    """An entry's name on the leaderboard: its variant, and its setting when the variant has several."""
    return entry["variant"] + (f" ({entry['setting']})" if entry.get("setting") else "")


_PALETTE = ("#1f77b4", "#aec7e8", "#ff7f0e", "#ffbb78", "#2ca02c", "#98df8a", "#d62728", "#ff9896", "#9467bd",
            "#c5b0d5", "#8c564b", "#c49c94", "#e377c2", "#f7b6d2", "#bcbd22", "#dbdb8d", "#17becf", "#9edae5",
            "#393b79", "#637939")
"""Matplotlib's tab20 and two more: as many distinct colours as registered variants."""


def _color(variant: str) -> str:
    """One colour per variant, the same in every panel (black: the no-attention baseline)."""
    from .. import efficient

    if variant == NO_ATTENTION:
        return "black"
    names = efficient.names()
    return _PALETTE[(names.index(variant) if variant in names else len(names)) % len(_PALETTE)]


def _bubbles(ax, entries: list[dict], title: str) -> None:
    pts = [e for e in entries if e.get("value") is not None and e.get("speed")]
    if entries and not pts:  # nothing to place on the speed axis: say why instead of a blank panel
        why = ("no dense run here: speed and memory are relative to dense"
               if not any(e["variant"] == "dense" for e in entries) else "no finished run with a speed")
        ax.text(0.5, 0.5, why + "\n"
                + ", ".join(f"{label(e)} {e['value']:.3f}" for e in entries if e.get("value") is not None),
                ha="center", va="center", fontsize=8, transform=ax.transAxes, wrap=True)
    for e in pts:
        size = 600 * (e.get("memory") or 1.0)
        ax.scatter(e["speed"], e["value"], s=size, alpha=0.45, color=_color(e["variant"]))
        if e.get("spread") and math.isfinite(e["spread"]):  # the seeds' spread: +- one standard deviation
            ax.errorbar(e["speed"], e["value"], yerr=e["spread"], color=_color(e["variant"]), capsize=3, lw=1)
        if e.get("sweep"):  # the sweep's range: every value's mean test score, dotted
            ax.vlines(e["speed"], e["sweep"]["low"], e["sweep"]["high"], colors=_color(e["variant"]),
                      linestyles=":", lw=1.2)
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

    ranked = [e for e in board["average"] if e.get("ranked", True)]
    fewer = [label(e) for e in board["average"] if not e.get("ranked", True)]
    title = f"average over the {len(board['tasks'])} tasks every shown variant ran (geometric mean speed)" + \
        (f"\nnot shown, ran fewer tasks: {', '.join(fewer)}" if fewer else "")
    panels = [(f"{t}", es) for t, es in board["tasks"].items()] + ([(title, ranked)] if len(board["tasks"]) > 1 else [])
    cols = min(3, len(panels))
    rows = math.ceil(len(panels) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5.2 * cols, 4.4 * rows), squeeze=False, layout="constrained")
    for ax, (title, es) in zip(axes.flat, panels):
        _bubbles(ax, es, "\n".join(textwrap.wrap(title, 60)))
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    swept = any(e.get("sweep") for es in board["tasks"].values() for e in es)
    heading = ("attnlab arena: score vs speed (bubble area: peak memory relative to dense; bars: +-1 sd over seeds"
               + ("; dotted: the range over a sweep's values" if swept else "") + ")")
    # constrained layout keeps it off the panels' titles
    fig.suptitle("\n".join(textwrap.wrap(heading, 40 * cols)), fontsize=10)
    return _save(fig, path)


def plot_curves(rows: list[dict], path: str | Path, labels: dict[str, str] | None = None) -> Path | None:
    """Validation score against training time, one panel per task and one line per leaderboard
    entry (``labels``: run id -> the entry's label, :func:`label`; default the variant), drawn from
    its first seed (and its easiest level): which variant is ahead at every budget, not only at
    the end. None when no stored run has a history (stores written before histories were kept)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = labels or {}
    tasks: dict[str, dict[str, tuple[str, list]]] = {}
    def easiest(r):  # its seed, then its level (easiest first: the levels' values in order)
        return (r["seed"], [v if isinstance(v, (int, float)) else 0 for v in (r.get("level") or {}).values()])

    for r in sorted(rows, key=easiest):
        hist = [h for h in r.get("history") or [] if h.get("seconds") is not None]
        name = labels.get(r.get("run_id"), r["variant"])
        if r["status"] == "done" and hist and name not in tasks.get(task_label(r), {}):
            tasks.setdefault(task_label(r), {})[name] = (r["variant"], hist)
    if not tasks:
        return None
    cols = min(3, len(tasks))
    nrows = math.ceil(len(tasks) / cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(5.2 * cols, 3.8 * nrows), squeeze=False, layout="constrained")
    for ax, (task, lines) in zip(axes.flat, tasks.items()):
        for name, (variant, hist) in lines.items():
            alone = len(hist) < 2  # one validation: a larger dot
            ax.plot([h["seconds"] for h in hist], [h["val"] for h in hist], marker="o" if alone else ".",
                    ms=7 if alone else 4, lw=1.2, color=_color(variant), label=name,
                    ls="--" if variant == NO_ATTENTION else "-")
        if all(len(hist) < 2 for _, hist in lines.values()):  # one dot a line: say why, not a blank-looking panel
            ax.text(0.5, 0.5, "one validation per run, at its last step:\nthe budget is no longer than the "
                    "task's eval_every",
                    ha="center", va="center", fontsize=8, transform=ax.transAxes, color="grey")
        ax.set_xlabel("training time (s, validation not counted)")
        ax.set_ylabel("validation score")
        ax.set_title(task, fontsize=10)
        ax.grid(True, alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7, ncol=2)
    for ax in list(axes.flat)[len(tasks):]:
        ax.axis("off")
    heading = ("attnlab arena: validation score against training time (dashed: no attention; one line per setting, its "
               "first seed and easiest level)")
    fig.suptitle("\n".join(textwrap.wrap(heading, 45 * cols)), fontsize=10)
    return _save(fig, path)


def plot_levels(board: dict, path: str | Path) -> Path | None:
    """The difficulty curve: for each task measured at several levels, each entry's score at each
    level (mean over seeds, +- one standard deviation), easiest first; the chance line where the
    task says it. None when no task has levels."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tasks = {t: [e for e in es if e.get("levels")] for t, es in board["tasks"].items()}
    tasks = {t: es for t, es in tasks.items() if es}
    if not tasks:
        return None
    fig, axes = plt.subplots(1, len(tasks), figsize=(6.2 * len(tasks), 4.4), squeeze=False)
    from .board import level_text

    for ax, (task, entries) in zip(axes.flat, tasks.items()):
        names = list(dict.fromkeys(level_text(p["level"]) for e in entries for p in e["levels"]))
        for e in entries:
            at = {level_text(p["level"]): p for p in e["levels"]}
            pts = [(i, at[n]["value"], at[n].get("spread")) for i, n in enumerate(names) if n in at
                   and at[n]["value"] is not None]
            if not pts:
                continue
            xs, ys, sd = zip(*pts)
            ax.errorbar(xs, ys, yerr=[s if s is not None and math.isfinite(s) else 0 for s in sd], marker="o", ms=5,
                        capsize=3, color=_color(e["variant"]),
                        ls="--" if e["variant"] == NO_ATTENTION else "-", label=label(e))
        if not ax.lines:  # every run failed: say so, not an empty panel
            ax.text(0.5, 0.5, "no finished run at any level (the reasons are on the board)", ha="center", va="center",
                    fontsize=8, transform=ax.transAxes, color="grey")
        ax.set_xticks(range(len(names)), names, fontsize=8)
        ax.set_xlabel("difficulty level (easiest first)")
        ax.set_ylabel("test score (mean over seeds)")
        ax.set_title(task, fontsize=10)
        ax.grid(True, alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7, ncol=2)
    fig.suptitle("attnlab arena: score against difficulty (a fixed-size state falls off as the keys grow; attention "
                 "holds)", fontsize=10)
    return _save(fig, path)


def plot_maps(maps: dict[str, list], path: str | Path, title: str) -> Path:
    """Attention maps of the first layer: one column per variant, one row per example; each row
    of a map scaled to its own maximum (square-root colours), so a query's weight shows where it
    goes even when a thousand keys share it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.colors import PowerNorm

    names = [v for v in maps if maps[v]]
    rows = max((len(maps[v]) for v in names), default=1)
    fig, axes = plt.subplots(rows, max(1, len(names)), figsize=(2.2 * max(1, len(names)), 2.3 * rows), squeeze=False)
    for j, v in enumerate(names):
        for i in range(rows):
            ax = axes[i][j]
            ax.set_xticks([])
            ax.set_yticks([])
            if i < len(maps[v]):
                m = maps[v][i].abs()
                # each row to its own maximum: where each query's weight goes
                m = m / m.amax(dim=-1, keepdim=True).clamp_min(1e-12)
                ax.imshow(m.numpy(), cmap="magma", aspect="auto", norm=PowerNorm(0.5, vmin=0, vmax=1),
                          interpolation="nearest")
            if i == 0:
                ax.set_title(v, fontsize=9)
    fig.suptitle(title, fontsize=10)
    return _save(fig, path)


def plot_cost(table: dict, scores: dict[str, float], path: str | Path, *, title_task: str = "") -> Path | None:
    """The lecture's chart from the cost table: left, score (``scores``: variant -> the task's mean
    score) against training-step speed relative to dense at the longest measured length, bubble
    area = peak memory relative to the fused dense there, each bubble naming its memory relative
    to the materialising dense too, whose own peak is written beside them; right, each variant's
    step seconds and peak memory against the length. None without measurements."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from .cost import REFERENCE, ratios

    rows = table.get("rows", [])
    if not rows:
        return None
    length = (max(r["length"] for r in rows if r["variant"] == "dense") if any(r["variant"] == "dense" for r in rows)
              else None)
    fig, (ax, ax_t, ax_m) = plt.subplots(1, 3, figsize=(17, 5.2))
    if length is not None:
        at = ratios(table, length)
        drawn = 0
        for v, r in at.items():
            score = scores.get(v)
            if v == REFERENCE or score is None or r["speed"] is None:
                continue
            ax.scatter(r["speed"], score, s=500 * (r["memory"] or 1.0), alpha=0.45, color=_color(v))
            ax.annotate(v, (r["speed"], score), fontsize=8, ha="center", va="center")
            drawn += 1
        if not drawn:  # the measured variants have no score on the board: say so, not an empty panel
            ax.text(0.5, 0.5, "no score to place: no measured variant finished a run of "
                    f"{title_task or 'the task'} on this board",
                    ha="center", va="center", fontsize=8, transform=ax.transAxes, wrap=True, color="grey")
        ref = next((x for x in rows if x["variant"] == REFERENCE and x["length"] == length), None)
        dense = next((x for x in rows if x["variant"] == "dense" and x["length"] == length), None)
        if ref and dense and ref["peak_bytes"] and dense["peak_bytes"]:
            how = (f"projected through {ref['from'][0]:,} and {ref['from'][1]:,} tokens"
                   if ref.get("projected") else "measured")
            naive = (f"\n{REFERENCE} (materialises N x N, scores as dense): {ref['peak_bytes'] / 2**30:.1f} GiB,\n"
                     f"{ref['peak_bytes'] / dense['peak_bytes']:.0f}x the fused dense's ({how})")
        else:
            naive = ""
        ax.set_xscale("log", base=2)
        ax.axvline(1.0, color="grey", lw=0.6, ls=":")
        ax.set_xlabel(f"training-step speed relative to the fused dense at {length:,} tokens (this machine's)")
        ax.set_ylabel(f"{title_task} score (mean over levels and seeds)" if title_task else "score")
        ax.set_title(f"score against speed at {length:,} tokens\n(bubble area: peak memory relative to the "
                     f"fused dense){naive}",
                     fontsize=8)
        ax.grid(True, alpha=0.3)
    variants = list(dict.fromkeys(r["variant"] for r in rows))
    for v in variants:
        mine = sorted((r for r in rows if r["variant"] == v), key=lambda r: r["length"])
        style = dict(marker="o", ms=4, color="grey" if v == REFERENCE else _color(v),
                     ls="--" if v in (REFERENCE, NO_ATTENTION) else "-", label=v)
        timed = [r for r in mine if r["seconds"] is not None]
        ax_t.plot([r["length"] for r in timed], [r["seconds"] for r in timed], **style)
        ax_m.plot([r["length"] for r in mine if r["peak_bytes"]],
                  [r["peak_bytes"] / 2**20 for r in mine if r["peak_bytes"]], **style)
    for a, what in ((ax_t, "seconds per training step"), (ax_m, "peak tensor MiB of a training step")):
        a.set_xscale("log", base=2)
        a.set_yscale("log")
        a.set_xlabel("tokens (batch 1)")
        a.set_ylabel(what)
        a.grid(True, alpha=0.3, which="both")
        a.legend(fontsize=7)
    n = table.get("threads")
    # a GPU, or the CPU's threads
    where = table.get("device") or f"{table.get('cpu') or 'CPU'}, {n} thread{'' if n == 1 else 's'}"
    ax_t.set_title(f"time (this machine: {where})", fontsize=9)
    ax_m.set_title("memory (the same on any machine)", fontsize=9)
    for r in rows:
        if r.get("projected"):
            ax_m.annotate(f"{r['variant']} at {r['length']:,}: projected (b N + c N^2 through {r['from'][0]:,} and "
                          f"{r['from'][1]:,})",
                          (0.02, 0.02), xycoords="axes fraction", fontsize=7)
    fig.suptitle("where efficient attention pays: one training step of the task's model", fontsize=11)
    fig.subplots_adjust(wspace=0.3, top=0.8)
    return _save(fig, path)


def slug(task: str) -> str:
    """A task's label as a file name: ``jsonl (mine.jsonl, sha256 1a2b...)`` -> ``jsonl-mine.jsonl-sha256-1a2b...``."""
    import re

    return re.sub(r"[^A-Za-z0-9._]+", "-", task).strip("-")


def _save(fig, path) -> Path:
    from ..viz.bench import save_figure

    return save_figure(fig, path, dpi=100)


