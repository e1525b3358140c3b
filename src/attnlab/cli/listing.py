"""``attnlab list``: the names every option that takes one accepts, with a line on each."""

from __future__ import annotations

import re

import typer

from .common import fail, out, print_json
from .options import json_option
from .tables import table

__all__ = ["KINDS", "list_names"]

KINDS = {
    "tasks": "the tasks of 'attnlab train TASK' and the arena (--tasks)",
    "variants": "the attention variants of --attention and the arena's --variants",
    "encodings": "the positional encodings of --positional",
    "models": "the backbones of --model",
    "scores": "the score functions of 'attnlab explain --score'",
    "normalizers": "the normalisers of 'attnlab explain --normalize'",
}


def _registry(kind: str):
    if kind == "tasks":
        from ..tasks import TASKS

        return TASKS
    if kind == "variants":
        from ..efficient import VARIANTS

        return VARIANTS
    if kind == "encodings":
        from ..positional import ENCODINGS

        return ENCODINGS
    if kind == "models":
        from ..models.base import BACKBONES

        return BACKBONES
    if kind == "scores":
        from ..core.scores import SCORES

        return SCORES
    from ..core.normalize import NORMALIZERS

    return NORMALIZERS


def _summary(obj) -> str:
    """The first sentence of a registered object's docstring, whole: it ends at a full stop outside parentheses and code
    (``et al. 2020)`` and ``q . k`` go on) that a capital letter or the end follows; Sphinx roles read as their names."""
    doc = re.sub(r":\w+:`~?([^`]+)`", r"\1", getattr(obj, "__doc__", None) or "").strip()
    first = " ".join(doc.split("\n\n")[0].split())
    depth, code = 0, False
    for i, c in enumerate(first):
        if first.startswith("``", i):
            code = not code
        elif c in "([{" and not code:
            depth += 1
        elif c in ")]}" and not code:
            depth = max(depth - 1, 0)
        elif c == "." and not code and depth == 0 and i > 0 and first[i - 1] != " " and _sentence_ends(first[i + 1 :]):
            first = first[:i]
            break
    return first.replace("``", "").rstrip(".")


def _sentence_ends(rest: str) -> bool:
    """Does the text after a full stop start a new sentence (a space and a capital letter), or is there none?"""
    return rest == "" or (rest[0] == " " and rest[1:2].isupper())


def list_names(
    what: str = typer.Argument(..., metavar="WHAT", help=f"One of {', '.join(KINDS)}."),
    as_json: bool = json_option("Print one JSON object: {name: {summary, options}}."),
) -> None:
    """List the names an option accepts: tasks, variants, encodings, models, scores, normalizers."""
    if what not in KINDS:
        fail(f"unknown list {what!r}; choose one of {', '.join(KINDS)}")
    registry = _registry(what)
    rows = {n: {"summary": _summary(registry.get(n)), "options": registry.options(n)} for n in registry.names()}
    if as_json:
        print_json(rows)
        return
    t = table(f"{what}: {KINDS[what]}", ["name", "what it is", "options"], left=["name", "what it is", "options"])
    for name, row in rows.items():
        opts = row["options"]
        t.add_row(name, row["summary"], "any" if opts is None else ", ".join(opts))
    out.print(t)
