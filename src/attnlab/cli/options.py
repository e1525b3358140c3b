"""The typer options several ``attnlab`` commands take: one spelling of each flag and of its default."""

from __future__ import annotations

import functools
import inspect
import typing
from collections.abc import Callable, Iterable
from enum import Enum, StrEnum

import typer
from typer.core import TyperCommand

from ..training.precision import PRECISIONS

__all__ = [
    "PanelledCommand",
    "Precision",
    "blocks_option",
    "choices",
    "command",
    "device_option",
    "gathered",
    "one_of",
    "option",
    "plain",
    "from_option",
    "heads_option",
    "json_option",
    "layer_types_option",
    "memory_option",
    "output_option",
    "plot_option",
    "precision_option",
    "repeats_option",
    "width_option",
]


def json_option(help: str, panel: str | None = None):
    """``--json``: print JSON instead of tables."""
    return typer.Option(False, "--json", help=help, rich_help_panel=panel)


def output_option(help: str):
    """``-o/--output FILE``: also write the JSON there."""
    return typer.Option(None, "-o", "--output", help=help)


def plot_option(help: str):
    """``--plot PNG``: also draw a chart there."""
    return typer.Option(None, "--plot", help=help)


def from_option(help: str):
    """``--from FILE``: measure nothing, report the JSON an earlier ``-o`` wrote."""
    return typer.Option(None, "--from", help=help)


def repeats_option(help: str = "Timed repetitions at least."):
    """``--repeats N``: timed repetitions (at least 1, default 3)."""
    return typer.Option(3, min=1, help=help)


def memory_option(help: str = "Measure peak memory (profiler)."):
    """``--memory/--no-memory``: measure peak memory too (default on)."""
    return typer.Option(True, "--memory/--no-memory", help=help)


def heads_option(default: int | None, help: str = "Attention heads (they divide --embed-dim).",
                 panel: str | None = None):
    """``--num-heads N``: attention heads (at least 1), the ``num_heads`` of :class:`attnlab.MultiHeadAttention`."""
    return typer.Option(default, "--num-heads", min=1, help=help, rich_help_panel=panel)


def width_option(default: int | None, help: str = "Model width E.", panel: str | None = None):
    """``--embed-dim N``: the model's width (at least 1), the ``embed_dim`` of :class:`attnlab.MultiHeadAttention`."""
    return typer.Option(default, "--embed-dim", min=1, help=help, rich_help_panel=panel)


def blocks_option(default: int | None, help: str = "Blocks.", panel: str | None = None):
    """``--num-layers N``: the model's blocks (at least 1)."""
    return typer.Option(default, "--num-layers", min=1, help=help, rich_help_panel=panel)


def layer_types_option(default: str):
    """``--layers a,b``: the sequence layer types compared (names of :mod:`attnlab.recurrent`; not a count)."""
    return typer.Option(default, help="Comma-separated layer types.")


def choices(name: str, values: Iterable[str], doc: str) -> type[StrEnum]:
    """An option's fixed set of ``values`` as a ``str``-valued enum named ``name``, documented by ``doc``:
    typer takes one of them (a bad value is click's usage error, exit code 2) and ``--help`` lists them.
    The command passes the library the member's ``.value`` (:func:`plain`)."""
    enum = StrEnum(name, [(v, v) for v in values])  # type: ignore[misc]
    enum.__doc__ = doc
    return enum


Precision = choices("Precision", PRECISIONS, "``--precision``: fp32, bf16 or auto (:mod:`attnlab.training.precision`).")


def precision_option(default: Precision | None, panel: str | None = None):
    """``--precision fp32|bf16|auto``: the arithmetic of training and evaluation (:mod:`attnlab.training.precision`)."""
    return typer.Option(default, rich_help_panel=panel,
                        help="Matrix products in float32, bfloat16 (mixed precision), or auto: bf16 where native.")


def device_option(default: str | None = "auto", help: str | None = None, panel: str | None = None):
    """``--device auto|cpu|cuda[:i]|mps``: where the model and the data live (:func:`attnlab.devices.resolve`);
    ``help`` replaces the option's help (a command that runs on the CPU only says so). Not a choice:
    ``cuda:i`` takes any index."""
    return typer.Option(default, "--device", metavar="auto|cpu|cuda[:i]|mps",
                        help=help or "Where to run: auto (CUDA where present, else the CPU), cpu, cuda, cuda:i or mps.",
                        rich_help_panel=panel)


def one_of(names: Iterable[str]):
    """The annotation of an option that takes one of ``names``: ``Literal[...]``, which typer checks
    (a bad value is click's usage error, exit code 2, listing the names) and ``--help`` shows.

    A registry's names are read when the command line is built (``import attnlab.cli``): the
    package has registered its own then; a name registered later from Python is not offered.
    """
    return typing.Literal[tuple(names)]  # type: ignore[valid-type]


def plain(value):
    """An option's value as the library takes it: an :class:`~enum.Enum` choice's ``.value``, anything else as is."""
    return value.value if isinstance(value, Enum) else value


class PanelledCommand(TyperCommand):
    """A command whose plain ``--help`` lists its options under headings, by each option's
    ``rich_help_panel`` (typer draws panels in its rich help only; attnlab's is click's plain text):
    the arguments, then each panel in the order of its first option, then ``Options`` (the options
    without a panel, ``--help`` among them)."""

    def format_options(self, ctx, formatter) -> None:
        """Write the Arguments section and one section per panel."""
        arguments, panels = [], {}
        for param in self.get_params(ctx):
            record = param.get_help_record(ctx)
            if record is None:
                continue
            if param.param_type_name == "argument":
                arguments.append(record)
            else:
                panels.setdefault(getattr(param, "rich_help_panel", None) or "", []).append(record)
        panels["Options"] = panels.pop("", [])
        for title, records in [("Arguments", arguments), *panels.items()]:
            if records:
                with formatter.section(title):
                    formatter.write_dl(records)


def option(name: str, annotation, default) -> inspect.Parameter:
    """The keyword parameter ``name`` of a command whose signature :func:`command` writes."""
    return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=annotation)


def command(run: Callable, like: Callable, params: list[inspect.Parameter]) -> Callable:
    """``run`` (which takes keyword arguments) as the typer command of ``like`` with the parameters
    ``params`` (``like``'s own, resolved, and any others made with :func:`option`): what typer reads."""
    functools.update_wrapper(run, like)
    hints = typing.get_type_hints(like)
    params = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY, annotation=hints.get(p.name, p.annotation))
              for p in params]
    run.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    run.__annotations__ = {p.name: p.annotation for p in params}
    del run.__wrapped__  # type: ignore[attr-defined]  # typer reads the signature above
    return run


def gathered(options: list[inspect.Parameter], into: str):
    """A command whose options ``options`` (made with :func:`option`) reach it as one dict, its
    parameter ``into`` (an :class:`~enum.Enum` choice as its value): a long list of settings
    declared once, away from the function's body."""
    def decorate(fn: Callable):
        def run(**given):
            settings = {p.name: plain(given.pop(p.name)) for p in options}  # a choice's value, as the library takes it
            return fn(**given, **{into: settings})

        own = [p for name, p in inspect.signature(fn).parameters.items() if name != into]
        # the positional ones first, as typer shows them
        arguments = [p for p in own if isinstance(p.default, typer.models.ArgumentInfo)]
        return command(run, fn, arguments + options + [p for p in own if p not in arguments])

    return decorate
