"""The chart of ``attnlab bench masks``: time and memory against N, a mask made dense against the
same mask computed block-sparse, one colour per pattern."""

from __future__ import annotations

from pathlib import Path

__all__ = ["plot_masks"]


def plot_masks(data: dict, path: str | Path) -> Path:
    """Left: forward + backward seconds against N; right: peak resident MiB above the process's
    start. Solid lines: block-sparse (the mask function); dashed: the same mask as a dense tensor;
    dotted: PyTorch's causal kernel (the causal pattern). A star: one training step of one layer
    under the window at its N.

    Args:
        data: ``{"records": [masks Record dicts]}`` as ``attnlab bench masks -o`` writes.
        path: the PNG to write.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    from .bench import log_log_axes, save_figure

    recs = [r for r in data.get("records") or [] if r["mode"] == "fwd_bwd" and r["seconds"]]
    if not recs:
        raise ValueError("nothing to plot: no forward + backward records")
    fig, (sec, mem) = plt.subplots(1, 2, figsize=(13, 5))
    styles = {"block-sparse": "-", "dense mask": "--", "pytorch causal": ":"}
    patterns = list(dict.fromkeys(r["pattern"] for r in recs))
    for i, p in enumerate(patterns):
        for method, style in styles.items():
            pts = sorted((r["n"], r["seconds"], r["rss_bytes"]) for r in recs if r["pattern"] == p
                         and r["method"] == method)
            if not pts:
                continue
            sec.plot([x[0] for x in pts], [x[1] for x in pts], style, marker="o", ms=3, color=f"C{i}")
            mem_pts = [x for x in pts if x[2]]
            if mem_pts:
                mem.plot([x[0] for x in mem_pts], [x[2] / 2**20 for x in mem_pts], style, marker="o",
                         ms=3, color=f"C{i}")
    # One legend under both panels: a colour per pattern, a line style per method.
    handles = [Line2D([], [], color=f"C{i}", marker="o", ms=3, label=p) for i, p in enumerate(patterns)]
    handles += [Line2D([], [], color="black", linestyle=style, label=method) for method, style in styles.items()
                if any(r["method"] == method for r in recs)]
    steps = [r for r in data["records"] if r["mode"] == "layer_step" and r["seconds"]]
    for r in steps:
        sec.scatter([r["n"]], [r["seconds"]], marker="*", s=120, color="black", zorder=3)
        if r["rss_bytes"]:
            mem.scatter([r["n"]], [r["rss_bytes"] / 2**20], marker="*", s=120, color="black", zorder=3)
    if steps:
        handles.append(Line2D([], [], color="black", marker="*", ms=10, linestyle="",
                              label=f"one layer's training step, window, N={steps[-1]['n']:,}"))
    log_log_axes(sec, "forward + backward seconds", "N")
    log_log_axes(mem, "peak resident MiB above the process's start", "N")
    fig.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, 0.02), ncol=6, fontsize=8, frameon=False)
    sizes = sorted({r["n"] for r in data["records"]})
    for ax in (sec, mem):
        ax.set_xticks(sizes, [f"{n // 1024}K" if n >= 1024 else str(n) for n in sizes])
        ax.minorticks_off()
    return save_figure(fig, path)
