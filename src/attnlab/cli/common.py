"""What every ``attnlab`` command shares: the error boundary, list options, progress bars, JSON files, charts."""

from __future__ import annotations

import functools
import importlib
import json
import os
import sys
import tempfile
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path

import typer
from rich.console import Console

from .errors import debugging, fail, usage_error, user_errors

__all__ = [
    "Tracker",
    "boundary",
    "chart",
    "emit_json",
    "int_list",
    "json_stdout",
    "jsonable",
    "load_report",
    "name_list",
    "output_folder",
    "print_json",
    "progress",
    "records_json",
    "refuse_overwrite",
    "require_text",
    "settings_dict",
    "split_list",
    "track",
    "write_json",
    "write_text",
]

# a log file or pipe gets wide tables; a terminal gets its own width
out = Console(width=None if sys.stdout.isatty() else 120)
err = Console(stderr=True)


def boundary(command: Callable) -> Callable:
    """Wrap a command so that a user error ends as one line on stderr, not a traceback, with click's
    exit code: 2 for a bad value, 1 for a failure at run time (:mod:`attnlab.cli.errors`).

    The errors are those of :func:`~attnlab.cli.errors.user_errors`; anything else (a bug) still
    shows its traceback, and ``attnlab --debug`` or ``ATTNLAB_DEBUG=1`` shows it for user errors
    too. The wrapper keeps the command's signature, so typer reads the same options.
    """

    @functools.wraps(command)
    def guarded(*args, **kwargs):
        try:
            with json_stdout(bool(kwargs.get("as_json"))):
                return command(*args, **kwargs)
        except BrokenPipeError:  # the reader went away (`... | head`): stop quietly, as a pipeline's writer should
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.__stdout__.fileno())  # the interpreter's final flush must not fail again
            raise typer.Exit(1) from None
        except Exception as e:
            if debugging() or not isinstance(e, user_errors()):
                raise
            import torch

            if isinstance(e, (MemoryError, torch.OutOfMemoryError)):  # the CPU's, or torch's on a GPU
                fail(f"out of memory ({str(e) or type(e).__name__}); try smaller sizes")
            fail(e)

    return guarded


# ---------------------------------------------------------------- --json: nothing but JSON on stdout

_JSON_OUT = None  # the real standard output while a --json command runs


@contextmanager
def json_stdout(active: bool) -> Iterator[None]:
    """While a ``--json`` command runs, everything it or a library prints goes to stderr and only
    :func:`print_json` reaches the real stdout: ``sys.stdout`` points at stderr, and so does file
    descriptor 1 when it is the process's own stdout (progress bars written by native code, such
    as the tokenizers library's)."""
    global _JSON_OUT
    if not active or _JSON_OUT is not None:
        yield
        return
    real = sys.stdout
    real.flush()
    saved = None
    if real is sys.__stdout__ and real is not None:
        try:
            fd = real.fileno()
        except (OSError, ValueError):  # not a real file
            fd = None
        if fd is not None:
            saved = os.dup(fd)
            os.dup2(sys.__stderr__.fileno(), fd)
    _JSON_OUT = os.fdopen(saved, "w", closefd=False) if saved is not None else real
    sys.stdout = sys.stderr
    try:
        yield
    finally:
        sys.stdout = real
        _JSON_OUT.flush()
        if saved is not None:
            os.dup2(saved, fd)
            os.close(saved)
        _JSON_OUT = None


def print_json(data) -> None:
    """Print ``data`` as one line of JSON on the real stdout (the only thing there under ``--json``)."""
    stream = _JSON_OUT if _JSON_OUT is not None else sys.stdout
    stream.write(json.dumps(data) + "\n")
    stream.flush()


def require_text(text: str) -> str:
    """The one refusal of empty text, the same for every command that reads some (explain,
    attention, view, generate): a usage error when ``text`` holds nothing but whitespace."""
    if not text.strip():
        usage_error('the text is empty: give some words, e.g. "I saw a saw"')
    return text


# ---------------------------------------------------------------- comma-separated options


def split_list(text: str) -> list[str]:
    """``"a, b,,c"`` -> ``["a", "b", "c"]``: the stripped, non-empty items of a comma-separated option."""
    return [x.strip() for x in text.split(",") if x.strip()]


def int_list(option: str, text: str, minimum: int = 0, what: str | None = None) -> list[int]:
    """A comma-separated option of integers, each at least ``minimum``; else a one-line error naming ``option``.

    ``what`` describes the allowed values in the error (default ``integers >= minimum``).
    """
    try:
        values = [int(x) for x in split_list(text)]
    except ValueError:
        usage_error(f"{option} must be comma-separated integers, got {text!r}")
    if not values or min(values) < minimum:
        usage_error(f"{option} must be {what or f'integers >= {minimum}'}, got {text!r}")
    return values


def name_list(option: str, text: str, known: Collection[str], hint: str | None = None,
              required: bool = True) -> list[str]:
    """A comma-separated option of names, each one of ``known``; else a one-line error naming ``option``.

    ``hint`` ends the error (default ``expected some of`` the known names); ``required``: no names is an error too.
    """
    names = split_list(text)
    bad = [n for n in names if n not in known]
    if bad or (required and not names):
        usage_error(f"unknown {option} {bad}; {hint or 'expected some of ' + ', '.join(known)}")
    return names


# ---------------------------------------------------------------- progress


def progress():
    """A progress bar on stderr (description, bar, done/total, elapsed, remaining), gone when done;
    drawn only where stderr is a terminal (a log file gets the plain lines of :class:`Tracker`)."""
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    return Progress(
        TextColumn("[progress.description]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=err,
        transient=True,
        disable=not err.is_terminal,
    )


class Tracker:
    """One progress bar and the records a study reports, rewritten to ``output`` after each one.

    Its :meth:`on_record` and :meth:`on_step` make the callbacks a study's ``run`` takes.

    Args:
        bar: the rich :class:`~rich.progress.Progress`; task: its task id.
        output: the JSON file to keep up to date (None: none).
        payload: ``records -> JSON data`` written there (default: the records themselves).
    """

    def __init__(self, bar, task, output: str | None = None, payload: Callable[[list], object] | None = None):
        self.bar, self.task, self.output = bar, task, output
        self.records: list = []
        self.payload = payload or (lambda records: records)

    def update(self, advance: int = 0, description: str | None = None) -> None:
        """Move the bar on by ``advance`` and (if given) show ``description``; where stderr is not a
        terminal (no bar), print ``[done/total] description`` as a plain line instead."""
        extra = {} if description is None else {"description": description}
        self.bar.update(self.task, advance=advance, **extra)
        if self.bar.disable and description is not None:
            task = next(t for t in self.bar.tasks if t.id == self.task)
            of = "" if task.total is None else f"/{task.total:g}"
            err.print(f"[{task.completed:g}{of}] {description}", highlight=False, markup=False, soft_wrap=True)

    def save(self) -> None:
        """Rewrite the output file (atomically: an interrupted run keeps what it measured)."""
        if self.output:
            write_json(self.output, self.payload(self.records))

    def on_record(
        self, describe: Callable | None = None, advance: int | Callable = 1, into: list | None = None
    ) -> Callable[[object], None]:
        """A callback for one finished record: keep it (in ``into``, default :attr:`records`), move the bar, save.

        ``describe(record)``: the bar's new description; ``advance``: a number, or ``record -> number``.
        """
        kept = self.records if into is None else into

        def callback(rec) -> None:
            self.update(advance(rec) if callable(advance) else advance, None if describe is None else describe(rec))
            kept.append(rec)
            self.save()

        return callback

    def on_step(self, describe: Callable[..., str], advance: int = 1) -> Callable[..., None]:
        """A callback for one training step: move the bar by ``advance`` and show ``describe(*args)``."""
        return lambda *args: self.update(advance, describe(*args))


@contextmanager
def track(description: str, total: int | None, output: str | None = None,
          payload: Callable | None = None) -> Iterator[Tracker]:
    """A :func:`progress` bar of ``total`` steps, as a :class:`Tracker` that writes ``output``."""
    with progress() as bar:
        yield Tracker(bar, bar.add_task(description, total=total), output, payload)


# ---------------------------------------------------------------- files


def refuse_overwrite(option: str, path: str | None, force: bool) -> None:
    """The rule of ``predict -o`` and ``view -o`` for a file the user names: an existing file there is
    replaced only with ``--force`` (else a one-line error naming ``option`` and the path, exit code 1:
    a file in the way). A folder there is left to the write, which names it."""
    if path and os.path.exists(path) and not os.path.isdir(path) and not force:
        fail(f"{option} {path} exists; add --force to replace it, or choose another file")


def output_folder(option: str, path: str) -> None:
    """A one-line error (exit code 1: a file in the way) unless ``path`` can be a folder: it is one, or
    nothing is there yet (nor at any folder above it that exists only as a file)."""
    for where in (Path(path), *Path(path).parents):
        if where.exists():
            if where.is_dir():
                return
            fail(f"{option} {path} is a file; it must be a folder: choose another {option}" if where == Path(path) else
                 f"{option} {path} must be a folder, but {where} is a file: choose another {option}")


def write_json(path: str, data) -> None:
    """Write JSON atomically: a temporary file beside the target, then a rename."""
    write_text(path, json.dumps(data, indent=1))


def write_text(path: str, text: str) -> None:
    """Write a text file atomically (a temporary file beside the target, then a rename), with the
    permissions of any file the user creates (their umask)."""
    from ..training.checkpoint import umask_mode

    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", dir=target.parent, suffix=".tmp", delete=False) as f:
        f.write(text)
    os.chmod(f.name, umask_mode())  # a temporary file is private; the result is an ordinary file
    os.replace(f.name, target)


def emit_json(data, as_json: bool, output: str | None = None) -> bool:
    """``-o``: write ``data`` to ``output``; ``--json``: print it (one line, :func:`print_json`). True if printed."""
    if output:
        write_json(output, data)
    if as_json:
        print_json(data)
    return as_json


def records_json(records: list) -> dict:
    """The JSON of a records file: ``{"records": [record.to_dict(), ...]}``."""
    return {"records": [r.to_dict() for r in records]}


def load_report(path: str, command: str, extract: Callable = lambda data: data):
    """``--from``: ``extract(the JSON in path)``, or a one-line error (exit code 1) if it is not what
    ``attnlab command -o`` wrote."""
    try:
        return extract(json.loads(Path(path).read_text()))
    except (OSError, ValueError, KeyError, TypeError, IndexError) as e:
        fail(f"--from {path}: not a records file written by 'attnlab {command} -o' ({e})")


def jsonable(summary: list[dict]) -> list[dict]:
    """Summary rows with string keys (JSON object keys), as they come back from a file."""
    conv = ("accuracy", "accuracy_min", "accuracy_max", "errors")
    return [{k: ({str(n): x for n, x in v.items()} if k in conv else v) for k, v in row.items()} for row in summary]


def settings_dict(settings) -> dict:
    """A settings dataclass as JSON: tuples become lists."""
    return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(settings).items()}


def chart(path: str | None, draw: str, data, **options) -> None:
    """``--plot PATH``: draw ``data`` with ``attnlab.viz.<draw>`` (e.g. ``"bench.plot_scaling"``) and say where.

    The drawing module is imported only then: matplotlib is slow to import.
    """
    if path:
        module, _, name = draw.rpartition(".")
        plot = getattr(importlib.import_module(f"attnlab.viz.{module}"), name)
        err.print(f"chart written to {plot(data, path, **options)}")
