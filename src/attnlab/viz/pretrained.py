"""The chart of ``attnlab bench pretrained``: fidelity against speed, without retraining."""

from __future__ import annotations

from pathlib import Path

__all__ = ["plot_pretrained"]


def plot_pretrained(records: list[dict], path: str | Path) -> Path:
    """One panel per sequence length: each (variant, budget) at its time relative to the trained
    model (x, log scale) and the mean cosine of its sentence embeddings to the trained model's
    (y); one colour per variant, budgets labelled, the trained model at (1, 1), 0.95 dashed.

    Args:
        records: dicts of :class:`attnlab.studies.pretrained.PretrainedRecord`.
        path: the PNG to write.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from .bench import save_figure

    rows = [r for r in records if r.get("time_ratio") is not None]
    if not rows:
        raise ValueError("no timed records to plot")
    lengths = sorted({r["n"] for r in rows})
    variants = list(dict.fromkeys(r["variant"] for r in rows))
    fig, axes = plt.subplots(1, len(lengths), figsize=(6.5 * len(lengths), 5), squeeze=False)
    for ax, n in zip(axes[0], lengths):
        for i, v in enumerate(variants):
            pts = sorted((r["time_ratio"], r["cosine_mean"], r["budget"]) for r in rows if r["n"] == n and r["variant"] == v)
            if not pts:
                continue
            xs, ys, labels = zip(*pts)
            ax.plot(xs, ys, marker="*" if v == "dense" else "o", markersize=12 if v == "dense" else 6, color=f"C{i}",
                    linestyle="-" if len(pts) > 1 else "none", label=v)
            for x, y, label in pts:
                if v != "dense":
                    ax.annotate(label.split("=")[-1], (x, y), textcoords="offset points", xytext=(4, 3), fontsize=7, color=f"C{i}")
        ax.axhline(0.95, color="grey", linestyle="--", linewidth=0.8)
        ax.set_xscale("log")
        docs = next(r["documents"] for r in rows if r["n"] == n)
        ax.set_title(f"N = {n} tokens ({docs} documents)")
        ax.set_xlabel("forward time relative to the trained model (log)")
        ax.set_ylabel("cosine to the trained model's embeddings (mean)")
        ax.grid(True, alpha=0.3)
    axes[0][-1].legend(fontsize=8, loc="center left", bbox_to_anchor=(1.01, 0.5))
    fig.suptitle("Efficient attention swapped into a trained model, no retraining: fidelity vs speed")
    fig.tight_layout()
    return save_figure(fig, path)
