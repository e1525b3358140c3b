"""``attnlab generate``: continue a prompt with a trained language model, streaming the text."""

from __future__ import annotations

import sys
from typing import Optional

import typer

from .common import fail

__all__ = ["generate"]


def generate(
    checkpoint: str = typer.Argument(..., help="A language model's checkpoint folder (attnlab train docs --out DIR)."),
    prompt: str = typer.Argument(..., help="The text to continue."),
    max_new_tokens: int = typer.Option(200, "--max-new-tokens", min=0, help="Tokens (bytes) to write."),
    temperature: float = typer.Option(0.8, min=0.0, help="Sampling temperature; 0 = greedy."),
    top_k: Optional[int] = typer.Option(None, "--top-k", min=1, help="Sample among the k most likely tokens only."),
    top_p: Optional[float] = typer.Option(None, "--top-p", min=0.0, max=1.0, help="Nucleus sampling: the smallest set of tokens whose probability reaches p."),
    seed: int = typer.Option(0, help="Seed of the sampling: the same seed writes the same text."),
    window: Optional[int] = typer.Option(None, min=1, help="Bounded StreamingLLM cache: keep the last WINDOW tokens (plus --sinks)."),
    sinks: int = typer.Option(4, min=0, help="With --window: the first tokens kept for ever (attention sinks)."),
    no_cache: bool = typer.Option(False, "--no-cache", help="Rerun the whole prefix at every step (the slow reference)."),
) -> None:
    """Generate text with a trained language model, token by token, with a key / value cache."""
    from ..training import CheckpointError, generate as run

    try:
        pieces = run(checkpoint, prompt, max_new_tokens=max_new_tokens, temperature=temperature, top_k=top_k, top_p=top_p, seed=seed,
                     cache=not no_cache, window=window, sinks=sinks)
        sys.stdout.write(prompt)
        sys.stdout.flush()
        for piece in pieces:
            sys.stdout.write(piece)
            sys.stdout.flush()
        sys.stdout.write("\n")
    except (CheckpointError, ValueError) as e:
        fail(str(e))
