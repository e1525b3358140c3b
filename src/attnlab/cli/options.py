"""The typer options several ``attnlab`` commands take: one spelling of each flag and of its default."""

from __future__ import annotations

import functools
import inspect
import typing
from collections.abc import Callable

import typer

__all__ = [
    "blocks_option",
    "command",
    "device_option",
    "gathered",
    "option",
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


def json_option(help: str):
    """``--json``: print JSON instead of tables."""
    return typer.Option(False, "--json", help=help)


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


def heads_option(default: int | None, help: str = "Attention heads (they divide --embed-dim)."):
    """``--num-heads N``: attention heads (at least 1), the ``num_heads`` of :class:`attnlab.MultiHeadAttention`."""
    return typer.Option(default, "--num-heads", min=1, help=help)


def width_option(default: int | None, help: str = "Model width E."):
    """``--embed-dim N``: the model's width (at least 1), the ``embed_dim`` of :class:`attnlab.MultiHeadAttention`."""
    return typer.Option(default, "--embed-dim", min=1, help=help)


def blocks_option(default: int | None, help: str = "Blocks."):
    """``--num-layers N``: the model's blocks (at least 1)."""
    return typer.Option(default, "--num-layers", min=1, help=help)


def layer_types_option(default: str):
    """``--layers a,b``: the sequence layer types compared (names of :mod:`attnlab.recurrent`; not a count)."""
    return typer.Option(default, help="Comma-separated layer types.")


def precision_option(default: str | None):
    """``--precision fp32|bf16|auto``: the arithmetic of training and evaluation (:mod:`attnlab.training.precision`)."""
    return typer.Option(default, metavar="fp32|bf16|auto",
                        help="Matrix products in float32, in bfloat16 (mixed precision: float32 weights and loss), or auto: bf16 where "
                             "the device does it natively (AVX-512 BF16 / AMX CPUs, CUDA). Default: fp32 (the arena: each task's own); "
                             "'attnlab bench precision' measures what bf16 gains here, variant by variant.")


def device_option(default: str | None = "auto", help: str | None = None):
    """``--device auto|cpu|cuda[:i]|mps``: where the model and the data live (:func:`attnlab.devices.resolve`);
    ``help`` replaces the option's help (a command that runs on the CPU only says so)."""
    return typer.Option(default, "--device", metavar="auto|cpu|cuda[:i]|mps",
                        help=help or "Where to run: auto (CUDA where present, else the CPU), cpu, cuda, cuda:i or mps.")


def option(name: str, annotation, default) -> inspect.Parameter:
    """The keyword parameter ``name`` of a command whose signature :func:`command` writes."""
    return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=annotation)


def command(run: Callable, like: Callable, params: list[inspect.Parameter]) -> Callable:
    """``run`` (which takes keyword arguments) as the typer command of ``like`` with the parameters
    ``params`` (``like``'s own, resolved, and any others made with :func:`option`): what typer reads."""
    functools.update_wrapper(run, like)
    hints = typing.get_type_hints(like)
    params = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY, annotation=hints.get(p.name, p.annotation)) for p in params]
    run.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    run.__annotations__ = {p.name: p.annotation for p in params}
    del run.__wrapped__  # type: ignore[attr-defined]  # typer reads the signature above
    return run


def gathered(options: list[inspect.Parameter], into: str):
    """A command whose options ``options`` (made with :func:`option`) reach it as one dict, its
    parameter ``into``: a long list of settings declared once, away from the function's body."""
    def decorate(fn: Callable):
        def run(**given):
            settings = {p.name: given.pop(p.name) for p in options}
            return fn(**given, **{into: settings})

        own = [p for name, p in inspect.signature(fn).parameters.items() if name != into]
        arguments = [p for p in own if isinstance(p.default, typer.models.ArgumentInfo)]  # the positional ones first, as typer shows them
        return command(run, fn, arguments + options + [p for p in own if p not in arguments])

    return decorate
