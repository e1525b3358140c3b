"""A measured command: the options and the flow every ``attnlab bench`` command with a saved
report shares, written once (:func:`measured`).

``--json`` prints the JSON instead of tables, ``-o FILE`` also writes it (after every record,
through the command's :func:`~attnlab.cli.common.track`), ``--plot PNG`` draws it, ``--from
FILE`` measures nothing and reports what an earlier ``-o`` wrote."""

from __future__ import annotations

import inspect
import typing
from collections.abc import Callable

from .common import chart, emit_json, load_report
from .options import command, from_option, json_option, option, output_option, plot_option

__all__ = ["measured"]


def measured(command_name: str, *, draw: str, show: Callable[[dict], None], what: str = "the records",
             plot_help: str, checked: Callable[[dict], dict] = lambda data: data,
             drawn: Callable[[dict], object] = lambda data: data):
    """Make ``measure(**options, output) -> data`` a command: its own options, then ``--json``,
    ``-o``, ``--plot`` and ``--from``; it measures (or reads ``--from``, checked by ``checked``),
    draws ``data`` with ``attnlab.viz.<draw>``, then prints it as JSON or with ``show``.

    Args:
        command_name: its name in messages (``"bench masks"``).
        draw: the drawing function under :mod:`attnlab.viz` (``"masks.plot_masks"``).
        show: prints ``data`` as tables.
        what: what the JSON holds, for ``--json``'s help.
        plot_help: ``--plot``'s help (what is drawn).
        checked: ``--from``: the JSON read, or a ``KeyError`` where it is not what ``-o`` wrote.
        drawn: what of ``data`` the drawing takes (default all of it).
    """
    def decorate(measure: Callable[..., dict]):
        def run(*, as_json: bool, output: str | None, plot: str | None, report: str | None, **options) -> None:
            data = load_report(report, command_name, checked) if report else measure(output=output, **options)
            chart(plot, draw, drawn(data))
            if not emit_json(data, as_json, None if report else output):
                show(data)

        own = [p for name, p in inspect.signature(measure).parameters.items() if name != "output"]
        text = typing.Optional[str]  # noqa: UP045 - typer reads the annotation object
        return command(run, measure, [
            *own, option("as_json", bool, json_option(f"Print {what} as JSON instead of tables.")),
            option("output", text, output_option("Also write the JSON to this file (after every record).")),
            option("plot", text, plot_option(plot_help)),
            option("report", text, from_option("Measure nothing: print (and --plot) the JSON written by -o."))])

    return decorate
