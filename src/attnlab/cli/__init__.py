"""The ``attnlab`` command: thin wrappers that parse arguments and call library functions.

One module per command group, over the helpers of :mod:`attnlab.cli.common`:

* :mod:`~attnlab.cli.explain` — ``explain``;
* :mod:`~attnlab.cli.pretrained` — ``attention``, ``view``, ``bench pretrained`` (pretrained models);
* :mod:`~attnlab.cli.bench_speed` — ``bench attention | scaling | graph | audio`` (time and memory);
* :mod:`~attnlab.cli.decode` — ``bench decode`` (cached decoding, streaming), ``bench packing``;
* :mod:`~attnlab.cli.ring` — ``bench ring`` (sequence parallelism: memory and time per process count);
* :mod:`~attnlab.cli.bench_accuracy` — ``bench positional | approximation | distance``;
* :mod:`~attnlab.cli.complexity` — ``complexity``; :mod:`~attnlab.cli.plot` — ``plot positional``;
* :mod:`~attnlab.cli.arena` — ``arena``, ``report``; :mod:`~attnlab.cli.compare` — ``compare vit-cnn``;
* :mod:`~attnlab.cli.train` — ``train``, ``eval``, ``predict``; :mod:`~attnlab.cli.generate` — ``generate``.

Library imports happen inside the commands, so that ``attnlab --help`` stays fast.
"""

from __future__ import annotations

import typer

from . import arena, bench_accuracy, bench_speed, compare, complexity, decode, explain, generate, plot, pretrained, ring, train
from .common import boundary, out, set_debug

__all__ = ["app", "main"]

app = typer.Typer(
    name="attnlab",
    help="Self-attention over any vector set: explain it step by step, benchmark it, train it, and compare the variants (attnlab arena).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
bench_app = typer.Typer(help="Measure speed, memory and accuracy, side by side in one run.", no_args_is_help=True)
app.add_typer(bench_app, name="bench")
compare_app = typer.Typer(help="Train rival models on the same data and compare them.", no_args_is_help=True)
app.add_typer(compare_app, name="compare")
plot_app = typer.Typer(help="Draw attnlab's parts to PNG files.", no_args_is_help=True)
app.add_typer(plot_app, name="plot")


def _version(value: bool) -> None:
    if value:
        from .. import __version__

        out.print(f"attnlab {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version and exit."),
    debug: bool = typer.Option(False, "--debug", help="Show the traceback of an error (also ATTNLAB_DEBUG=1)."),
) -> None:
    """attnlab: self-attention over any vector set."""
    set_debug(debug)


# every command, in the order of the help; each behind the one error boundary
app.command()(boundary(explain.explain))
app.command()(boundary(pretrained.attention))
app.command()(boundary(pretrained.view))
bench_app.command("attention")(boundary(bench_speed.attention))
bench_app.command("positional")(boundary(bench_accuracy.positional))
bench_app.command("scaling")(boundary(bench_speed.scaling))
bench_app.command("approximation")(boundary(bench_accuracy.approximation))
bench_app.command("distance")(boundary(bench_accuracy.distance))
bench_app.command("graph")(boundary(bench_speed.graph))
bench_app.command("audio")(boundary(bench_speed.audio))
bench_app.command("pretrained")(boundary(pretrained.bench_pretrained))
bench_app.command("decode")(boundary(decode.bench_decode))
bench_app.command("packing")(boundary(decode.bench_packing))
bench_app.command("ring")(boundary(ring.bench_ring))
plot_app.command("positional")(boundary(plot.positional))
app.command()(boundary(complexity.complexity))
app.command()(boundary(arena.arena))
app.command()(boundary(arena.report))
compare_app.command("vit-cnn")(boundary(compare.vit_cnn))
app.command()(boundary(train.train))
app.command("eval")(boundary(train.eval_cmd))
app.command()(boundary(train.predict))
app.command()(boundary(generate.generate))


def main() -> None:
    """Entry point of the ``attnlab`` console script."""
    app()
