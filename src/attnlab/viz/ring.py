"""The chart of ``attnlab bench ring``: memory per process and time per step against the length."""

from __future__ import annotations

from pathlib import Path

__all__ = ["plot_ring"]


def plot_ring(data: dict, path: str | Path) -> Path:
    """Left: peak tensor memory per process against the sequence length, one line per process
    count P, a cross where a length ran out of memory (at the cap, drawn as a dashed line).
    Right: seconds per forward + backward step, and the communication share of each step.

    Args:
        data: ``{"records": [RingRecord dicts]}``.
        path: the PNG to write.
    """
    import matplotlib
    import matplotlib.ticker

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from .bench import save_figure

    recs = data.get("records") or []
    if not recs:
        raise ValueError("nothing to plot: no records")
    r0 = recs[0]
    fig, (mem, sec) = plt.subplots(1, 2, figsize=(13, 4.8))
    lengths = sorted({r["length"] for r in recs})
    cap = r0["memory_cap"] / 2**20 if r0["memory_cap"] else None
    for i, p in enumerate(sorted({r["processes"] for r in recs})):
        ok = sorted((r["length"], r["peak_bytes"] / 2**20, r["seconds"], r["comm_share"]) for r in recs
                    if r["processes"] == p and r["status"] == "ok" and r["peak_bytes"])
        label = "1 process (plain layer)" if p == 1 else f"{p} processes (ring)"
        if ok:
            mem.plot([o[0] for o in ok], [o[1] for o in ok], marker="o", color=f"C{i}", label=label)
            sec.plot([o[0] for o in ok], [o[2] for o in ok], marker="o", color=f"C{i}", label=label)
            if p > 1:
                for n, _, s, share in ok:
                    sec.annotate(f"{share:.0%}", (n, s), textcoords="offset points", xytext=(4, -12),
                                 fontsize=7, color=f"C{i}")
        failed = [r["length"] for r in recs if r["processes"] == p and r["status"] not in ("ok", "skipped")]
        if failed and cap:
            mem.scatter(failed, [cap] * len(failed), marker="x", s=70, color=f"C{i}", zorder=3,
                        label=f"{label}: out of memory")
    if cap:
        mem.axhline(cap, ls="--", color="grey", lw=1)
        mem.annotate(f"cap {cap:.0f} MiB per process", (lengths[0], cap), textcoords="offset points", xytext=(0, 4),
                     fontsize=8, color="grey")
    kind = "causal" if r0["causal"] else "bidirectional"
    for ax in (mem, sec):
        ax.set_xscale("log", base=2)
        ax.set_xticks(lengths, [f"{n:,}" for n in lengths])
        ax.minorticks_off()
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%g"))
        ax.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    mem.set(xlabel="sequence length", ylabel="peak tensor memory per process (MiB)",
            title=f"memory per process, Encoder d={r0['dim']}, {r0['layers']} layers, {kind}")
    sec.set(xlabel="sequence length", ylabel="seconds per forward + backward step",
            title="step time (labels: communication share of the step)")
    return save_figure(fig, path)
