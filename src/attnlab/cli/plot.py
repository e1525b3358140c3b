"""``attnlab plot positional``: draw attnlab's parts to PNG files."""

from __future__ import annotations

import typer

from .. import positional as P
from .common import err, print_json
from .errors import fail, usage_error
from .options import json_option, one_of, output_option

__all__ = ["Encoding", "positional"]

Encoding = one_of(P.names())
"""``NAME``: a registered positional encoding (``attnlab list encodings``)."""

_WHAT = {"input": "positional vectors e^i, one column per position", "bias": "bias b_h(i, j) per head"}


def positional(
    name: Encoding = typer.Argument(..., metavar="NAME", help="The encoding to draw."),
    length: int = typer.Option(128, min=1, help="Number of positions drawn."),
    dim: int = typer.Option(64, min=1, help="Width E of the vectors (for rope: the head width D)."),
    num_heads: int = typer.Option(8, "--num-heads", min=1, help="Heads of a bias encoding."),
    seed: int = typer.Option(0, help="Seed of a trainable encoding's initialisation."),
    output: str | None = output_option("The PNG file (default positional-NAME.png)."),
    as_json: bool = json_option("Print one JSON object (encoding, kind, path) instead of a sentence."),
) -> None:
    """Draw a positional encoding: vectors (one column per position), per-head biases, or RoPE's angles."""
    import torch

    from ..viz.positional import plot_positional

    if name == "none":
        usage_error("the 'none' encoding adds no positional information: there is nothing to draw")
    torch.manual_seed(seed)
    try:
        pe = P.create(name, dim=dim, num_heads=num_heads, max_len=length)
    except ValueError as e:
        fail(e)
    trained = any(True for _ in pe.parameters())
    title = f"{name} at initialisation (seed {seed}): " + _WHAT.get(pe.kind, "") if trained else None
    path = plot_positional(pe, length, output or f"positional-{name}.png", title=title)
    if as_json:
        print_json({"encoding": name, "kind": pe.kind, "path": str(path)})
        return
    err.print(f"written to {path}")
