"""The ``attnlab`` command: thin wrappers that parse arguments and call library functions.

One module per command group, over the helpers of :mod:`attnlab.cli.common`:

* :mod:`~attnlab.cli.explain` — ``explain``;
* :mod:`~attnlab.cli.pretrained` — ``attention``, ``view``, ``bench pretrained`` (pretrained models);
* :mod:`~attnlab.cli.bench_speed` — ``bench attention | scaling | graph | audio`` (time and memory),
  ``bench peak | precision`` (this machine's peak, float32 against bfloat16 training);
* :mod:`~attnlab.cli.bench_masks` — ``bench masks`` (masks as dense tensors, block-sparse, FlexAttention);
* :mod:`~attnlab.cli.decode` — ``bench decode`` (cached decoding, streaming), ``bench packing``;
* :mod:`~attnlab.cli.ring` — ``bench ring`` (sequence parallelism: memory and time per process count);
* :mod:`~attnlab.cli.bench_accuracy` — ``bench positional | approximation | distance``;
* :mod:`~attnlab.cli.bench_recall` — ``bench recall`` (associative recall against state size);
* :mod:`~attnlab.cli.device_check` — ``bench device`` (this device against the float64 reference, its speed, the
  arena's scores);
* :mod:`~attnlab.cli.complexity` — ``complexity``; :mod:`~attnlab.cli.plot` — ``plot positional``;
* :mod:`~attnlab.cli.arena` — ``arena``, ``report``; :mod:`~attnlab.cli.compare` — ``compare vit-cnn``;
* :mod:`~attnlab.cli.train` — ``train``, ``eval``, ``predict``; :mod:`~attnlab.cli.generate` — ``generate``;
* :mod:`~attnlab.cli.listing` — ``list`` (the names of tasks, variants, encodings, models, scores, normalisers);
* :mod:`~attnlab.cli.backends` — ``backends`` (which kernel computes each variant on this device, and why).

Library imports happen inside the commands, so that ``attnlab --help`` stays fast.
"""

from __future__ import annotations

import typer

from . import (
    arena,
    backends,
    bench_accuracy,
    bench_masks,
    bench_recall,
    bench_speed,
    compare,
    complexity,
    decode,
    device_check,
    explain,
    generate,
    listing,
    plot,
    pretrained,
    ring,
    train,
)
from .common import boundary, out
from .errors import OneLineErrors, set_debug
from .options import PanelledCommand

__all__ = ["app", "main"]

app = typer.Typer(
    name="attnlab",
    help="Self-attention over any vector set: explain it step by step, benchmark it, train it, and compare the "
         "variants (attnlab arena).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    cls=OneLineErrors,
    rich_markup_mode=None,  # click's plain help: option names never cut, one wrap, readable at 80 columns
)
bench_app = typer.Typer(help="Measure speed, memory and accuracy, side by side in one run.", no_args_is_help=True,
                        rich_markup_mode=None)
app.add_typer(bench_app, name="bench")
compare_app = typer.Typer(help="Train rival models on the same data and compare them.", no_args_is_help=True,
                          rich_markup_mode=None)
app.add_typer(compare_app, name="compare")
plot_app = typer.Typer(help="Draw attnlab's parts to PNG files.", no_args_is_help=True, rich_markup_mode=None)
app.add_typer(plot_app, name="plot")


def _version(value: bool) -> None:
    if value:
        from .. import __version__

        out.print(f"attnlab {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                 help="Print the version and exit."),
    debug: bool = typer.Option(False, "--debug", help="Show the traceback of an error (also ATTNLAB_DEBUG=1)."),
    threads: int | None = typer.Option(
        None, "--threads", min=1, metavar="N",
        help="torch threads of the command (default: one per core; on a shared machine 1 is often faster)."),
) -> None:
    """attnlab: self-attention over any vector set."""
    set_debug(debug)
    if threads is not None:
        import torch

        torch.set_num_threads(threads)


# every command, in the order of the help: (group, name, function); each behind the one error boundary
COMMANDS = [
    (app, "explain", explain.explain),
    (app, "attention", pretrained.attention),
    (app, "view", pretrained.view),
    (bench_app, "attention", bench_speed.attention),
    (bench_app, "positional", bench_accuracy.positional),
    (bench_app, "scaling", bench_speed.scaling),
    (bench_app, "peak", bench_speed.peak),
    (bench_app, "precision", bench_speed.precision),
    (bench_app, "masks", bench_masks.bench_masks),
    (bench_app, "approximation", bench_accuracy.approximation),
    (bench_app, "distance", bench_accuracy.distance),
    (bench_app, "recall", bench_recall.recall),
    (bench_app, "graph", bench_speed.graph),
    (bench_app, "audio", bench_speed.audio),
    (bench_app, "pretrained", pretrained.bench_pretrained),
    (bench_app, "decode", decode.bench_decode),
    (bench_app, "packing", decode.bench_packing),
    (bench_app, "ring", ring.bench_ring),
    (bench_app, "device", device_check.bench_device),
    (plot_app, "positional", plot.positional),
    (app, "complexity", complexity.complexity),
    (app, "arena", arena.arena),
    (app, "report", arena.report),
    (compare_app, "vit-cnn", compare.vit_cnn),
    (app, "train", train.train),
    (app, "eval", train.eval_cmd),
    (app, "predict", train.predict),
    (app, "generate", generate.generate),
    (app, "list", listing.list_names),
    (app, "backends", backends.backends),
]
for _group, _name, _command in COMMANDS:
    _group.command(_name, cls=PanelledCommand)(boundary(_command))  # options under their panels' headings


def main() -> None:
    """Entry point of the ``attnlab`` console script (a warning is one line: ``warning: ...``)."""
    import warnings

    warnings.formatwarning = lambda message, *_, **__: f"warning: {message}\n"
    app()
