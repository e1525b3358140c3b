"""The chart of ``attnlab bench pretrained``: fidelity against speed, without retraining."""

from __future__ import annotations

from pathlib import Path

__all__ = ["plot_pretrained"]


def plot_pretrained(records: list[dict], path: str | Path) -> Path:
    """One panel per sequence length: each (variant, budget) at its time relative to the trained
    model (x, log scale) and the mean cosine of its sentence embeddings to the trained model's
    (y; 0.95 dashed) or, for a decoder's records, its perplexity relative to the trained model's
    (y, log; 1.1 dashed); one colour per variant, budgets labelled, the trained model at (1, 1).

    Args:
        records: dicts of :class:`attnlab.studies.pretrained.PretrainedRecord`.
        path: the PNG to write.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib import ticker

    from .bench import save_figure

    rows = [r for r in records if r.get("time_ratio") is not None]
    if not rows:
        raise ValueError("no timed records to plot")
    lengths = sorted({r["n"] for r in rows})
    variants = list(dict.fromkeys(r["variant"] for r in rows))
    decoder = "perplexity" in rows[0]
    field, base, line = ("ratio", "sdpa", 1.1) if decoder else ("cosine_mean", "dense", 0.95)
    fig, axes = plt.subplots(1, len(lengths), figsize=(6.5 * len(lengths), 5), squeeze=False)
    for ax, n in zip(axes[0], lengths):
        for i, v in enumerate(variants):
            pts = sorted((r["time_ratio"], r[field], r["budget"]) for r in rows if r["n"] == n and r["variant"] == v)
            if not pts:
                continue
            xs, ys, labels = zip(*pts)
            ax.plot(xs, ys, marker="*" if v == base else "o", markersize=12 if v == base else 6, color=f"C{i}",
                    linestyle="-" if len(pts) > 1 else "none", label=v)
            for x, y, label in pts:
                if v not in (base, "attnlab"):
                    ax.annotate(label.split("=")[-1], (x, y), textcoords="offset points", xytext=(4, 3),
                                fontsize=7, color=f"C{i}")
        ax.axhline(line, color="grey", linestyle="--", linewidth=0.8)
        ax.set_xscale("log")
        if decoder:
            ax.set_yscale("log")
        for axis in (ax.xaxis, ax.yaxis):  # plain numbers (1.5, 2, 6), not powers of ten, on the log axes
            axis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f"{v:g}"))
            axis.set_minor_formatter(ticker.FuncFormatter(lambda v, _: f"{v:g}" if str(v)[0] in "235" else ""))
        docs = next(r["windows" if decoder else "documents"] for r in rows if r["n"] == n)
        ax.set_title(f"N = {n} tokens ({docs} {'held-out windows' if decoder else 'documents'})")
        ax.set_xlabel("forward time relative to the trained model" + (" under sdpa" if decoder else "") + " (log)")
        ax.set_ylabel("perplexity relative to the trained model's (log)" if decoder
                      else "cosine to the trained model's embeddings (mean)")
        ax.grid(True, alpha=0.3)
    axes[0][-1].legend(fontsize=8, loc="center left", bbox_to_anchor=(1.01, 0.5))
    fig.suptitle("Efficient attention swapped into a trained model, no retraining: fidelity vs speed")
    fig.tight_layout()
    return save_figure(fig, path)
