"""Shared argument checks: one message shape for every layer, model, task and study.

Each check returns the value it accepted, so a constructor reads ``self.n = positive_int("n", n)``.
A ``bool`` is never an int here (``True`` is not a size), nor a number.
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["choice", "int_at_least", "is_int", "number_above", "optional_int", "positive_int", "probability"]


class ArgumentTypeError(TypeError):
    """A value of the wrong type given to attnlab: a deliberate argument check, which the command
    line reports as a one-line usage error (any other ``TypeError`` is a bug and keeps its traceback)."""


class DataError(ValueError):
    """A file whose content attnlab cannot use (a data file's bad line, a damaged results store): not a
    bad argument but a failure at run time, which the command line ends with exit code 1, not 2."""


def is_int(value) -> bool:
    """Whether ``value`` is an ``int`` and not a ``bool`` (for checks whose message is their own)."""
    return isinstance(value, int) and not isinstance(value, bool)


def _int_words(minimum: int) -> str:
    return "a positive int" if minimum == 1 else f"an int >= {minimum}"


def int_at_least(name: str, value, minimum: int) -> int:
    """``value`` if it is an ``int`` (not a bool) ``>= minimum``, else a ``ValueError`` naming ``name``."""
    if not is_int(value) or value < minimum:
        raise ValueError(f"{name} must be {_int_words(minimum)}, got {value!r}")
    return value


def positive_int(name: str, value) -> int:
    """``value`` if it is an ``int >= 1`` (not a bool), else
    ``ValueError("<name> must be a positive int, got ...")``."""
    return int_at_least(name, value, 1)


def optional_int(name: str, value, minimum: int = 1) -> int | None:
    """``None``, or ``value`` if it is an ``int >= minimum`` (not a bool); else
    ``ValueError("<name> must be None or a positive int, got ...")`` (``an int >= minimum``)."""
    if value is not None and (not is_int(value) or value < minimum):
        raise ValueError(f"{name} must be None or {_int_words(minimum)}, got {value!r}")
    return value


def number_above(name: str, value, bound: float) -> float:
    """``value`` as a float if it is a number (int or float, not a bool) ``> bound``, else
    ``ValueError("<name> must be a number > <bound>, got ...")``."""
    if not isinstance(value, (int, float)) or isinstance(value, bool) or value <= bound:
        raise ValueError(f"{name} must be a number > {bound}, got {value!r}")
    return float(value)


def probability(name: str, value, *, inclusive_one: bool = False) -> float:
    """``value`` as a float in ``[0, 1)`` (``[0, 1]`` with ``inclusive_one``), else a ``ValueError``."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and (
        0.0 <= value <= 1.0 if inclusive_one else 0.0 <= value < 1.0)
    if not ok:
        raise ValueError(f"{name} must be a number in [0, 1{']' if inclusive_one else ')'}, got {value!r}")
    return float(value)


def choice(name: str, value, options: Iterable[str]) -> str:
    """``value`` if it is one of ``options``, else a ``ValueError`` that lists them."""
    options = list(options)
    if value not in options:
        raise ValueError(f"{name} must be one of {', '.join(map(repr, options))}, got {value!r}")
    return value
