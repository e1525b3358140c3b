"""The table of attention variants, generated at every build from the registry.

A page writes

    ```{variant-table}
    ```

and gets one row per registered variant (:data:`attnlab.efficient.VARIANTS`, in the order of
registration): its declared capabilities (:class:`attnlab.layers.step.Capabilities`, in the
columns of ``attnlab list variants``), the first sentence of its docstring and the options it
takes beyond :class:`attnlab.MultiHeadAttention`'s. A
variant added later (its file in ``attnlab/efficient/``) is in the table at the next build:
nothing here names a variant.
"""

from __future__ import annotations

import re

from docutils.parsers.rst import Directive
from docutils.statemachine import StringList


def _cell(text: str) -> str:
    """Plain text as a table cell: Markdown's punctuation escaped (``*``, ``_``, ``|``, ...), one line."""
    return re.sub(r"([\\`*_\[\]<>~|])", r"\\\1", str(text)).replace("\n", " ")


def markdown() -> list[str]:
    """The table as Markdown lines, one row per registered variant."""
    from attnlab import MultiHeadAttention, efficient
    from attnlab.cli.listing import CAPABILITY_COLUMNS, list_rows
    from attnlab.registry import keyword_options

    common = set(keyword_options(MultiHeadAttention) or ())
    rows = list_rows("variants")
    columns = ["name", *CAPABILITY_COLUMNS, "what it is", "its own options"]
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for name in efficient.VARIANTS.in_order():
        row = rows[name]
        options = row["options"]
        own = "any" if options is None else ", ".join(f"`{o}`" for o in options if o not in common) or "those of `MultiHeadAttention`"
        cells = [*(show(row["capabilities"]) for show in CAPABILITY_COLUMNS.values()), row["summary"]]
        lines.append(f"| `{name}` | " + " | ".join(_cell(c) for c in cells) + f" | {own} |")
    return lines


class VariantTable(Directive):
    """``{variant-table}``: :func:`markdown`, parsed where the directive stands."""

    has_content = False

    def run(self):
        from docutils import nodes

        box = nodes.container(classes=["variant-table"])
        self.state.nested_parse(StringList(markdown(), source="attnlab.efficient.VARIANTS"), self.content_offset, box)
        return [box]


def setup(app):
    app.add_directive("variant-table", VariantTable)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
