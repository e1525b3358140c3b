"""How an ``attnlab`` command fails: one line on stderr, ``error: ...``, and click's exit codes.

* **2, a usage error**: the command line itself is wrong: a bad option value or name (a device
  this machine lacks included), a missing or extra argument, options that exclude or need each
  other. Click ends its own such errors so (:class:`OneLineErrors`); :func:`usage_error` ends ours.
* **1, a failure at run time**: the command line is valid but running it failed: a file that is
  missing, unreadable, damaged or of the wrong kind (a checkpoint, a data file, a results store, a
  report), a file or run in the way of what the command writes, out of memory, a missing tool or
  package, a failed run (:func:`fail`; :func:`runtime_errors` lists the exceptions of this kind).
"""

from __future__ import annotations

import json
import os
import pickle
import sqlite3
import sys
from typing import NoReturn

import typer
from rich.console import Console
from typer.core import TyperGroup

try:  # typer >= 0.26 carries its own copy of click
    from typer._click import exceptions as click_exceptions
except ImportError:  # older typer: click itself
    from click import exceptions as click_exceptions

__all__ = [
    "OneLineErrors",
    "cpu_device",
    "debugging",
    "device_or_fail",
    "exit_code",
    "fail",
    "runtime_errors",
    "set_debug",
    "usage_error",
    "user_errors",
]

_stderr = Console(stderr=True)

#: ``attnlab --debug`` (or ``ATTNLAB_DEBUG=1``): let errors through with their traceback.
DEBUG = False


def set_debug(value: bool) -> None:
    """Turn the traceback of user errors on or off (the root ``--debug`` option)."""
    global DEBUG
    DEBUG = bool(value)


def debugging() -> bool:
    """True under ``attnlab --debug`` or ``ATTNLAB_DEBUG`` set (not to 0): errors keep their traceback."""
    return DEBUG or os.environ.get("ATTNLAB_DEBUG", "") not in ("", "0")


def usage_error(message: str) -> NoReturn:
    """End the command as click ends a usage error: ``error: message`` on stderr, exit code 2."""
    _end(message, 2)


def fail(problem: str | BaseException, code: int | None = None) -> NoReturn:
    """End the command on a failure at run time: ``error: ...`` on stderr, exit code 1 (click's ``ClickException``).

    Given a caught user error, its message, and the code of its kind (:func:`exit_code`: a bad value
    the library refused is still a usage error); ``code`` overrides either.
    """
    if isinstance(problem, BaseException):
        _end(str(problem) or type(problem).__name__, exit_code(problem) if code is None else code)
    _end(problem, 1 if code is None else code)


def _end(message: str, code: int) -> NoReturn:
    """The one error line (as written: no rich markup, never wrapped) and the exit; under ``--debug``,
    called while an exception is handled, that exception again, traceback and all."""
    from rich.markup import escape

    if debugging() and sys.exc_info()[1] is not None:
        raise
    _stderr.print(f"[bold red]error:[/] {escape(str(message))}", soft_wrap=True)
    raise typer.Exit(code)


def user_errors() -> tuple[type[BaseException], ...]:
    """The exceptions a user's input can cause, which end as one line rather than a traceback: bad
    values (``ValueError``, and the deliberate type checks' :class:`attnlab.validate.ArgumentTypeError`;
    any other ``TypeError`` is a bug and keeps its traceback) and every :func:`runtime_errors` one."""
    from ..validate import ArgumentTypeError

    return (ValueError, ArgumentTypeError, *runtime_errors())


def runtime_errors() -> tuple[type[BaseException], ...]:
    """The user errors that are failures at run time (exit code 1), not usage errors: files
    (``OSError``), damaged pickles and SQLite stores, checkpoints, pretrained models and data files
    that cannot serve (:class:`~attnlab.training.CheckpointError`, :class:`~attnlab.pretrained.PretrainedError`,
    :class:`~attnlab.validate.DataError`, a file that changed since its run), JSON or text that
    does not decode, memory (the CPU's and the GPU's), a missing tool or optional package."""
    import torch

    from ..audio import MissingToolError
    from ..extras import MissingExtraError
    from ..pretrained import PretrainedError
    from ..tasks.base import DataChangedError
    from ..training.checkpoint import CheckpointError
    from ..validate import DataError

    return (OSError, sqlite3.Error, pickle.UnpicklingError, json.JSONDecodeError, UnicodeDecodeError, MemoryError,
            torch.OutOfMemoryError, CheckpointError, PretrainedError, DataError, DataChangedError, MissingToolError,
            MissingExtraError)


def exit_code(error: BaseException) -> int:
    """The exit code of a user error: 1 for a failure at run time (:func:`runtime_errors`), else 2 (a usage error)."""
    return 1 if isinstance(error, runtime_errors()) else 2


def device_or_fail(device: str | None):
    """The :class:`torch.device` that ``--device`` names here, or a usage error (a device this machine
    lacks is a bad value)."""
    from ..devices import DeviceError, resolve

    try:
        return resolve(device)
    except DeviceError as e:
        usage_error(str(e))


def cpu_device(device: str | None, why: str):
    """``--device`` of a command that runs on the CPU only: the CPU for ``cpu`` and ``auto``; a
    device this machine lacks is refused as by :func:`device_or_fail`, and any other device with a
    usage error saying ``why`` it cannot run there."""
    import torch

    if device_or_fail(device).type != "cpu" and device not in (None, "auto"):
        usage_error(f"--device {device}: {why}; use --device cpu")
    return torch.device("cpu")


class OneLineErrors(TyperGroup):
    """The root command group: click's own errors (a bad option value, a missing argument, an unknown
    option) end as one line on stderr, ``error: ... (see 'attnlab CMD --help')``, with click's exit
    code (2 for these usage errors), like every other error of the command line; typer would draw a
    multi-line box."""

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        """Run the command line; with ``standalone_mode`` exit with its code."""
        try:
            code = super().main(args=args, prog_name=prog_name, complete_var=complete_var, standalone_mode=False,
                                **extra)
        except click_exceptions.NoArgsIsHelpError as e:  # a group called alone: its help
            if not standalone_mode:
                raise
            e.show()
            sys.exit(e.exit_code)
        except click_exceptions.ClickException as e:
            if not standalone_mode:
                raise
            where = f" (see '{e.ctx.command_path} --help')" if getattr(e, "ctx", None) is not None else ""
            _stderr.print(f"[bold red]error:[/] {_escape(e.format_message() + where)}", soft_wrap=True, highlight=False)
            sys.exit(e.exit_code)
        except typer.Abort:
            if not standalone_mode:
                raise
            _stderr.print("aborted", highlight=False)
            sys.exit(1)
        if standalone_mode:
            sys.exit(code if isinstance(code, int) else 0)
        return code


def _escape(text: str) -> str:
    """Click's message on one line, without the ``Value error, `` typer puts before a refused choice."""
    from rich.markup import escape

    return escape(" ".join(str(text).replace(": Value error, ", ": ").split()))
