"""``attnlab list``: the names every option that takes one accepts, with a line on each."""

from __future__ import annotations

import re

import typer

from .common import out, print_json
from .errors import fail
from .options import choices, json_option, plain
from .tables import table

__all__ = ["CAPABILITY_COLUMNS", "KINDS", "Kind", "list_names", "list_rows", "option_rows", "variants_table"]

KINDS = {
    "tasks": "the tasks of 'attnlab train TASK' and the arena (--tasks)",
    "variants": "the attention variants of --attention and the arena's --variants",
    "encodings": "the positional encodings of --positional",
    "models": "the backbones of --model",
    "scores": "the score functions of 'attnlab explain --score'",
    "normalizers": "the normalisers of 'attnlab explain --normalize'",
}

Kind = choices("Kind", KINDS, "``list WHAT``: one of :data:`KINDS`.")


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


_POINTER = re.compile(r"\s*[(;,]?\s*see\s+the\s+module(?:'s)?\s+docstring\)?", re.IGNORECASE)
"""A docstring's pointer to its module's docstring, which a command-line user cannot read: left out of a summary."""


def _summary(obj) -> str:
    """The first sentence of a registered object's docstring, whole: it ends at a full stop outside parentheses and
    code (``et al. 2020)`` and ``q . k`` go on) that a capital letter or the end follows; Sphinx roles read as their
    names, and a pointer to the module's docstring ("(see the module docstring)") is left out."""
    doc = re.sub(r":\w+:`~?([^`]+)`", r"\1", getattr(obj, "__doc__", None) or "").strip()
    doc = _POINTER.sub("", doc)
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


def list_rows(what: str) -> dict[str, dict]:
    """The rows of ``attnlab list WHAT`` (one of :data:`KINDS`), by name, sorted: ``{summary, options}``
    (the first sentence of the docstring; the keyword options, None for any), and for variants
    their declared ``capabilities`` too (:meth:`attnlab.layers.step.Capabilities.describe`)."""
    registry = _registry(what)
    rows = {n: {"summary": _summary(registry.get(n)), "options": registry.options(n)} for n in registry.names()}
    if what == "variants":
        from ..efficient import capabilities

        for n, row in rows.items():
            row["capabilities"] = capabilities(n).describe()
    return rows


def option_rows(what: str, name: str) -> dict[str, dict]:
    """The options of one entry of ``attnlab list WHAT`` (``attnlab list WHAT NAME``), in the order
    its signature takes them: ``{option: {default, help}}`` (``default``: its value, None when it has
    none; a class's attribute ``default_<option>`` where the signature's is None, "the class's own";
    ``help``: what the docstring's ``Args:`` says of it, :func:`attnlab.registry.option_docs`)."""
    import inspect

    from ..registry import option_docs

    registry = _registry(what)
    obj = registry.get(name)
    docs = option_docs(obj)
    params: dict[str, inspect.Parameter] = {}
    for src in ([c for c in obj.__mro__ if "__init__" in vars(c) and c is not object] if isinstance(obj, type)
                else [obj]):
        fn = src.__init__ if isinstance(src, type) else src
        for p in inspect.signature(fn).parameters.values():
            if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.name != "self":
                params.setdefault(p.name, p)
    known = registry.options(name)
    def default(o: str, p: inspect.Parameter):
        given = None if p.default is p.empty else p.default
        return getattr(obj, f"default_{o}", None) if given is None and isinstance(obj, type) else given

    return {o: {"default": default(o, p), "help": docs.get(o, "")} for o, p in params.items()
            if known is None or o in known}


def list_names(
    what: Kind = typer.Argument(..., metavar="WHAT", help="What to list."),
    name: str | None = typer.Argument(
        None, metavar="[NAME]", help="One of them: its options, their defaults and what each is."),
    as_json: bool = json_option("Print one JSON object: each name's summary and options (with NAME: its options)."),
) -> None:
    """List the names an option accepts (tasks, variants, encodings, models, scores, normalizers), or one name's
    options."""
    what = plain(what)
    if name is not None:
        try:
            options = option_rows(what, name)
        except ValueError as e:
            fail(e)
        if as_json:
            print_json(options)
            return
        t = table(f"{name}: {_summary(_registry(what).get(name))}", ["option", "default", "what it is"],
                  left=["option", "default", "what it is"])
        for o, row in options.items():
            # Sphinx roles read as their names
            helped = re.sub(r":\w+:`~?([^`]+)`", r"\1", row["help"]).replace("``", "")
            t.add_row(o, "-" if row["default"] is None else str(row["default"]), helped or "-")
        out.print(t)
        return
    rows = list_rows(what)
    if as_json:
        print_json(rows)
        return
    if what == "variants":
        out.print(variants_table(rows))
        return
    t = table(f"{what}: {KINDS[what]}", ["name", "what it is", "options"], left=["name", "what it is", "options"])
    t.caption = f"'attnlab list {what} NAME': one's options, their defaults and what each is"
    for name, row in rows.items():
        opts = row["options"]
        t.add_row(name, row["summary"], "any" if opts is None else ", ".join(opts))
    out.print(t)


CAPABILITY_COLUMNS = {
    "family": lambda c: c["family"] + (" (ref.)" if c["reference"] else ""),
    "causal": lambda c: c["causal"] or "-",
    "masks": lambda c: {"any": "any", "key_padding": "padding"}[c["masks"]],
    "scores": lambda c: _yes(c["forms_scores"]),
    "cache": lambda c: c["cache"] or "-",
    "exact": lambda c: _yes(c["exact"]),
    "mixer": lambda c: _yes(c["mixer"]),
}
"""The columns of ``attnlab list variants``: each variant's declared capabilities
(:class:`attnlab.layers.step.Capabilities`), shortly: its family (``ref.``: a slow reference of
another variant, left out of the grids); its causal form (``mask``: a causal mask, which the
step's option ``causal=True`` adds; ``option``: the step's option ``causal=True``, its method
changed; ``-``: none); the masks it takes (any, or key padding and packed documents); whether
it forms the scores (a score bias, score functions, the weights); what it decodes with (``-``: no
cached decoding); whether it is exact; whether it is a sequence mixer (a layer owning its projections)."""


def _yes(flag: bool) -> str:
    return "yes" if flag else "-"


def variants_table(rows: dict[str, dict]):
    """The table of ``attnlab list variants``: per variant its :data:`CAPABILITY_COLUMNS` and what it
    is (``rows``: the ``--json`` rows, with their ``capabilities``; their options are left to ``--json``)."""
    columns = ["name", *CAPABILITY_COLUMNS, "what it is"]
    t = table(f"variants: {KINDS['variants']}", columns, left=columns)
    for col in t.columns[:-1]:  # the short columns whole, the summary wraps in what is left
        col.no_wrap = True
    t.caption = "causal: by a causal mask (which causal=True adds), by the option causal=True, or none (-); " \
                "masks: any, or key padding and packed documents; " \
                "scores: it forms them (score bias, score functions, weights); " \
                "mixer: a sequence mixer (a layer owning its projections, gates and norm); " \
                "each variant's options: --json"
    for name, row in rows.items():
        t.add_row(name, *(show(row["capabilities"]) for show in CAPABILITY_COLUMNS.values()), row["summary"])
    return t
