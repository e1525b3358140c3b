"""What every study returns: records, each one JSON object (``to_dict``), and the timing fields
the speed studies share, defined once."""

from __future__ import annotations

from dataclasses import asdict, dataclass

__all__ = ["StudyRecord", "timed"]


class StudyRecord:
    """Base of every study's record (a dataclass): :meth:`to_dict` gives it as a JSON object."""

    def to_dict(self) -> dict:
        """As a JSON object (the dataclass's fields in order)."""
        return asdict(self)


def timed(cls=None, *, note: bool = True):
    """Class decorator: a dataclass of the class's own fields followed by the timing fields
    ``seconds`` (median over the timed repetitions, None where not measured), ``peak_bytes``
    (the profiler's peak of live tensor bytes during one call, or None) and ``repeats``, and,
    with ``note``, ``note`` (why a value is None; default None)."""

    def wrap(c):
        c.__annotations__.update({"seconds": "float | None", "peak_bytes": "int | None", "repeats": "int"})
        if note:
            c.__annotations__["note"] = "str | None"
            c.note = None
        return dataclass(c)

    return wrap(cls) if cls is not None else wrap
