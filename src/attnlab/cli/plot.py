"""``attnlab plot positional``: draw attnlab's parts to PNG files."""

from __future__ import annotations

import typer

from .common import err, fail, print_json
from .options import json_option, output_option

__all__ = ["positional"]

_WHAT = {"input": "positional vectors e^i, one column per position", "bias": "bias b_h(i, j) per head"}


def positional(
    name: str = typer.Argument(..., help="The encoding: sinusoidal, learned, rnn, floater, relative, alibi, rope."),
    length: int = typer.Option(128, min=1, help="Number of positions drawn."),
    dim: int = typer.Option(64, min=1, help="Width E of the vectors (for rope: the head width D)."),
    num_heads: int = typer.Option(8, "--num-heads", min=1, help="Heads of a bias encoding."),
    seed: int = typer.Option(0, help="Seed of a trainable encoding's initialisation."),
    output: str | None = output_option("The PNG file (default positional-NAME.png)."),
    as_json: bool = json_option("Print one JSON object (encoding, kind, path) instead of a sentence."),
) -> None:
    """Draw a positional encoding: vectors (one column per position), per-head biases, or RoPE's angles."""
    import torch

    from .. import positional as P
    from ..viz.positional import plot_positional

    if name not in P.names():
        fail(f"unknown positional encoding {name!r}; choose one of {', '.join(P.names())}")
    if name == "none":
        fail("the 'none' encoding adds no positional information: there is nothing to draw")
    torch.manual_seed(seed)
    try:
        pe = P.create(name, dim=dim, num_heads=num_heads, max_len=length)
    except ValueError as e:
        fail(str(e))
    trained = any(True for _ in pe.parameters())
    title = f"{name} at initialisation (seed {seed}): " + _WHAT.get(pe.kind, "") if trained else None
    path = plot_positional(pe, length, output or f"positional-{name}.png", title=title)
    if as_json:
        print_json({"encoding": name, "kind": pe.kind, "path": str(path)})
        return
    err.print(f"written to {path}")
