"""The chart of ``attnlab bench decode``: decoding speed against the context length."""

from __future__ import annotations

from pathlib import Path

__all__ = ["plot_decode"]


def plot_decode(data: dict, path: str | Path) -> Path:
    """Left: tokens per second of the decoding steps (after the prompt) against the context,
    one line per implementation (log-log). Right, when measured: the bytes a cache holds
    against the stream length, full cache against sinks + window.

    Args:
        data: ``{"speed": [DecodeRecord dicts], "memory": [StreamMemoryRecord dicts], ...}``.
        path: the PNG to write.
    """
    import matplotlib
    import matplotlib.ticker

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from .bench import save_figure

    speed, memory = data.get("speed") or [], data.get("memory") or []
    if not speed and not memory:
        raise ValueError("nothing to plot: no speed or memory records")
    panels = [p for p in (speed, memory) if p]
    fig, axes = plt.subplots(1, len(panels), figsize=(6.5 * len(panels), 4.5), squeeze=False)
    ax = axes[0][0]
    if speed:
        for i, impl in enumerate(dict.fromkeys(r["implementation"] for r in speed)):
            pts = sorted((r["context"], r["decode_tokens_per_second"]) for r in speed
                         if r["implementation"] == impl and r["decode_tokens_per_second"])
            if pts:
                ax.plot(*zip(*pts), marker="o", color=f"C{i}", label=impl)
        r0 = speed[0]
        contexts = sorted({r["context"] for r in speed})
        ax.set_xscale("log")
        ax.set_xticks(contexts, [str(c) for c in contexts])
        ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.set(yscale="log", xlabel="context (tokens before the new ones)", ylabel="decoded tokens per second",
               title=f"greedy decoding, d={r0['dim']}, {r0['layers']} layers, {r0['heads']} heads (CPU)")
        ax.legend()
        ax.grid(True, which="both", alpha=0.3)
    if memory:
        ax = axes[0][-1]
        for i, kind in enumerate(dict.fromkeys(r["cache"] for r in memory)):
            pts = sorted((r["tokens"], r["cache_bytes"] / 2**20) for r in memory if r["cache"] == kind)
            ax.plot(*zip(*pts), marker="o", color=f"C{i + 3}", label=kind)
        ax.set(xscale="log", yscale="log", xlabel="tokens streamed", ylabel="cache (MiB)",
               title="cache memory over a stream")
        ax.legend()
        ax.grid(True, which="both", alpha=0.3)
    return save_figure(fig, path)
