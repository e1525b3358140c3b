"""Drawings of positional encodings: the vectors, the biases, the rotation angles."""

from __future__ import annotations

import math
from pathlib import Path

import torch

from ..positional.base import PositionalEncoding

__all__ = ["plot_positional", "plot_extrapolation"]


def plot_positional(pe: PositionalEncoding, length: int, path: str | Path, *, title: str | None = None) -> Path:
    """Draw what ``pe`` gives positions ``0..length-1`` and write it to a PNG.

    * input encodings: the ``(E, L)`` heatmap of the vectors ``e^i``, one column per position,
      as the lecture draws the Transformer's sinusoidal encoding;
    * bias encodings: the ``(L, L)`` bias matrix of every head (rows: query ``i``, columns:
      key ``j``);
    * rope: the rotation angle ``i theta_k`` of every pair ``k`` (mod 2 pi, a cyclic colour
      map), one column per position.

    Args:
        pe: the encoding (trained or not).
        length: number of positions L.
        path: the PNG to write (its folder is created).
        title: the figure title (default: the encoding's name and sizes).

    Returns:
        The path written.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if pe.kind == "none":
        raise ValueError("the 'none' encoding adds no positional information: there is nothing to draw")
    table = pe.table(length).detach().cpu().float()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if pe.kind == "bias":
        h = table.shape[0]
        cols = min(h, 4)
        rows = math.ceil(h / cols)
        fig, axes = plt.subplots(rows, cols, figsize=(3.2 * cols, 3.0 * rows), squeeze=False)
        lim = table.abs().max().item() or 1.0
        for i, ax in enumerate(axes.flat):
            if i >= h:
                ax.axis("off")
                continue
            im = ax.imshow(table[i].numpy(), cmap="RdBu_r", vmin=-lim, vmax=lim, interpolation="nearest")
            ax.set_title(f"head {i}", fontsize=9)
            ax.set_xlabel("key position j", fontsize=8)
            if i % cols == 0:
                ax.set_ylabel("query position i", fontsize=8)
        fig.colorbar(im, ax=axes.ravel().tolist(), shrink=0.8, label="bias added to the score")
        default = f"{pe.name}: bias b_h(i, j) per head, L = {length}"
    else:
        fig, ax = plt.subplots(figsize=(9, 4.5))
        if pe.kind == "rotation":
            data = torch.remainder(table, 2 * math.pi).T.numpy()  # (D/2, L)
            im = ax.imshow(data, aspect="auto", cmap="twilight", vmin=0, vmax=2 * math.pi, interpolation="nearest")
            ax.set_ylabel("pair k of dimensions (2k, 2k+1)")
            fig.colorbar(im, ax=ax, label="rotation angle i theta_k mod 2 pi")
            default = f"{pe.name}: rotation angles, head width {pe.dim}, L = {length}"
        else:
            data = table.T.numpy()  # (E, L): one column per position
            lim = float(abs(data).max()) or 1.0
            im = ax.imshow(data, aspect="auto", cmap="RdBu_r", vmin=-lim, vmax=lim, interpolation="nearest")
            ax.set_ylabel("dimension")
            fig.colorbar(im, ax=ax, label="value")
            default = f"{pe.name}: positional vectors e^i, one column per position, E = {pe.dim}"
        ax.set_xlabel("position i")
    fig.suptitle(title or default)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path


def plot_extrapolation(results: list[dict], path: str | Path, *, train_length: int | None = None) -> Path:
    """Accuracy against test length, one line per encoding (records of ``attnlab bench positional``).

    Args:
        results: dicts with ``encoding`` and ``accuracy`` ({length: mean accuracy or None}),
            optionally ``accuracy_min`` / ``accuracy_max`` drawn as a band.
        path: the PNG to write.
        train_length: drawn as a vertical line.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if not results:
        raise ValueError("no results to plot")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for i, r in enumerate(results):
        pts = sorted((int(k), v) for k, v in r["accuracy"].items() if v is not None)
        if not pts:
            continue
        xs, ys = zip(*pts)
        missing = sorted(int(k) for k, v in r["accuracy"].items() if v is None)
        label = r["encoding"] + (f" (no result at {', '.join(map(str, missing))})" if missing else "")
        ax.plot(xs, ys, marker="o", color=f"C{i}", label=label)
        lo, hi = r.get("accuracy_min"), r.get("accuracy_max")
        if lo and hi:
            lows = [lo[str(x)] if str(x) in lo else lo[x] for x in xs]
            highs = [hi[str(x)] if str(x) in hi else hi[x] for x in xs]
            ax.fill_between(xs, lows, highs, color=f"C{i}", alpha=0.15)
    if train_length:
        ax.axvline(train_length, color="grey", linestyle=":", label=f"training length {train_length}")
    ax.set_xscale("log", base=2)
    lengths = sorted({int(k) for r in results for k in r["accuracy"]})
    ax.set_xticks(lengths, [str(n) for n in lengths])
    ax.set_xlabel("test sequence length")
    ax.set_ylabel("token accuracy")
    ax.set_ylim(0, 1.02)
    ax.legend(fontsize=8, loc="lower left")
    ax.set_title("length extrapolation (delayed copy)")
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path
