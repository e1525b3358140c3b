"""``attnlab generate``: continue a prompt with a trained language model, streaming the text."""

from __future__ import annotations

import sys
import unicodedata

import typer

from .common import err, print_json, require_text
from .errors import device_or_fail, fail, usage_error
from .options import device_option, json_option

__all__ = ["generate", "printable"]


def generate(
    checkpoint: str = typer.Argument(
        ..., metavar="DIR", help="A language model's checkpoint folder (attnlab train docs --out DIR)."),
    prompt: str = typer.Argument(..., help="The text to continue."),
    max_new_tokens: int = typer.Option(200, "--max-new-tokens", min=0, help="Tokens (bytes) to write."),
    temperature: float = typer.Option(0.8, min=0.0, help="Sampling temperature; 0 = greedy."),
    top_k: int | None = typer.Option(None, "--top-k", min=1, help="Sample among the k most likely tokens only."),
    top_p: float | None = typer.Option(
        None, "--top-p",
        help="Nucleus sampling: the smallest set of tokens whose probability reaches p (0 < p <= 1)."),
    seed: int = typer.Option(0, help="Seed of the sampling: the same seed writes the same text."),
    window: int | None = typer.Option(
        None, min=1, help="Bounded StreamingLLM cache: keep the last WINDOW tokens (plus --sinks)."),
    sinks: int | None = typer.Option(
        None, min=0, help="With --window: the first tokens kept for ever (attention sinks; default 4)."),
    no_cache: bool = typer.Option(
        False, "--no-cache", help="Rerun the whole prefix at every step (the slow reference)."),
    raw: bool = typer.Option(
        False, "--raw", help="Write the bytes as generated, control characters too (default on a terminal: escaped)."),
    as_json: bool = json_option(
        "Print one JSON object (prompt, text, new_tokens, warnings) instead of streaming the text."),
    device: str = device_option(),
) -> None:
    """Generate text with a trained language model, token by token, with a key / value cache."""
    from ..training import CheckpointError, load_checkpoint
    from ..training import generate as run

    require_text(prompt)
    if top_p is not None and not 0 < top_p <= 1:
        usage_error(f"--top-p must be in (0, 1], got {top_p}")
    if sinks is not None and window is None:
        usage_error("--sinks needs --window: sinks are kept by the bounded cache, and without --window the cache keeps "
                    "every token")
    where = device_or_fail(device)
    warnings = []
    try:
        ck = load_checkpoint(checkpoint)
        context = ck.context
        length = len(prompt.encode("utf-8"))
        if context and window is None and length + max_new_tokens > context:
            warnings.append(f"the prompt ({length} bytes) and {max_new_tokens} new tokens run past the {context}-byte "
                            "context the model was trained on: expect the text to degrade there (--window W keeps a "
                            "bounded cache)")
        pieces = run(checkpoint, prompt, max_new_tokens=max_new_tokens, temperature=temperature, top_k=top_k,
                     top_p=top_p, seed=seed, cache=not no_cache, window=window, sinks=4 if sinks is None else sinks,
                     device=where)  # checks the checkpoint: errors first
        for w in warnings:
            err.print(f"[yellow]warning:[/] {w}", soft_wrap=True, highlight=False)
        if as_json:
            text = "".join(pieces)
            print_json({"prompt": prompt, "text": text, "new_tokens": len(text.encode("utf-8")), "warnings": warnings})
            return
        escape = not raw and sys.stdout.isatty()
        sys.stdout.write(printable(prompt) if escape else prompt)
        sys.stdout.flush()
        for piece in pieces:
            sys.stdout.write(printable(piece) if escape else piece)
            sys.stdout.flush()
        sys.stdout.write("\n")
    except (CheckpointError, ValueError) as e:
        fail(e)


def printable(text: str) -> str:
    """``text`` safe for a terminal: control and other non-printable characters (NUL, ESC, ...)
    as ``\\xNN`` / ``\\uNNNN`` escapes; newlines and tabs kept."""
    return "".join(c if c in "\n\t" or not unicodedata.category(c).startswith("C") else _escaped(c) for c in text)


def _escaped(c: str) -> str:
    n = ord(c)
    return f"\\x{n:02x}" if n < 0x100 else f"\\u{n:04x}" if n < 0x10000 else f"\\U{n:08x}"
