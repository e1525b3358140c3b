"""The command line's tables: results tables, labelled matrices, and how their entries are written."""

from __future__ import annotations

from collections.abc import Collection

from rich import box
from rich.table import Table

__all__ = ["fmt", "fmt_x", "matrix", "on_device", "table"]


def on_device(device) -> str:
    """Where a table's numbers were measured, for its title: nothing on the CPU, else
    `` on cuda (NVIDIA H100 80GB HBM3)`` (:func:`attnlab.devices.in_words`)."""
    from ..devices import in_words

    where = in_words(device)
    return "" if where == "cpu" else f" on {where}"


def fmt(x) -> str:
    """A matrix entry: three decimals, ``·`` for a masked (None) one."""
    return "·" if x is None else f"{x:.3f}"


def fmt_x(x) -> str:
    """A ratio: ``1.23x``, ``-`` when unknown."""
    return "-" if x is None else f"{x:.2f}x"


def matrix(title: str, rows: list, row_labels: list[str], col_labels: list[str]) -> Table:
    """A labelled matrix as a table (entries by :func:`fmt`)."""
    t = Table(title=title, title_justify="left", show_edge=False, pad_edge=False)
    t.add_column("", style="bold")
    for c in col_labels:
        t.add_column(c, justify="right")
    for label, row in zip(row_labels, rows):
        t.add_row(label, *(fmt(x) for x in row))
    return t


def table(title: str | None, columns: list[str], left: Collection[str] | None = None, **column_options) -> Table:
    """A results table (simple heading rule): ``columns`` right-aligned but those in ``left`` (default the first).

    ``column_options`` go to every column (e.g. ``no_wrap=True``).
    """
    left = columns[:1] if left is None else left
    t = Table(title=title, box=box.SIMPLE_HEAD)
    for col in columns:
        t.add_column(col, justify="left" if col in left else "right", **column_options)
    return t
